"""What every POST surface shares over HTTP: body reading, Server-Timing, metrics, serialization.

What is not HTTP (request parsing, limits, `meta`, running inputs) lives in `gateway/execution/`.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from typing import Any

import orjson
from aiohttp import web
from pydantic import BaseModel

from ..assets import inline_input_assets
from ..body import read_body
from ..errors import ApiError
from ..execution.requests import parse
from ..runtime import Runtime, ServedModel
from ..timing import Timing

log = logging.getLogger("sr_gateway.http")

RUNTIME_KEY = web.AppKey("runtime", Runtime)
JSON = "application/json"
DUMPS_OPTIONS = orjson.OPT_SERIALIZE_NUMPY  # float32 vectors serialise as shortest float32 text


@dataclass
class Call:
    request: web.Request
    runtime: Runtime
    timing: Timing
    body: Any = None
    parts: dict[str, bytes] | None = None  # image parts of a multipart body, by name (None: a JSON body)


Handler = Callable[[Call], Awaitable[dict[str, Any]]]


def json_response(payload: Any, status: int = 200, headers: dict[str, str] | None = None) -> web.Response:
    return web.Response(body=orjson.dumps(payload), status=status, content_type=JSON, headers=headers)


def error_response(error: ApiError) -> web.Response:
    return json_response(error.body(), error.status, error.headers())


def surface(endpoint: str, render: Callable[[ApiError], ApiError] | None = None,
            ) -> Callable[[Handler], Callable[[web.Request], Awaitable[web.Response]]]:
    """Wrap a surface: every response, errors included, carries Server-Timing and is counted. `render` turns
    every error of the surface (body errors included) into its own shape (System One's schemas)."""

    def decorate(fn: Handler) -> Callable[[web.Request], Awaitable[web.Response]]:
        async def handler(request: web.Request) -> web.Response:
            runtime = request.app[RUNTIME_KEY]
            call = Call(request, runtime, Timing())
            status = 200
            try:
                mark = time.perf_counter()
                call.timing.begin("parse")
                body = await read_body(request, runtime.settings.max_request_bytes)
                call.body, call.parts = body.json, body.parts
                call.timing.add("parse", mark)
                result = await fn(call)
                mark = time.perf_counter()
                payload = orjson.dumps(result, option=DUMPS_OPTIONS)
                call.timing.add("serialize", mark)
                error: ApiError | None = None
            except ApiError as exc:
                call.timing.settle()  # a body or validation error's time shows in parse / tokenize
                error = render(exc) if render is not None else exc
                status = error.status
            except asyncio.CancelledError:
                call.timing.finish()
                log.info("%s: the client went away after %.1f ms; its work was cancelled (499)", endpoint,
                         call.timing.total_ms or 0.0)
                runtime.metrics.observe_request(endpoint, 499, call.timing)  # client went away (nginx's 499)
                raise
            except Exception:
                log.exception("unhandled error on %s", endpoint)
                error = ApiError("internal_error", "internal error; see the gateway log")
                error = render(error) if render is not None else error
                status = error.status
            if error is not None:
                mark = time.perf_counter()
                payload = orjson.dumps(error.body())
                call.timing.add("serialize", mark)
            call.timing.finish()
            runtime.metrics.observe_request(endpoint, status, call.timing)
            headers = {"Server-Timing": call.timing.header(), **(error.headers() if error is not None else {})}
            return web.Response(body=payload, status=status, content_type=JSON, headers=headers)

        handler.__name__ = fn.__name__
        handler.__doc__ = fn.__doc__
        return handler

    return decorate


Work = Callable[[Runtime, ServedModel, Any, "Call | None"], Awaitable[dict[str, Any]]]


def surface_route(path: str, endpoint: str, request: type[BaseModel], work: Work) -> web.RouteDef:
    """POST route of a surface: parse the request, resolve its model for this surface, then do the work (which
    the readiness check and future bundles call directly, without HTTP)."""

    @surface(endpoint)
    async def handler(call: Call) -> dict[str, Any]:
        mark = time.perf_counter()
        call.timing.begin("tokenize")
        if call.parts and endpoint not in ("embeddings", "classify"):
            raise ApiError("invalid_request", f"{request.__name__} reads no images: send a JSON body")
        body = await inline_input_assets(call.body, call.parts) if endpoint in ("embeddings", "classify") \
            else call.body
        req = parse(request, body)
        model = call.runtime.resolve(getattr(req, "model", None), endpoint)
        call.timing.add("tokenize", mark)
        return await work(call.runtime, model, req, call)

    handler.__name__ = f"create_{endpoint}"
    return web.post(path, handler)
