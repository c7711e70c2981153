"""GET /deployments/{id}/logs through the real apiserver to the fake kubelet (tools/testenv)."""

from __future__ import annotations

import asyncio
import os
import ssl
from pathlib import Path
from typing import Any

import aiohttp
import pytest

from tests.controlplane.conftest import Api, Cluster, Project, validate_response, vllm

pytestmark = pytest.mark.asyncio
LOGS = "/deployments/{id}/logs"
KIND = "LLMInferenceService"


async def get_logs(api: Api, token: str | None, dep_id: str, query: str = "") -> tuple[int, Any, Any]:
    """(status, text or error body, headers); error bodies are validated against the OpenAPI document."""
    headers = {"x-keystone-token": token} if token else {}
    async with api.http.get(f"/api/v1/deployments/{dep_id}/logs{query}", headers=headers) as resp:
        if resp.status == 200:
            return 200, await resp.text(), resp.headers
        body = await resp.json()
        validate_response(LOGS, "GET", resp.status, body)
        return resp.status, body, resp.headers


async def kubelet_debug(what: str = "streams") -> dict[str, Any]:
    """What the fake kubelet saw: open log streams / exec sessions, or the last terminal size per pod."""
    certs = Path(os.environ["SR_TESTENV_DIR"]) / "certs"
    ctx = ssl.create_default_context(cafile=str(certs / "ca.crt"))
    ctx.load_cert_chain(certs / "client.crt", certs / "client.key")  # the kubelet checks client certificates
    async with aiohttp.ClientSession() as http, http.get(
        os.environ["SR_TEST_KUBELET_URL"] + f"/debug/{what}", ssl=ctx
    ) as r:
        return dict(await r.json())


async def kubelet_streams() -> dict[str, int]:
    return await kubelet_debug("streams")


def lines(ns: str, pod: str, start: int, end: int, ctr: str = "main") -> str:
    return "".join(f"{ns}/{pod}/{ctr} line {i}\n" for i in range(start, end))


async def test_a_single_pod_deployment_returns_its_log_as_plain_text_with_the_default_tail(
    api: Api, project: Project, cluster: Cluster
) -> None:
    d = await api.create(project.member, **vllm("one"))
    pod = await cluster.add_pod(KIND, project.ns, "one")
    status, text, headers = await get_logs(api, project.reader, d["id"], "?container=main")
    assert status == 200 and text == lines(project.ns, pod, 0, 10)
    assert headers["Content-Type"] == "text/plain; charset=utf-8" and headers["X-Accel-Buffering"] == "no"
    _, text, _ = await get_logs(api, project.reader, d["id"], "?tailLines=3")
    assert text == lines(project.ns, pod, 7, 10)
    for bad in ("0", "-2", "abc"):
        _, text, _ = await get_logs(api, project.reader, d["id"], f"?tailLines={bad}")
        assert text == lines(project.ns, pod, 0, 10), bad
    _, text, _ = await get_logs(api, project.reader, d["id"], "?follow=yes")  # not true/1: no follow
    assert text == lines(project.ns, pod, 0, 10)


async def test_several_pods_need_a_pod_that_belongs_to_the_deployment(
    api: Api, project: Project, cluster: Cluster
) -> None:
    d = await api.create(project.member, **vllm("many"))
    other = await api.create(project.member, **vllm("stranger"))
    pods = [await cluster.add_pod(KIND, project.ns, "many", i) for i in range(2)]
    stranger = await cluster.add_pod(KIND, project.ns, "stranger")
    status, err, _ = await get_logs(api, project.member, d["id"])
    assert (status, err["error"]) == (400, "pod_required")
    status, err, _ = await get_logs(api, project.member, d["id"], f"?pod={stranger}")
    assert (status, err["error"]) == (400, "invalid_pod")
    status, text, _ = await get_logs(api, project.member, d["id"], f"?pod={pods[1]}&container=main&tailLines=1")
    assert (status, text) == (200, lines(project.ns, pods[1], 9, 10))
    status, err, _ = await get_logs(api, project.member, d["id"], f"?pod={pods[1]}&container=nope")
    assert (status, err["error"]) == (404, "not_found")
    assert other["id"] != d["id"]


async def test_follow_streams_new_lines_and_a_departed_client_frees_the_upstream_stream_at_once(
    api: Api, project: Project, cluster: Cluster
) -> None:
    d = await api.create(project.member, **vllm("tailf"))
    pod = await cluster.add_pod(KIND, project.ns, "tailf")
    key = f"{project.ns}/{pod}/main"
    got = b""
    resp = await api.http.get(f"/api/v1/deployments/{d['id']}/logs?follow=1&tailLines=1",
                              headers={"x-keystone-token": project.member})
    assert resp.status == 200
    while got.count(b"\n") < 4:  # the old last line, then lines that did not exist when we asked
        got += await asyncio.wait_for(resp.content.readany(), 5)
    assert got.startswith(lines(project.ns, pod, 9, 12).encode())
    assert (await kubelet_streams()).get(key) == 1
    resp.close()  # the client hangs up
    for _ in range(30):
        if not (await kubelet_streams()).get(key):
            break
        await asyncio.sleep(0.1)
    assert not (await kubelet_streams()).get(key), "upstream log stream still open after the client left"


async def test_logs_status_codes(
    api: Api, api_nokube: Api, api_broken: Api, project: Project, cluster: Cluster
) -> None:
    d = await api.create(project.member, **vllm("codes"))
    assert (await get_logs(api, None, d["id"]))[0] == 401
    status, err, _ = await get_logs(api, project.observer, d["id"])
    assert (status, err["error"]) == (403, "forbidden")
    status, err, _ = await get_logs(api, project.member, d["id"])
    assert (status, err["error"]) == (404, "no_pods")
    status, err, _ = await get_logs(api, project.member, "deployment-nope")
    assert (status, err["error"]) == (404, "not_found")
    status, err, _ = await get_logs(api_nokube, project.member, d["id"])
    assert (status, err["error"]) == (503, "unavailable")
    catalog_only = await api_nokube.create(project.member, **vllm())
    status, err, _ = await get_logs(api, project.member, catalog_only["id"])
    assert (status, err["error"]) == (422, "invalid_backend")
    status, err, _ = await get_logs(api_broken, project.member, d["id"])
    assert (status, err) == (500, {"error": "internal_error", "message": "reading the logs failed"})
    await cluster.add_pod(KIND, project.ns, "codes")
    async with cluster.rbac_revoked():
        status, err, _ = await get_logs(api, project.member, d["id"])
        assert (status, err["error"]) == (403, "forbidden")
    await cluster.delete(KIND, project.ns, "codes")
    status, err, _ = await get_logs(api, project.member, d["id"])
    assert (status, err["error"]) == (404, "not_found")
