"""POST /v1/bundle — several surface requests in one call, answered in task order, each with its own status.

The bundle fails as a whole only when it is malformed (400) or too large (413: more than --max-bundle-tasks tasks,
or the body limit). Tasks run concurrently (Triton batches their inputs together); a failing task answers its own
error with the status it would have had alone. `options.deadline_ms` applies to every task unless a task's own
deadline is earlier. Server-Timing reports the queue/forward/post of the task answered last. A multipart body's
image parts go to the tasks whose `assets` name them (each part to exactly one asset, else the bundle is a 400).
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from typing import Any

from aiohttp import web
from pydantic import BaseModel

from ..assets import inline_input_assets, share_parts
from ..decisions.request import DecisionRequest, parse_request
from ..errors import ApiError
from ..execution.jobs import job_group
from ..execution.requests import MIN_DEADLINE_MS, parse
from ..runtime import Runtime, ServedModel
from ..timing import Timing
from .classify import ClassifyRequest, classify
from .common import Call, surface
from .decisions import decide
from .embeddings import EmbeddingsRequest, embed
from .rerank import RerankRequest, rerank

log = logging.getLogger("sr_gateway.http")

Work = Callable[[Runtime, ServedModel, Any, Call | None], Awaitable[dict[str, Any]]]


def _parser(model: type[BaseModel]) -> Callable[[Any], Any]:
    return lambda body: parse(model, body)


SURFACES: dict[str, tuple[Callable[[Any], Any], Work]] = {
    "decisions": (parse_request, decide),
    "classify": (_parser(ClassifyRequest), classify),
    "embeddings": (_parser(EmbeddingsRequest), embed),
    "rerank": (_parser(RerankRequest), rerank),
}


@dataclass
class Task:
    id: str
    surface: str
    body: dict[str, Any]


def _tasks(body: Any, limit: int) -> tuple[list[Task], float | None]:
    if not isinstance(body, dict):
        raise ApiError("invalid_request", "the request body must be a JSON object")
    unknown = sorted(set(body) - {"tasks", "options"})
    if unknown:
        raise ApiError("invalid_request", f"unknown members: {', '.join(unknown)}")
    options = body.get("options", {})
    if not isinstance(options, dict) or set(options) - {"deadline_ms"}:
        raise ApiError("invalid_request", "options takes only deadline_ms")
    deadline = options.get("deadline_ms")
    if "deadline_ms" in options and (isinstance(deadline, bool) or not isinstance(deadline, int | float)
                                     or deadline < MIN_DEADLINE_MS):
        raise ApiError("invalid_request", f"options.deadline_ms must be a number of at least {MIN_DEADLINE_MS}")
    raw = body.get("tasks")
    if not isinstance(raw, list) or not raw:
        raise ApiError("invalid_request", "tasks must be a non-empty list")
    if len(raw) > limit:
        raise ApiError("request_too_large", f"the bundle has {len(raw)} tasks; --max-bundle-tasks is {limit}")
    tasks: list[Task] = []
    seen: set[str] = set()
    for index, task in enumerate(raw):
        if not isinstance(task, dict):
            raise ApiError("invalid_request", f"tasks[{index}] must be an object")
        tid = task.get("id")
        if not isinstance(tid, str) or not tid:
            raise ApiError("invalid_request", f"tasks[{index}].id must be a non-empty string")
        if tid in seen:
            raise ApiError("invalid_request", f"task id {tid!r} is used twice")
        seen.add(tid)
        named = [k for k in task if k != "id"]
        if len(named) != 1 or named[0] not in SURFACES:
            raise ApiError("invalid_request", f"task {tid!r} must hold exactly one of {sorted(SURFACES)}")
        inner = task[named[0]]
        if not isinstance(inner, dict):
            raise ApiError("invalid_request", f"task {tid!r}: {named[0]} must be an object")
        tasks.append(Task(tid, named[0], inner))
    return tasks, float(deadline) if deadline is not None else None


def _with_deadline(body: dict[str, Any], deadline: float | None) -> dict[str, Any]:
    """The bundle's deadline, unless the task's own is earlier."""
    if deadline is None:
        return body
    options = body.get("options")
    if "options" in body and not isinstance(options, dict):
        return body  # the surface's own validation answers this (null included)
    own = (options or {}).get("deadline_ms")
    if isinstance(own, int | float) and not isinstance(own, bool) and own <= deadline:
        return body
    return {**body, "options": {**(options or {}), "deadline_ms": deadline}}


async def _run(call: Call, task: Task, deadline: float | None,
               parts: dict[str, bytes] | None) -> tuple[dict[str, Any], Timing]:
    """One task, answered as its own endpoint would answer it: its status, its error. A bug in one task is that
    task's 500, never the bundle's."""
    timing = Timing(started=call.timing.started)
    sub = Call(call.request, call.runtime, timing, task.body, parts)
    parser, work = SURFACES[task.surface]
    try:
        mark = time.perf_counter()
        body = task.body
        if task.surface in ("embeddings", "classify"):  # their image assets, as on their own endpoints
            body = await inline_input_assets(body, parts)
        req = parser(_with_deadline(body, deadline))
        model = call.runtime.resolve(getattr(req, "model", None), task.surface)
        timing.add("tokenize", mark)
        answer = await work(call.runtime, model, req, sub)
    except ApiError as exc:
        return {"id": task.id, "status": exc.status, "error": exc.body()["error"]}, timing
    except Exception:
        log.exception("unhandled error in bundle task %r (%s)", task.id, task.surface)
        error = ApiError("internal_error", "internal error; see the gateway log")
        return {"id": task.id, "status": error.status, "error": error.body()["error"]}, timing
    timing.finish()
    return {"id": task.id, "status": 200, task.surface: answer}, timing


@surface("bundle")
async def create_bundle(call: Call) -> dict[str, Any]:
    mark = time.perf_counter()
    call.timing.begin("tokenize")
    tasks, deadline = _tasks(call.body, call.runtime.settings.max_bundle_tasks)
    parts = share_parts({t.id: t.body for t in tasks}, call.parts, "task")
    call.timing.add("tokenize", mark)
    with job_group():  # tasks for one model are one job group: identical inputs across them run once
        done = await asyncio.gather(*(_run(call, t, deadline, parts[t.id]) for t in tasks))
    results = [r for r, _ in done]
    timings = [t for _, t in done]
    last = max(timings, key=lambda t: t.total_ms or 0.0)
    call.timing.ms["tokenize"] += sum(t.ms["tokenize"] for t in timings)
    for phase in ("queue", "forward", "post"):
        call.timing.ms[phase] += last.ms[phase]
    return {"results": results}


def routes() -> list[web.RouteDef]:
    return [web.post("/v1/bundle", create_bundle)]


__all__ = ["SURFACES", "DecisionRequest", "routes"]
