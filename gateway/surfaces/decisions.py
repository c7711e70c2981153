"""POST /v1/decisions — every question answered in place: a failed question carries its own error."""

from __future__ import annotations

from typing import Any

from aiohttp import web

from ..decisions.request import DecisionRequest, parse_request
from ..decisions.response import render_decisions
from ..decisions.running import answer
from ..runtime import Runtime, ServedModel
from .common import Call, surface


async def decide(runtime: Runtime, model: ServedModel, req: DecisionRequest, call: Call | None = None
                 ) -> dict[str, Any]:
    """The surface's work, shared by the HTTP handler, bundles and the readiness (golden) check."""
    answered = await answer(runtime, model, req, call.timing if call is not None else None,
                            parts=call.parts if call is not None else None)
    return render_decisions(answered, req.options.return_meta)


@surface("decisions")
async def create_decisions(call: Call) -> dict[str, Any]:
    import time

    mark = time.perf_counter()
    call.timing.begin("tokenize")
    req = parse_request(call.body)
    model = call.runtime.resolve(req.model, "decisions")
    call.timing.add("tokenize", mark)
    return await decide(call.runtime, model, req, call)


def routes() -> list[web.RouteDef]:
    return [web.post("/v1/decisions", create_decisions)]
