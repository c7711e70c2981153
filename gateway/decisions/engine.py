"""The question engine behind /v1/decisions, /v1/systemone and bundles: parse, validate, answer, assemble.

A request is one state with its questions, or a batch (`states`) of named entries, each read exactly as if sent
alone with the batch's model and options. Every valid question of every entry goes to the model's family in one
pass, so texts shared across questions and entries are read once. Failures stay where they happen: an invalid
question or one whose input is too long fails alone; a rejected entry fails only its own questions.
"""

from __future__ import annotations

import asyncio
import logging
import time
from dataclasses import dataclass, field
from typing import Any

from pydantic import Field, StrictBool, StrictInt, StrictStr

from ..assets import Assets
from ..errors import ApiError, ItemCode, ItemError, QuestionCode, no_answer
from ..execution.meta import response_meta
from ..execution.requests import MIN_DEADLINE_MS, Strict, parse
from ..runtime import Runtime, ServedModel
from ..timing import Timing, charge, charge_model
from .answers import assemble
from .cache import Cached, ResultCache
from .cache import key as cache_key
from .families import Ask, Context, Family, Phases, family_for
from .media import EntryMedia, answer_with_videos, decode, read_videos, reads_video, substitute, video_question
from .questions import Invalid, Question, QuestionError, check_collisions, validate
from .state import OMITTED, State, parse_state

log = logging.getLogger("sr_gateway.http")
ENTRY_FIELDS = {"state", "questions", "images", "videos"}


class DecisionOptions(Strict):
    deadline_ms: float | StrictInt | None = Field(default=None, ge=MIN_DEADLINE_MS)
    return_meta: StrictBool = False
    max_tokens: StrictInt | None = Field(default=None, ge=1)
    long_context: StrictBool = False


class DecisionRequest(Strict):
    """Top level; `state`, `questions`, `roles` and entries are checked by hand for the reference's messages."""

    model: StrictStr | None = None
    state: Any = None
    questions: Any = None
    roles: Any = None
    images: list[Any] | None = None
    videos: list[Any] | None = None
    states: Any = None
    assets: dict[str, Any] | None = None
    options: DecisionOptions = DecisionOptions()


@dataclass
class Failure:
    question: str
    type: str | None
    code: ItemCode | QuestionCode
    message: str
    reason: str | None = None


def rejected(q: Question | Invalid, rejection: ApiError) -> Failure:
    """A question of a rejected entry. The spec answers every such question with invalid_input, reason
    input_malformed, and the rejection's message, whatever was rejected (an image, a video, an asset, roles or
    the token count); a limit's own reason (request_tokens) is the request's, when every entry is rejected."""
    return Failure(q.id, q.type, "invalid_input", rejection.message, "input_malformed")


@dataclass
class Entry:
    """One state with its questions, validated; `rejected` fails every question of the entry."""

    name: str | None
    state: State | None
    questions: list[Question | Invalid]
    rejected: ApiError | None = None
    asks: list[Ask] = field(default_factory=list)
    media: EntryMedia | None = None


@dataclass
class EntryAnswer:
    body: dict[str, Any]
    failures: list[Failure]


@dataclass
class Answered:
    model: ServedModel
    entries: dict[str | None, EntryAnswer]
    batch: bool
    queue_ms: float
    forward_ms: float


def result_cache(runtime: Runtime, model: ServedModel) -> ResultCache | None:
    """The model's result cache, or None where the settings leave this model uncached."""
    policy = runtime.settings.result_cache
    if policy == "off" or runtime.settings.result_cache_entries <= 0 or (
            policy == "exact" and model.card.numerics != "exact"):
        return None
    fam = family(model)
    found: ResultCache | None = getattr(fam, "results", None)
    if found is None:
        found = ResultCache(runtime.settings.result_cache_entries)
        fam.results = found  # type: ignore[attr-defined]
    return found


def family(model: ServedModel) -> Family:
    """The model's family, built once (a card error surfaces at load, through the golden check)."""
    if model.family is None:
        model.family = family_for(model)
    return model.family  # type: ignore[no-any-return]


def parse_request(body: Any) -> DecisionRequest:
    req = parse(DecisionRequest, body)
    top = {k for k in ("state", "questions", "images", "videos") if k in req.model_fields_set}
    if "states" in req.model_fields_set:
        if top:
            raise ApiError("invalid_request", f"a batch request (states) has no top-level {sorted(top)}: use one "
                                              "form or the other")
    else:
        for name in ("state", "questions"):
            if name not in req.model_fields_set:
                raise ApiError("invalid_request", f"{name} is required")
    return req


def _roles(req: DecisionRequest) -> Any:
    return req.roles if "roles" in req.model_fields_set else OMITTED


def _questions(raw: Any, where: str) -> dict[str, Any]:
    if not isinstance(raw, dict) or not raw:
        raise ApiError("invalid_request", f"{where} must be an object naming at least one question")
    blank = [k for k in raw if not k.strip()]
    if blank:
        raise ApiError("invalid_request", f"{where} has a blank question id")
    return raw


def _entry(model: ServedModel, fam: Family, name: str | None, media: EntryMedia, roles: Any) -> Entry:
    where = "questions" if name is None else f"states.{name}.questions"
    questions = _questions(media.questions, where)
    state, roles_error = _state(media.state, roles, "state" if name is None else f"states.{name}.state")
    spec = model.card.decisions
    assert spec is not None
    placements = set(model.card.image_placements)
    checked: list[Question | Invalid] = []
    for qid, raw in questions.items():
        q = validate(qid, raw, spec, model.id)
        if isinstance(q, Question):
            try:
                fam.check(q)
                state.span_view(q.over) if q.type == "span" else state.view(q.over)
                if reads_video(q):
                    q = video_question(model, fam, q, media)
                elif q.type == "box":
                    _box_target(model, q, media)
                outside = media.question_places.get(qid, set()) - placements
                if outside:
                    raise QuestionError(f"images in a question's {sorted(outside)} are read only by models whose "
                                        f"image_placements list them; model {model.id} reads images in "
                                        f"{sorted(placements) or 'none'}", "question_images_unsupported")
            except QuestionError as exc:
                q = Invalid(qid, q.type, str(exc), exc.code)
        checked.append(q)
    entry = Entry(name, state, check_collisions(checked), rejected=roles_error, media=media)
    modalities = list(model.card.modalities or ["text"])
    # Images in the state need the modality; images in a question fail that question by placement (above).
    used = {"images": bool(media.images), "videos": bool(media.videos)}
    for kind, present in used.items():
        if present and kind.rstrip("s") not in modalities:
            entry.rejected = ApiError("invalid_request", f"model {model.id} does not read {kind}; it reads "
                                                         f"{modalities}")
    return entry


def _state(value: Any, roles: Any, where: str) -> tuple[State, ApiError | None]:
    """The entry's state, and the rejection of the request's `roles` for it: top-level roles apply to every entry
    of a batch, so roles naming a part one entry lacks reject that entry (alone: the request), not the batch."""
    try:
        return parse_state(value, roles, where=where), None
    except ApiError as exc:
        if roles is OMITTED or roles is None:
            raise
        try:
            state = parse_state(value, None, where=where)
        except ApiError:
            raise exc from None
        return state, exc


def _box_target(model: ServedModel, q: Question, media: EntryMedia) -> None:
    """A box question locates what its instructions describe in the one image they reference, else in the
    state's only image (with `at`, in the state's video: media.video_question)."""
    own = media.question_images.get(q.id, [])
    if len(own) > 1:
        raise QuestionError(f"the instructions reference {len(own)} images; a box question locates in one",
                            "box_target_ambiguous")
    if not own and len(media.images) > 1:
        raise QuestionError(f"the state holds {len(media.images)} images; reference the one to search in the "
                            "instructions", "box_target_ambiguous")
    if not own and not media.images:
        raise QuestionError("a box question needs an image: in its instructions or the state", "box_needs_image")


def build_entries(model: ServedModel, req: DecisionRequest, parts: dict[str, bytes] | None = None, *,
                  leading: bool = False) -> list[Entry]:
    fam = family(model)
    roles = _roles(req)
    assets = Assets.parse(req.assets, parts)
    if "states" not in req.model_fields_set:
        media = substitute(assets, req.state, req.questions, req.images, "", leading=leading)
        media.videos = list(req.videos or [])
        assets.check_all_used()
        return [_entry(model, fam, None, media, roles)]
    if not isinstance(req.states, dict) or not req.states:
        raise ApiError("invalid_request", "states must be an object naming at least one state")
    entries = []
    for name, raw in req.states.items():
        if not name.strip():
            raise ApiError("invalid_request", "states has a blank state name")
        if not isinstance(raw, dict):
            raise ApiError("invalid_request", f"states.{name} must be an object with state and questions")
        unknown = sorted(set(raw) - ENTRY_FIELDS)
        if unknown:
            raise ApiError("invalid_request", f"states.{name} does not take {unknown}")
        for needed in ("state", "questions"):
            if needed not in raw:
                raise ApiError("invalid_request", f"states.{name}.{needed} is required")
        media = substitute(assets, raw["state"], raw["questions"], raw.get("images"), f"states.{name}.",
                           leading=leading)
        videos = raw.get("videos")
        if videos is not None and not isinstance(videos, list):
            raise ApiError("invalid_request", f"states.{name}.videos must be a list")
        media.videos = list(videos or [])
        entries.append(_entry(model, fam, name, media, roles))
    assets.check_all_used()
    return entries


async def _decode(model: ServedModel, entries: list[Entry]) -> None:
    """Decode each entry's images; a rejected image fails its entry (or, alone, the request) naming the asset."""
    for entry in entries:
        if entry.rejected is not None or entry.media is None:
            continue
        valid = {q.id for q in entry.questions if isinstance(q, Question)}
        pictures = [*entry.media.images, *(p for qid, ps in entry.media.question_images.items() if qid in valid
                                           for p in ps)]
        if not pictures:
            continue
        rejected = await decode(model, pictures)
        if rejected:
            entry.rejected = ApiError("invalid_request", next(iter(rejected.values())))


def _check_any_valid(entries: list[Entry]) -> None:
    valid = [q for e in entries if e.rejected is None for q in e.questions if isinstance(q, Question)]
    if valid:
        return
    reasons = [f"{q.id if e.name is None else f'{e.name}.{q.id}'}: {q.message}" for e in entries
               if e.rejected is None for q in e.questions if isinstance(q, Invalid)]
    raise ApiError("invalid_request", "no question is valid: " + "; ".join(reasons))


def _request_tokens(model: ServedModel, entry: Entry) -> None:
    """State-once models bound a whole request: the state once plus each question's own tokens."""
    spec, limit = model.card.decisions, model.card.limits.max_request_tokens
    if spec is None or spec.usage != "state_once" or limit is None or entry.state is None:
        return
    encoder = model.text_encoder()
    tokenizer = model.tokenizer
    assert tokenizer is not None
    state = encoder.encode(entry.state.view(None).text, max_tokens=limit + 1, overflow="truncate").tokens
    total = state
    for q in entry.questions:
        if isinstance(q, Question):
            texts = [q.instructions, *(o.description or o.key for o in q.options)]
            total += sum(len(e.ids) for e in tokenizer.encode_batch(texts, add_special_tokens=False))
    if total > limit:
        entry.rejected = ApiError("invalid_request", f"the request holds at least {total} tokens (the state once "
                                                     f"plus each question), over model {model.id}'s "
                                                     f"max_request_tokens {limit}", reason="request_tokens",
                                  limit=limit)


@dataclass
class Plan:
    """One request, validated and split into the questions the family will answer."""

    model: ServedModel
    req: DecisionRequest
    entries: list[Entry]
    asks: list[Ask]
    timing: Timing | None
    started: float
    long_context: bool = False
    phases: list[Phases] = field(default_factory=list)
    error: ApiError | None = None  # the request failed as a whole while its questions were answered


async def plan(runtime: Runtime, model: ServedModel, req: DecisionRequest, timing: Timing | None, *,
               long_context: bool = False, whole: bool = False, parts: dict[str, bytes] | None = None,
               leading: bool = False) -> Plan:
    """Validate a request; a failure of the request as a whole raises ApiError (400 and friends). `whole`: System
    One answers invalid questions as the request's failure (422), so a request with none valid is not a 400.
    `parts`: a multipart body's image parts; `leading`: System One's array states with images before the text."""
    started = time.perf_counter()
    entries = build_entries(model, req, parts, leading=leading)
    await _decode(model, entries)
    await read_videos(model, entries)
    for entry in entries:
        if entry.rejected is None:
            _request_tokens(model, entry)
    if all(e.rejected is not None for e in entries):  # alone, or every entry: the (first) rejection answers
        raise next(e.rejected for e in entries if e.rejected is not None)
    if not whole:
        _check_any_valid(entries)
    asks: list[Ask] = []
    for entry in entries:
        if entry.rejected is not None or entry.state is None:
            continue
        for q in entry.questions:
            if isinstance(q, Question):
                view = entry.state.span_view(q.over) if q.type == "span" else entry.state.view(q.over)
                media = entry.media
                pictures = [] if media is None or q.type == "span" else [*media.images,
                                                                        *media.question_images.get(q.id, [])]
                ask = Ask(entry.name, q, view, pictures=pictures,
                          own_pictures=list(media.question_images.get(q.id, [])) if media else [])
                entry.asks.append(ask)
                asks.append(ask)
    charge(timing, "tokenize", started)
    return Plan(model, req, entries, asks, timing, timing.started if timing is not None else started,
                long_context or req.options.long_context)


async def run(runtime: Runtime, plans: list[Plan]) -> None:
    """Answer the questions of several requests in one pass per model: texts they share are read once. Requests
    keep their own deadlines, so they share a pass only when their options agree; the rest run side by side."""
    groups: dict[tuple[str, float | None, int | None, bool], list[Plan]] = {}
    for p in plans:
        o = p.req.options
        groups.setdefault((p.model.id, o.deadline_ms, o.max_tokens, p.long_context), []).append(p)

    async def one(group: list[Plan]) -> None:
        """One pass for the group; where it fails as a whole (admission: overload, --max-queue, out of memory),
        each request is answered again on its own, so each gets the status it would get alone."""
        try:
            await _answer_together(runtime, group)
            return
        except ApiError as exc:
            if len(group) == 1:
                group[0].error = exc
                return
        except Exception:
            log.exception("unhandled error answering %d decisions requests", len(group))
            for p in group:
                p.error = ApiError("internal_error", "internal error; see the gateway log")
            return
        for p in group:
            _forget_answers(p)
            await one([p])

    await asyncio.gather(*(one(g) for g in groups.values()))


def _forget_answers(p: Plan) -> None:
    """Clear what a failed pass left on a request's questions before it is answered again."""
    for ask in p.asks:
        ask.outcome, ask.error, ask.reason, ask.view_tokens, ask.question_tokens = None, None, None, 0, 0
        ask.tokens_lower_bound = False
        ask.seen.clear()
    p.phases = []


async def _answer_together(runtime: Runtime, group: list[Plan]) -> None:
    """The questions of several requests in one pass through the family (cache hits skip the model)."""
    first = group[0]
    model, max_tokens = first.model, first.req.options.max_tokens
    cache = result_cache(runtime, model)
    todo: list[tuple[Ask, bytes | None]] = []
    for ask in (a for p in group for a in p.asks):
        k = cache_key(model, ask, max_tokens) if cache is not None else None
        hit = cache.get(k) if cache is not None and k is not None else None
        if cache is not None:
            runtime.metrics.child(runtime.metrics.result_cache, model.id, "hit" if hit else "miss").inc()
        if hit is not None:
            ask.outcome, ask.view_tokens, ask.question_tokens = hit.outcome, hit.view_tokens, hit.question_tokens
            ask.tokens_lower_bound = hit.tokens_lower_bound
        else:
            todo.append((ask, k))
    if not todo:
        return
    ctx = Context(runtime, model, first.req.options.deadline_ms, max_tokens, min(p.started for p in group),
                  first.long_context)
    phases = await answer_with_videos(ctx, family(model), [a for a, _ in todo],
                                      [e.media for p in group for e in p.entries if e.media is not None])
    for p in group:
        p.phases = phases
    if cache is not None:
        for ask, k in todo:
            if k is not None and ask.error is None and ask.outcome is not None:
                cache.put(k, Cached(ask.outcome, ask.view_tokens, ask.question_tokens, ask.tokens_lower_bound))


def finish(runtime: Runtime, p: Plan) -> Answered:
    """The request's answer; raises the error it failed with as a whole, if it did."""
    if p.error is not None:
        raise p.error
    mark = time.perf_counter()
    _question_limits(p)
    out = {e.name: _assemble(runtime, p.model, e) for e in p.entries}
    queue_ms, forward_ms = model_time(p.phases)
    charge_model(p.timing, queue_ms, forward_ms)
    charge(p.timing, "post", mark)
    return Answered(p.model, out, any(e.name is not None for e in p.entries), queue_ms, forward_ms)


def model_time(phases: list[Phases]) -> tuple[float, float]:
    """(queue_ms, forward_ms) of a request: every model call it made (OCR, then the encoder, then the tagger)
    counts, not only the last one to answer."""
    return sum(x.queue_ms for x in phases), sum(x.forward_ms for x in phases)


def _question_limits(p: Plan) -> None:
    """Models with a validated length bound each question (the state it reads plus itself) by it, or by
    max_input_tokens with long context (slower and less accurate, so the client asks for it)."""
    limits = p.model.card.limits
    if limits.validated_input_tokens is None:
        return
    limit = limits.max_input_tokens if p.long_context else limits.validated_input_tokens
    for ask in p.asks:
        tokens = ask.view_tokens + ask.question_tokens
        if ask.error is None and tokens > limit:
            hint = "" if p.long_context else f" (long context allows up to {limits.max_input_tokens})"
            ask.error = ItemError("max_length_exceeded", f"the question reads {tokens} tokens with its state, over "
                                                         f"the {limit} this model answers{hint}")
            ask.reason = "question_tokens"
            ask.outcome = None


async def answer(runtime: Runtime, model: ServedModel, req: DecisionRequest, timing: Timing | None, *,
                 long_context: bool = False, parts: dict[str, bytes] | None = None) -> Answered:
    p = await plan(runtime, model, req, timing, long_context=long_context, parts=parts)
    await run(runtime, [p])
    return finish(runtime, p)


def _assemble(runtime: Runtime, model: ServedModel, entry: Entry) -> EntryAnswer:
    spec = model.card.decisions
    assert spec is not None
    by_id = {a.question.id: a for a in entry.asks}
    answers: dict[str, Any] = {}
    spans: dict[str, Any] = {}
    sets: dict[str, Any] = {}
    thresholds: dict[str, float] = {}
    failures: list[Failure] = []
    views: dict[str, int] = {}
    lower_bound = False  # some state was read only in part: its tokens count what was read (spec: long inputs)
    question_tokens = 0
    per_question = 0
    for q in entry.questions:
        failure: Failure | None = None
        if isinstance(q, Invalid):
            failure = Failure(q.id, q.type, q.code, q.message, "question_invalid")
        elif entry.rejected is not None:
            failure = rejected(q, entry.rejected)
        else:
            ask = by_id[q.id]
            if q.type in ("set", "span"):
                thresholds[q.id] = q.threshold if q.threshold is not None else spec.thresholds.get(q.type, 0.5)
            views[ask.view.text] = ask.view_tokens
            lower_bound = lower_bound or ask.tokens_lower_bound
            per_question += ask.view_tokens + ask.question_tokens
            question_tokens += ask.question_tokens
            if ask.error is None and ask.outcome is not None:
                try:
                    got, extra = assemble(q, ask.outcome, spec.confidence, thresholds.get(q.id))
                except ItemError as exc:  # a non-finite readout fails this question only
                    ask.fail(exc)
                else:
                    answers.update(got)
                    if "sets" in extra:
                        sets[q.id] = extra["sets"]
                    if "spans" in extra:
                        spans[q.id] = extra["spans"]
            if ask.error is not None or ask.outcome is None:
                error = no_answer(ask.error)
                failure = Failure(q.id, q.type, error.code, error.message, ask.reason or _reason(error.code))
        if failure is not None:
            answers[q.id] = {"type": failure.type, "error": failure.code, "message": failure.message}
            failures.append(failure)
        runtime.metrics.count_input(model.id, failure.code if failure else "ok")
    tokens = sum(views.values()) + question_tokens if spec.usage == "state_once" else per_question
    body: dict[str, Any] = {"model": model.id, "answers": answers}
    if spans:
        body["spans"] = spans
    if sets:
        body["sets"] = sets
    if thresholds:
        body["thresholds"] = thresholds
    body["usage"] = {"input_tokens": tokens, "output_tokens": 0}
    if lower_bound:
        body["usage"]["tokens_lower_bound"] = True
    return EntryAnswer(body, failures)


def _reason(code: str) -> str:
    return {"max_length_exceeded": "question_tokens", "scan_budget_exceeded": "scan_budget",
            "deadline_exceeded": "deadline", "unavailable": "model_unavailable",
            "invalid_model_output": "model_output"}.get(code, code)


def render_decisions(answered: Answered, return_meta: bool) -> dict[str, Any]:
    """The /v1/decisions body: failed questions answered in place."""
    meta = response_meta(answered.model, answered.queue_ms, answered.forward_ms) if return_meta else None
    if not answered.batch:
        body = dict(answered.entries[None].body)
        if meta is not None:
            body["meta"] = meta
        return body
    states = {}
    usage: dict[str, Any] = {"input_tokens": 0, "output_tokens": 0}
    for name, entry in answered.entries.items():
        states[str(name)] = {**entry.body, **({"meta": meta} if meta is not None else {})}
        usage["input_tokens"] += entry.body["usage"]["input_tokens"]
        if entry.body["usage"].get("tokens_lower_bound"):
            usage["tokens_lower_bound"] = True
    out: dict[str, Any] = {"model": answered.model.id, "states": states, "usage": usage}
    if meta is not None:
        out["meta"] = meta
    return out
