"""The aiohttp application: routes, JSON 404/405, start-up and graceful shutdown."""

from __future__ import annotations

import logging
from collections.abc import Awaitable, Callable

from aiohttp import web

from .cards import discover
from .errors import ApiError
from .lifecycle import Lifecycle
from .metrics import Metrics
from .runtime import Runtime
from .settings import Settings
from .surfaces import bundle, classify, decisions, embeddings, info, rerank, systemone
from .surfaces.common import RUNTIME_KEY, error_response
from .triton import Engine

LIFECYCLE_KEY = web.AppKey("lifecycle", Lifecycle)
log = logging.getLogger("sr_gateway.http")


@web.middleware
async def json_errors(request: web.Request,
                      handler: Callable[[web.Request], Awaitable[web.StreamResponse]]) -> web.StreamResponse:
    """Every error of every route answers in the API's JSON format, never aiohttp's HTML page: unknown paths
    (404), wrong methods (405, with the methods the path allows in `Allow`, RFC 9110), and a crash in any handler
    (500; the surfaces render their own errors with Server-Timing before this)."""
    try:
        return await handler(request)
    except web.HTTPMethodNotAllowed as exc:
        allowed = ", ".join(sorted(exc.allowed_methods))
        response = error_response(ApiError("invalid_request", f"method {request.method} not allowed on "
                                                              f"{request.path}; allowed: {allowed}", status=405))
        response.headers["Allow"] = allowed
        return response
    except web.HTTPNotFound:
        return error_response(ApiError("invalid_request", f"no route {request.path}", status=404))
    except web.HTTPException:
        raise
    except Exception:
        log.exception("unhandled error on %s %s", request.method, request.path)
        return error_response(ApiError("internal_error", "internal error; see the gateway log"))


def create_app(settings: Settings, *, engine: Engine | None = None, start_models: bool = True) -> web.Application:
    """The gateway over `engine`, or (None) over Triton as the settings say: a child tritonserver, or the one at
    --triton-url. A given engine (the fast tests' fake) sits behind the same `Inference` (row packing,
    coalescing) as Triton; no child process, no gRPC. `start_models`: load, warm and check every model through
    the lifecycle at start-up, and stop it at shutdown; without it the caller sets the models' statuses."""
    cards = discover(settings.model_repository, settings.model_ids or None)
    runtime = Runtime(settings, cards, Metrics(), engine)
    app = web.Application(middlewares=[json_errors], client_max_size=settings.max_request_bytes + 1)
    app[RUNTIME_KEY] = runtime
    app.add_routes(info.routes() + embeddings.routes() + classify.routes() + rerank.routes()
                   + decisions.routes() + systemone.routes(settings.systemone_schema) + bundle.routes())
    if start_models:
        lifecycle = Lifecycle(runtime)
        app[LIFECYCLE_KEY] = lifecycle

        async def startup(_: web.Application) -> None:
            await lifecycle.start()

        async def draining(_: web.Application) -> None:
            runtime.draining = True  # /health turns 503 while in-flight requests finish

        async def shutdown(_: web.Application) -> None:
            await lifecycle.stop()

        app.on_startup.append(startup)
        app.on_shutdown.append(draining)
        app.on_cleanup.append(shutdown)
    return app
