"""The aiohttp application: routes under ``/api/v1``, auth, and the one place errors become responses."""

from __future__ import annotations

import asyncio
import json
import logging
from collections.abc import AsyncIterator, Awaitable, Callable
from typing import Any

import aiohttp
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
    "logs": "reading the logs failed",
    "exec": "opening the terminal session failed",
    "metrics": "reading the deployment failed",
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
            # The contract's error codes have no "method_not_allowed": the request itself is invalid.
            allowed = exc.headers.get("Allow", "")
            return web.json_response(
                {"error": "invalid_request", "message": f"method {request.method} not allowed; allowed: {allowed}"},
                status=405, headers={"Allow": allowed},
            )
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


async def deployment_logs(request: web.Request) -> web.StreamResponse:
    """GET /deployments/{id}/logs: plain text, streamed chunk by chunk; with follow, until either side ends.

    The client's disconnect is checked at least twice a second, so an abandoned follow releases the
    upstream (apiserver -> kubelet) stream at once, not at the next log line.
    """
    who = await _principal(request)
    follow = request.query.get("follow", "").lower() in ("true", "1")
    tail = _int_param(request, "tailLines", 500)
    upstream = await request.app[SERVICE].open_logs(
        who,
        request.match_info["id"],
        request.query.get("pod") or None,
        request.query.get("container") or None,
        follow,
        tail if tail > 0 else 500,
    )
    resp = web.StreamResponse(headers={"Content-Type": "text/plain; charset=utf-8", "X-Accel-Buffering": "no"})
    try:
        await resp.prepare(request)
        while True:
            try:
                chunk = await asyncio.wait_for(upstream.content.readany(), 0.5)
            except TimeoutError:
                if request.transport is None or request.transport.is_closing():
                    break
                continue
            if not chunk:
                await resp.write_eof()
                break
            await resp.write(chunk)
    except (ConnectionResetError, aiohttp.ClientError):
        pass  # the client or the upstream went away: nothing more to send either way
    finally:
        upstream.close()
    return resp


async def deployment_exec(request: web.Request) -> web.WebSocketResponse:
    """GET /deployments/{id}/exec: a browser terminal bridged to the pod's exec subresource.

    Errors before the upgrade are ordinary JSON errors. Client frames are JSON ``input``/``resize``;
    terminal output goes out as text frames; when the session ends, one text frame gives the reason and
    a normal close follows. Whichever side hangs up, the other is closed too.
    """
    who = await _principal(request)
    upstream = await request.app[SERVICE].open_exec(
        who, request.match_info["id"], request.query.get("pod") or None, request.query.get("container") or None
    )
    ws = web.WebSocketResponse(heartbeat=30)
    try:
        await ws.prepare(request)
    except BaseException:
        await upstream.close()
        raise
    reason = await _bridge(ws, upstream)
    if not ws.closed:
        await ws.send_str(reason)
        await ws.close()
    return ws


async def _bridge(ws: web.WebSocketResponse, upstream: aiohttp.ClientWebSocketResponse) -> str:
    """Pump both directions until one side ends; returns why the session ended."""
    ended: dict[str, str] = {}

    async def from_client() -> None:
        async for msg in ws:
            if msg.type != aiohttp.WSMsgType.TEXT:
                continue
            try:
                frame = json.loads(msg.data)
            except ValueError:
                continue
            if not isinstance(frame, dict):
                continue
            if frame.get("type") == "input" and isinstance(frame.get("data"), str):
                await upstream.send_bytes(b"\x00" + frame["data"].encode())
            elif frame.get("type") == "resize" and isinstance(frame.get("cols"), int) and isinstance(
                frame.get("rows"), int
            ):
                size = {"Width": frame["cols"], "Height": frame["rows"]}
                await upstream.send_bytes(b"\x04" + json.dumps(size).encode())
        ended.setdefault("reason", "session closed by the client")

    async def from_pod() -> None:
        async for msg in upstream:
            if msg.type != aiohttp.WSMsgType.BINARY or not msg.data:
                continue
            channel, data = msg.data[0], msg.data[1:]
            if channel in (1, 2) and data:
                await ws.send_str(data.decode("utf-8", errors="replace"))
            elif channel == 3:
                ended["reason"] = _exit_reason(data)
        ended.setdefault("reason", "session ended")

    tasks = [asyncio.ensure_future(from_client()), asyncio.ensure_future(from_pod())]
    try:
        await asyncio.wait(tasks, return_when=asyncio.FIRST_COMPLETED)
    finally:
        for task in tasks:
            task.cancel()
        await asyncio.gather(*tasks, return_exceptions=True)
        await upstream.close()
    return ended.get("reason", "session ended")


def _exit_reason(data: bytes) -> str:
    """The end-of-session line from the exec Status on channel 3."""
    try:
        status = json.loads(data)
    except ValueError:
        return "session ended"
    if status.get("status") == "Success":
        return "session ended: exit code 0"
    causes = (status.get("details") or {}).get("causes") or []
    code = next((c.get("message") for c in causes if c.get("reason") == "ExitCode"), None)
    if code is not None:
        return f"session ended: exit code {code}"
    return f"session ended: {status.get('message') or status.get('reason') or 'failure'}"


async def deployment_metrics(request: web.Request) -> web.Response:
    """GET /deployments/{id}/metrics?range=5m|15m|1h|3h&runtime=vllm."""
    who = await _principal(request)
    body = await request.app[SERVICE].metrics(
        who, request.match_info["id"], request.query.get("range"), request.query.get("runtime")
    )
    return web.json_response(body)


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
            await kube.aclose()
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
    r.add_get(f"{PREFIX}/deployments/{{id}}/logs", deployment_logs, name="logs")
    r.add_get(f"{PREFIX}/deployments/{{id}}/exec", deployment_exec, name="exec")
    r.add_get(f"{PREFIX}/deployments/{{id}}/metrics", deployment_metrics, name="metrics")
    return app
