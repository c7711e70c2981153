"""Who may do what: the cross-project matrix, global read, and Keystone token validation and caching."""

from __future__ import annotations

import asyncio
import socket
from dataclasses import replace

import pytest

from tests.controlplane.conftest import (
    OPENAPI,
    SHORT_TOKEN_TTL_S,
    Api,
    Cluster,
    Keystone,
    Project,
    make_client,
    settings_for,
    vllm,
)

pytestmark = pytest.mark.asyncio

ENDPOINTS = [
    ("GET", "/deployments/{id}", None),
    ("GET", "/deployments/{id}/pods", None),
    ("GET", "/deployments/{id}/logs", None),
    ("GET", "/deployments/{id}/exec", None),
    ("GET", "/deployments/{id}/metrics", None),
    ("PATCH", "/deployments/{id}", {"name": "hijacked"}),
    ("PATCH", "/deployments/{id}", {"replicas": 5}),
    ("POST", "/deployments/{id}/stop", None),
    ("POST", "/deployments/{id}/start", None),
    ("DELETE", "/deployments/{id}", None),
]


async def test_another_projects_deployment_is_404_on_every_endpoint_for_every_role_and_stays_untouched(
    api: Api, project: Project, other_project: Project, cluster: Cluster
) -> None:
    d = await api.create(other_project.member, **vllm("private"))
    before = await cluster.get("LLMInferenceService", other_project.ns, "private")
    for token in (project.member, project.reader):
        for method, path, body in ENDPOINTS:
            status, err = await api.call(method, path, token, json=body, id=d["id"])
            writes = method != "GET" or path.endswith("/exec")  # a terminal runs commands: write permission
            expected = 403 if token == project.reader and writes else 404
            assert status == expected, (method, path, status, err)
        _, listing = await api.call("GET", "/deployments", token, expect=200)
        assert d["id"] not in [i["id"] for i in listing["items"]]
    after = await cluster.get("LLMInferenceService", other_project.ns, "private")
    assert before and after and after["metadata"]["resourceVersion"] == before["metadata"]["resourceVersion"]
    _, body = await api.call("GET", "/deployments/{id}", other_project.member, expect=200, id=d["id"])
    assert body["name"] == "private" and body["spec"]["replicas"] == 1


async def test_global_read_does_not_grant_writes_to_other_projects(
    api: Api, project: Project, admin_token: str, cluster: Cluster
) -> None:
    d = await api.create(project.member, **vllm("admin-reads"))
    await api.call("GET", "/deployments/{id}", admin_token, expect=200, id=d["id"])
    await api.call("GET", "/deployments/{id}/pods", admin_token, expect=200, id=d["id"])
    for method, path, body in ENDPOINTS:
        if method == "GET":
            continue
        status, _ = await api.call(method, path, admin_token, json=body, id=d["id"])
        assert status == 404, (method, path)
    assert await cluster.get("LLMInferenceService", project.ns, "admin-reads") is not None


async def test_a_role_without_deployment_permissions_is_403_on_every_endpoint(
    api: Api, project: Project
) -> None:
    d = await api.create(project.member, **vllm())
    for method, path, body in [*ENDPOINTS, ("GET", "/deployments", None), ("POST", "/deployments", vllm())]:
        status, err = await api.call(method, path, project.observer, json=body, id=d["id"])
        assert (status, err["error"]) == (403, "forbidden"), (method, path)


async def test_missing_or_invalid_tokens_are_401_on_every_endpoint(api: Api, project: Project) -> None:
    d = await api.create(project.member, **vllm())
    for token in (None, "", "garbage-token"):
        for method, path, body in [*ENDPOINTS, ("GET", "/deployments", None), ("POST", "/deployments", vllm())]:
            status, err = await api.call(method, path, token, json=body, id=d["id"])
            assert (status, err["error"]) == (401, "unauthorized"), (method, path, token)


async def test_a_revoked_token_is_rejected_once_the_cache_ttl_has_passed(
    api_short_ttl: Api, project: Project, keystone: Keystone
) -> None:
    token = project.reader
    await api_short_ttl.call("GET", "/deployments", token, expect=200)
    await keystone.revoke(token)
    await asyncio.sleep(SHORT_TOKEN_TTL_S + 0.2)
    _, err = await api_short_ttl.call("GET", "/deployments", token, expect=401)
    assert err["error"] == "unauthorized"


async def test_a_reader_can_read_but_not_write(api: Api, project: Project) -> None:
    d = await api.create(project.member, **vllm())
    await api.call("GET", "/deployments", project.reader, expect=200)
    await api.call("GET", "/deployments/{id}", project.reader, expect=200, id=d["id"])
    await api.call("POST", "/deployments", project.reader, json=vllm(), expect=403)


async def test_with_keystone_unreachable_every_endpoint_is_a_clear_503(
    env: dict[str, str], catalog_db: str, shared_project: Project
) -> None:
    with socket.socket() as s:  # a port nothing listens on
        s.bind(("127.0.0.1", 0))
        dead = f"http://127.0.0.1:{s.getsockname()[1]}/v3"
    tc = await make_client(replace(settings_for(env, catalog_db), keystone_url=dead))
    try:
        api = Api(tc)
        for method, path, body in [("GET", "/deployments", None), ("POST", "/deployments", vllm()),
                                   ("GET", "/deployments/api-schemas", None), *ENDPOINTS]:
            status, err = await api.call(method, path, shared_project.member, json=body, id="deployment-x")
            assert status == 503, (method, path, status, err)
            assert err["error"] == "unavailable" and "Keystone" in err["message"]
    finally:
        await tc.close()


async def test_a_method_the_path_does_not_have_is_405_with_a_contract_error_code(api: Api) -> None:
    async with api.http.put("/api/v1/deployments") as resp:
        assert resp.status == 405
        body = await resp.json()
        assert "GET" in resp.headers["Allow"] and "POST" in resp.headers["Allow"]
    errors = OPENAPI["components"]["schemas"]["Error"]["properties"]["error"]["enum"]
    assert body["error"] in errors and "PUT" in body["message"]
