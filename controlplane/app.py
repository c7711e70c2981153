"""The aiohttp application: routes under ``/api/v1``, auth, and the one place errors become responses."""

from __future__ import annotations

import json
import logging
from collections.abc import AsyncIterator, Awaitable, Callable
from typing import Any

from aiohttp import web

from controlplane.auth import TOKEN_HEADER, KeystoneAuth, Principal
from controlplane.config import Settings
from controlplane.db import make_engine, migrate
from controlplane.errors import ApiError, invalid_request
from controlplane.kube import KubeBackend
from controlplane.service import DeploymentService

log = logging.getLogger(__name__)
PREFIX = "/api/v1"
SERVICE = web.AppKey("service", DeploymentService)
AUTH = web.AppKey("auth", KeystoneAuth)
SETTINGS = web.AppKey("settings", Settings)

Handler = Callable[[web.Request], Awaitable[web.StreamResponse]]

# What the 500 message says for each operation (the spec names the failed operation, nothing more).
_FAILURE = {
    "list": "listing deployments failed",
    "create": "creating the deployment failed",
    "get": "reading the deployment failed",
    "update": "updating the deployment failed",
    "stop": "stopping the deployment failed",
    "start": "starting the deployment failed",
    "delete": "deleting the deployment failed",
    "pods": "listing the deployment's pods failed",
    "api_schemas": "listing deployments failed",
}


def _error(err: ApiError) -> web.Response:
    return web.json_response(err.body(), status=err.status)


@web.middleware
async def errors_middleware(request: web.Request, handler: Handler) -> web.StreamResponse:
    """Every failure leaves as ``{"error", "message"}``; unexpected ones as 500 without internals."""
    try:
        return await handler(request)
    except ApiError as err:
        return _error(err)
    except web.HTTPException as exc:
        if exc.status == 404:
            return web.json_response({"error": "not_found", "message": "no such endpoint"}, status=404)
        if exc.status == 405:
            return web.json_response({"error": "method_not_allowed", "message": exc.reason}, status=405)
        raise
    except Exception:
        op = request.match_info.route.name or ""
        log.exception("unhandled error in %s %s", request.method, request.path)
        return web.json_response(
            {"error": "internal_error", "message": _FAILURE.get(op, "request failed")}, status=500
        )


async def _principal(request: web.Request) -> Principal:
    return await request.app[AUTH].authenticate(request.headers.get(TOKEN_HEADER))


async def _json_body(request: web.Request) -> Any:
    try:
        return await request.json(loads=json.loads)
    except (ValueError, UnicodeDecodeError) as exc:
        raise invalid_request("request body must be valid JSON") from exc


def _int_param(request: web.Request, key: str, default: int) -> int:
    raw = request.query.get(key)
    try:
        return int(raw) if raw is not None else default
    except ValueError:
        return default


async def list_deployments(request: web.Request) -> web.Response:
    """GET /deployments: page < 1 -> 1; page_size capped at 200; 0 or absent -> everything."""
    who = await _principal(request)
    page = max(1, _int_param(request, "page", 1))
    page_size = min(200, max(0, _int_param(request, "page_size", 0)))
    return web.json_response(await request.app[SERVICE].list_page(who, page, page_size))


async def api_schemas(request: web.Request) -> web.Response:
    """GET /deployments/api-schemas."""
    who = await _principal(request)
    return web.json_response(await request.app[SERVICE].api_schemas(who))


async def create_deployment(request: web.Request) -> web.Response:
    """POST /deployments."""
    who = await _principal(request)
    body = await _json_body(request)
    return web.json_response(await request.app[SERVICE].create(who, body), status=201)


async def get_deployment(request: web.Request) -> web.Response:
    """GET /deployments/{id}."""
    who = await _principal(request)
    return web.json_response(await request.app[SERVICE].get(who, request.match_info["id"]))


async def update_deployment(request: web.Request) -> web.Response:
    """PATCH /deployments/{id}."""
    who = await _principal(request)
    body = await _json_body(request)
    return web.json_response(await request.app[SERVICE].update(who, request.match_info["id"], body))


async def stop_deployment(request: web.Request) -> web.Response:
    """POST /deployments/{id}/stop."""
    who = await _principal(request)
    return web.json_response(await request.app[SERVICE].set_stopped(who, request.match_info["id"], True))


async def start_deployment(request: web.Request) -> web.Response:
    """POST /deployments/{id}/start."""
    who = await _principal(request)
    return web.json_response(await request.app[SERVICE].set_stopped(who, request.match_info["id"], False))


async def deployment_pods(request: web.Request) -> web.Response:
    """GET /deployments/{id}/pods."""
    who = await _principal(request)
    return web.json_response(await request.app[SERVICE].pods(who, request.match_info["id"]))


async def delete_deployment(request: web.Request) -> web.Response:
    """DELETE /deployments/{id}: 204 with no body."""
    who = await _principal(request)
    await request.app[SERVICE].delete(who, request.match_info["id"])
    return web.Response(status=204)


def create_app(settings: Settings) -> web.Application:
    """Build the app; the database is migrated and clients are opened in the startup context."""
    app = web.Application(middlewares=[errors_middleware])
    app[SETTINGS] = settings

    async def lifecycle(app: web.Application) -> AsyncIterator[None]:
        engine = make_engine(settings.database_url)
        await migrate(engine)
        kube = KubeBackend(settings.kubeconfig, settings.kube_timeout_s) if settings.kubeconfig else None
        auth = KeystoneAuth(settings.keystone_url, settings.token_cache_ttl_s, settings.role_permissions)
        app[SERVICE] = DeploymentService(engine, kube, settings)
        app[AUTH] = auth
        yield
        await auth.close()
        if kube is not None:
            kube.close()
        await engine.dispose()

    app.cleanup_ctx.append(lifecycle)
    r = app.router
    r.add_get(f"{PREFIX}/deployments", list_deployments, name="list")
    r.add_post(f"{PREFIX}/deployments", create_deployment, name="create")
    r.add_get(f"{PREFIX}/deployments/api-schemas", api_schemas, name="api_schemas")  # before {id}
    r.add_get(f"{PREFIX}/deployments/{{id}}", get_deployment, name="get")
    r.add_patch(f"{PREFIX}/deployments/{{id}}", update_deployment, name="update")
    r.add_post(f"{PREFIX}/deployments/{{id}}/stop", stop_deployment, name="stop")
    r.add_post(f"{PREFIX}/deployments/{{id}}/start", start_deployment, name="start")
    r.add_delete(f"{PREFIX}/deployments/{{id}}", delete_deployment, name="delete")
    r.add_get(f"{PREFIX}/deployments/{{id}}/pods", deployment_pods, name="pods")
    return app
