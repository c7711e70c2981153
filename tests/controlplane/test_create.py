"""POST /deployments: validation rules, the workload it submits, and every status code of its table."""

from __future__ import annotations

import asyncio
import json
from collections.abc import AsyncIterator
from dataclasses import replace
from pathlib import Path
from typing import Any

import pytest
import pytest_asyncio
import sqlalchemy as sa

from controlplane.catalog import import_catalog
from controlplane.db import deployments, make_engine
from tests.controlplane.conftest import (
    DIGEST,
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


async def catalog_rows(db: str, project_id: str) -> list[Any]:
    """Every catalog row of a project, deleted or not (what "nothing half-written" is checked against)."""
    engine = make_engine(db)
    async with engine.connect() as conn:
        rows = (await conn.execute(sa.select(deployments).where(deployments.c.project_id == project_id))).all()
    await engine.dispose()
    return list(rows)


async def test_create_returns_201_pending_and_submits_an_llminferenceservice(
    api: Api, project: Project, cluster: Cluster
) -> None:
    body = await api.create(project.member, **vllm("  Qwen Chat  ", description="d", modelName="qwen-chat",
                                                   replicas=2, labels={"team": "a"}))
    assert body["status"] == "pending" and body["stopped"] is False
    assert body["name"] == "Qwen Chat"
    assert body["projectId"] == project.id and body["projectName"] == project.name
    assert body["ownerUserId"] == project.member_user_id
    assert body["backend"] == {"catalog": "k8s", "type": "LLMInferenceService", "id": f"{project.id}/qwen-chat"}
    spec = body["spec"]
    assert spec["k8sName"] == "qwen-chat" and spec["engineName"] == "vLLM"
    assert spec["engineConfigName"] == "vllm-config" and spec["artifactName"] == "Qwen2.5-7B-Instruct"
    assert spec["modelUri"] == f"oci://registry.example.com/models/qwen@{DIGEST}"
    assert spec["replicas"] == 2 and spec["modelId"] == "t-model-qwen"
    assert body["labels"] == {"team": "a", "beacon.io/runtime": "vllm"}
    obj = await cluster.get("LLMInferenceService", project.ns, "qwen-chat")
    assert obj is not None
    assert obj["spec"]["model"] == {"uri": spec["modelUri"], "name": "qwen-chat"}
    assert obj["spec"]["replicas"] == 2
    assert obj["spec"]["baseRefs"] == [{"name": "vllm-config"}]
    assert obj["metadata"]["labels"]["sr-gateway.io/deployment-id"] == body["id"]
    assert obj["metadata"]["annotations"]["serving.kserve.io/stop"] == "false"


async def test_create_for_a_triton_engine_submits_an_inferenceservice_with_oci_prefix_completed(
    api: Api, project: Project, cluster: Cluster
) -> None:
    body = await api.create(project.member, **triton("MiniLM", replicas=0))
    assert body["spec"]["modelUri"] == f"oci://registry.example.com/models/minilm@{DIGEST}"
    assert body["spec"]["replicas"] == 1
    assert "artifactId" not in body["spec"]
    obj = await cluster.get("InferenceService", project.ns, "minilm")
    assert obj is not None
    pred = obj["spec"]["predictor"]
    assert pred["minReplicas"] == 1 and pred["maxReplicas"] == 1
    assert pred["model"]["runtime"] == "sr-gateway-triton"
    assert pred["model"]["storageUri"] == body["spec"]["modelUri"]


@pytest.mark.parametrize(
    ("body", "fragment"),
    [
        ({"engineId": "t-vllm", "artifactId": "t-art-qwen"}, "name"),
        ({"name": "   ", "engineId": "t-vllm", "artifactId": "t-art-qwen"}, "name"),
        ({"name": "x", "artifactId": "t-art-qwen"}, "engineId"),
        ({"name": "x", "engineId": "t-vllm"}, "artifactId or modelUri"),
        ({"name": "x", "engineId": "t-nope", "artifactId": "t-art-qwen"}, "engine t-nope"),
        ({"name": "x", "engineId": "t-vllm", "artifactId": "t-nope"}, "artifact t-nope"),
        ({"name": "x", "engineId": "t-vllm", "artifactId": "t-art-notready"}, "not ready"),
        ({"name": "x", "engineId": "t-vllm", "artifactId": "t-art-qwen", "modelId": "t-nope"}, "model t-nope"),
        ({"name": "x", "engineId": "t-vllm", "modelUri": "hf://Qwen/Qwen2.5"}, "OCI"),
        ({"name": "x", "engineId": "t-vllm", "artifactId": "t-art-qwen", "replicas": "2"}, "replicas"),
        ({"name": "x", "engineId": "t-vllm", "artifactId": "t-art-qwen", "labels": {"a": 1}}, "labels"),
        ({"name": "x", "engineId": "t-vllm", "artifactId": "t-art-qwen", "env": [{"name": "A"}]}, "env"),
        ({"name": "x", "engineId": "t-vllm", "artifactId": "t-art-qwen", "resources": {"cpu": "lots"}}, "cpu"),
        ({"name": "x", "engineId": "t-vllm", "artifactId": "t-art-qwen", "bogus": 1}, "unknown fields"),
    ],
)
async def test_create_rejects_an_invalid_request_with_400_and_writes_nothing(
    api: Api, shared_project: Project, catalog_db: str, body: dict[str, Any], fragment: str
) -> None:
    project = shared_project
    before = len(await catalog_rows(catalog_db, project.id))
    _, err = await api.call("POST", "/deployments", project.member, json=body, expect=400)
    assert err["error"] == "invalid_request" and fragment in err["message"]
    assert len(await catalog_rows(catalog_db, project.id)) == before


async def test_create_rejects_a_body_that_is_not_a_json_object_with_400(api: Api, shared_project: Project) -> None:
    project = shared_project
    _, err = await api.call("POST", "/deployments", project.member, data="{not json", expect=400)
    assert err["error"] == "invalid_request"
    _, err = await api.call("POST", "/deployments", project.member, json=[1, 2], expect=400)
    assert err["error"] == "invalid_request"


async def _private_catalog(db: str, project: Project) -> None:
    engine = make_engine(db)
    p = project.id
    await import_catalog(engine, {
        "engines": [{"id": f"e-{p}", "name": "private vLLM", "runtime": "vllm", "backend": "LLMInferenceService",
                     "configName": "vllm-config", "project": p, "resources": {"gpu": "1"}}],
        "models": [{"id": f"m-{p}", "name": "private model", "project": p}],
        "artifacts": [
            {"id": f"a-{p}", "name": "private artifact", "project": p, "uri": f"oci://r.example.com/p@{DIGEST}"},
            {"id": f"l-{p}", "name": "private lora", "project": p, "lora": True,
             "uri": f"oci://r.example.com/l@{DIGEST}"},
        ],
    })
    await engine.dispose()


async def test_the_engines_image_command_args_env_and_resources_from_the_catalog_reach_the_workload(
    api: Api, project: Project, cluster: Cluster, catalog_db: str
) -> None:
    p = project.id
    container = {"image": "registry.example.com/engine:2.1", "command": ["serve"], "args": ["--port", "8080"],
                 "env": [{"name": "MODE", "value": "engine"}, {"name": "KEEP", "value": "1"}],
                 "resources": {"cpu": "2", "memory": "3Gi"}}
    engine = make_engine(catalog_db)
    await import_catalog(engine, {"engines": [
        {"id": f"ti-{p}", "name": "engine with a container", "runtime": "triton", "backend": "InferenceService",
         "configName": "sr-gateway-triton", "modelFormat": "onnx", **container},
        {"id": f"tl-{p}", "name": "vLLM with a container", "runtime": "vllm", "backend": "LLMInferenceService",
         "configName": "vllm-config", **container}]})
    await engine.dispose()
    two = {"cpu": "2", "memory": "3Gi"}
    await api.create(project.member, **triton("from-engine", engineId=f"ti-{p}"))
    obj = await cluster.get("InferenceService", project.ns, "from-engine")
    assert obj is not None
    model = obj["spec"]["predictor"]["model"]
    assert (model["image"], model["command"], model["args"]) == ("registry.example.com/engine:2.1", ["serve"],
                                                                 ["--port", "8080"])
    assert model["env"] == container["env"]
    assert model["resources"] == {"requests": two, "limits": two}
    # the deployment's own values win field by field: env by name, resources by key
    await api.create(project.member, **vllm("overridden", engineId=f"tl-{p}", image="vllm:9",
                                            env=[{"name": "MODE", "value": "mine"}], resources={"cpu": "1"}))
    llm = await cluster.get("LLMInferenceService", project.ns, "overridden")
    assert llm is not None
    main = llm["spec"]["template"]["containers"][0]
    assert (main["image"], main["command"], main["args"]) == ("vllm:9", ["serve"], ["--port", "8080"])
    assert main["env"] == [{"name": "MODE", "value": "mine"}, {"name": "KEEP", "value": "1"}]
    mixed = {"cpu": "1", "memory": "3Gi"}
    assert main["resources"] == {"requests": mixed, "limits": mixed}


async def test_create_accepts_resources_that_are_all_private_to_the_project(
    api: Api, project: Project, catalog_db: str
) -> None:
    await _private_catalog(catalog_db, project)
    p = project.id
    body = await api.create(project.member, name="mine", engineId=f"e-{p}", modelId=f"m-{p}",
                            artifactId=f"a-{p}", lora={"adapters": [{"name": "x", "artifactId": f"l-{p}"}]})
    assert body["spec"]["engineId"] == f"e-{p}"


@pytest.mark.parametrize("mix", ["private-engine", "private-model", "private-artifact", "private-lora"])
async def test_create_refuses_mixing_public_and_private_resources(
    api: Api, shared_project: Project, catalog_db: str, mix: str
) -> None:
    project = shared_project
    await _private_catalog(catalog_db, project)
    p = project.id
    body = vllm("mixed")
    if mix == "private-engine":
        body["engineId"] = f"e-{p}"
    elif mix == "private-model":
        body["modelId"] = f"m-{p}"
    elif mix == "private-artifact":
        body["artifactId"] = f"a-{p}"
    else:
        body["lora"] = {"adapters": [{"name": "x", "artifactId": f"l-{p}"}]}
    _, err = await api.call("POST", "/deployments", project.member, json=body, expect=400)
    assert "all be public or all belong" in err["message"]


async def test_create_cannot_use_another_projects_private_resources(
    api: Api, project: Project, other_project: Project, catalog_db: str
) -> None:
    await _private_catalog(catalog_db, other_project)
    o = other_project.id
    _, err = await api.call("POST", "/deployments", project.member, json=vllm(engineId=f"e-{o}"), expect=400)
    assert f"engine e-{o} not found" in err["message"]
    _, err = await api.call("POST", "/deployments", project.member, json=vllm(artifactId=f"a-{o}"), expect=400)
    assert f"artifact a-{o} not found" in err["message"]


@pytest.mark.parametrize(
    ("extra", "fragment"),
    [
        ({"engineId": "t-triton"}, "only supported for vLLM"),
        ({"engineId": "t-vllm-cpu"}, "requires an engine or deployment with accelerators"),
        ({"engineId": "t-vllm-kvt"}, "--kv-transfer-config"),
        ({"args": ["--kv-transfer-config", "{}"]}, "--kv-transfer-config"),
        ({"command": ["vllm", "serve", "--kv-transfer-config={}"]}, "--kv-transfer-config"),
        ({"env": [{"name": "VLLM_ARGS", "value": "--kv-transfer-config {}"}]}, "--kv-transfer-config"),
    ],
)
async def test_kv_cache_offloading_needs_vllm_with_accelerators_and_no_manual_kv_transfer_config(
    api: Api, shared_project: Project, extra: dict[str, Any], fragment: str
) -> None:
    project = shared_project
    body = vllm(kvCacheOffloading={"cpu": "8Gi"}, **extra)
    if extra.get("engineId") == "t-triton":
        body.pop("artifactId"), body.pop("modelId")
        body["modelUri"] = f"r.example.com/m@{DIGEST}"
    _, err = await api.call("POST", "/deployments", project.member, json=body, expect=400)
    assert fragment in err["message"]


@pytest.mark.parametrize("kv", [{"cpu": "0Gi"}, {"cpu": "-1Gi"}, {}, {"cpu": "8Gi", "evictionPolicy": "fifo"}])
async def test_kv_cache_offloading_needs_a_positive_cpu_quantity_and_a_known_policy(
    api: Api, shared_project: Project, kv: dict[str, Any]
) -> None:
    project = shared_project
    await api.call("POST", "/deployments", project.member, json=vllm(kvCacheOffloading=kv), expect=400)


async def test_kv_cache_offloading_is_accepted_on_vllm_with_accelerators_and_defaults_to_lru(
    api: Api, project: Project, cluster: Cluster
) -> None:
    body = await api.create(project.member, **vllm("kv", kvCacheOffloading={"cpu": "8Gi"}))
    assert body["spec"]["kvCacheOffloading"] == {"cpu": "8Gi", "evictionPolicy": "lru"}
    obj = await cluster.get("LLMInferenceService", project.ns, "kv")
    assert obj is not None and obj["spec"]["kvCacheOffloading"] == {"cpu": "8Gi", "evictionPolicy": "lru"}
    # A deployment-level accelerator override makes a CPU engine eligible.
    body = await api.create(project.member, **vllm("kv-gpu", engineId="t-vllm-cpu", resources={"gpu": "1"},
                                                   kvCacheOffloading={"cpu": "4Gi", "evictionPolicy": "arc"}))
    assert body["spec"]["resources"] == {"gpu": "1"}


@pytest.mark.parametrize(
    ("adapters", "engine", "fragment"),
    [
        ([{"name": "a", "artifactId": "t-lora-ok"}], "t-sglang", "only supported for vLLM"),
        ([{"name": "a", "artifactId": "t-lora-ok"}, {"name": "a", "artifactId": "t-lora-ok2"}], "t-vllm",
         "duplicate"),
        ([{"name": "a", "artifactId": "t-lora-notready"}], "t-vllm", "must be ready"),
        ([{"name": "a", "artifactId": "t-lora-noflag"}], "t-vllm", "flagged as LoRA"),
        ([{"name": "a", "artifactId": "t-lora-tag"}], "t-vllm", "pinned by digest"),
        ([{"name": "a", "artifactId": "t-nope"}], "t-vllm", "not found"),
        ([{"artifactId": "t-lora-ok"}], "t-vllm", "required"),
    ],
)
async def test_lora_is_only_for_vllm_with_unique_names_and_ready_flagged_digest_pinned_artifacts(
    api: Api, shared_project: Project, adapters: list[dict[str, str]], engine: str, fragment: str
) -> None:
    project = shared_project
    body = vllm(engineId=engine, lora={"adapters": adapters})
    _, err = await api.call("POST", "/deployments", project.member, json=body, expect=400)
    assert fragment in err["message"]


async def test_lora_adapters_are_resolved_to_their_digest_pinned_uris(
    api: Api, project: Project, cluster: Cluster
) -> None:
    adapters = [{"name": "a", "artifactId": "t-lora-ok", "modelId": "t-model-qwen"},
                {"name": "b", "artifactId": "t-lora-ok2"}]
    body = await api.create(project.member, **vllm("with-lora", lora={"adapters": adapters}))
    assert body["spec"]["lora"]["adapters"] == [
        {"name": "a", "artifactId": "t-lora-ok", "modelId": "t-model-qwen",
         "uri": f"oci://registry.example.com/lora/a@{DIGEST}"},
        {"name": "b", "artifactId": "t-lora-ok2", "uri": f"oci://registry.example.com/lora/b@{DIGEST}"},
    ]
    obj = await cluster.get("LLMInferenceService", project.ns, "with-lora")
    assert obj is not None
    assert [a["uri"] for a in obj["spec"]["model"]["lora"]["adapters"]] == [
        a["uri"] for a in body["spec"]["lora"]["adapters"]
    ]
    empty = await api.create(project.member, **vllm("empty-lora", lora={"adapters": []}))
    assert "lora" not in empty["spec"]


async def test_a_name_that_leaves_no_dns_label_gets_a_generated_workload_name(api: Api, project: Project) -> None:
    body = await api.create(project.member, **vllm("模型部署"))
    assert body["name"] == "模型部署"
    assert body["spec"]["k8sName"].startswith("deployment-")


async def test_create_with_an_existing_name_is_409_conflict(api: Api, project: Project, catalog_db: str) -> None:
    await api.create(project.member, **vllm("Same Name"))
    _, err = await api.call("POST", "/deployments", project.member, json=vllm("same-name"), expect=409)
    assert err["error"] == "conflict"
    assert len(await catalog_rows(catalog_db, project.id)) == 1


async def test_concurrent_creates_of_the_same_name_have_exactly_one_winner_and_catalog_agrees_with_cluster(
    api: Api, project: Project, cluster: Cluster, catalog_db: str
) -> None:
    results = await asyncio.gather(
        *(api.call("POST", "/deployments", project.member, json=vllm("race")) for _ in range(4))
    )
    codes = sorted(code for code, _ in results)
    assert codes == [201, 409, 409, 409]
    winner = next(body for code, body in results if code == 201)
    rows = await catalog_rows(catalog_db, project.id)
    assert [r.id for r in rows] == [winner["id"]]
    objs = await cluster.list("LLMInferenceService", project.ns)
    assert [o["metadata"]["labels"]["sr-gateway.io/deployment-id"] for o in objs] == [winner["id"]]


async def test_a_foreign_workload_with_the_same_name_is_409_and_the_catalog_keeps_nothing(
    api: Api, project: Project, cluster: Cluster, catalog_db: str
) -> None:
    await cluster.create("LLMInferenceService", project.ns, "taken")
    _, err = await api.call("POST", "/deployments", project.member, json=vllm("taken"), expect=409)
    assert err["error"] == "conflict"
    assert await catalog_rows(catalog_db, project.id) == []


async def test_create_without_the_project_namespace_is_404_and_the_catalog_keeps_nothing(
    api: Api, keystone: Keystone, catalog_db: str
) -> None:
    bare = await keystone.project()  # no namespace provisioned
    _, err = await api.call("POST", "/deployments", bare.member, json=vllm(), expect=404)
    assert err["error"] == "not_found"
    assert await catalog_rows(catalog_db, bare.id) == []


async def test_create_in_a_terminating_namespace_is_403_refused_by_kubernetes_and_keeps_nothing(
    api: Api, keystone: Keystone, cluster: Cluster, catalog_db: str
) -> None:
    p = await keystone.project()
    await cluster.provision(p.ns)
    await cluster.terminate_namespace(p.ns)
    _, err = await api.call("POST", "/deployments", p.member, json=vllm(), expect=403)
    assert err["error"] == "forbidden" and "being terminated" in err["message"]
    assert await catalog_rows(catalog_db, p.id) == []


async def test_create_refused_by_kubernetes_rbac_is_403_and_keeps_nothing(
    api: Api, project: Project, cluster: Cluster, catalog_db: str
) -> None:
    async with cluster.rbac_revoked():
        _, err = await api.call("POST", "/deployments", project.member, json=vllm(), expect=403)
    assert err["error"] == "forbidden" and "Kubernetes refused" in err["message"]
    assert await catalog_rows(catalog_db, project.id) == []


async def test_create_with_labels_kubernetes_rejects_is_422_and_the_catalog_keeps_nothing(
    api: Api, project: Project, catalog_db: str, cluster: Cluster
) -> None:
    _, err = await api.call("POST", "/deployments", project.member, json=vllm(labels={"bad key!": "x"}),
                            expect=422)
    assert err["error"] == "invalid_request" and "Kubernetes rejected" in err["message"]
    assert await catalog_rows(catalog_db, project.id) == []
    assert await cluster.list("LLMInferenceService", project.ns) == []


async def test_an_engine_with_an_invalid_backend_reference_is_422(api: Api, shared_project: Project) -> None:
    project = shared_project
    _, err = await api.call("POST", "/deployments", project.member, json=vllm(engineId="t-bad-backend"),
                            expect=422)
    assert err["error"] == "invalid_request" and "invalid backend" in err["message"]


async def test_create_without_a_token_is_401_and_without_project_scope_is_401(
    api: Api, shared_project: Project
) -> None:
    project = shared_project
    _, err = await api.call("POST", "/deployments", None, json=vllm(), expect=401)
    assert err["error"] == "unauthorized"
    _, err = await api.call("POST", "/deployments", project.unscoped, json=vllm(), expect=401)
    assert "project-scoped" in err["message"]


async def test_create_without_write_permission_is_403(api: Api, shared_project: Project) -> None:
    project = shared_project
    for token in (project.reader, project.observer):
        _, err = await api.call("POST", "/deployments", token, json=vllm(), expect=403)
        assert err["error"] == "forbidden"


async def test_create_when_the_catalog_fails_is_500(api_broken: Api, shared_project: Project) -> None:
    project = shared_project
    _, err = await api_broken.call("POST", "/deployments", project.member, json=vllm(), expect=500)
    assert err == {"error": "internal_error", "message": "creating the deployment failed"}


async def test_create_without_kubernetes_configured_records_a_catalog_only_deployment(
    api_nokube: Api, project: Project, cluster: Cluster
) -> None:
    body = await api_nokube.create(project.member, **vllm("catalog-only"))
    assert body["status"] == "pending" and body["backend"]["catalog"] == ""
    assert await cluster.list("LLMInferenceService", project.ns) == []


KIND = "LLMInferenceService"
MANAGED = {"app.kubernetes.io/managed-by": "sr-controlplane"}
ID_LABEL = "sr-gateway.io/deployment-id"


@pytest_asyncio.fixture
async def lossy(
    env: dict[str, str], catalog_db: str, tmp_path: Path
) -> AsyncIterator[tuple[Api, SwallowingProxy]]:
    """The service reaching the real apiserver through a proxy that can lose one answer."""
    proxy = SwallowingProxy(apiserver_port(env["SR_TEST_KUBE_CP_KUBECONFIG"]))
    await proxy.start()
    kubeconfig = kubeconfig_via(env["SR_TEST_KUBE_CP_KUBECONFIG"], proxy.port, tmp_path / "kubeconfig")
    tc = await make_client(replace(settings_for(env, catalog_db), kubeconfig=kubeconfig, kube_timeout_s=1.5))
    yield Api(tc), proxy
    await tc.close()
    await proxy.close()


async def test_a_create_that_times_out_after_the_apiserver_accepted_it_adopts_the_workload(
    lossy: tuple[Api, SwallowingProxy], api: Api, project: Project, cluster: Cluster, catalog_db: str
) -> None:
    lapi, proxy = lossy
    proxy.armed = True  # the create request (padded past the threshold) is the one whose answer is lost
    body = await lapi.create(project.member, **vllm("slowpoke", env=[{"name": "PAD", "value": "x" * 4000}]))
    assert proxy.swallowed == 1
    obj = await cluster.get(KIND, project.ns, "slowpoke")
    assert obj is not None and obj["metadata"]["labels"][ID_LABEL] == body["id"]
    rows = [r for r in await catalog_rows(catalog_db, project.id) if r.deleted_at is None]
    assert [(r.id, r.backend_uid) for r in rows] == [(body["id"], obj["metadata"]["uid"])]
    # Adopted for good: later writes pass the uid precondition.
    await api.call("PATCH", "/deployments/{id}", project.member, json={"replicas": 2}, expect=200, id=body["id"])


async def test_a_workload_orphaned_by_an_earlier_create_is_replaced_by_the_next_create_of_that_name(
    api: Api, project: Project, cluster: Cluster
) -> None:
    orphan = await cluster.create(KIND, project.ns, "leftover", labels={**MANAGED, ID_LABEL: "deployment-gone"})
    body = await api.create(project.member, **vllm("leftover"))
    obj = await cluster.get(KIND, project.ns, "leftover")
    assert obj is not None and obj["metadata"]["uid"] != orphan["metadata"]["uid"]
    assert obj["metadata"]["labels"][ID_LABEL] == body["id"]


async def test_a_workload_of_a_live_deployment_keeps_its_name_taken(
    api: Api, project: Project, cluster: Cluster, catalog_db: str
) -> None:
    alive = await api.create(project.member, **vllm("alive"))
    squat = await cluster.create(KIND, project.ns, "squat", labels={**MANAGED, ID_LABEL: alive["id"]})
    _, err = await api.call("POST", "/deployments", project.member, json=vllm("squat"), expect=409)
    assert err["error"] == "conflict"
    obj = await cluster.get(KIND, project.ns, "squat")
    assert obj is not None and obj["metadata"]["uid"] == squat["metadata"]["uid"]
    assert [r.id for r in await catalog_rows(catalog_db, project.id) if r.deleted_at is None] == [alive["id"]]


@pytest.mark.parametrize(("fields", "fragment"), [
    ({"name": "n" * 256}, "at most 255"),
    ({"resources": {"cpu": 4}}, "resources.cpu must be a string"),
    ({"resources": {"memory": "1" * 65}}, "resources.memory must be a string"),
])
async def test_create_limits_match_the_openapi_document(
    api: Api, shared_project: Project, fields: dict[str, Any], fragment: str
) -> None:
    _, err = await api.call("POST", "/deployments", shared_project.member, json=vllm(**fields), expect=400)
    assert err["error"] == "invalid_request" and fragment in err["message"], err


async def test_strings_no_database_can_store_are_refused_with_400_not_500(
    api: Api, shared_project: Project
) -> None:
    """Found by schemathesis: PostgreSQL refuses NUL in text, so such a body used to fail with 500."""
    for body in (vllm("nul\u0000name"), vllm(engineId="t-\u0000vllm"), vllm(labels={"a": "\ud800"})):
        _, err = await api.call("POST", "/deployments", shared_project.member,
                                data=json.dumps(body, ensure_ascii=True), expect=400)
        assert err["error"] == "invalid_request" and "NUL" in err["message"]
    await api.call("GET", "/deployments/{id}", shared_project.member, expect=404, id="deployment-%00")
