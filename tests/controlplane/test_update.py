"""PATCH /deployments/{id}: allowed fields, what reaches Kubernetes, and every status code of its table."""

from __future__ import annotations

import asyncio
from typing import Any

import pytest

from controlplane.catalog import import_catalog
from controlplane.db import make_engine
from tests.controlplane.conftest import DIGEST, Api, Cluster, Project, triton, vllm

pytestmark = pytest.mark.asyncio
PATH = "/deployments/{id}"


async def test_renaming_changes_the_catalog_only_and_never_touches_kubernetes(
    api: Api, project: Project, cluster: Cluster
) -> None:
    d = await api.create(project.member, **vllm("keep-name"))
    await cluster.set_status("LLMInferenceService", project.ns, "keep-name",
                             {"conditions": [{"type": "Ready", "status": "True"}]})
    _, live = await api.call("GET", PATH, project.member, expect=200, id=d["id"])
    assert live["status"] == "ready"
    before = await cluster.get("LLMInferenceService", project.ns, "keep-name")
    _, body = await api.call("PATCH", PATH, project.member, json={"name": "  New Name ", "description": "x"},
                             expect=200, id=d["id"])
    # The catalog's status: the detail read wrote nothing, and no reconciler runs here.
    assert (body["name"], body["description"], body["status"]) == ("New Name", "x", "pending")
    assert body["spec"]["k8sName"] == "keep-name" and "ready" not in body
    after = await cluster.get("LLMInferenceService", project.ns, "keep-name")
    assert before is not None and after is not None
    assert after["metadata"]["resourceVersion"] == before["metadata"]["resourceVersion"]


async def test_runtime_changes_update_the_workload_and_make_the_status_pending(
    api: Api, project: Project, cluster: Cluster
) -> None:
    d = await api.create(project.member, **vllm("tune", image="vllm:1", args=["--a"], env=[
        {"name": "A", "value": "1"}]))
    await cluster.set_status("LLMInferenceService", project.ns, "tune",
                             {"conditions": [{"type": "Ready", "status": "True"}]})
    await api.call("GET", PATH, project.member, expect=200, id=d["id"])
    _, body = await api.call("PATCH", PATH, project.member, expect=200, id=d["id"], json={
        "replicas": 3, "modelName": "qwen-v2", "image": "", "args": [], "env": [],
        "lora": {"adapters": [{"name": "a", "artifactId": "t-lora-ok"}]},
        "kvCacheOffloading": {"cpu": "2Gi"}})
    assert body["status"] == "pending"
    spec = body["spec"]
    assert spec["replicas"] == 3 and spec["modelName"] == "qwen-v2"
    assert "image" not in spec and "args" not in spec and "env" not in spec
    assert spec["lora"]["adapters"][0]["uri"] == f"oci://registry.example.com/lora/a@{DIGEST}"
    obj = await cluster.get("LLMInferenceService", project.ns, "tune")
    assert obj is not None
    assert obj["spec"]["replicas"] == 3 and obj["spec"]["model"]["name"] == "qwen-v2"
    gpu = {"nvidia.com/gpu": "1"}  # the engine's resources stay when the deployment's overrides are cleared
    assert obj["spec"]["template"]["containers"][0] == {
        "name": "main", "env": [{"name": "SERVED_MODEL_NAME", "value": "qwen-v2"}],
        "resources": {"requests": gpu, "limits": gpu}}
    assert obj["spec"]["kvCacheOffloading"]["cpu"] == "2Gi"
    _, body = await api.call("PATCH", PATH, project.member, expect=200, id=d["id"],
                             json={"lora": None, "kvCacheOffloading": None, "modelName": ""})
    assert "lora" not in body["spec"] and "kvCacheOffloading" not in body["spec"]
    assert "modelName" not in body["spec"]
    obj = await cluster.get("LLMInferenceService", project.ns, "tune")
    assert obj is not None and "lora" not in obj["spec"]["model"] and "kvCacheOffloading" not in obj["spec"]


@pytest.mark.parametrize("field", ["modelId", "artifactId", "modelUri", "resources", "labels"])
async def test_fields_that_would_replace_the_model_or_resources_are_refused_with_400(
    api: Api, shared_project: Project, field: str
) -> None:
    project = shared_project
    d = await api.create(project.member, **vllm())
    _, err = await api.call("PATCH", PATH, project.member, json={field: "x"}, expect=400, id=d["id"])
    assert err["error"] == "invalid_request" and field in err["message"]


@pytest.mark.parametrize(
    "patch",
    [{"replicas": 0}, {"replicas": "2"}, {"name": " "}, {"command": "ls"}, {"env": [{"name": 1, "value": "x"}]},
     {"kvCacheOffloading": {"cpu": "0"}}, {"lora": {"adapters": [{"name": "a", "artifactId": "t-lora-tag"}]}},
     {"unknown": 1}],
)
async def test_invalid_values_are_400_and_change_nothing(
    api: Api, shared_project: Project, cluster: Cluster, patch: dict[str, Any]
) -> None:
    project = shared_project
    d = await api.create(project.member, **vllm())
    name = d["spec"]["k8sName"]
    before = await cluster.get("LLMInferenceService", project.ns, name)
    _, err = await api.call("PATCH", PATH, project.member, json=patch, expect=400, id=d["id"])
    assert err["error"] == "invalid_request"
    after = await cluster.get("LLMInferenceService", project.ns, name)
    assert before and after and after["metadata"]["resourceVersion"] == before["metadata"]["resourceVersion"]
    _, body = await api.call("GET", PATH, project.member, expect=200, id=d["id"])
    assert body["spec"] == d["spec"] and body["name"] == d["name"]


async def test_a_body_that_is_not_json_is_400(api: Api, shared_project: Project) -> None:
    project = shared_project
    d = await api.create(project.member, **vllm())
    await api.call("PATCH", PATH, project.member, data="nope", expect=400, id=d["id"])


async def test_switching_engines_keeps_visibility_and_needs_lora_removed_first(
    api: Api, project: Project, cluster: Cluster, catalog_db: str
) -> None:
    d = await api.create(project.member, **vllm("switch", lora={"adapters": [{"name": "a",
                                                                               "artifactId": "t-lora-ok"}]}))
    _, err = await api.call("PATCH", PATH, project.member, json={"engineId": "t-sglang"}, expect=400, id=d["id"])
    assert "remove the LoRA adapters" in err["message"]
    await api.call("PATCH", PATH, project.member, json={"lora": None}, expect=200, id=d["id"])
    _, body = await api.call("PATCH", PATH, project.member, json={"engineId": "t-sglang"}, expect=200,
                             id=d["id"])
    assert body["spec"]["engineId"] == "t-sglang" and body["spec"]["engineConfigName"] == "sglang-config"
    obj = await cluster.get("LLMInferenceService", project.ns, "switch")
    assert obj is not None and obj["spec"]["baseRefs"] == [{"name": "sglang-config"}]

    engine = make_engine(catalog_db)
    await import_catalog(engine, {"engines": [
        {"id": f"e2-{project.id}", "name": "private", "runtime": "vllm", "backend": "LLMInferenceService",
         "configName": "c", "project": project.id}]})
    await engine.dispose()
    _, err = await api.call("PATCH", PATH, project.member, json={"engineId": f"e2-{project.id}"}, expect=400,
                            id=d["id"])
    assert "all be public or all belong" in err["message"]
    _, err = await api.call("PATCH", PATH, project.member, json={"engineId": "t-triton"}, expect=400, id=d["id"])
    assert "another workload kind" in err["message"]


async def test_unknown_engine_is_404_and_an_engine_with_an_invalid_backend_is_422(
    api: Api, shared_project: Project
) -> None:
    project = shared_project
    d = await api.create(project.member, **vllm())
    _, err = await api.call("PATCH", PATH, project.member, json={"engineId": "t-nope"}, expect=404, id=d["id"])
    assert err["error"] == "not_found"
    _, err = await api.call("PATCH", PATH, project.member, json={"engineId": "t-bad-backend"}, expect=422,
                            id=d["id"])
    assert err["error"] == "invalid_request"


async def test_runtime_change_of_a_workload_deleted_behind_our_back_is_404(
    api: Api, project: Project, cluster: Cluster
) -> None:
    d = await api.create(project.member, **vllm("gone"))
    await cluster.delete("LLMInferenceService", project.ns, "gone")
    _, err = await api.call("PATCH", PATH, project.member, json={"replicas": 2}, expect=404, id=d["id"])
    assert err["error"] == "not_found"
    _, body = await api.call("GET", PATH, project.member, expect=200, id=d["id"])
    assert body["spec"]["replicas"] == 1


async def test_runtime_change_of_a_workload_replaced_behind_our_back_is_409_and_leaves_it_alone(
    api: Api, project: Project, cluster: Cluster
) -> None:
    d = await api.create(project.member, **vllm("replaced"))
    await cluster.delete("LLMInferenceService", project.ns, "replaced")
    await cluster.create("LLMInferenceService", project.ns, "replaced", {"someone": "else"})
    _, err = await api.call("PATCH", PATH, project.member, json={"replicas": 2}, expect=409, id=d["id"])
    assert err["error"] == "conflict"
    obj = await cluster.get("LLMInferenceService", project.ns, "replaced")
    assert obj is not None and obj["spec"] == {"someone": "else"}


async def test_update_refused_by_kubernetes_is_403(api: Api, project: Project, cluster: Cluster) -> None:
    d = await api.create(project.member, **vllm())
    async with cluster.rbac_revoked():
        _, err = await api.call("PATCH", PATH, project.member, json={"replicas": 2}, expect=403, id=d["id"])
    assert "Kubernetes refused" in err["message"]


async def test_update_auth_errors_and_catalog_failure(
    api: Api, api_broken: Api, project: Project
) -> None:
    d = await api.create(project.member, **triton())
    _, err = await api.call("PATCH", PATH, None, json={"replicas": 2}, expect=401, id=d["id"])
    _, err = await api.call("PATCH", PATH, project.unscoped, json={"replicas": 2}, expect=401, id=d["id"])
    assert "project-scoped" in err["message"]
    # Renaming touches no workload: the spec asks for no project scope, only the write permission.
    _, err = await api.call("PATCH", PATH, project.unscoped, json={"name": "n"}, expect=403, id=d["id"])
    assert err["error"] == "forbidden"
    _, err = await api.call("PATCH", PATH, project.reader, json={"name": "n"}, expect=403, id=d["id"])
    _, err = await api.call("PATCH", PATH, project.member, json={"name": "n"}, expect=404, id="deployment-x")
    _, err = await api_broken.call("PATCH", PATH, project.member, json={"name": "n"}, expect=500, id=d["id"])
    assert err == {"error": "internal_error", "message": "updating the deployment failed"}


async def test_update_of_a_catalog_only_deployment_with_kubernetes_configured_is_422(
    api: Api, api_nokube: Api, project: Project
) -> None:
    d = await api_nokube.create(project.member, **vllm())
    _, err = await api.call("PATCH", PATH, project.member, json={"replicas": 2}, expect=422, id=d["id"])
    assert err["error"] == "invalid_request" and "no valid Kubernetes workload" in err["message"]


async def test_updates_kubernetes_rejects_are_422_and_change_nothing(
    api: Api, project: Project, cluster: Cluster
) -> None:
    d = await api.create(project.member, **vllm("old-schema"))
    before = await cluster.get("LLMInferenceService", project.ns, "old-schema")
    async with cluster.llmisvc_requires_router():
        for method, path, body in [("PATCH", PATH, {"replicas": 2}), ("POST", PATH + "/stop", None),
                                   ("POST", PATH + "/start", None)]:
            _, err = await api.call(method, path, project.member, json=body, expect=422, id=d["id"])
            assert err["error"] == "invalid_request" and "Kubernetes rejected" in err["message"], err
    after = await cluster.get("LLMInferenceService", project.ns, "old-schema")
    assert before and after and after["metadata"]["resourceVersion"] == before["metadata"]["resourceVersion"]
    _, body = await api.call("GET", PATH, project.member, expect=200, id=d["id"])
    assert (body["status"], body["spec"]["replicas"]) == ("pending", 1)


async def test_concurrent_patches_through_two_replicas_lose_no_update_and_leave_catalog_and_cluster_in_step(
    api: Api, api_short_ttl: Api, project: Project, cluster: Cluster
) -> None:
    """Two app instances on one catalog play two replicas; every PATCH changes a different field."""
    d = await api.create(project.member, **vllm("racy"))
    changes: list[dict[str, Any]] = [
        {"replicas": 3}, {"image": "vllm:2"}, {"modelName": "racy-model"}, {"args": ["--max-model-len", "4096"]},
        {"env": [{"name": "X", "value": "1"}]}, {"command": ["vllm", "serve"]},
    ]
    replicas = [api, api_short_ttl]
    results = await asyncio.gather(*(
        replicas[i % 2].call("PATCH", PATH, project.member, json=c, id=d["id"]) for i, c in enumerate(changes)
    ))
    assert [status for status, _ in results] == [200] * len(changes), results
    _, listing = await api.call("GET", "/deployments", project.member, expect=200)
    spec = next(x for x in listing["items"] if x["id"] == d["id"])["spec"]
    for change in changes:  # every acknowledged change is in the catalog ...
        for key, value in change.items():
            assert spec[key] == value, (key, spec)
    obj = await cluster.get("LLMInferenceService", project.ns, "racy")
    assert obj is not None
    live = obj["spec"]
    container = live["template"]["containers"][0]
    # ... and in the workload: the cluster holds exactly what the catalog says
    assert live["replicas"] == spec["replicas"] and live["model"]["name"] == spec["modelName"]
    assert (container["image"], container["args"], container["command"]) == (
        spec["image"], spec["args"], spec["command"])
    assert {"name": "X", "value": "1"} in container["env"]
