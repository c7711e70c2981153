"""The service as operators see it: /healthz, /readyz, /metrics, /openapi.yaml, request ids, JSON logs and
the audit trail, terminal session limits, and settings rejected at start with their name."""

from __future__ import annotations

import argparse
import asyncio
import io
import json
import logging
import os
import socket
import ssl
import subprocess
import sys
import uuid
from collections.abc import AsyncIterator, Iterator
from contextlib import asynccontextmanager, contextmanager
from dataclasses import replace
from pathlib import Path
from typing import Any

import aiohttp
import pytest
from prometheus_client.parser import text_string_to_metric_families

from controlplane.config import Settings
from controlplane.telemetry import JsonFormatter, RequestIdFilter
from tests.controlplane.conftest import Api, Cluster, Keystone, Project, make_client, settings_for, vllm
from tests.controlplane.test_exec import read_until

pytestmark = pytest.mark.asyncio
KIND = "LLMInferenceService"
OPENAPI_FILE = Path(__file__).parents[2] / "controlplane" / "openapi.yaml"


def _dead_url() -> str:
    with socket.socket() as s:  # a port nothing listens on
        s.bind(("127.0.0.1", 0))
        return f"http://127.0.0.1:{s.getsockname()[1]}/v3"


@contextmanager
def json_log() -> Iterator[io.StringIO]:
    """What the service logs during the block, formatted as ``log_format=json`` formats it."""
    out = io.StringIO()
    handler = logging.StreamHandler(out)
    handler.addFilter(RequestIdFilter())
    handler.setFormatter(JsonFormatter())
    root = logging.getLogger()
    old_level = root.level
    root.addHandler(handler)
    root.setLevel(logging.INFO)
    try:
        yield out
    finally:
        root.removeHandler(handler)
        root.setLevel(old_level)


async def _client(env: dict[str, str], db: str, **changes: Any) -> AsyncIterator[Api]:
    tc = await make_client(replace(settings_for(env, db), **changes))
    try:
        yield Api(tc)
    finally:
        await tc.close()


async def test_healthz_and_the_served_openapi_document(api: Api) -> None:
    async with api.http.get("/healthz") as resp:
        assert resp.status == 200 and await resp.json() == {"status": "ok"}
    async with api.http.get("/openapi.yaml") as resp:
        assert resp.status == 200 and await resp.text() == OPENAPI_FILE.read_text()


async def test_readyz_reports_each_dependency_but_only_the_database_decides(
    api: Api, api_nokube: Api, env: dict[str, str], catalog_db: str
) -> None:
    async with api.http.get("/readyz") as resp:
        assert resp.status == 200
        assert await resp.json() == {"status": "ready", "checks": {
            "database": "ok", "kubernetes": "ok", "keystone": "ok"}}
    async with api_nokube.http.get("/readyz") as resp:
        assert resp.status == 200 and (await resp.json())["checks"]["kubernetes"] == "not configured"
    async for dead in _client(env, catalog_db, keystone_url=_dead_url()):
        async with dead.http.get("/readyz") as resp:  # a shared dependency down: every replica would go
            body = await resp.json()                   # unready at once, so it is reported, not decisive
            assert resp.status == 200 and body["status"] == "ready"
            assert body["checks"]["keystone"].startswith("error:") and body["checks"]["database"] == "ok"
        async with dead.http.get("/metrics") as resp:
            assert 'sr_cp_dependency_up{dependency="keystone"} 0.0' in await resp.text()
    async with api.http.get("/metrics") as resp:
        assert 'sr_cp_dependency_up{dependency="keystone"} 1.0' in await resp.text()



async def test_metrics_count_requests_by_route_and_status_and_time_kubernetes_and_keystone_calls(
    env: dict[str, str], catalog_db: str, project: Project
) -> None:
    async for api in _client(env, catalog_db):
        await api.create(project.member, **vllm())
        await api.call("GET", "/deployments", project.member, expect=200)
        await api.call("GET", "/deployments/{id}", project.member, expect=404, id="deployment-none")
        async with api.http.get("/metrics") as resp:
            assert resp.status == 200
            samples = {(s.name, tuple(sorted(s.labels.items()))): s.value
                       for f in text_string_to_metric_families(await resp.text()) for s in f.samples}
        assert samples[("sr_cp_http_requests_total",
                        (("method", "GET"), ("route", "list"), ("status", "200")))] == 1
        assert samples[("sr_cp_http_requests_total",
                        (("method", "GET"), ("route", "get"), ("status", "404")))] == 1
        assert samples[("sr_cp_http_requests_total",
                        (("method", "POST"), ("route", "create"), ("status", "201")))] == 1
        assert samples[("sr_cp_http_request_seconds_count", (("method", "GET"), ("route", "list")))] == 1
        assert samples[("sr_cp_kubernetes_call_seconds_count",
                        (("action", "create LLMInferenceService"), ("outcome", "ok")))] == 1
        assert samples[("sr_cp_keystone_call_seconds_count", (("outcome", "valid"),))] >= 1


async def test_every_write_leaves_one_audit_line_with_who_project_what_and_result_under_its_request_id(
    api: Api, project: Project
) -> None:
    rid = uuid.uuid4().hex
    with json_log() as out:
        async with api.http.post("/api/v1/deployments", json=vllm("audited"),
                                 headers={"x-keystone-token": project.member, "X-Request-Id": rid}) as resp:
            assert resp.status == 201 and resp.headers["X-Request-Id"] == rid
            created = await resp.json()
        await api.call("PATCH", "/deployments/{id}", project.reader, json={"replicas": 2}, expect=403,
                       id=created["id"])
        await api.call("DELETE", "/deployments/{id}", project.member, expect=204, id=created["id"])
    lines = [json.loads(x) for x in out.getvalue().splitlines()]
    audits = [x for x in lines if x.get("audit")]
    assert [(a["action"], a["result"], a["deployment_id"]) for a in audits] == [
        ("create", 201, created["id"]), ("update", 403, created["id"]), ("delete", 204, created["id"])]
    assert all(a["project_id"] == project.id and a["user_id"] for a in audits)
    assert audits[0]["request_id"] == rid and audits[0]["user_id"] == project.member_user_id
    assert audits[1]["request_id"] not in (rid, "-")  # made up by the service when the caller sent none


async def _shell(
    api: Api, cluster: Cluster, project: Project, name: str, token: str
) -> aiohttp.ClientWebSocketResponse:
    d = await api.create(project.member, **vllm(name))
    await cluster.add_pod(KIND, project.ns, name)
    ws = await api.http.ws_connect(f"/api/v1/deployments/{d['id']}/exec", headers={"x-keystone-token": token})
    await ws.send_json({"type": "input", "data": "echo up\n"})
    await read_until(ws, "up")
    return ws


async def _closed_normally(ws: aiohttp.ClientWebSocketResponse) -> None:
    msg = await asyncio.wait_for(ws.receive(), 10)
    assert msg.type == aiohttp.WSMsgType.CLOSE and msg.data == aiohttp.WSCloseCode.OK
    await ws.close()


async def test_an_idle_terminal_session_is_closed_with_the_reason_and_audited(
    env: dict[str, str], catalog_db: str, project: Project, cluster: Cluster
) -> None:
    async for api in _client(env, catalog_db, exec_idle_timeout_s=1.0):
        with json_log() as out:
            ws = await _shell(api, cluster, project, "idler", project.member)
            assert "session closed: idle for 1 s" in await read_until(ws, "session closed")
            await _closed_normally(ws)
        audits = [x for x in map(json.loads, out.getvalue().splitlines()) if x.get("action") == "exec"]
        assert [a["result"] for a in audits] == ["opened", "session closed: idle for 1 s"]


async def test_a_busy_terminal_session_still_ends_at_the_total_time_limit(
    env: dict[str, str], catalog_db: str, project: Project, cluster: Cluster
) -> None:
    async for api in _client(env, catalog_db, exec_idle_timeout_s=30.0, exec_max_session_s=2.0):
        ws = await _shell(api, cluster, project, "busy", project.member)
        seen = ""
        while "session closed" not in seen:
            await ws.send_json({"type": "input", "data": "echo tick\n"})
            msg = await asyncio.wait_for(ws.receive(), 10)
            assert msg.type == aiohttp.WSMsgType.TEXT, msg
            seen += msg.data
        assert "session closed: time limit of 2 s reached" in seen
        await _closed_normally(ws)


async def test_a_terminal_session_ends_when_its_token_is_revoked(
    env: dict[str, str], catalog_db: str, project: Project, cluster: Cluster, keystone: Keystone
) -> None:
    _, user, password = keystone.shared["member"]
    token = await keystone.token(user, password, project_id=project.id)
    async for api in _client(env, catalog_db, exec_token_recheck_s=0.5, token_cache_ttl_s=60.0):
        ws = await _shell(api, cluster, project, "revoked", token)
        await keystone.revoke(token)
        assert "session closed: the token is no longer valid" in await read_until(ws, "session closed")
        await _closed_normally(ws)


@pytest.mark.parametrize(("variable", "value", "setting"), [
    ("SR_CP_KUBE_TIMEOUT_S", "soon", "kube_timeout_s"),
    ("SR_CP_ARCHITECTURE", "riscv", "architecture"),
    ("SR_CP_PROMETHEUS_URL", "prometheus:9090", "prometheus_url"),
    ("SR_CP_KEYSTONE_CA_FILE", "/nonexistent/ca.pem", "keystone_ca_file"),
    ("SR_CP_ROLE_PERMISSIONS", '{"member": "deployment:read"}', "role_permissions"),
])
async def test_an_invalid_setting_stops_the_start_naming_the_setting(variable: str, value: str, setting: str) -> None:
    env = {**os.environ, variable: value}
    out = await asyncio.to_thread(subprocess.run, [sys.executable, "-m", "controlplane.cli", "serve", "--port", "0"],
                                  env=env, capture_output=True, text=True, timeout=60, check=False)
    assert out.returncode == 2 and f"{setting} ({variable})" in out.stderr, out.stderr


async def test_every_setting_has_an_env_twin_and_a_serve_flag() -> None:
    env = {Settings.env_name("kube_timeout_s"): "7", Settings.env_name("exec_idle_timeout_s"): "12"}
    assert Settings.resolve(None, env).kube_timeout_s == 7.0
    parser = argparse.ArgumentParser()
    Settings.add_arguments(parser)
    args = parser.parse_args(["--exec-idle-timeout-s", "5"])
    assert Settings.resolve(args, env).exec_idle_timeout_s == 5.0  # flag > environment


@asynccontextmanager
async def tls_in_front_of(upstream: str) -> AsyncIterator[str]:
    """A TLS endpoint (the test CA's certificate for 127.0.0.1) forwarding to a plain HTTP service; its URL."""
    certs = Path(os.environ["SR_TESTENV_DIR"]) / "certs"
    ctx = ssl.create_default_context(ssl.Purpose.CLIENT_AUTH)
    ctx.load_cert_chain(certs / "server.crt", certs / "server.key")
    host, port = upstream.split("//", 1)[1].split("/", 1)[0].split(":")

    async def pipe(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        try:
            while data := await reader.read(65536):
                writer.write(data)
                await writer.drain()
        except (ConnectionError, ssl.SSLError):
            pass
        finally:
            writer.close()

    async def handle(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        up_reader, up_writer = await asyncio.open_connection(host, int(port))
        await asyncio.gather(pipe(reader, up_writer), pipe(up_reader, writer))

    server = await asyncio.start_server(handle, "127.0.0.1", 0, ssl=ctx)
    path = "/" + upstream.split("//", 1)[1].split("/", 1)[1]
    try:
        yield f"https://127.0.0.1:{server.sockets[0].getsockname()[1]}{path}"
    finally:
        server.close()


async def test_keystone_over_tls_is_trusted_only_with_its_ca_configured(
    env: dict[str, str], catalog_db: str, shared_project: Project
) -> None:
    ca = str(Path(os.environ["SR_TESTENV_DIR"]) / "certs" / "ca.crt")
    async with tls_in_front_of(env["SR_TEST_KEYSTONE_URL"]) as url:
        async for api in _client(env, catalog_db, keystone_url=url, keystone_ca_file=ca):
            await api.call("GET", "/deployments", shared_project.member, expect=200)
        async for api in _client(env, catalog_db, keystone_url=url):  # system CAs do not know the test CA
            _, err = await api.call("GET", "/deployments", shared_project.member, expect=503)
            assert err["error"] == "unavailable" and "Keystone" in err["message"]
