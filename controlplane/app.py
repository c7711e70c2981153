"""The aiohttp application: routes under ``/api/v1``, auth, and the one place errors become responses."""

from __future__ import annotations

import asyncio
import codecs
import json
import logging
import time
import uuid
from collections.abc import AsyncIterator, Awaitable, Callable
from pathlib import Path
from typing import Any

import aiohttp
from aiohttp import web
from prometheus_client import CONTENT_TYPE_LATEST, generate_latest
from sqlalchemy.ext.asyncio import AsyncEngine

from controlplane.auth import TOKEN_HEADER, KeystoneAuth, Principal
from controlplane.config import Settings
from controlplane.db import make_engine, migrate, ping
from controlplane.errors import ApiError, invalid_request, too_many_requests
from controlplane.kube import KubeBackend
from controlplane.reconciler import Reconciler
from controlplane.service import DeploymentService
from controlplane.telemetry import REQUEST_ID, Telemetry, audit

log = logging.getLogger(__name__)
PREFIX = "/api/v1"
SERVICE = web.AppKey("service", DeploymentService)
AUTH = web.AppKey("auth", KeystoneAuth)
SETTINGS = web.AppKey("settings", Settings)
TELEMETRY = web.AppKey("telemetry", Telemetry)
ENGINE = web.AppKey("engine", AsyncEngine)
KUBE = web.AppKey("kube", KubeBackend)
RECONCILER = web.AppKey("reconciler", Reconciler)
OPENAPI_FILE = Path(__file__).with_name("openapi.yaml")
PRINCIPAL = web.RequestKey("principal", Principal)
CREATED_ID = web.RequestKey("created_id", str)
REQUEST_ID_HEADER = "X-Request-Id"
# Writes that leave an audit line (exec sessions log their own, at open and at close).
AUDITED = frozenset({"create", "update", "stop", "start", "delete"})

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
    return web.json_response(err.body(), status=err.status, headers=err.headers)


READY_CHECK_TIMEOUT_S = 5.0
"""Each readiness check's own bound; the orchestrator's probe timeout must be longer (k8s/base)."""

MAX_JSON_DEPTH = 32
"""Deepest JSON nesting a request body may have (the deepest valid deployment body is 4 levels)."""


class SessionLimiter:
    """Concurrent long-lived sessions (terminals, followed logs) per user in this replica: one user cannot
    hold the apiserver's and kubelets' streams for everyone. Beyond the cap: 429 with Retry-After."""

    def __init__(self, what: str, limit: int, retry_after_s: int) -> None:
        self._what, self._limit, self._retry = what, limit, retry_after_s
        self._open: dict[str, int] = {}

    def acquire(self, user_id: str) -> None:
        """Count one more session for ``user_id``; 429 when that would exceed the cap."""
        held = self._open.get(user_id, 0)
        if held >= self._limit:
            raise too_many_requests(f"at most {self._limit} open {self._what} per user; close one first",
                                    self._retry)
        self._open[user_id] = held + 1

    def release(self, user_id: str) -> None:
        """One session of ``user_id`` ended."""
        held = self._open.get(user_id, 0) - 1
        if held > 0:
            self._open[user_id] = held
        else:
            self._open.pop(user_id, None)


EXEC_SESSIONS = web.AppKey("exec_sessions", SessionLimiter)
LOG_FOLLOWS = web.AppKey("log_follows", SessionLimiter)


@web.middleware
async def context_middleware(request: web.Request, handler: Handler) -> web.StreamResponse:
    """Request id (taken from the caller or made here) on every log line and response, request metrics
    by route and status, and the audit line of every write."""
    rid = request.headers.get(REQUEST_ID_HEADER, "")[:64] or uuid.uuid4().hex
    token = REQUEST_ID.set(rid)
    started = time.perf_counter()
    status = 500
    try:
        resp = await handler(request)
        status = resp.status
        resp.headers[REQUEST_ID_HEADER] = rid
        return resp
    finally:
        route = request.match_info.route.name or ("unmatched" if request.match_info.http_exception else "other")
        tel = request.app[TELEMETRY]
        tel.requests.labels(route=route, method=request.method, status=str(status)).inc()
        tel.latency.labels(route=route, method=request.method).observe(time.perf_counter() - started)
        if route in AUDITED:
            dep_id = request.match_info.get("id") or request.get(CREATED_ID)
            audit(route, who=request.get(PRINCIPAL), deployment=dep_id, result=status)
        REQUEST_ID.reset(token)


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
        if exc.status == 413:
            return web.json_response(
                {"error": "invalid_request",
                 "message": f"request body too large; at most {request.app[SETTINGS].max_body_bytes} bytes"},
                status=413,
            )
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
    who = await request.app[AUTH].authenticate(request.headers.get(TOKEN_HEADER), request.remote)
    request[PRINCIPAL] = who  # for the audit line
    return who


async def _json_body(request: web.Request) -> Any:
    try:
        body = await request.json(loads=json.loads)
    except (ValueError, UnicodeDecodeError) as exc:
        raise invalid_request("request body must be valid JSON") from exc
    except RecursionError as exc:  # nesting deeper than the parser's stack
        raise invalid_request(f"request body is nested deeper than {MAX_JSON_DEPTH} levels") from exc
    if _depth(body) > MAX_JSON_DEPTH:
        raise invalid_request(f"request body is nested deeper than {MAX_JSON_DEPTH} levels")
    if _has_unstorable_text(body):
        raise invalid_request("strings must not contain NUL characters or unpaired surrogates")
    return body


def _depth(value: Any) -> int:
    """Nesting depth of a parsed JSON value, without recursion (a hostile body must not blow the stack)."""
    deepest, stack = 0, [(value, 1)]
    while stack:
        item, level = stack.pop()
        if isinstance(item, dict | list):
            deepest = max(deepest, level)
            if level <= MAX_JSON_DEPTH:
                stack.extend((v, level + 1) for v in (item.values() if isinstance(item, dict) else item))
    return deepest


def _has_unstorable_text(value: Any) -> bool:
    """NUL and lone surrogates are valid JSON but no database (or Kubernetes) stores them: refuse them at
    the door with 400 instead of failing deep inside with 500."""
    if isinstance(value, str):
        if "\x00" in value:
            return True
        try:
            value.encode("utf-8")
        except UnicodeEncodeError:
            return True
        return False
    if isinstance(value, dict):
        return any(_has_unstorable_text(k) or _has_unstorable_text(v) for k, v in value.items())
    if isinstance(value, list):
        return any(_has_unstorable_text(v) for v in value)
    return False


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
    created = await request.app[SERVICE].create(who, body)
    request[CREATED_ID] = str(created["id"])
    return web.json_response(created, status=201)


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
    follows = request.app[LOG_FOLLOWS]
    if follow:
        follows.acquire(who.user_id)
    try:
        upstream = await request.app[SERVICE].open_logs(
            who,
            request.match_info["id"],
            request.query.get("pod") or None,
            request.query.get("container") or None,
            follow,
            tail if tail > 0 else 500,
        )
    except BaseException:
        if follow:
            follows.release(who.user_id)
        raise
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
        if follow:
            follows.release(who.user_id)
    return resp


async def deployment_exec(request: web.Request) -> web.WebSocketResponse:
    """GET /deployments/{id}/exec: a browser terminal bridged to the pod's exec subresource.

    Errors before the upgrade are ordinary JSON errors. Client frames are JSON ``input``/``resize``;
    terminal output goes out as text frames; when the session ends, one text frame gives the reason and
    a normal close follows. Whichever side hangs up, the other is closed too.
    """
    who = await _principal(request)
    dep_id = request.match_info["id"]
    sessions = request.app[EXEC_SESSIONS]
    try:
        sessions.acquire(who.user_id)
    except ApiError as err:
        audit("exec", who=who, deployment=dep_id, result=err.status)
        raise
    try:
        return await _exec_session(request, who, dep_id)
    finally:
        sessions.release(who.user_id)


async def _exec_session(request: web.Request, who: Principal, dep_id: str) -> web.WebSocketResponse:
    """One terminal session, from opening the pod's exec stream to the final frame."""
    try:
        upstream = await request.app[SERVICE].open_exec(
            who, dep_id, request.query.get("pod") or None, request.query.get("container") or None
        )
    except ApiError as err:
        audit("exec", who=who, deployment=dep_id, result=err.status)
        raise
    ws = web.WebSocketResponse(heartbeat=30)
    try:
        await ws.prepare(request)
    except BaseException:
        await upstream.close()
        raise
    settings, tel = request.app[SETTINGS], request.app[TELEMETRY]
    audit("exec", who=who, deployment=dep_id, result="opened", pod=request.query.get("pod"))
    tel.exec_sessions.inc()
    try:
        reason = await _bridge(ws, upstream, _SessionLimits(
            idle_s=settings.exec_idle_timeout_s, total_s=settings.exec_max_session_s,
            recheck_s=settings.exec_token_recheck_s, auth=request.app[AUTH],
            token=request.headers.get(TOKEN_HEADER, ""),
        ))
    finally:
        tel.exec_sessions.dec()
    audit("exec", who=who, deployment=dep_id, result=reason)
    if not ws.closed:
        await ws.send_str(reason)
        await ws.close()
    return ws


class _SessionLimits:
    """Idle and total time limits of a terminal session, and how often its token is checked again."""

    def __init__(self, *, idle_s: float, total_s: float, recheck_s: float, auth: KeystoneAuth, token: str) -> None:
        self.idle_s, self.total_s, self.recheck_s = idle_s, total_s, recheck_s
        self.auth, self.token = auth, token
        self.started = self.last_activity = time.monotonic()

    def touch(self) -> None:
        self.last_activity = time.monotonic()

    async def watch(self) -> str:
        """Returns why the session must end, once it must."""
        next_check = self.started + self.recheck_s
        while True:
            now = time.monotonic()
            idle_end, total_end = self.last_activity + self.idle_s, self.started + self.total_s
            if now >= total_end:
                return f"session closed: time limit of {self.total_s:g} s reached"
            if now >= idle_end:
                return f"session closed: idle for {self.idle_s:g} s"
            if now >= next_check:
                if not await self.auth.still_valid(self.token):
                    return "session closed: the token is no longer valid"
                next_check = time.monotonic() + self.recheck_s
            await asyncio.sleep(max(0.05, min(idle_end, total_end, next_check) - time.monotonic()))


async def _bridge(
    ws: web.WebSocketResponse, upstream: aiohttp.ClientWebSocketResponse, limits: _SessionLimits
) -> str:
    """Pump both directions until one side ends or a limit is reached; returns why the session ended."""
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
            limits.touch()
            if frame.get("type") == "input" and isinstance(frame.get("data"), str):
                await upstream.send_bytes(b"\x00" + frame["data"].encode())
            elif frame.get("type") == "resize" and isinstance(frame.get("cols"), int) and isinstance(
                frame.get("rows"), int
            ):
                size = {"Width": frame["cols"], "Height": frame["rows"]}
                await upstream.send_bytes(b"\x04" + json.dumps(size).encode())
        ended.setdefault("reason", "session closed by the client")

    # One incremental decoder per output channel: a character whose UTF-8 bytes arrive in two frames is
    # sent whole, not as two replacement characters.
    decoders = {ch: codecs.getincrementaldecoder("utf-8")(errors="replace") for ch in (1, 2)}

    async def from_pod() -> None:
        async for msg in upstream:
            if msg.type != aiohttp.WSMsgType.BINARY or not msg.data:
                continue
            channel, data = msg.data[0], msg.data[1:]
            limits.touch()
            if channel in (1, 2) and data:
                text = decoders[channel].decode(data)
                if text:
                    await ws.send_str(text)
            elif channel == 3:
                ended["reason"] = _exit_reason(data)
        ended.setdefault("reason", "session ended")

    async def limit() -> None:
        ended["reason"] = await limits.watch()

    tasks = [asyncio.ensure_future(from_client()), asyncio.ensure_future(from_pod()), asyncio.ensure_future(limit())]
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


async def _only_get(request: web.Request) -> web.Response:
    """Other methods on a GET-only path: 405 with this path's own ``Allow``."""
    raise web.HTTPMethodNotAllowed(request.method, ["GET", "HEAD"])


async def healthz(_: web.Request) -> web.Response:
    """Liveness: the process serves requests (nothing external is asked)."""
    return web.json_response({"status": "ok"})


async def readyz(request: web.Request) -> web.Response:
    """Readiness: the catalog database answers. Keystone and the apiserver are reported (and exported as
    ``sr_cp_dependency_up``) but do not decide: when a shared dependency is down every replica would go
    unready at once, the load balancer would have nowhere to send requests, and callers would get connection
    errors instead of the API's clear 503/502 naming the dependency."""
    app = request.app
    checks: dict[str, str] = {}

    async def kubernetes() -> None:
        if KUBE in app:
            await app[KUBE].ping()

    probes = {"database": ping(app[ENGINE]), "kubernetes": kubernetes(), "keystone": app[AUTH].check()}
    results = await asyncio.gather(*(asyncio.wait_for(p, READY_CHECK_TIMEOUT_S) for p in probes.values()),
                                   return_exceptions=True)
    for name, result in zip(probes, results, strict=True):
        if isinstance(result, BaseException):
            checks[name] = f"error: {getattr(result, 'message', None) or type(result).__name__}"
        else:
            checks[name] = "ok" if name != "kubernetes" or KUBE in app else "not configured"
        if name != "database" and checks[name] != "not configured":
            app[TELEMETRY].dependency_up.labels(dependency=name).set(0 if checks[name].startswith("error") else 1)
    ready = checks["database"] == "ok"
    return web.json_response({"status": "ready" if ready else "not ready", "checks": checks},
                             status=200 if ready else 503)


async def metrics_endpoint(request: web.Request) -> web.Response:
    """Prometheus exposition of this service's own metrics."""
    return web.Response(body=generate_latest(request.app[TELEMETRY].registry),
                        headers={"Content-Type": CONTENT_TYPE_LATEST})


async def openapi_document(_: web.Request) -> web.Response:
    """The contract this service implements."""
    return web.Response(text=OPENAPI_FILE.read_text(), content_type="application/yaml")


def create_app(settings: Settings) -> web.Application:
    """Build the app; the database is migrated and clients are opened in the startup context."""
    app = web.Application(middlewares=[context_middleware, errors_middleware], client_max_size=settings.max_body_bytes)
    app[SETTINGS] = settings
    telemetry = app[TELEMETRY] = Telemetry()
    app[EXEC_SESSIONS] = SessionLimiter("terminal sessions", settings.max_exec_sessions_per_user,
                                        settings.session_retry_after_s)
    app[LOG_FOLLOWS] = SessionLimiter("followed log streams", settings.max_log_follows_per_user,
                                      settings.session_retry_after_s)

    async def lifecycle(app: web.Application) -> AsyncIterator[None]:
        engine = make_engine(settings.database_url)
        await migrate(engine)
        kube = KubeBackend(settings.kubeconfig, settings.kube_timeout_s, telemetry) if settings.kubeconfig else None
        auth = KeystoneAuth(settings.keystone_url, settings.token_cache_ttl_s, settings.role_permissions,
                            ca_file=settings.keystone_ca_file, timeout_s=settings.keystone_timeout_s,
                            telemetry=telemetry, cache_size=settings.token_cache_size,
                            global_read_project_id=settings.global_read_project_id,
                            invalid_limit=settings.invalid_token_limit,
                            invalid_window_s=settings.invalid_token_window_s)
        app[SERVICE] = DeploymentService(engine, kube, settings)
        app[AUTH] = auth
        app[ENGINE] = engine
        task: asyncio.Task[None] | None = None
        if kube is not None:
            app[KUBE] = kube
            if settings.reconcile_interval_s > 0:
                app[RECONCILER] = Reconciler(
                    engine, kube, telemetry, interval_s=settings.reconcile_interval_s,
                    lease_namespace=settings.reconcile_lease_namespace, lease_name=settings.reconcile_lease_name,
                    lease_duration_s=settings.reconcile_lease_duration_s,
                    lease_renew_s=settings.reconcile_lease_renew_s,
                    orphan_grace_s=settings.orphan_grace_s,
                )
                task = asyncio.create_task(app[RECONCILER].run())
        yield
        if task is not None:
            task.cancel()
            await asyncio.gather(task, return_exceptions=True)
        await auth.close()
        if kube is not None:
            await kube.aclose()
        await engine.dispose()

    app.cleanup_ctx.append(lifecycle)
    r = app.router
    r.add_get("/healthz", healthz, name="healthz")
    r.add_get("/readyz", readyz, name="readyz")
    r.add_get("/metrics", metrics_endpoint, name="metrics_endpoint")
    r.add_get("/openapi.yaml", openapi_document, name="openapi")
    r.add_get(f"{PREFIX}/deployments", list_deployments, name="list")
    r.add_post(f"{PREFIX}/deployments", create_deployment, name="create")
    schemas = r.add_resource(f"{PREFIX}/deployments/api-schemas", name="api_schemas")  # before {id}
    schemas.add_route("GET", api_schemas)
    schemas.add_route("HEAD", api_schemas)
    schemas.add_route("*", _only_get)  # else PATCH/DELETE would fall through to the {id} route
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
