"""KServe wiring on a shared cluster (issue 24, the rest of it): an InferenceService resolves the runtime it names
on the real apiserver (the shipped ClusterServingRuntime, or KServe's failure when there is none); a create that
failed or was cancelled after its workload was sent is cleaned up by the reconciler, workload first, then record;
a managed workload that has no record is deleted after the grace period; the caps hold for what the catalog
engine asks for too; no `:latest` or untagged image comes in through create or PATCH; and without Kubernetes a
create needs no project-scoped token, as the spec says."""

from __future__ import annotations

import asyncio
import uuid
from collections.abc import AsyncIterator
from dataclasses import replace
from pathlib import Path
from typing import Any

import pytest
import pytest_asyncio
import sqlalchemy as sa

from controlplane.app import AUTH, ENGINE, KUBE, SERVICE
from controlplane.catalog import import_catalog
from controlplane.db import deployments, make_engine
from controlplane.reconciler import Reconciler
from controlplane.telemetry import Telemetry
from k8s.render import render
from tests.controlplane.conftest import (
    Api,
    Cluster,
    Keystone,
    Project,
    SwallowingProxy,
    apiserver_port,
    kubeconfig_via,
    make_client,
    settings_for,
    triton,
    vllm,
)

pytestmark = pytest.mark.asyncio
ISVC = "InferenceService"
LLM = "LLMInferenceService"
MANAGED = {"app.kubernetes.io/managed-by": "sr-controlplane"}
ID_LABEL = "sr-gateway.io/deployment-id"


async def rows_of(db: str, dep_id: str) -> list[Any]:
    engine = make_engine(db)
    async with engine.connect() as conn:
        rows = (await conn.execute(sa.select(deployments).where(deployments.c.id == dep_id))).all()
    await engine.dispose()
    return list(rows)


async def add_engines(db: str, *entries: dict[str, Any]) -> None:
    engine = make_engine(db)
    await import_catalog(engine, {"engines": list(entries)})
    await engine.dispose()


@pytest_asyncio.fixture
async def client_with(env: dict[str, str], catalog_db: str) -> AsyncIterator[Any]:
    """A factory of services with changed settings, all closed at the end of the test."""
    opened: list[Api] = []

    async def make(**changes: Any) -> Api:
        api = Api(await make_client(replace(settings_for(env, catalog_db), **changes)))
        opened.append(api)
        return api

    yield make
    for api in opened:
        await api.http.close()


# -- 1. the runtime an InferenceService names ------------------------------------------------------------------


async def test_the_test_apiserver_has_the_shipped_cluster_serving_runtime(cluster: Cluster) -> None:
    shipped = next(d for d in render("base") if d["kind"] == "ClusterServingRuntime")
    installed = await cluster.serving_runtime("default", shipped["metadata"]["name"])
    assert installed is not None, "tools/testenv installs k8s/base's ClusterServingRuntime"
    assert installed["spec"] == shipped["spec"]


async def test_a_deployment_created_through_the_api_resolves_the_shipped_runtime_and_becomes_ready(
    api: Api, project: Project, cluster: Cluster
) -> None:
    d = await api.create(project.member, **triton("resolves"))
    obj = await cluster.get(ISVC, project.ns, "resolves")
    assert obj is not None and obj["spec"]["predictor"]["model"]["runtime"] == "sr-gateway-triton"
    assert await cluster.runtime_failure(project.ns, obj) is None
    url = f"http://resolves-predictor.{project.ns}.svc.cluster.local"
    written = await cluster.set_status(ISVC, project.ns, "resolves", {
        "conditions": [{"type": "PredictorReady", "status": "True"}, {"type": "Ready", "status": "True"}],
        "address": {"url": url}})
    assert "modelStatus" not in written
    _, body = await api.call("GET", "/deployments/{id}", project.member, expect=200, id=d["id"])
    assert (body["status"], body["ready"], body["spec"]["endpoint"]) == ("ready", "True", url)


async def test_a_deployment_whose_runtime_does_not_exist_shows_kserves_failure_and_never_becomes_ready(
    api: Api, project: Project, cluster: Cluster, catalog_db: str
) -> None:
    await add_engines(catalog_db, {"id": f"nort-{project.id}", "name": "no runtime", "runtime": "triton",
                                   "backend": ISVC, "configName": "no-such-runtime", "modelFormat": "onnx"})
    d = await api.create(project.member, **triton("runtimeless", engineId=f"nort-{project.id}"))
    written = await cluster.set_status(ISVC, project.ns, "runtimeless", {
        "conditions": [{"type": "Ready", "status": "True"}]})  # what a KServe that assumed a runtime would say
    assert written["modelStatus"]["lastFailureInfo"]["reason"] == "RuntimeNotRecognized"
    _, body = await api.call("GET", "/deployments/{id}", project.member, expect=200, id=d["id"])
    assert (body["status"], body["ready"]) == ("pending", "False")
    assert body["conditions"] == [{"type": "Ready", "status": "False", "reason": "RuntimeNotRecognized",
                                   "message": "Waiting for runtime to become available"}]


async def test_a_namespaced_serving_runtime_wins_over_the_cluster_one_as_in_kserve(
    api: Api, project: Project, cluster: Cluster
) -> None:
    """KServe looks in the namespace first: a project's own (here: disabled) ServingRuntime of that name wins."""
    body = {"apiVersion": "serving.kserve.io/v1alpha1", "kind": "ServingRuntime",
            "metadata": {"name": "sr-gateway-triton"},
            "spec": {"disabled": True, "supportedModelFormats": [{"name": "onnx", "version": "1"}],
                     "containers": [{"name": "kserve-container", "image": "example/x:1"}]}}
    await cluster.run(cluster.custom.create_namespaced_custom_object, "serving.kserve.io", "v1alpha1", project.ns,
                      "servingruntimes", body)
    await api.create(project.member, **triton("shadowed"))
    written = await cluster.set_status(ISVC, project.ns, "shadowed", {"conditions": [{"type": "Ready",
                                                                                       "status": "True"}]})
    assert written["modelStatus"]["lastFailureInfo"]["reason"] == "RuntimeDisabled"


# -- 2. orphans ---------------------------------------------------------------------------------------------------


@pytest_asyncio.fixture
async def slow_lossy(
    env: dict[str, str], catalog_db: str, tmp_path: Path
) -> AsyncIterator[tuple[Any, SwallowingProxy]]:
    """The service reaching the apiserver through a proxy that loses one answer, with a long Kubernetes timeout:
    a create waits on its lost answer long enough to be cancelled meanwhile."""
    proxy = SwallowingProxy(apiserver_port(env["SR_TEST_KUBE_CP_KUBECONFIG"]))
    await proxy.start()
    kubeconfig = kubeconfig_via(env["SR_TEST_KUBE_CP_KUBECONFIG"], proxy.port, tmp_path / "kubeconfig")
    tc = await make_client(replace(settings_for(env, catalog_db), kubeconfig=kubeconfig, kube_timeout_s=20.0))
    yield tc, proxy
    await tc.close()
    await proxy.close()


def reconciler_of(tc: Any, env: dict[str, str], orphan_grace_s: float = 600.0) -> Reconciler:
    app = tc.server.app
    return Reconciler(app[ENGINE], app[KUBE], Telemetry(), interval_s=1.0,
                      lease_namespace=env["SR_TEST_CP_NAMESPACE"], lease_name=f"l-{uuid.uuid4().hex[:8]}",
                      lease_duration_s=15.0, orphan_grace_s=orphan_grace_s)


async def test_a_create_cancelled_after_its_workload_was_sent_is_cleaned_up_workload_first_then_record(
    slow_lossy: tuple[Any, SwallowingProxy], api: Api, project: Project, cluster: Cluster, catalog_db: str,
    env: dict[str, str],
) -> None:
    tc, proxy = slow_lossy
    who = await tc.server.app[AUTH].authenticate(project.member)
    name = f"cancelled-{uuid.uuid4().hex[:6]}"
    proxy.armed = True  # the create (padded past the threshold) reaches the apiserver; its answer never comes
    task = asyncio.create_task(tc.server.app[SERVICE].create(
        who, vllm(name, env=[{"name": "PAD", "value": "x" * 4000}])))
    for _ in range(200):
        if (obj := await cluster.get(LLM, project.ns, name)) is not None:
            break
        await asyncio.sleep(0.05)
    assert obj is not None and proxy.swallowed == 1 and not task.done()
    task.cancel()  # e.g. the replica shuts down while the create waits on the apiserver
    with pytest.raises(asyncio.CancelledError):
        await task
    dep_id = obj["metadata"]["labels"][ID_LABEL]
    (row,) = await rows_of(catalog_db, dep_id)
    assert row.status == "deleting" and row.deleted_at is not None
    _, listed = await api.call("GET", "/deployments", project.member, expect=200)
    assert dep_id not in [i["id"] for i in listed["items"]]  # hidden, and its name is free again

    rec = reconciler_of(tc, env)
    await rec.reconcile_once()
    assert await cluster.get(LLM, project.ns, name) is None  # the workload first ...
    assert [r.status for r in await rows_of(catalog_db, dep_id)] == ["deleting"]  # ... the record stays meanwhile
    await rec.reconcile_once()
    assert await rows_of(catalog_db, dep_id) == []  # ... then the record


async def test_a_managed_workload_without_a_record_is_deleted_only_after_the_grace_period(
    api: Api, project: Project, cluster: Cluster, env: dict[str, str]
) -> None:
    await cluster.create(LLM, project.ns, "stray", labels={**MANAGED, ID_LABEL: "deployment-nobody"})
    rec = reconciler_of(api.http, env, orphan_grace_s=1.0)
    await rec.reconcile_once()
    assert f"{project.ns}/stray" in rec.found["workloads_without_record"]
    assert await cluster.get(LLM, project.ns, "stray") is not None  # within the grace: a create may be under way
    await asyncio.sleep(1.1)
    await rec.reconcile_once()
    assert await cluster.get(LLM, project.ns, "stray") is None
    never = reconciler_of(api.http, env, orphan_grace_s=-1.0)
    await cluster.create(LLM, project.ns, "kept", labels={**MANAGED, ID_LABEL: "deployment-nobody-2"})
    await never.reconcile_once()
    await asyncio.sleep(0.2)
    await never.reconcile_once()
    assert await cluster.get(LLM, project.ns, "kept") is not None  # negative grace: never deleted


# -- 3. caps on the catalog engine's resources; pinned images everywhere -------------------------------------------


async def test_an_engine_asking_for_more_than_the_caps_is_refused_unless_the_deployment_asks_for_less(
    client_with: Any, project: Project, cluster: Cluster, catalog_db: str
) -> None:
    big = f"big-{project.id}"
    await add_engines(catalog_db, {"id": big, "name": "four GPUs", "runtime": "vllm", "backend": LLM,
                                   "configName": "vllm-config", "resources": {"gpu": "4", "memory": "64Gi"}})
    api = await client_with(max_gpu=2, max_memory="128Gi")
    _, err = await api.call("POST", "/deployments", project.member, json=vllm("greedy", engineId=big), expect=400)
    assert err["error"] == "invalid_request"
    assert "resources.gpu must be at most 2" in err["message"] and big in err["message"], err
    assert await cluster.get(LLM, project.ns, "greedy") is None
    await api.create(project.member, **vllm("modest", engineId=big, resources={"gpu": "2"}))
    obj = await cluster.get(LLM, project.ns, "modest")
    assert obj is not None
    requests = obj["spec"]["template"]["containers"][0]["resources"]["requests"]
    assert requests == {"nvidia.com/gpu": "2", "memory": "64Gi"}
    # PATCH to that engine from one within the caps: the engine's GPUs would reach the pods, so refused too
    small = await api.create(project.member, **vllm("small"))
    _, err = await api.call("PATCH", "/deployments/{id}", project.member, json={"engineId": big}, expect=400,
                            id=small["id"])
    assert "resources.gpu must be at most 2" in err["message"]


@pytest.mark.parametrize("image", ["registry.example.com/vllm:latest", "registry.example.com/vllm",
                                   "vllm:latest", "registry.example.com:5000/vllm"])
async def test_an_unpinned_image_is_refused_on_create_and_on_patch(
    api: Api, shared_project: Project, cluster: Cluster, image: str
) -> None:
    name = f"img-{uuid.uuid4().hex[:6]}"
    _, err = await api.call("POST", "/deployments", shared_project.member, json=vllm(name, image=image), expect=400)
    assert err["error"] == "invalid_request" and repr(image) in err["message"], err
    assert await cluster.get(LLM, shared_project.ns, name) is None
    ok = await api.create(shared_project.member, **vllm(image="registry.example.com/vllm:0.6.3"))
    _, err = await api.call("PATCH", "/deployments/{id}", shared_project.member, json={"image": image}, expect=400,
                            id=ok["id"])
    assert repr(image) in err["message"]
    pinned = f"registry.example.com/vllm@sha256:{'cd' * 32}"
    _, body = await api.call("PATCH", "/deployments/{id}", shared_project.member, json={"image": pinned},
                             expect=200, id=ok["id"])
    assert body["spec"]["image"] == pinned


# -- 4. token scopes -----------------------------------------------------------------------------------------------


async def test_without_kubernetes_a_system_scoped_token_creates_and_only_that_scope_sees_it(
    api_nokube: Api, api: Api, project: Project, keystone: Keystone
) -> None:
    system = await keystone.system_token()
    d = await api_nokube.create(system, **vllm("platform-owned"))
    assert d["status"] == "pending" and d["backend"]["catalog"] == ""
    await api_nokube.call("GET", "/deployments/{id}", system, expect=200, id=d["id"])
    await api_nokube.call("GET", "/deployments/{id}", project.member, expect=404, id=d["id"])
    _, listed = await api_nokube.call("GET", "/deployments", project.member, expect=200)
    assert d["id"] not in [i["id"] for i in listed["items"]]
    # with Kubernetes configured the spec asks for a project-scoped token
    _, err = await api.call("POST", "/deployments", system, json=vllm("needs-project"), expect=401)
    assert err["error"] == "unauthorized"
