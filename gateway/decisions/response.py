"""The response: each entry's answers, sets, spans, thresholds and usage, and the /v1/decisions body.

Failed questions are answered in place with their own error (`Failure`); System One reads the same failures to
fail its request as a whole (surfaces/systemone.py).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from ..errors import ApiError, ItemCode, ItemError, QuestionCode, no_answer
from ..execution.meta import response_meta
from ..runtime import Runtime, ServedModel
from .answers import assemble
from .entries import Entry
from .questions import Invalid, Question


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


def entry_answer(runtime: Runtime, model: ServedModel, entry: Entry) -> EntryAnswer:
    """One entry's body (answers in question order, spans, sets, thresholds, usage) and its failed questions."""
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
