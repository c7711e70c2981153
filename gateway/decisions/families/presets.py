"""Trained presets over a sentence encoder, zero-shot for everything else.

The spec: a typed question naming a preset the card lists uses the preset the model was trained on. This family
answers those questions with small heads fitted by `tools/train_presets.py` on the served encoder's embeddings of
the labelled preset data (`tools/decisions_eval/presets/*.jsonl`, `train` lines only); every other question goes to
the zero-shot family it extends. The heads are a standardisation and a matrix multiply on the encoder's EMBEDDING
(computed here, in the gateway; Triton stays the only runner of the encoder), so a preset costs no extra model.

Features (the same code builds them at training and when serving, so the two cannot drift; the cheap signals are
documented in preset_signals.py):
- one text: its embedding e, plus, for `pii`, cheap signals where an embedding is blind;
- two parts (relevance: request/candidate; grounded: context/answer): u, v, |u − v|, u ⊙ v, cos(u, v), plus lexical
  signals (grounded: numbers by value, weekdays, names and codes of the answer the context lacks, one-sided negation,
  the answer's new words and CJK pairs; relevance: the share of the request's words and CJK pairs the candidate has,
  the gap between the parts' scripts, and the cosine of the parts embedded with E5's `query: `/`passage: `);
- `language`: no embedding at all — lingua-language-detector's confidences over the languages in play, script
  shares and word counts (the head IS a softmax over those, fitted like the others).
The build may weight a kind's trailing signal columns against the embedding (chosen by cross-validation); the
weight lives in the head's stored scale, so serving needs nothing else.

Answers have the zero-shot family's shapes: noul P(true), choice probabilities in the preset's option order, score
probabilities over its levels (the served score is the expected level Σ p_i·i).
"""

from __future__ import annotations

import asyncio
import json
import math
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

import numpy as np

from ...errors import ItemError, no_answer
from ...execution.jobs import Job, run_jobs
from ...runtime import Runtime, ServedModel
from ...text import InputTooLong
from ...timing import Timing
from ..answers import Outcome
from . import lm_reading
from .base import Ask, Context, FamilyError, Params, Phases
from .preset_signals import grounded_signals, language_features, pii_signals, relevance_signals
from .zeroshot import ZeroShot, ZeroShotParams

if TYPE_CHECKING:
    from ...cards import Card

ARTEFACT_FORMAT = 1
HEAD_TOLERANCE = 2e-3  # served (fp32) vs in-process probabilities of the artefact's golden texts


def precision_tolerance(card: Card, precision: str | None) -> float:
    """The golden tolerance `card` allows at a precision it offers beyond fp32 (0 for fp32 or an unknown one)."""
    spec = card.precisions.get(precision) if precision else None  # type: ignore[call-overload]
    return (spec.golden_tolerance or 0.0) if spec is not None else 0.0


def reader_tolerance(card: Card, fitted: dict[str, Any], served: dict[str, Any]) -> float:
    """The LM's share of a golden's tolerance: 0 where it is served on the engine and precision the heads were
    fitted on; else its card's tolerance for whichever of the two is not fp32 (its state moves by that much)."""
    if (fitted.get("engine"), fitted.get("precision")) == (served.get("engine"), served.get("precision", "fp32")):
        return 0.0
    return max(precision_tolerance(card, fitted.get("precision")), precision_tolerance(card, served.get("precision")))

# --------------------------------------------------------------------------------------------- features

SIGNALS = {"pii": 12, "grounded": 9, "relevance": 4}  # trailing signal columns per kind (preset_signals)


# What the encoder reads of a two-part state, by kind: E5's retrieval prefixes where cross-validation chose them over
# the parts as written (tools/pair_features_cv, set B: grounded 0.7172 → 0.7297 on 640 train lines; relevance gained
# 0.15 points, under the 1-point bar fixed before the run). The signals always read the parts as written.
ENCODER_PREFIXES: dict[str, tuple[str, str]] = {"grounded": ("query: ", "passage: ")}
# Kinds that also read their parts with E5's prefixes for one more signal, the cosine of the two prefixed vectors:
# E5's trained retrieval score, which holds across languages where word overlap is zero (tools/pair_features_cv,
# set G with the script-gap signal: relevance 0.7270 → 0.7604 on 989 train lines; 2 more encoder rows a question).
ALSO_PREFIXED: dict[str, tuple[str, str]] = {"relevance": ("query: ", "passage: ")}


def encoder_texts(kind: str, texts: list[str]) -> list[str]:
    """The texts the encoder embeds for a head of this kind, in the order `features` reads their vectors: its
    parts (prefixed where the kind is), then the prefixed parts where the kind also reads those."""
    prefixes, also = ENCODER_PREFIXES.get(kind), ALSO_PREFIXED.get(kind)
    reads = [p + t for p, t in zip(prefixes, texts, strict=True)] if prefixes else list(texts)
    return reads + ([p + t for p, t in zip(also, texts, strict=True)] if also else [])


def _cosine(u: np.ndarray, v: np.ndarray) -> float:
    return float(u @ v / max(float(np.linalg.norm(u) * np.linalg.norm(v)), 1e-12))


# Kinds whose features run a library analyser (LAC and the PII recognisers, lingua): milliseconds of CPU per text, so
# they are computed off the event loop, as the zero-shot family runs its span readers.
OFF_LOOP = frozenset({"pii", "language"})


def signal_count(kind: str) -> int:
    """How many of a kind's feature columns are cheap signals (the build may weight them against the embedding)."""
    return SIGNALS.get(kind, 0)


def features(kind: str, texts: list[str], vectors: list[np.ndarray], state: np.ndarray | None = None) -> np.ndarray:
    """A preset's feature row from its texts (one, or the two parts) and their embeddings (the same order); with
    the LM's `state` of the pair (lm_reading), that state goes between the embedding columns and the signals, so
    the signals stay the trailing columns the build weights."""
    row = _features(kind, texts, vectors)
    if state is None:
        return row
    end = len(row) - signal_count(kind)
    return np.concatenate([row[:end], np.asarray(state, dtype=np.float64), row[end:]])


def _features(kind: str, texts: list[str], vectors: list[np.ndarray]) -> np.ndarray:
    if kind == "language":
        return language_features(texts[0])
    if kind == "pair":
        u, v = (np.asarray(x, dtype=np.float64) for x in vectors)
        return np.concatenate([u, v, np.abs(u - v), u * v, [float(u @ v)]])
    if kind == "grounded":
        u, v = (np.asarray(x, dtype=np.float64) for x in vectors)
        return np.concatenate([u, v, np.abs(u - v), u * v, [float(u @ v)], grounded_signals(*texts)])
    if kind == "relevance":
        u, v, qu, pv = (np.asarray(x, dtype=np.float64) for x in vectors)
        return np.concatenate([u, v, np.abs(u - v), u * v, [float(u @ v)], relevance_signals(*texts),
                               [_cosine(qu, pv)]])
    e = np.asarray(vectors[0], dtype=np.float64)
    return np.concatenate([e, pii_signals(texts[0])]) if kind == "pii" else e


def kind_of(preset: str, parts: list[str]) -> str:
    """The feature kind of a preset: by name where it has its own signals, else by its number of parts."""
    if preset in ("language", "pii"):
        return preset
    if len(parts) == 2:
        return preset if preset in ("grounded", "relevance") else "pair"
    return "text"


# --------------------------------------------------------------------------------------------- the heads

@dataclass
class Head:
    """One preset's fitted head: p = softmax(((x − mean) / scale) · W + b), classes in the preset's key order."""

    preset: str
    type: str
    kind: str
    parts: list[str]
    keys: list[str]
    mean: np.ndarray
    scale: np.ndarray
    weights: np.ndarray  # [features, classes]
    bias: np.ndarray
    reader: str | None = None  # the served LM whose state of the pair it reads (lm_reading), if any

    def probabilities(self, x: np.ndarray) -> np.ndarray:
        z = ((np.asarray(x, dtype=np.float64) - self.mean) / self.scale) @ self.weights + self.bias
        z = z - z.max()
        p = np.exp(z)
        return np.asarray(p / p.sum())

    @classmethod
    def from_json(cls, raw: dict[str, Any]) -> Head:
        return cls(raw["preset"], raw["type"], raw["kind"], list(raw["parts"]), list(raw["keys"]),
                   np.asarray(raw["mean"]), np.asarray(raw["scale"]), np.asarray(raw["weights"]),
                   np.asarray(raw["bias"]), raw.get("reader"))

    def to_json(self) -> dict[str, Any]:
        return {"preset": self.preset, "type": self.type, "kind": self.kind, "parts": self.parts, "keys": self.keys,
                "mean": self.mean.tolist(), "scale": self.scale.tolist(), "weights": self.weights.tolist(),
                "bias": self.bias.tolist(), "reader": self.reader}


def load_heads(path: Path) -> tuple[dict[str, Head], dict[str, Any]]:
    """The artefact's heads by preset name, and its record (key, golden texts, cross-validation report)."""
    raw = json.loads(path.read_text())
    if raw.get("format") != ARTEFACT_FORMAT:
        raise FamilyError(f"{path}: artefact format {raw.get('format')} is not {ARTEFACT_FORMAT}; rebuild it with "
                          "`sr-gateway models build`")
    return {name: Head.from_json(h) for name, h in raw["heads"].items()}, raw


# --------------------------------------------------------------------------------------------- the family

class PresetHeadsParams(Params):
    artefact: str = "1/preset-heads.json"  # relative to the card's directory; built, never committed
    # A served instruction LM (its model id) whose state of the pair the two-part heads read (lm_reading): the
    # build fits them with it, and this model is ready only when that one is.
    reader: str | None = None


class PresetsParams(ZeroShotParams):
    prefix: str = ""  # put before every text the zero-shot family embeds (E5: "query: "); presets embed raw text
    presets: PresetHeadsParams = PresetHeadsParams()


class Presets(ZeroShot):
    name = "presets"
    params_type = PresetsParams

    def __init__(self, model: ServedModel) -> None:
        super().__init__(model)
        path = model.card.directory / self.params.presets.artefact
        if not path.is_file():
            raise FamilyError(f"no preset heads at {path}: build them with `sr-gateway models build`")
        self.heads, self.record = load_heads(path)
        # A listed preset without a head (its data not written yet: the build says so) is answered zero-shot from
        # the card's definition; `self.untrained` names them.
        self.untrained = sorted({n for n, d in self.spec.presets.items() if d.get("type") != "span"}
                                - set(self.heads))
        for name, head in self.heads.items():
            definition = self.spec.presets.get(name)
            if definition is None:
                continue
            keys = self._keys(definition)
            if head.reader != (self.params.presets.reader if lm_reading.reads_state(head.kind) else None):
                raise FamilyError(f"preset {name}: the head was fitted reading {head.reader or 'no LM'}, the card "
                                  f"names {self.params.presets.reader or 'none'}; rebuild the heads")
            if head.type != definition.get("type") or head.keys != keys:
                raise FamilyError(f"preset {name}: the head answers {head.type} {head.keys}, the card asks "
                                  f"{definition.get('type')} {keys}; rebuild the heads")
        # A trained head is a softmax over its preset's own keys, with no abstain option: a card declaring one for
        # a type a trained head answers would promise abstain_probability that question cannot carry.
        declared = set(self.spec.abstain.types) if self.spec.abstain is not None else set()
        if blocked := sorted(n for n, h in self.heads.items() if h.type in declared and n in self.spec.presets):
            raise FamilyError(f"decisions.abstain lists {sorted(declared)}, but the trained preset heads {blocked} "
                              "have no abstain option")

    @staticmethod
    def _keys(definition: dict[str, Any]) -> list[str]:
        kind = definition.get("type")
        if kind == "noul":
            return ["false", "true"]
        if kind == "score":
            return [str(i) for i in range(len(definition.get("levels") or definition.get("criteria") or []))]
        listed = definition.get("choices") or []
        return list(definition["criteria"]) if "criteria" in definition else [str(o["key"]) for o in listed]

    # -- zero-shot texts carry the encoder's query prefix (E5 reads "query: ..." for symmetric tasks)
    def option_texts(self, q: Any) -> list[str]:
        return [self.params.prefix + t for t in super().option_texts(q)]

    def _read(self, ctx: Context, text: str, q: Any) -> Any:
        return super()._read(ctx, self.params.prefix + text, q)

    def components(self) -> list[str]:
        """The zero-shot family's, and the LM the two-part heads read (the model is ready only when it is)."""
        return [*super().components(), *sorted({h.reader for h in self.heads.values() if h.reader is not None})]

    async def warm(self, runtime: Runtime) -> None:
        """Readiness: the artefact's golden texts (English and Chinese, per preset), embedded by the served encoder
        (and read by the served LM, for heads that read its state), must give the probabilities recorded in
        process at build time."""
        await super().warm(runtime)
        for case in self.record.get("golden", []):
            head = self.heads[case["preset"]]
            vectors, error = await self.embed(runtime, encoder_texts(head.kind, case["texts"]), None, None)
            state: np.ndarray | None = None
            if error is None and head.reader is not None:
                lm = runtime.models[head.reader]
                states, error = await self.run_texts(
                    runtime, lm, [lm_reading.prompt(lm.text_encoder(), head.kind, case["texts"])],
                    lm.card.limits.max_input_tokens, None, None)
                state = states[0] if states else None
            if error is not None:
                raise FamilyError(f"preset {head.preset}: a golden text failed: {error.message}")
            got = head.probabilities(features(head.kind, case["texts"], vectors, state))
            worst = float(np.max(np.abs(got - np.asarray(case["probabilities"]))))
            tolerance = self.golden_tolerance(runtime, head)
            if worst > tolerance:
                raise FamilyError(f"preset {head.preset}: golden {case['texts'][0][:40]!r} differs by {worst:.2e} "
                                  f"(tolerance {tolerance:g}) from the in-process build")

    def golden_tolerance(self, runtime: Runtime, head: Head) -> float:
        """How far a golden's served probabilities may be from the build's. The encoder was read at fp32 in the
        build, so its faster served precision (bf16 on AVX-512/AMX hosts) brings its card's own, looser tolerance;
        the LM was read on its served engine and precision (the artefact's key), so only a different one served now
        (another host's tune, a test's forced choice) brings the LM card's tolerance for the one that is not fp32."""
        tolerance = max(HEAD_TOLERANCE, precision_tolerance(self.model.card, self.model.engine.get("precision")))
        if head.reader is not None:
            lm = runtime.models[head.reader]
            fitted = self.record.get("key", {}).get("reader", {}).get("served", {})
            tolerance = max(tolerance, reader_tolerance(lm.card, fitted, lm.engine))
        return tolerance

    async def embed(self, runtime: Runtime, texts: list[str], deadline_ms: float | None, started: float | None,
                    ) -> tuple[list[np.ndarray], ItemError | None]:
        """The served encoder's EMBEDDING of each text, read truncated to the card's max_input_tokens."""
        limit = self.model.card.limits.truncate_tokens or self.model.card.limits.max_input_tokens
        return await self.run_texts(runtime, self.model, texts, limit, deadline_ms, started)

    @staticmethod
    async def run_texts(runtime: Runtime, model: ServedModel, texts: list[str], limit: int,
                        deadline_ms: float | None, started: float | None,
                        ) -> tuple[list[np.ndarray], ItemError | None]:
        """`model`'s output vector for each text (truncated to `limit` tokens), or the first failure."""
        encoder = model.text_encoder()
        try:
            jobs = [Job(encoder.encode(t, max_tokens=limit, overflow="truncate").ids) for t in texts]
        except InputTooLong as exc:  # pragma: no cover - truncation never overflows
            return [], ItemError("max_length_exceeded", exc.message)
        await run_jobs(runtime, model, jobs, deadline_ms=deadline_ms,
                       timing=Timing(started=started) if started is not None else None)
        failed = next((j.error for j in jobs if j.result is None), None)
        if failed is not None or any(j.result is None for j in jobs):
            return [], no_answer(failed)
        return [np.asarray(j.result.values, dtype=np.float64) for j in jobs if j.result is not None], None

    async def answer(self, ctx: Context, asks: list[Ask]) -> list[Phases]:
        trained = [a for a in asks if a.question.preset in self.heads and a.error is None and not a.pictures]
        others = [a for a in asks if a not in trained]
        phases = await super().answer(ctx, others) if others else []
        if trained:
            phases.extend(await self._trained(ctx, trained))
        return phases

    def _texts(self, head: Head, ask: Ask) -> list[str]:
        if len(head.parts) == 2:
            by_name = dict(zip(ask.view.keys, ask.view.parts, strict=False))
            if all(p in by_name for p in head.parts):
                return [by_name[p] for p in head.parts]
            return list(ask.view.parts[:2]) if len(ask.view.parts) >= 2 else [ask.view.text, ask.view.text]
        return [ask.view.text]

    async def _trained(self, ctx: Context, asks: list[Ask]) -> list[Phases]:
        """Every trained ask's features: the encoder's rows and, for heads that read one, the LM's prompts, each
        distinct text run once, the two models at the same time."""
        encoder = self.model.text_encoder()
        limit = self.model.card.limits.truncate_tokens or self.model.card.limits.max_input_tokens
        wanted: dict[str, Job] = {}
        prompts: dict[str, dict[str, Job]] = {}  # per LM: its prompts' jobs
        plans: list[tuple[Ask, Head, list[str], list[Job], Job | None]] = []
        for ask in asks:
            head = self.heads[ask.question.preset or ""]
            texts = self._texts(head, ask)
            if head.kind == "language":
                plans.append((ask, head, texts, [], None))
                ask.view_tokens = len(encoder.encode(texts[0], max_tokens=limit, overflow="truncate").ids)
                continue
            reads = encoder_texts(head.kind, texts)
            for text in reads:
                if text not in wanted:
                    wanted[text] = Job(encoder.encode(text, max_tokens=limit, overflow="truncate").ids)
            read: Job | None = None
            if head.reader is not None:
                lm = ctx.runtime.models[head.reader]
                lm_encoder = lm.text_encoder()
                text = lm_reading.prompt(lm_encoder, head.kind, texts)
                by_prompt = prompts.setdefault(head.reader, {})
                if text not in by_prompt:
                    by_prompt[text] = Job(lm_encoder.encode(text, max_tokens=lm.card.limits.max_input_tokens,
                                                            overflow="truncate").ids)
                read = by_prompt[text]
                ask.question_tokens = len(read.ids)  # the LM's prompt: the question this head asks of the state
            plans.append((ask, head, texts, [wanted[t] for t in reads], read))
            ask.view_tokens = sum(len(wanted[t].ids) for t in dict.fromkeys(reads))
        runs = [run_jobs(ctx.runtime, self.model, list(wanted.values()), deadline_ms=ctx.deadline_ms,
                         timing=Timing(started=ctx.started))] if wanted else []
        runs += [run_jobs(ctx.runtime, ctx.runtime.models[name], list(by_text.values()),
                          deadline_ms=ctx.deadline_ms, timing=Timing(started=ctx.started))
                 for name, by_text in prompts.items()]
        phases = [Phases.of(queue_ms, forward_ms) for queue_ms, forward_ms in await asyncio.gather(*runs)]
        for ask, head, texts, rows, state_job in plans:
            needed = [*rows, *([state_job] if state_job is not None else [])]
            failed = next((j.error for j in needed if j.result is None), None)
            if failed is not None or any(j.result is None for j in needed):
                ask.fail(no_answer(failed))
                continue
            vectors = [np.asarray(j.result.values, dtype=np.float64) for j in rows if j.result is not None]
            state = (np.asarray(state_job.result.values, dtype=np.float64)
                     if state_job is not None and state_job.result is not None else None)
            row = (await asyncio.to_thread(features, head.kind, texts, vectors) if head.kind in OFF_LOOP
                   else features(head.kind, texts, vectors, state))
            p = head.probabilities(row)
            if not all(math.isfinite(float(x)) for x in p):
                ask.fail(ItemError("invalid_model_output", "the preset head gave a non-finite probability"))
                continue
            ask.outcome = Outcome(p)
        return phases or [Phases.of(0.0, 0.0)]


def classify_scores(model: ServedModel, preset: str, values: np.ndarray) -> np.ndarray:
    """/v1/classify over a trained preset's head (a card head with `preset:`): the preset's probabilities from the
    encoder's embedding of the input, in the head's label order. Only one-text, embedding-fed presets qualify."""
    from . import family  # here, not at the top: the package imports this module

    fam = family(model)
    head = fam.heads.get(preset) if isinstance(fam, Presets) else None
    if head is None or head.kind != "text":
        raise FamilyError(f"model {model.id}: preset {preset!r} has no one-text head of the presets family")
    return head.probabilities(features(head.kind, [""], [values]))
