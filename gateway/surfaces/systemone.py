"""POST /v1/systemone and /v1/systemone/batch — decisions the System One way, in the process's schema.

System One clients must get an answer of its question's type for every question, so any failed question fails the
request as a whole (`question_failed`, status from the first failed question, the message listing every failed
question). The schema (`--systemone-schema`) sets how strictly requests are read and how errors look:

- `vllm-sr/5.0` (default): strict — a member the schema does not define is a 400 naming it; an object state without
  `roles` has no part with a role; the `TypeSafe-Danger-Zone-Long-Context: true` header turns long context on;
  errors are `detail` (a list on 422) plus the flat `code`, `question`, `state`, `reason` and `limit`; an
  overloaded process answers 529 with Retry-After.
- `vllm-sr/4.0`: the internal form and every 5.0 form; errors carry `error` plus `detail` and the flat fields.
"""

from __future__ import annotations

import time
from typing import Any

from aiohttp import web

from ..assets import share_parts
from ..decisions.questions import Invalid
from ..decisions.request import DecisionRequest, parse_request
from ..decisions.response import Answered, Failure, rejected, render_decisions
from ..decisions.running import Plan, finish, model_time, plan, run
from ..errors import QUESTION_STATUS, STATUS, SYSTEMONE_OVERLOADED, ApiError
from ..runtime import Runtime
from ..timing import Timing
from .common import Call, surface

SCHEMAS = ("vllm-sr/5.0", "vllm-sr/4.0")
LONG_CONTEXT_HEADER = "TypeSafe-Danger-Zone-Long-Context"
# Members of a vllm-sr/5.0 request: System One's plus the vllm-sr extensions (`roles` included: without it an
# object state's parts have no role).
STRICT_MEMBERS = {"model", "state", "questions", "roles", "images", "videos", "assets", "states", "options"}


class SystemOneError(ApiError):
    """An error already rendered in the process's System One schema."""

    def __init__(self, status: int, body: dict[str, Any], code: str, message: str) -> None:
        Exception.__init__(self, message)
        self.code, self.message, self.status, self.reason, self.limit = code, message, status, None, None
        self._body = body

    def body(self) -> dict[str, Any]:
        return self._body


def _flat(fields: dict[str, Any]) -> dict[str, Any]:
    return {k: v for k, v in fields.items() if v is not None}


def render_error(schema: str, code: str, message: str, status: int, detail: list[dict[str, Any]] | None = None,
                 **fields: Any) -> SystemOneError:
    """One error in the process's schema: 5.0 `detail` (+ flat fields), 4.0 `error` + `detail` + flat fields."""
    if code == "overloaded" and schema == "vllm-sr/5.0":
        status = SYSTEMONE_OVERLOADED
    flat = _flat({"code": code, **fields})
    shown: Any = detail if status == 422 and detail is not None else (
        [{"loc": ["body"], "msg": message, "type": code}] if status == 422 else message)
    if schema == "vllm-sr/5.0":
        return SystemOneError(status, {"detail": shown, **flat}, code, message)
    error = {"code": code, "message": message, **_flat(fields)}
    return SystemOneError(status, {"error": error, "detail": shown, **flat}, code, message)


def from_api_error(schema: str, exc: ApiError) -> SystemOneError:
    return render_error(schema, exc.code, exc.message, exc.status, reason=exc.reason, limit=exc.limit)


def question_failed(schema: str, answered: Answered) -> SystemOneError | None:
    """The request's error when any question failed, else None."""
    return _failed(schema, [(name, f) for name, e in answered.entries.items() for f in e.failures])


def invalid_before_running(schema: str, p: Plan) -> SystemOneError | None:
    """Invalid questions and rejected entries fail a System One request before any model work is spent on it."""
    failures: list[tuple[str | None, Failure]] = []
    for e in p.entries:
        for q in e.questions:
            if isinstance(q, Invalid):
                failures.append((e.name, Failure(q.id, q.type, q.code, q.message, "question_invalid")))
            elif e.rejected is not None:
                failures.append((e.name, rejected(q, e.rejected)))
    return _failed(schema, failures)


def _failed(schema: str, failures: list[tuple[str | None, Failure]]) -> SystemOneError | None:
    if not failures:
        return None
    name, first = failures[0]
    listed = "; ".join(f"{'' if n is None else n + '.'}{f.question}: {f.code}: {f.message}" for n, f in failures)
    message = f"{len(failures)} question{'s' if len(failures) > 1 else ''} failed: {listed}"
    detail = [{"loc": ["body", *(["states", n] if n is not None else []), "questions", f.question],
               "msg": f.message, "type": f.code} for n, f in failures]
    return render_error(schema, "question_failed", message, QUESTION_STATUS.get(first.code, 400), detail,
                        question_error=first.code, reason=first.reason, question=first.question, state=name)


def _parse(schema: str, body: Any) -> DecisionRequest:
    if schema == "vllm-sr/5.0" and isinstance(body, dict):
        unknown = sorted(set(body) - STRICT_MEMBERS)
        if unknown:
            raise ApiError("invalid_request", f"vllm-sr/5.0 requests do not define {unknown}")
    req = parse_request(body)
    if schema == "vllm-sr/5.0" and "roles" not in req.model_fields_set:
        req = req.model_copy(update={"roles": None})
        req.model_fields_set.add("roles")
    return req


def _long_context(request: web.Request) -> bool:
    return request.headers.get(LONG_CONTEXT_HEADER, "").strip().lower() == "true"


async def _plan(runtime: Runtime, schema: str, body: Any, timing: Timing | None, long_context: bool,
                parts: dict[str, bytes] | None) -> Plan:
    req = _parse(schema, body)
    model = runtime.resolve(req.model, "decisions")
    return await plan(runtime, model, req, timing, long_context=long_context, whole=True, parts=parts,
                      leading=True)


def _respond(runtime: Runtime, schema: str, p: Plan) -> dict[str, Any]:
    answered = finish(runtime, p)
    failed = question_failed(schema, answered)
    if failed is not None:
        raise failed
    return render_decisions(answered, p.req.options.return_meta)


def routes(schema: str) -> list[web.RouteDef]:
    if schema not in SCHEMAS:
        raise ValueError(f"systemone schema must be one of {SCHEMAS}, not {schema!r}")

    def render(exc: ApiError) -> ApiError:
        return exc if isinstance(exc, SystemOneError) else from_api_error(schema, exc)

    @surface("systemone", render)
    async def create_systemone(call: Call) -> dict[str, Any]:
        try:
            call.timing.begin("tokenize")
            p = await _plan(call.runtime, schema, call.body, call.timing, _long_context(call.request), call.parts)
            early = invalid_before_running(schema, p)
            if early is not None:
                raise early
            await run(call.runtime, [p])
            return _respond(call.runtime, schema, p)
        except SystemOneError:
            raise
        except ApiError as exc:
            raise from_api_error(schema, exc) from exc

    @surface("systemone_batch", render)
    async def create_systemone_batch(call: Call) -> dict[str, Any]:
        """Several named requests answered in one pass through the family, each exactly as if sent alone."""
        try:
            body = call.body
            if not isinstance(body, dict) or set(body) != {"requests"} or not isinstance(body["requests"], dict) \
                    or not body["requests"]:
                raise ApiError("invalid_request", "a batch is {\"requests\": {name: request, ...}} with at least one "
                                                  "request")
            if len(body["requests"]) > call.runtime.settings.max_bundle_tasks:
                raise ApiError("request_too_large", f"the batch has {len(body['requests'])} requests; "
                                                    f"--max-bundle-tasks is {call.runtime.settings.max_bundle_tasks}")
            parts = share_parts(body["requests"], call.parts, "request")
        except ApiError as exc:
            raise from_api_error(schema, exc) from exc
        mark = time.perf_counter()
        long_context = _long_context(call.request)
        plans: dict[str, Plan] = {}
        responses: dict[str, dict[str, Any]] = {}
        for name, raw in body["requests"].items():
            try:
                planned = await _plan(call.runtime, schema, raw, Timing(started=call.timing.started), long_context,
                                      parts[name])
                early = invalid_before_running(schema, planned)
                if early is not None:
                    raise early
                plans[name] = planned
            except ApiError as exc:
                err = exc if isinstance(exc, SystemOneError) else from_api_error(schema, exc)
                responses[name] = {"status": err.status, "body": err.body()}
        call.timing.add("tokenize", mark)
        await run(call.runtime, list(plans.values()))
        mark = time.perf_counter()
        for name, p in plans.items():
            try:
                responses[name] = {"status": 200, "body": _respond(call.runtime, schema, p)}
            except ApiError as exc:  # failed as a whole: admission (each request is admitted as if alone)
                err = exc if isinstance(exc, SystemOneError) else from_api_error(schema, exc)
                responses[name] = {"status": err.status, "body": err.body()}
        # every model call of the batch once (requests answered in one pass share their phases)
        queue_ms, forward_ms = model_time(list({id(x): x for p in plans.values() for x in p.phases}.values()))
        call.timing.ms["queue"] += queue_ms
        call.timing.ms["forward"] += forward_ms
        call.timing.add("post", mark)
        return {"responses": {name: responses[name] for name in body["requests"]}}

    return [web.post("/v1/systemone", create_systemone), web.post("/v1/systemone/batch", create_systemone_batch)]


__all__ = ["SCHEMAS", "STATUS", "routes"]
