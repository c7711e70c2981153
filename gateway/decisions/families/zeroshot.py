"""Zero-shot decisions over a sentence embedder, with spans from a token tagger.

No generative decision model ships offline, so this family answers with what we have (and says so on its card):

- choice / score: softmax over options of cos(state, option text) / T, where each option's text comes from the
  card's template (instructions, key, description); with windows, each option scores its best window; a card that
  declares an abstain option (`decisions.abstain`, `parameters.abstain.cosine` c) also answers a choice's
  abstain_probability, the share of one more option scoring cos = c in that softmax;
- noul: with both descriptions, the two-option choice; otherwise sigmoid((cos(state, text) − b) / T) with the
  true description or the instructions as the text (a lone false description flips it);
- set: one such sigmoid per label (independent labels); with `centred: [set]` a label's cosine is first taken
  relative to the mean cosine of the question's labels. E5 moves a text's cosines to every label up or down together
  (a long text sits lower than a short one), so one absolute bias cannot fit every text: on the seen ad-hoc sets,
  exact selections rose from 0.32 to 0.48 (5-fold CV grouped by question, tools/decisions_eval/RUNS.md 2026-12-07);
- span: the tagger's BIO spans whose entity types the question's labels name (by key or alias, else by a word of
  the description), merged with the spans of the field's PII libraries (pii_zh: validated e-mails, phone numbers,
  resident ids, bank cards; Chinese names and addresses), which win where the two overlap; the tagger's spans over
  Han characters, which it reads as unknown tokens, are dropped, and so are its phone and identifier spans in a
  sentence with Han characters, where the libraries' checks decide (pii_zh.CHECKED_TYPES; every tagger type under
  the same question label), and its person spans that are handles or an honorific's lone surname. Offsets in code points
  of the one part read; the question's noul is the highest probability any token of the part (or a library span)
  has of being one of those types.

Temperatures and biases are fitted on the labelled set in tools/decisions_eval (tools/fit_decisions.py).
Option texts are embedded once per distinct text and kept in a bounded LRU cache.
"""

from __future__ import annotations

import asyncio
import re
from collections import OrderedDict
from dataclasses import dataclass, field, replace
from typing import Any, Literal

import numpy as np
from pydantic import Field

from ...errors import ItemError, no_answer, too_long
from ...execution.items import Item, prepare_item, token_probabilities
from ...execution.jobs import Job, run_jobs
from ...heads import decode_spans, sigmoid, softmax
from ...images.ocr import read_many
from ...runtime import ServedModel
from ...text import InputTooLong
from ...timing import Timing
from ..answers import Outcome
from ..pii_zh import CHECKED_TYPES, Found, has_han, in_han_sentence
from ..pii_zh import TYPES as LIBRARY_TYPES
from ..pii_zh import find as find_pii
from ..pii_zh import load as load_pii
from ..questions import Option, Question, QuestionError
from ..romanized import given_names
from ..state import View
from .base import Ask, Context, Family, FamilyError, Params, Phases

DEFAULT_TEMPLATES = {"choice": "{key}: {description}", "score": "{instructions} {description}",
                     "set": "{key}: {description}", "noul": "{instructions}", "noul_option": "{description}"}


class TaggerParams(Params):
    model: str  # id of the served token-classifier card
    head: str | None = None
    types: dict[str, list[str]]  # entity type → names a question label may use for it (keys or description words)


class PairParams(Params):
    """Nouls over a state whose first two parts are a pair the card names (a request and a candidate passage, a
    context and an answer) also weigh how alike the two parts are: logit += weight · (cos(part₁, part₂) − bias) / T.
    Other multi-part states (a subject and a body, a previous message and a request) are read as one text."""

    weight: float = 0.0
    bias: float = 0.0
    parts: list[tuple[str, str]] = Field(default_factory=list)


class OcrParams(Params):
    model: str  # id of the served OCR card: images are read as their text lines


class AbstainParams(Params):
    """The abstain option of choice questions (`decisions.abstain` on the card): one more option whose cosine with
    the state is `cosine` whatever the state, in the same softmax at the choice temperature. It wins when no option's
    text is at least that alike to the state: "none of these" as a sentence embedder can say it."""

    cosine: float = Field(ge=-1, le=1)


class ZeroShotParams(Params):
    templates: dict[str, str] = DEFAULT_TEMPLATES
    temperature: dict[str, float]
    pair: PairParams = PairParams()
    bias: dict[str, float] = Field(default_factory=dict)
    cache_entries: int = 4096
    tagger: TaggerParams | None = None
    ocr: OcrParams | None = None
    abstain: AbstainParams | None = None
    # question types whose option cosines are centred on the question's mean before the bias (set only: choice and
    # score take a softmax, which a common shift does not change)
    centred: list[Literal["set"]] = Field(default_factory=list)


_TRUNCATE = Question("", "noul", "", overflow="truncate")  # how a part compared with another part is read


# An honorific before a lone surname (Mr. Lee, Dr Chen) addresses someone; like 王经理 it is no name by itself
_GIVEN_BEFORE = re.compile(r"(?<![A-Za-z0-9@._\-])([A-Z][a-z]+) $")
_HONORIFIC = re.compile(r"(?:^|(?<=[^A-Za-z]))(?:Mr|Mrs|Ms|Miss|Mx|Dr|Prof)\.?\s*$")


def _not_a_name(text: str, start: int, end: int) -> bool:
    """A tagger PERSON span that is no person's name: a handle or a piece of an address (a digit or `_` in it, a
    hyphen joining lower-case parts as in a user name, or glued to `/` or `@` of a URL or an account), or a
    single word after an honorific only (Mr. Lee: a way of addressing someone, like 王经理). Names are written
    capitalised and with letters only; a hyphenated name's parts are capitalised (Jean-Luc)."""
    span = text[start:end]
    if any(c.isdigit() or c == "_" for c in span) or re.search(r"-[a-z]", span):
        return True
    if (start > 0 and text[start - 1] in "/@") or (end < len(text) and text[end] in "/@"):
        return True
    return " " not in span.strip() and _HONORIFIC.search(text, 0, start) is not None


def _norm(name: str) -> str:
    return re.sub(r"[^A-Z0-9]+", "_", name.upper()).strip("_")


@dataclass
class _Reading:
    """One distinct state text read by the embedder: its jobs (one per window) and tokens counted."""

    jobs: list[Job] = field(default_factory=list)
    tokens: int = 0
    lower_bound: bool = False  # read only in part: `tokens` counts what was read
    error: ItemError | None = None


class OptionCache:
    """Embeddings of option texts, most recently used last; bounded so hostile requests cannot grow it."""

    def __init__(self, entries: int) -> None:
        self.entries = entries
        self._data: OrderedDict[str, tuple[np.ndarray, int]] = OrderedDict()
        self.hits = 0
        self.misses = 0

    def get(self, text: str) -> tuple[np.ndarray, int] | None:
        found = self._data.get(text)
        if found is None:
            self.misses += 1
            return None
        self._data.move_to_end(text)
        self.hits += 1
        return found

    def put(self, text: str, vector: np.ndarray, tokens: int) -> None:
        self._data[text] = (vector, tokens)
        self._data.move_to_end(text)
        while len(self._data) > self.entries:
            self._data.popitem(last=False)


class ZeroShot(Family):
    name = "zeroshot"
    params_type = ZeroShotParams

    def __init__(self, model: ServedModel) -> None:
        super().__init__(model)
        p: ZeroShotParams = self.params
        missing = [t for t in self.spec.question_types if t in ("choice", "noul", "score", "set")
                   and t not in p.temperature]
        if missing:
            raise FamilyError(f"decisions.parameters.temperature has no entry for {missing}")
        if "span" in self.spec.question_types and p.tagger is None:
            raise FamilyError("span questions need decisions.parameters.tagger")
        self.cache = OptionCache(p.cache_entries)

    def components(self) -> list[str]:
        return [self.params.tagger.model] if self.params.tagger is not None else []

    def abstain_types(self) -> set[str]:
        return {"choice"} if self.params.abstain is not None else set()

    async def warm(self, runtime: Any) -> None:
        """Span questions also read the PII libraries: load them now (off the event loop), not on a first request."""
        await super().warm(runtime)
        if "span" in self.spec.question_types:
            await asyncio.to_thread(load_pii)

    def optional_components(self) -> list[str]:
        """The OCR model: waited for when this process serves it; without it, questions over images fail alone."""
        return [self.params.ocr.model] if self.params.ocr is not None else []

    # -- validation --------------------------------------------------------------------------------------------
    def check(self, question: Question) -> None:
        if question.type == "span":
            self.span_types(question)

    def span_types(self, question: Question) -> dict[str, str]:
        """Tagger entity type → the question label it answers (the first label naming it)."""
        tagger: TaggerParams = self.params.tagger
        out: dict[str, str] = {}
        for option in question.options:
            types = self._types_for(option, tagger)
            if not types:
                raise QuestionError(f"label {option.key!r} names no entity type the tagger finds; it finds "
                                    f"{sorted(tagger.types)}")
            for t in types:
                out.setdefault(t, option.key)
        return out

    @staticmethod
    def _types_for(option: Option, tagger: TaggerParams) -> list[str]:
        key = _norm(option.key)
        by_key = [t for t, names in tagger.types.items() if key == _norm(t) or key in {_norm(n) for n in names}]
        if by_key or not option.description:
            return by_key
        # By the description: the types whose longest name occurs in it ("an email address" is EMAIL, not ADDRESS)
        words = f" {_norm(option.description).replace('_', ' ')} "
        best: dict[str, int] = {}
        for t, names in tagger.types.items():
            for n in names:
                phrase = _norm(n).replace("_", " ")
                if f" {phrase} " in words:
                    best[t] = max(best.get(t, 0), len(phrase))
        longest = max(best.values(), default=0)
        return [t for t, size in best.items() if size == longest]

    # -- texts -------------------------------------------------------------------------------------------------
    def option_texts(self, q: Question) -> list[str]:
        """The texts compared with the state, one per option (noul without descriptions: one text)."""
        t = self.params.templates
        if q.type == "noul":
            false, true = q.options
            if false.description is None and true.description is None:
                return [t["noul"].format(instructions=q.instructions)]
            return [t["noul_option"].format(instructions=q.instructions, key=o.key, description=o.description)
                    for o in q.options if o.description is not None]
        template = t[q.type]
        return [template.format(instructions=q.instructions, key=o.key, description=o.description or o.key)
                for o in q.options]

    # -- answering ---------------------------------------------------------------------------------------------
    async def answer(self, ctx: Context, asks: list[Ask]) -> list[Phases]:
        phases: list[Phases] = []
        pictured = [a for a in asks if a.pictures]
        if pictured:
            phases.append(await self._read_images(ctx, pictured))
        live = [a for a in asks if a.error is None]
        embed = [a for a in live if a.question.type not in ("span", "box")]
        spans = [a for a in live if a.question.type == "span"]
        boxes = [a for a in live if a.question.type == "box"]
        if embed:
            phases.append(await self._embedded(ctx, embed))
        if spans:
            phases.append(await self._tagged(ctx, spans))
        if boxes:
            phases.append(await self._boxes(ctx, boxes))
        return phases

    # -- images: read as their OCR text lines ------------------------------------------------------------------
    async def _read_images(self, ctx: Context, asks: list[Ask]) -> Phases:
        """Each image a question reads becomes "[image k]" followed by its text lines, in front of the state."""
        ocr_params: OcrParams | None = self.params.ocr
        ocr = ctx.runtime.models.get(ocr_params.model) if ocr_params is not None else None
        if ocr is None or not ocr.ready:
            why = ("this model reads no images" if ocr_params is None else
                   f"it reads images through {ocr_params.model}, which is not {'served' if ocr is None else 'ready'}")
            for ask in asks:
                ask.fail(ItemError("unavailable", f"the question reads images, but {why}"))
            return Phases()
        distinct = {id(p.decoded): p.decoded for a in asks for p in a.pictures if p.decoded is not None}
        timing = Timing(started=ctx.started)
        answers = await read_many(ctx.runtime, ocr, list(distinct.values()), deadline_ms=ctx.deadline_ms,
                                  timing=timing)
        found = dict(zip(distinct, answers, strict=True))
        for ask in asks:
            blocks = []
            for picture in ask.pictures:
                lines = found.get(id(picture.decoded))
                if isinstance(lines, ItemError) or lines is None:
                    ask.fail(lines or ItemError("invalid_model_output", "an image was not read"))
                    break
                ask.seen[picture.number] = lines
                blocks.append(f"[image {picture.number}]\n" + "\n".join(line.text for line in lines))
            if ask.error is None:
                ask.view = replace(ask.view, text="\n\n".join([*blocks, ask.view.text]))
        return Phases.of(timing.ms["queue"], timing.ms["forward"])

    async def _boxes(self, ctx: Context, asks: list[Ask]) -> Phases:
        """Box: the text line of the target image whose text is most like the instructions; its probability is the
        softmax of cos / T over the image's lines (no line: the whole image, confidence null)."""
        encoder = self.model.text_encoder()
        limit = self.model.card.limits.max_input_tokens
        wanted: dict[str, Job] = {}
        plans: list[tuple[Ask, str, list[Any]]] = []
        for ask in asks:
            own = ask.own_pictures
            target = own[0] if own else next(p for p in ask.pictures if p not in own)
            lines = ask.seen.get(target.number, [])
            instructions = re.sub(r"\[image \d+\]", " ", ask.question.instructions).strip() or "text"
            plans.append((ask, instructions, lines))
            for text in [instructions, *(line.text for line in lines)]:
                if text not in wanted:
                    wanted[text] = Job(encoder.encode(text, max_tokens=limit, overflow="truncate").ids)
            ask.question_tokens = len(wanted[instructions].ids)
        queue_ms, forward_ms = await run_jobs(ctx.runtime, self.model, list(wanted.values()),
                                             deadline_ms=ctx.deadline_ms, timing=Timing(started=ctx.started))
        temperature = self.params.temperature.get("box", 0.05)
        for ask, instructions, lines in plans:
            jobs = [wanted[instructions], *(wanted[line.text] for line in lines)]
            failed = next((j.error for j in jobs if j.result is None), None)
            if failed is not None or any(j.result is None for j in jobs):
                ask.fail(no_answer(failed))
                continue
            if not lines:
                ask.outcome = Outcome(np.asarray([np.nan]), box={"top": 0.0, "left": 0.0, "bottom": 1.0,
                                                                  "right": 1.0})
                continue
            query = np.asarray(jobs[0].result.values, dtype=np.float64)  # type: ignore[union-attr]
            cos = np.asarray([float(query @ np.asarray(j.result.values, dtype=np.float64))  # type: ignore[union-attr]
                              for j in jobs[1:]])
            p = softmax(cos / temperature)
            best = int(np.argmax(p))
            ask.outcome = Outcome(np.asarray([p[best]]), box=lines[best].box.as_dict())
        return Phases.of(queue_ms, forward_ms)

    def _read(self, ctx: Context, text: str, q: Question) -> _Reading:
        encoder = self.model.text_encoder()
        limits = self.model.card.limits
        reading = _Reading()
        try:
            if q.overflow == "truncate":
                enc = encoder.encode(text, max_tokens=limits.truncate_tokens or limits.max_input_tokens,
                                     overflow="truncate")
                reading.jobs, reading.tokens, reading.lower_bound = [Job(enc.ids)], enc.tokens, enc.tokens_lower_bound
                return reading
            window = self.spec.window
            budget = ctx.max_tokens or limits.max_scan_tokens or limits.max_input_tokens
            windows = encoder.windows(text, window_tokens=window.tokens if window else limits.max_input_tokens,
                                      overlap=window.overlap if window else 0, scan_budget=budget)
        except InputTooLong as exc:
            reading.error = too_long(exc)
            reading.tokens, reading.lower_bound = exc.tokens, exc.lower_bound
            return reading
        reading.jobs = [Job(w.ids) for w in windows]
        reading.tokens = windows[-1].content_end + encoder.layout.size
        return reading

    async def _embedded(self, ctx: Context, asks: list[Ask]) -> Phases:
        encoder = self.model.text_encoder()
        limit = self.model.card.limits.max_input_tokens
        readings: dict[tuple[str, bool], _Reading] = {}
        pending: dict[str, Job] = {}
        known: dict[str, tuple[np.ndarray, int]] = {}  # option texts found in the cache, held for this request
        texts: dict[int, list[str]] = {}
        for index, ask in enumerate(asks):
            key = (ask.view.text, ask.question.overflow == "truncate")
            if key not in readings:
                readings[key] = self._read(ctx, ask.view.text, ask.question)
            if self._paired(ask.question, ask.view):
                for part in ask.view.parts[:2]:
                    if (part, True) not in readings:
                        readings[(part, True)] = self._read(ctx, part, _TRUNCATE)
            texts[index] = self.option_texts(ask.question)
            for text in texts[index]:
                if text in pending or text in known:
                    continue
                cached = self.cache.get(text)
                if cached is not None:
                    known[text] = cached
                    continue
                try:
                    enc = encoder.encode(text, max_tokens=limit, overflow="reject")
                except InputTooLong as exc:
                    ask.fail(ItemError("max_length_exceeded", f"an option text of this question is too long: "
                                                              f"{exc.message}"))
                    continue
                pending[text] = Job(enc.ids)
        jobs = [j for r in readings.values() for j in r.jobs] + list(pending.values())
        queue_ms, forward_ms = await run_jobs(ctx.runtime, self.model, jobs, deadline_ms=ctx.deadline_ms,
                                             timing=Timing(started=ctx.started))
        phases = Phases.of(queue_ms, forward_ms)
        for text, job in pending.items():
            if job.result is not None:
                known[text] = (np.asarray(job.result.values, dtype=np.float32), len(job.ids))
                self.cache.put(text, *known[text])
        for index, ask in enumerate(asks):
            reading = readings[(ask.view.text, ask.question.overflow == "truncate")]
            ask.view_tokens, ask.tokens_lower_bound = reading.tokens, reading.lower_bound
            if ask.error is not None:
                continue
            if reading.error is not None:
                ask.fail(reading.error)
                continue
            failed = next((j.error for j in reading.jobs if j.error is not None), None)
            missing = [pending[t].error for t in texts[index] if t not in known]
            failed = failed or next((e for e in missing if e is not None), None)
            if failed is None and missing:
                failed = ItemError("invalid_model_output", "no answer for an option text")
            if failed is not None:
                ask.fail(failed)
                continue
            vectors = [known[t][0] for t in texts[index]]
            ask.question_tokens = sum(known[t][1] for t in texts[index])
            state = np.stack([np.asarray(j.result.values, dtype=np.float32) for j in reading.jobs
                              if j.result is not None])
            cos = np.max(np.stack(vectors) @ state.T, axis=1).astype(np.float64)  # best window per option
            pair = None
            if self._paired(ask.question, ask.view):
                first, second = (readings[(part, True)] for part in ask.view.parts[:2])
                if first.error or second.error or not first.jobs[0].result or not second.jobs[0].result:
                    ask.fail(first.error or second.error or first.jobs[0].error or second.jobs[0].error
                             or ItemError("invalid_model_output", "no answer for a part"))
                    continue
                pair = float(np.dot(first.jobs[0].result.values, second.jobs[0].result.values))
            ask.outcome = Outcome(self.probabilities(ask.question, cos, pair), abstain=self.abstain(ask.question, cos))
        return phases

    def _paired(self, q: Question, view: View) -> bool:
        false, true = q.options if q.type == "noul" else (None, None)
        named = tuple(view.keys[:2]) in {tuple(p) for p in self.params.pair.parts}
        return (q.type == "noul" and len(view.parts) >= 2 and named and self.params.pair.weight != 0.0
                and false is not None and true is not None and false.description is None
                and true.description is None)

    def probabilities(self, q: Question, cos: np.ndarray, pair: float | None = None) -> np.ndarray:
        """The family's scoring rule from cosines (one per option text) to the question's probabilities."""
        temperature = self.params.temperature[q.type]
        bias = self.params.bias.get(q.type, 0.0)
        if q.type in ("choice", "score"):
            return softmax(cos / temperature)
        if q.type == "set":
            return sigmoid((cos - (cos.mean() if "set" in self.params.centred else 0.0) - bias) / temperature)
        false, true = q.options  # noul
        if false.description is not None and true.description is not None:
            return softmax(cos / temperature)
        logit = (cos[0] - bias) / temperature
        if pair is not None:
            logit += self.params.pair.weight * (pair - self.params.pair.bias) / temperature
        p_true = sigmoid(logit)
        if false.description is not None:  # only the false description was compared
            p_true = 1.0 - p_true
        return np.asarray([1.0 - p_true, p_true])

    def abstain(self, q: Question, cos: np.ndarray) -> float | None:
        """P(abstain) of the softmax over the options and the abstain option (cosine fixed by the card), where the
        card declares one; the question's probabilities are that softmax renormalised without it (`probabilities`)."""
        if not self.abstains(q):
            return None
        level = self.params.abstain.cosine
        return float(softmax(np.append(cos, level) / self.params.temperature[q.type])[-1])

    async def _tagged(self, ctx: Context, asks: list[Ask]) -> Phases:
        tagger_params: TaggerParams = self.params.tagger
        tagger = ctx.runtime.models.get(tagger_params.model)
        if tagger is None or not tagger.ready:
            for ask in asks:
                ask.fail(ItemError("unavailable", f"the span tagger {tagger_params.model} is not ready"))
            return Phases()
        heads = tagger.card.heads or []
        head = next((h for h in heads if h.name == tagger_params.head), heads[0])
        encoder = tagger.text_encoder()
        limits = tagger.card.limits
        budget = min(ctx.max_tokens or self.model.card.limits.max_scan_tokens or limits.max_input_tokens,
                     limits.max_scan_tokens or limits.max_input_tokens)
        window = head.window
        tokens = window.tokens if window else limits.max_input_tokens
        overlap = window.overlap if window else 0
        items: dict[tuple[str, bool], Item] = {}
        for ask in asks:
            key = (ask.view.text, ask.question.overflow == "truncate")
            if key not in items:
                if key[1]:
                    items[key] = prepare_item(encoder, ask.view.text, "truncate",
                                              min(limits.max_input_tokens, budget), tokens, overlap)
                else:
                    items[key] = prepare_item(encoder, ask.view.text, "window", budget, tokens, overlap)
        jobs = [j for item in items.values() for j in item.jobs]
        queue_ms, forward_ms = await run_jobs(ctx.runtime, tagger, jobs, deadline_ms=ctx.deadline_ms,
                                             timing=Timing(started=ctx.started))
        tokens_of: dict[tuple[str, bool], tuple[np.ndarray, list[tuple[int, int]]]] = {}
        for key, item in items.items():
            if item.error is None and all(j.result is not None for j in item.jobs):
                tokens_of[key] = token_probabilities(item, [np.asarray(j.result.values) for j in item.jobs
                                                             if j.result is not None])
        # The libraries read exactly the text the tagger read (a truncated part: up to its last token read), so
        # the card's scan limits bound their cost too; in a worker thread, off the event loop.
        read = {key: key[0][:offsets[-1][1]] if key[1] and offsets else key[0]
                for key, (_, offsets) in tokens_of.items()}
        distinct = list(dict.fromkeys(read.values()))
        library = dict(zip(distinct, await asyncio.to_thread(lambda: [find_pii(t) for t in distinct]), strict=True))
        for ask in asks:
            key = (ask.view.text, ask.question.overflow == "truncate")
            item = items[key]
            ask.view_tokens = int(item.usage.get("tokens", 0))
            ask.tokens_lower_bound = bool(item.usage.get("tokens_lower_bound", False))
            failed = item.error or next((j.error for j in item.jobs if j.error is not None), None)
            if failed is not None or key not in tokens_of:
                ask.fail(failed or ItemError("invalid_model_output", "the tagger gave no answer"))
                continue
            probs, offsets = tokens_of[key]
            ask.outcome = self._spans(ask, head.labels, probs, offsets, library[read[key]])
        return Phases.of(queue_ms, forward_ms)

    def _spans(self, ask: Ask, labels: list[str], probs: np.ndarray, offsets: list[tuple[int, int]],
               library: list[Found] | None = None) -> Outcome:
        q = ask.question
        wanted = self.span_types(q)
        threshold = q.threshold if q.threshold is not None else self.spec.thresholds.get("span", 0.5)
        # P(token is one of the wanted types) = Σ over their B- and I- labels
        mask = np.asarray([lab != "O" and lab.split("-", 1)[-1] in wanted for lab in labels], dtype=np.float64)
        p_any = float(np.max(probs @ mask, initial=0.0)) if len(probs) else 0.0
        text = ask.view.text
        # In a sentence with Han characters the libraries, not the tagger, decide what a phone number or resident
        # id is (pii_zh.CHECKED_TYPES says why): the tagger's spans there are dropped for every question label that
        # a checked type answers, whichever of the tagger's types it came from. A label such as GOVERNMENT_ID also
        # names PASSPORT and DRIVERS_LICENSE, and in Chinese text the tagger gives those to any code with letters
        # and digits (a licence code's last letter, a courier or inpatient number): once a library checks what the
        # label means (a resident id), an unchecked span of another type under the same label is only noise.
        checked = {wanted[t] for t in CHECKED_TYPES if t in wanted}
        found = [s for s in decode_spans(probs, offsets, labels, threshold) if s.label in wanted
                 and not (wanted[s.label] in checked and in_han_sentence(text, s.start, s.end))]
        spans: list[dict[str, Any]] = []
        chosen: list[dict[str, Any]] = []  # the libraries' spans the question's labels name
        for f in library or []:
            label = next((wanted[t] for t in LIBRARY_TYPES.get(f.entity, ()) if t in wanted), None)
            if label is not None and f.probability >= threshold:
                chosen.append({"label": label, "start": f.start, "end": f.end, "text": text[f.start:f.end],
                               "probability": round(f.probability, 6)})
                p_any = max(p_any, f.probability)
        for s in found:
            label = wanted[s.label]
            last = spans[-1] if spans else None
            # a person's given name and surname are one PERSON span when only spaces separate them
            if last is not None and last["label"] == label and not text[last["end"]:s.start].strip():
                last["end"], last["text"] = s.end, text[last["start"]:s.end]
                last["probability"] = round(min(last["probability"], s.probability), 6)
                continue
            start = s.start
            # an English given name the tagger left out before the surname it found (Maria Gonzalez → Gonzalez)
            given = _GIVEN_BEFORE.search(text, 0, start)
            if given is not None and s.label in LIBRARY_TYPES["PERSON"] and given.group(1) in given_names():
                start = given.start(1)
            spans.append({"label": label, "start": start, "end": s.end, "text": text[start:s.end],
                          "probability": round(s.probability, 6)})
        # A library span beats a tagger fragment over it (`.wei` of an e-mail, a mobile number called TAX_ID, an
        # 18-digit number whose resident-id check digit fails), whether or not the question asked for the library
        # span's label; the tagger reads Han characters as unknown tokens, so its spans over them are dropped.
        spans = [s for s in spans if not has_han(s["text"])
                 and all(s["end"] <= f.start or f.end <= s["start"] for f in library or [])]
        persons = {wanted[t] for t in LIBRARY_TYPES["PERSON"] if t in wanted}
        spans = [s for s in spans if s["label"] not in persons or not _not_a_name(text, s["start"], s["end"])]
        return Outcome(np.asarray([p_any]), sorted([*chosen, *spans], key=lambda s: s["start"]))
