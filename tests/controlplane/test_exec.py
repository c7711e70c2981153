"""GET /deployments/{id}/exec: a WebSocket terminal through the real apiserver to the fake kubelet."""

from __future__ import annotations

import asyncio
from dataclasses import replace
from typing import Any

import aiohttp
import pytest

from tests.controlplane.conftest import Api, Cluster, Project, make_client, settings_for, validate_response, vllm
from tests.controlplane.test_logs import kubelet_debug, kubelet_streams

pytestmark = pytest.mark.asyncio
EXEC = "/deployments/{id}/exec"
KIND = "LLMInferenceService"


async def refused(api: Api, token: str | None, dep_id: str, query: str = "") -> tuple[int, Any]:
    """Attempt the upgrade; return the HTTP error that came instead (validated against the OpenAPI)."""
    headers = {"x-keystone-token": token} if token else {}
    with pytest.raises(aiohttp.WSServerHandshakeError) as info:
        await api.http.ws_connect(f"/api/v1/deployments/{dep_id}/exec{query}", headers=headers)
    status = info.value.status
    async with api.http.get(f"/api/v1/deployments/{dep_id}/exec{query}", headers=headers) as resp:
        assert resp.status == status
        body = await resp.json()
    validate_response(EXEC, "GET", status, body)
    return status, body


async def read_until(ws: aiohttp.ClientWebSocketResponse, needle: str) -> str:
    seen = ""
    while needle not in seen:
        msg = await asyncio.wait_for(ws.receive(), 10)
        assert msg.type == aiohttp.WSMsgType.TEXT, msg
        seen += msg.data
    return seen


async def test_a_terminal_session_runs_input_and_ends_with_a_reason_and_a_normal_close(
    api: Api, project: Project, cluster: Cluster
) -> None:
    d = await api.create(project.member, **vllm("shell"))
    pod = await cluster.add_pod(KIND, project.ns, "shell")
    ws = await api.http.ws_connect(f"/api/v1/deployments/{d['id']}/exec?container=main",
                                   headers={"x-keystone-token": project.member})
    await ws.send_json({"type": "resize", "cols": 120, "rows": 30})
    await ws.send_json({"type": "input", "data": "echo hello-from-pod\n"})
    assert "hello-from-pod" in await read_until(ws, "hello-from-pod")
    assert (await kubelet_debug("resizes"))[pod] == {"Width": 120, "Height": 30}  # resize -> channel 4
    await ws.send_json({"type": "input", "data": "exit 3\n"})
    assert "session ended: exit code 3" in await read_until(ws, "session ended")
    msg = await asyncio.wait_for(ws.receive(), 10)
    assert msg.type == aiohttp.WSMsgType.CLOSE and msg.data == aiohttp.WSCloseCode.OK
    await ws.close()


async def test_twenty_sessions_dropped_by_their_clients_leave_no_process_behind(
    env: dict[str, str], catalog_db: str, project: Project, cluster: Cluster
) -> None:
    tc = await make_client(replace(settings_for(env, catalog_db), max_exec_sessions_per_user=20))
    try:
        await _twenty_sessions(Api(tc), project, cluster)
    finally:
        await tc.close()


async def _no_exec_streams(within_s: float) -> bool:
    """The kubelet counts every test's streams: a shell an earlier test dropped may still be closing."""
    for _ in range(int(within_s * 10)):
        if not (await kubelet_streams()).get("exec"):
            return True
        await asyncio.sleep(0.1)
    return not (await kubelet_streams()).get("exec")


async def _twenty_sessions(api: Api, project: Project, cluster: Cluster) -> None:
    assert await _no_exec_streams(30), "an earlier test's exec sessions never closed"
    d = await api.create(project.member, **vllm("many-shells"))
    await cluster.add_pod(KIND, project.ns, "many-shells")
    sessions = []
    for i in range(20):
        ws = await api.http.ws_connect(f"/api/v1/deployments/{d['id']}/exec",
                                       headers={"x-keystone-token": project.member})
        await ws.send_json({"type": "input", "data": f"echo alive-{i}\n"})
        await read_until(ws, f"alive-{i}")
        sessions.append(ws)
    assert (await kubelet_streams()).get("exec") == 20
    for ws in sessions:
        await ws.close()  # the browser tab goes away
    assert await _no_exec_streams(5), "exec sessions left on the kubelet"


async def test_exec_errors_before_the_upgrade(
    api: Api, api_nokube: Api, api_broken: Api, project: Project, cluster: Cluster, admin_token: str
) -> None:
    d = await api.create(project.member, **vllm("noshell"))
    assert (await refused(api, None, d["id"]))[0] == 401
    status, err = await refused(api, project.reader, d["id"])  # reading is not enough to run commands
    assert (status, err["error"]) == (403, "forbidden")
    assert (await refused(api, admin_token, d["id"]))[0] == 404  # global read grants no terminal
    assert (await refused(api, project.member, d["id"]))[1]["error"] == "no_pods"
    pods = [await cluster.add_pod(KIND, project.ns, "noshell", i) for i in range(2)]
    assert (await refused(api, project.member, d["id"]))[1]["error"] == "pod_required"
    assert (await refused(api, project.member, d["id"], "?pod=elsewhere"))[1]["error"] == "invalid_pod"
    assert (await refused(api, project.member, d["id"], f"?pod={pods[0]}&container=x"))[0] == 404
    assert (await refused(api_nokube, project.member, d["id"]))[0] == 503
    catalog_only = await api_nokube.create(project.member, **vllm())
    assert (await refused(api, project.member, catalog_only["id"]))[1]["error"] == "invalid_backend"
    status, err = await refused(api_broken, project.member, d["id"])
    assert (status, err["message"]) == (500, "opening the terminal session failed")
    async with cluster.rbac_revoked():
        status, err = await refused(api, project.member, d["id"], f"?pod={pods[0]}")
        assert (status, err["error"]) == (403, "forbidden")
