"""Running a decisions request: plan it, answer its questions through the model's family, finish its response.

Used by /v1/decisions, /v1/systemone and bundles. Every valid question of every entry goes to the model's family
in one pass, so texts shared across questions and entries are read once; several requests whose options agree
share that pass too (System One's batch). A question whose input is too long fails alone.
"""

from __future__ import annotations

import asyncio
import logging
import time
from dataclasses import dataclass, field

from ..errors import ApiError, ItemError
from ..runtime import Runtime, ServedModel
from ..timing import Timing, charge, charge_model
from .cache import Cached, result_cache
from .cache import key as cache_key
from .entries import Entry, build_entries, check_any_valid, check_request_tokens, decode_images
from .families import Ask, Context, Phases, family
from .media import answer_with_videos, read_videos
from .questions import Question
from .request import DecisionRequest
from .response import Answered, entry_answer

log = logging.getLogger("sr_gateway.http")


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
    await decode_images(model, entries)
    await read_videos(model, entries)
    for entry in entries:
        if entry.rejected is None:
            check_request_tokens(model, entry)
    if all(e.rejected is not None for e in entries):  # alone, or every entry: the (first) rejection answers
        raise next(e.rejected for e in entries if e.rejected is not None)
    if not whole:
        check_any_valid(entries)
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
    out = {e.name: entry_answer(runtime, p.model, e) for e in p.entries}
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
    """One request planned, run alone and finished (/v1/decisions, bundles, the readiness golden)."""
    p = await plan(runtime, model, req, timing, long_context=long_context, parts=parts)
    await run(runtime, [p])
    return finish(runtime, p)
