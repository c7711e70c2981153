"""The aiohttp application: routes, JSON 404/405, start-up and graceful shutdown."""

from __future__ import annotations

from collections.abc import Awaitable, Callable

from aiohttp import web

from .cards import discover
from .decisions import surface as decisions
from .decisions import systemone
from .errors import ApiError
from .lifecycle import Lifecycle
from .metrics import Metrics
from .runtime import Runtime
from .settings import Settings
from .surfaces import bundle, classify, embeddings, info, rerank
from .surfaces.common import RUNTIME_KEY, error_response

LIFECYCLE_KEY = web.AppKey("lifecycle", Lifecycle)


@web.middleware
async def json_errors(request: web.Request,
                      handler: Callable[[web.Request], Awaitable[web.StreamResponse]]) -> web.StreamResponse:
    """Unknown paths and wrong methods answer in the API's error format, not aiohttp's HTML."""
    try:
        return await handler(request)
    except web.HTTPMethodNotAllowed:
        return error_response(ApiError("invalid_request", "method not allowed", status=405))
    except web.HTTPNotFound:
        return error_response(ApiError("invalid_request", f"no route {request.path}", status=404))


def create_app(settings: Settings, *, start_models: bool = True) -> web.Application:
    cards = discover(settings.model_repository, settings.model_ids or None)
    runtime = Runtime(settings, cards, Metrics())
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
