"""GET /deployments/api-schemas: real local HTTP servers play workloads speaking OpenAI, Cohere, both or
neither; KServe's status (played by the test) decides which deployments are probed at all."""

from __future__ import annotations

import asyncio
import time
from collections.abc import AsyncIterator
from typing import Any

import pytest
import pytest_asyncio
from aiohttp import web
from aiohttp.test_utils import TestServer

from tests.controlplane.conftest import PROBE_TIMEOUT_S, Api, Cluster, Project, vllm

pytestmark = pytest.mark.asyncio
PATH = "/deployments/api-schemas"
KIND = "LLMInferenceService"
SEEN = web.AppKey("seen", list)
DEFAULT = {"schemas": ["OpenAI"], "recommended": "OpenAI", "unreachable": True}
REACHED_NEITHER = {"schemas": ["OpenAI"], "recommended": "OpenAI"}  # answered: not "unreachable"


def _server(openai: bool, cohere: bool, hang: bool = False) -> web.Application:
    seen: list[dict[str, Any]] = []

    async def models(_: web.Request) -> web.Response:
        if hang:
            await asyncio.sleep(30)
        return web.json_response({"object": "list", "data": [{"id": "served-model", "object": "model"}]})

    async def rerank(request: web.Request) -> web.Response:
        body = await request.json()
        seen.append(body)
        return web.json_response({"id": "r", "results": [{"index": 0, "relevance_score": 0.9}]})

    app = web.Application()
    if openai or hang:
        app.router.add_get("/v1/models", models)
    if cohere:
        app.router.add_post("/v1/rerank", rerank)
    app[SEEN] = seen
    return app


@pytest_asyncio.fixture
async def workloads() -> AsyncIterator[dict[str, TestServer]]:
    servers = {
        "openai": TestServer(_server(True, False), host="127.0.0.1"),
        "cohere": TestServer(_server(False, True), host="127.0.0.1"),
        "both": TestServer(_server(True, True), host="127.0.0.1"),
        "neither": TestServer(_server(False, False), host="127.0.0.1"),
        "hung1": TestServer(_server(False, False, hang=True), host="127.0.0.1"),
        "hung2": TestServer(_server(False, False, hang=True), host="127.0.0.1"),
    }
    for s in servers.values():
        await s.start_server()
    yield servers
    for s in servers.values():
        await s.close()


async def _ready(cluster: Cluster, ns: str, name: str, url: str | None) -> None:
    status: dict[str, Any] = {"conditions": [{"type": "Ready", "status": "True"}]}
    if url:
        status["addresses"] = [{"url": url}]
    await cluster.set_status(KIND, ns, name, status)


async def test_each_visible_deployment_reports_the_protocols_its_workload_answers(
    api: Api, project: Project, other_project: Project, cluster: Cluster, workloads: dict[str, TestServer]
) -> None:
    ids: dict[str, str] = {}
    for name, srv in workloads.items():
        d = await api.create(project.member, **vllm(name, modelName=f"{name}-model"))
        ids[name] = d["id"]
        await _ready(cluster, project.ns, name, str(srv.make_url("")).rstrip("/"))
    for name in ("not-ready", "stopped", "no-service"):
        ids[name] = (await api.create(project.member, **vllm(name)))["id"]
    await cluster.set_status(KIND, project.ns, "not-ready", {
        "conditions": [{"type": "Ready", "status": "False"}], "addresses": [{"url": "http://127.0.0.1:9"}]})
    await _ready(cluster, project.ns, "stopped", str(workloads["both"].make_url("")).rstrip("/"))
    await api.call("POST", "/deployments/{id}/stop", project.member, expect=200, id=ids["stopped"])
    await _ready(cluster, project.ns, "no-service", None)
    theirs = await api.create(other_project.member, **vllm("theirs"))

    started = time.monotonic()
    _, body = await api.call("GET", PATH, project.reader, expect=200)
    elapsed = time.monotonic() - started

    assert body["items"] == {
        ids["openai"]: {"schemas": ["OpenAI"], "recommended": "OpenAI"},
        ids["cohere"]: {"schemas": ["Cohere"], "recommended": "Cohere"},
        ids["both"]: {"schemas": ["OpenAI", "Cohere"], "recommended": "OpenAI"},
        ids["neither"]: REACHED_NEITHER,
        ids["hung1"]: DEFAULT,
        ids["hung2"]: DEFAULT,
        ids["not-ready"]: DEFAULT,
        ids["stopped"]: DEFAULT,
        ids["no-service"]: DEFAULT,
    }
    assert theirs["id"] not in body["items"]
    # Two hung workloads, probed in parallel and bounded: well under two sequential timeouts each.
    assert elapsed < 3 * PROBE_TIMEOUT_S + 2
    app = workloads["cohere"].app
    assert app is not None
    seen = app[SEEN]
    assert seen and seen[-1]["model"] == "cohere-model" and seen[-1]["documents"] == ["ping"]
    calls = len(seen)

    # Asked again: the answers come from the per-generation cache, no rerank work is sent again ...
    _, again = await api.call("GET", PATH, project.reader, expect=200)
    assert again["items"] == body["items"] and len(seen) == calls
    # ... until the workload's configuration changes (a new generation): then it is asked once more.
    await api.call("PATCH", "/deployments/{id}", project.member, json={"modelName": "cohere-v2"}, expect=200,
                   id=ids["cohere"])
    await _ready(cluster, project.ns, "cohere", str(workloads["cohere"].make_url("")).rstrip("/"))
    _, third = await api.call("GET", PATH, project.reader, expect=200)
    assert third["items"][ids["cohere"]] == {"schemas": ["Cohere"], "recommended": "Cohere"}
    assert len(seen) == calls + 1 and seen[-1]["model"] == "cohere-v2"


async def test_api_schemas_without_kubernetes_reports_every_deployment_unreachable(
    api_nokube: Api, project: Project
) -> None:
    d = await api_nokube.create(project.member, **vllm())
    _, body = await api_nokube.call("GET", PATH, project.member, expect=200)
    assert body["items"] == {d["id"]: DEFAULT}


async def test_api_schemas_status_codes(api: Api, api_broken: Api, project: Project, admin_token: str) -> None:
    d = await api.create(project.member, **vllm())
    await api.call("GET", PATH, None, expect=401)
    await api.call("GET", PATH, "bogus", expect=401)
    _, err = await api.call("GET", PATH, project.observer, expect=403)
    assert err["error"] == "forbidden"
    _, err = await api_broken.call("GET", PATH, project.member, expect=500)
    assert err == {"error": "internal_error", "message": "listing deployments failed"}
    _, body = await api.call("GET", PATH, admin_token, expect=200)
    assert d["id"] in body["items"]  # global read
