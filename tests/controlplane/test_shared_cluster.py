"""Safe on a shared cluster (issue 24, control-plane half): tenants cannot steer KServe through labels, an
ordinary project's admin cannot read other tenants, per-deployment and per-user caps, a token cache that
honours Keystone's expiry and stays bounded, throttled invalid tokens, nothing secret in error texts, and
the request contract's edges (deep JSON, large bodies, the api-schemas Allow)."""

from __future__ import annotations

import asyncio
import json
import os
import ssl
import stat
import uuid
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from dataclasses import replace
from pathlib import Path
from typing import Any

import aiohttp
import pytest
import sqlalchemy as sa
import yaml
from prometheus_client.parser import text_string_to_metric_families

from controlplane.db import make_engine
from controlplane.errors import ApiError
from controlplane.kube import KINDS, KubeBackend
from tests.controlplane.conftest import (
    Api,
    Cluster,
    Keystone,
    Project,
    make_client,
    settings_for,
    triton,
    vllm,
)
from tests.controlplane.test_operations import json_log

pytestmark = pytest.mark.asyncio
KIND = "LLMInferenceService"
READS = ["/deployments/{id}", "/deployments/{id}/pods", "/deployments/{id}/logs", "/deployments/{id}/metrics"]


@asynccontextmanager
async def client(env: dict[str, str], db: str, **changes: Any) -> AsyncIterator[Api]:
    """A service with some settings changed, stopped at the end of the block."""
    tc = await make_client(replace(settings_for(env, db), **changes))
    try:
        yield Api(tc)
    finally:
        await tc.close()


async def keystone_calls(api: Api) -> float:
    """How many token validations this service sent to Keystone so far (its own /metrics)."""
    async with api.http.get("/metrics") as resp:
        text = await resp.text()
    return sum(s.value for f in text_string_to_metric_families(text) for s in f.samples
               if s.name == "sr_cp_keystone_call_seconds_count")


# -- labels ----------------------------------------------------------------------------------------------


@pytest.mark.parametrize("key", [
    "networking.kserve.io/visibility", "serving.kserve.io/deploymentMode", "kserve.io/anything",
    "app.kubernetes.io/managed-by", "kubernetes.io/metadata.name", "node.k8s.io/x", "k8s.io/x",
    "istio.io/rev", "sidecar.istio.io/inject", "sr-gateway.io/deployment-id",
])
async def test_a_label_with_a_reserved_prefix_is_400_naming_the_key_and_creates_nothing(
    api: Api, shared_project: Project, cluster: Cluster, key: str
) -> None:
    name = f"lbl-{uuid.uuid4().hex[:6]}"
    _, err = await api.call("POST", "/deployments", shared_project.member,
                            json=vllm(name, labels={"team": "a", key: "exposed"}), expect=400)
    assert err["error"] == "invalid_request" and key in err["message"], err
    assert await cluster.get(KIND, shared_project.ns, name) is None
    _, listing = await api.call("GET", "/deployments", shared_project.member, expect=200)
    assert name not in [i["name"] for i in listing["items"]]


async def test_every_workload_is_cluster_local_and_ordinary_labels_pass_through(
    api: Api, project: Project, cluster: Cluster
) -> None:
    await api.create(project.member, **vllm("local-llm", labels={"team": "a", "example.com/tier": "gold"}))
    await api.create(project.member, **triton("local-tri", labels={"beacon.io/runtime": "mine"}))
    for kind, name in ((KIND, "local-llm"), ("InferenceService", "local-tri")):
        obj = await cluster.get(kind, project.ns, name)
        assert obj is not None and obj["metadata"]["labels"]["networking.kserve.io/visibility"] == "cluster-local"
    llm = await cluster.get(KIND, project.ns, "local-llm")
    assert llm is not None and llm["metadata"]["labels"]["example.com/tier"] == "gold"
    tri = await cluster.get("InferenceService", project.ns, "local-tri")
    assert tri is not None and tri["metadata"]["labels"]["beacon.io/runtime"] == "triton"  # system-managed


# -- global read -----------------------------------------------------------------------------------------


async def test_the_admin_of_another_project_cannot_read_this_projects_deployments(
    api: Api, project: Project, other_project: Project, keystone: Keystone, cluster: Cluster
) -> None:
    d = await api.create(project.member, **vllm("tenant-a"))
    await cluster.add_pod(KIND, project.ns, "tenant-a")
    _, name, pw = await keystone.user_with_role(other_project.id, "admin")
    admin_b = await keystone.token(name, pw, project_id=other_project.id)
    for path in READS:
        status, err = await api.call("GET", path, admin_b, id=d["id"])
        assert status == 404, (path, status, err)
    _, listing = await api.call("GET", "/deployments", admin_b, expect=200)
    assert d["id"] not in [i["id"] for i in listing["items"]]
    _, schemas = await api.call("GET", "/deployments/api-schemas", admin_b, expect=200)
    assert d["id"] not in [i["id"] for i in schemas["items"]]
    own = await api.create(admin_b, **vllm("tenant-b"))  # still the admin of its own project
    await api.call("GET", "/deployments/{id}", admin_b, expect=200, id=own["id"])


async def test_system_scoped_and_admin_project_tokens_read_every_project_and_each_read_is_audited(
    api: Api, env: dict[str, str], catalog_db: str, project: Project, keystone: Keystone, admin_token: str
) -> None:
    d = await api.create(project.member, **vllm("watched"))
    system = await keystone.system_token()
    with json_log() as out:
        await api.call("GET", "/deployments/{id}", system, expect=200, id=d["id"])
        _, listing = await api.call("GET", "/deployments", admin_token, expect=200)
        await api.call("GET", "/deployments/{id}", project.member, expect=200, id=d["id"])  # own: no audit
    assert d["id"] in [i["id"] for i in listing["items"]]
    audits = [x for x in map(json.loads, out.getvalue().splitlines()) if x.get("action") == "cross_project_read"]
    assert [(a["deployment_id"], a["target_project"], a["project_id"]) for a in audits] == [
        (d["id"], project.id, None), (None, "*", keystone.admin_project_id)]
    # Without the admin project configured, the same project-scoped admin token reads only its own project.
    async with client(env, catalog_db) as plain:
        await plain.call("GET", "/deployments/{id}", admin_token, expect=404, id=d["id"])
        await plain.call("GET", "/deployments/{id}", system, expect=200, id=d["id"])


# -- limits ----------------------------------------------------------------------------------------------


@pytest.mark.parametrize(("field", "value", "cap"), [
    ("replicas", 3, "at most 2"),
    ("resources", {"cpu": "2500m"}, "resources.cpu must be at most 2"),
    ("resources", {"memory": "5Gi"}, "resources.memory must be at most 4Gi"),
    ("resources", {"gpu": "2"}, "resources.gpu must be at most 1"),
])
async def test_requests_over_the_configured_caps_are_400_naming_the_field(
    env: dict[str, str], catalog_db: str, shared_project: Project, cluster: Cluster, field: str, value: Any,
    cap: str,
) -> None:
    async with client(env, catalog_db, max_replicas=2, max_cpu="2", max_memory="4Gi", max_gpu=1) as api:
        name = f"big-{uuid.uuid4().hex[:6]}"
        _, err = await api.call("POST", "/deployments", shared_project.member, json=vllm(name, **{field: value}),
                                expect=400)
        assert err["error"] == "invalid_request" and cap in err["message"], err
        assert await cluster.get(KIND, shared_project.ns, name) is None
        ok = await api.create(shared_project.member, **vllm(replicas=2, resources={"cpu": "2", "memory": "4Gi"}))
        _, err = await api.call("PATCH", "/deployments/{id}", shared_project.member, json={"replicas": 3},
                                expect=400, id=ok["id"])
        assert "at most 2" in err["message"]


async def test_a_user_beyond_the_concurrent_follow_and_terminal_caps_gets_429_with_retry_after(
    env: dict[str, str], catalog_db: str, project: Project, cluster: Cluster
) -> None:
    async with client(env, catalog_db, max_log_follows_per_user=1, max_exec_sessions_per_user=1,
                      session_retry_after_s=7) as api:
        d = await api.create(project.member, **vllm("capped"))
        await cluster.add_pod(KIND, project.ns, "capped")
        hdr = {"x-keystone-token": project.member}
        url = f"/api/v1/deployments/{d['id']}"
        first = await api.http.get(f"{url}/logs?follow=1&tailLines=1", headers=hdr)
        assert first.status == 200
        await asyncio.wait_for(first.content.readany(), 5)
        async with api.http.get(f"{url}/logs?follow=1", headers=hdr) as second:
            assert second.status == 429 and second.headers["Retry-After"] == "7"
            assert (await second.json())["error"] == "too_many_requests"
        async with api.http.get(f"{url}/logs?tailLines=1", headers=hdr) as plain:  # not following: no cap
            assert plain.status == 200
        first.close()
        for _ in range(50):  # the released slot: the server notices the hang-up within half a second
            async with api.http.get(f"{url}/logs?follow=1&tailLines=1", headers=hdr) as again:
                if again.status == 200:
                    break
            await asyncio.sleep(0.2)
        assert again.status == 200
        ws = await api.http.ws_connect(f"{url}/exec", headers=hdr)
        with pytest.raises(aiohttp.WSServerHandshakeError) as refused:
            await api.http.ws_connect(f"{url}/exec", headers=hdr)
        assert refused.value.status == 429 and refused.value.headers is not None
        assert refused.value.headers["Retry-After"] == "7"
        await ws.close()


# -- token cache -----------------------------------------------------------------------------------------


async def test_a_cached_token_is_rejected_once_keystone_says_it_expired(
    env: dict[str, str], catalog_db: str, project: Project, keystone: Keystone
) -> None:
    token = await keystone.short_lived_token(project, 4.0)
    async with client(env, catalog_db, token_cache_ttl_s=600.0) as api:
        await api.call("GET", "/deployments", token, expect=200)
        await asyncio.sleep(5.0)
        _, err = await api.call("GET", "/deployments", token, expect=401)
        assert err["error"] == "unauthorized"


async def test_the_token_cache_is_bounded_and_evicts_the_least_recently_used(
    env: dict[str, str], catalog_db: str, project: Project
) -> None:
    async with client(env, catalog_db, token_cache_size=2) as api:
        for token in (project.member, project.reader, project.observer):
            await api.call("GET", "/deployments", token)
        assert await keystone_calls(api) == 3
        await api.call("GET", "/deployments", project.observer, expect=403)  # still cached
        assert await keystone_calls(api) == 3
        await api.call("GET", "/deployments", project.member, expect=200)  # evicted: asked again
        assert await keystone_calls(api) == 4


async def test_a_client_presenting_many_invalid_tokens_is_throttled_without_asking_keystone(
    env: dict[str, str], catalog_db: str, project: Project
) -> None:
    async with client(env, catalog_db, invalid_token_limit=3, invalid_token_window_s=600.0) as api:
        await api.call("GET", "/deployments", project.member, expect=200)
        for i in range(3):
            await api.call("GET", "/deployments", f"guess-{i}", expect=401)
        asked = await keystone_calls(api)
        async with api.http.get("/api/v1/deployments", headers={"x-keystone-token": "guess-4"}) as resp:
            assert resp.status == 429 and 590 <= int(resp.headers["Retry-After"]) <= 600
            assert (await resp.json())["error"] == "too_many_requests"
        await api.call("GET", "/deployments", project.reader, expect=429)  # unknown tokens wait too
        await api.call("GET", "/deployments", project.member, expect=200)  # a validated one still works
        assert await keystone_calls(api) == asked


# -- nothing secret reaches a caller ---------------------------------------------------------------------


async def test_kubernetes_refusals_do_not_tell_the_caller_the_service_account_or_its_rights(
    api: Api, project: Project, cluster: Cluster
) -> None:
    d = await api.create(project.member, **vllm("refused"))
    await cluster.add_pod(KIND, project.ns, "refused")
    with json_log() as out:
        async with cluster.rbac_revoked():
            bodies = [await api.call("POST", "/deployments", project.member, json=vllm(), expect=403),
                      await api.call("GET", "/deployments/{id}/pods", project.member, expect=403, id=d["id"]),
                      await api.call("POST", "/deployments/{id}/stop", project.member, expect=403, id=d["id"])]
    for _, err in bodies:
        assert err["error"] == "forbidden" and "Kubernetes" in err["message"], err
        for secret in ("serviceaccount", "system:", "sr-controlplane", "cannot", project.ns):
            assert secret not in err["message"].lower(), err
    assert "system:serviceaccount" in out.getvalue()  # the operator still sees why


# -- contract edges --------------------------------------------------------------------------------------


async def test_deeply_nested_json_is_400_not_500(api: Api, shared_project: Project) -> None:
    for depth in (40, 100_000):
        deep = "[" * depth + "]" * depth
        body = '{"name": "deep", "engineId": "t-vllm", "artifactId": "t-art-qwen", "labels": ' + deep + "}"
        _, err = await api.call("POST", "/deployments", shared_project.member, data=body, expect=400)
        assert err["error"] == "invalid_request" and "nested" in err["message"], (depth, err)


async def test_a_body_over_the_limit_is_a_json_413(env: dict[str, str], catalog_db: str, shared_project: Project
                                                   ) -> None:
    async with client(env, catalog_db, max_body_bytes=4096) as api:
        _, err = await api.call("POST", "/deployments", shared_project.member,
                                json=vllm(description="x" * 5000), expect=413)
        assert err["error"] == "invalid_request" and "4096" in err["message"]
        await api.call("POST", "/deployments", shared_project.member, json=vllm(description="x" * 100),
                       expect=201)


async def test_api_schemas_answers_other_methods_with_its_own_allow(api: Api, shared_project: Project) -> None:
    for method in ("PATCH", "DELETE", "POST", "PUT"):
        async with api.http.request(method, "/api/v1/deployments/api-schemas", json={"name": "x"},
                                    headers={"x-keystone-token": shared_project.member}) as resp:
            assert resp.status == 405, method
            assert set(resp.headers["Allow"].split(",")) <= {"GET", "HEAD"}, resp.headers["Allow"]
            assert (await resp.json())["error"] == "invalid_request"


# -- the test environment itself ----------------------------------------------------------------------------


async def test_the_stand_in_kubelet_answers_only_clients_with_a_certificate_from_the_cluster_ca() -> None:
    certs = Path(os.environ["SR_TESTENV_DIR"]) / "certs"
    url = os.environ["SR_TEST_KUBELET_URL"] + "/debug/streams"
    anonymous = ssl.create_default_context(cafile=str(certs / "ca.crt"))
    async with aiohttp.ClientSession() as http:
        with pytest.raises(aiohttp.ClientError):
            async with http.get(url, ssl=anonymous) as resp:
                await resp.read()
        signed = ssl.create_default_context(cafile=str(certs / "ca.crt"))
        signed.load_cert_chain(certs / "client.crt", certs / "client.key")
        async with http.get(url, ssl=signed) as resp:
            assert resp.status == 200


async def test_the_run_directory_with_the_admin_token_and_ca_key_is_private_to_its_owner() -> None:
    run = Path(os.environ["SR_TESTENV_DIR"])
    assert stat.S_IMODE(run.stat().st_mode) == 0o700
    assert (run / "certs" / "ca.key").exists() and (run / "tokens.csv").exists()


async def test_postgresql_refuses_connections_without_the_password(env: dict[str, str]) -> None:
    dsn = env["SR_TEST_PG_DSN"]
    user_pw = dsn.split("://", 1)[1].split("@", 1)[0]
    assert ":" in user_pw, "the DSN carries no password"
    without = make_engine(dsn.replace(user_pw + "@", user_pw.split(":", 1)[0] + "@"))
    try:
        with pytest.raises(Exception, match="password"):
            async with without.connect() as conn:
                await conn.execute(sa.text("SELECT 1"))
    finally:
        await without.dispose()
    with_password = make_engine(dsn)
    try:
        async with with_password.connect() as conn:
            assert (await conn.execute(sa.text("SELECT 1"))).scalar() == 1
    finally:
        await with_password.dispose()


# -- operability -----------------------------------------------------------------------------------------


async def test_a_rotated_service_account_token_file_is_read_again(
    env: dict[str, str], shared_project: Project, tmp_path: Path
) -> None:
    """The kubelet rotates the projected token; a client that read tokenFile once would get 401s after it."""
    kubeconfig = yaml.safe_load(Path(env["SR_TEST_KUBE_CP_KUBECONFIG"]).read_text())
    user = kubeconfig["users"][0]["user"]
    token = Path(user["tokenFile"]).read_text().strip()
    token_file = tmp_path / "token"
    token_file.write_text(token)
    user["tokenFile"] = str(token_file)
    (tmp_path / "kubeconfig").write_text(yaml.safe_dump(kubeconfig))
    kube = KubeBackend(str(tmp_path / "kubeconfig"), 5.0, token_reread_s=0.0)
    try:
        for current, expected in ((token, 404), ("rotated-away", 403), (token, 404)):
            token_file.write_text(current)
            with pytest.raises(ApiError) as err:
                await kube.get(KINDS[KIND], shared_project.ns, "nothing-here")
            assert err.value.status == expected, (current, err.value.message)
    finally:
        await kube.aclose()


async def test_a_character_split_across_two_exec_frames_reaches_the_terminal_whole(
    api: Api, project: Project, cluster: Cluster
) -> None:
    d = await api.create(project.member, **vllm("utf8"))
    await cluster.add_pod(KIND, project.ns, "utf8")
    ws = await api.http.ws_connect(f"/api/v1/deployments/{d['id']}/exec",
                                   headers={"x-keystone-token": project.member})
    try:  # the first byte of "中" in one write, the other two 0.3 s later: two reads, two frames
        await ws.send_json({"type": "input", "data": "printf '\\344'; sleep 0.3; printf '\\270\\255-end\\n'\n"})
        seen = ""
        while "-end" not in seen:
            msg = await asyncio.wait_for(ws.receive(), 10)
            assert msg.type == aiohttp.WSMsgType.TEXT, msg
            seen += msg.data
        assert "中-end" in seen and "\ufffd" not in seen, repr(seen)
    finally:
        await ws.close()


async def test_router_scheduler_pods_are_not_the_deployments_pods_and_do_not_keep_it_stopping(
    api: Api, project: Project, cluster: Cluster
) -> None:
    d = await api.create(project.member, **vllm("routed"))
    model_pod = await cluster.add_pod(KIND, project.ns, "routed")
    await cluster.add_pod(KIND, project.ns, "routed", component="router-scheduler")
    _, pods = await api.call("GET", "/deployments/{id}/pods", project.member, expect=200, id=d["id"])
    assert [p["name"] for p in pods["items"]] == [model_pod]
    async with api.http.get(f"/api/v1/deployments/{d['id']}/logs",
                            headers={"x-keystone-token": project.member}) as resp:
        assert resp.status == 200, await resp.text()  # one pod: no pod_required because of the scheduler
    await cluster.remove_pod(project.ns, model_pod)
    _, stopped = await api.call("POST", "/deployments/{id}/stop", project.member, expect=200, id=d["id"])
    assert stopped["status"] == "stopped", stopped
