"""GET /deployments (pagination, catalog snapshot) and GET /deployments/{id} (live KServe status)."""

from __future__ import annotations

from typing import Any

import pytest
from jsonschema import Draft202012Validator

from tests.controlplane.conftest import OPENAPI, Api, Cluster, Project, triton, vllm

pytestmark = pytest.mark.asyncio


async def test_list_pages_newest_first_and_reports_total_page_and_page_size(api: Api, project: Project) -> None:
    made = [(await api.create(project.member, **triton(f"p{i}")))["id"] for i in range(5)]
    newest_first = list(reversed(made))
    _, body = await api.call("GET", "/deployments?page=2&page_size=2", project.member, expect=200)
    assert (body["total"], body["page"], body["page_size"]) == (5, 2, 2)
    assert [d["id"] for d in body["items"]] == newest_first[2:4]
    _, everything = await api.call("GET", "/deployments", project.member, expect=200)
    assert [d["id"] for d in everything["items"]] == newest_first


@pytest.mark.parametrize(
    ("query", "page", "page_size", "count"),
    [
        ("", 1, 0, 3),
        ("?page_size=0", 1, 0, 3),
        ("?page=0&page_size=2", 1, 2, 2),
        ("?page=-5&page_size=2", 1, 2, 2),
        ("?page_size=1000", 1, 200, 3),
        ("?page=3&page_size=2", 3, 2, 0),
        ("?page=abc&page_size=xyz", 1, 0, 3),
    ],
)
async def test_list_pagination_rules(
    api: Api, project: Project, query: str, page: int, page_size: int, count: int
) -> None:
    for i in range(3):
        await api.create(project.member, **triton(f"q{i}"))
    _, body = await api.call("GET", "/deployments" + query, project.member, expect=200)
    assert (body["page"], body["page_size"], body["total"], len(body["items"])) == (page, page_size, 3, count)


async def test_list_items_carry_no_live_ready_or_conditions_and_a_detail_read_writes_nothing(
    api: Api, project: Project, cluster: Cluster
) -> None:
    d = await api.create(project.member, **vllm("live"))
    await cluster.set_status("LLMInferenceService", project.ns, "live",
                             {"conditions": [{"type": "Ready", "status": "True"}]})
    _, detail = await api.call("GET", "/deployments/{id}", project.member, expect=200, id=d["id"])
    assert detail["status"] == "ready" and detail["ready"] == "True"
    _, body = await api.call("GET", "/deployments", project.member, expect=200)
    (item,) = body["items"]
    assert "ready" not in item and "conditions" not in item
    # Reads never write: the list shows the catalog, which only the reconciler brings in step.
    assert item["status"] == "pending" and item["updatedAt"] == d["updatedAt"]


async def test_list_shows_only_the_callers_project_and_everything_to_a_global_reader(
    api: Api, project: Project, other_project: Project, admin_token: str
) -> None:
    mine = await api.create(project.member, **triton("mine"))
    theirs = await api.create(other_project.member, **triton("theirs"))
    _, body = await api.call("GET", "/deployments", project.reader, expect=200)
    assert [d["id"] for d in body["items"]] == [mine["id"]]
    _, body = await api.call("GET", "/deployments", admin_token, expect=200)
    ids = {d["id"] for d in body["items"]}
    assert {mine["id"], theirs["id"]} <= ids and body["total"] >= 2


async def test_list_errors_401_403_and_500(api: Api, api_broken: Api, project: Project) -> None:
    _, err = await api.call("GET", "/deployments", None, expect=401)
    assert err["error"] == "unauthorized"
    _, err = await api.call("GET", "/deployments", "not-a-token", expect=401)
    assert err["error"] == "unauthorized"
    _, err = await api.call("GET", "/deployments", project.observer, expect=403)
    assert err["error"] == "forbidden"
    _, err = await api_broken.call("GET", "/deployments", project.member, expect=500)
    assert err == {"error": "internal_error", "message": "listing deployments failed"}


async def test_detail_follows_kserve_from_pending_to_ready_with_endpoint_only_once_reported(
    api: Api, project: Project, cluster: Cluster
) -> None:
    d = await api.create(project.member, **vllm("qwen"))
    _, body = await api.call("GET", "/deployments/{id}", project.member, expect=200, id=d["id"])
    assert body["status"] == "pending" and "ready" not in body and "endpoint" not in body["spec"]

    await cluster.set_status("LLMInferenceService", project.ns, "qwen", {"conditions": [
        {"type": "Ready", "status": "False", "reason": "MinimumReplicasUnavailable", "message": "0/1",
         "lastTransitionTime": "2026-09-21T00:01:00Z"}]})
    _, body = await api.call("GET", "/deployments/{id}", project.member, expect=200, id=d["id"])
    assert (body["status"], body["ready"]) == ("pending", "False")
    assert body["conditions"] == [{"type": "Ready", "status": "False", "reason": "MinimumReplicasUnavailable",
                                   "message": "0/1", "lastTransitionTime": "2026-09-21T00:01:00Z"}]
    assert "endpoint" not in body["spec"]

    url = f"http://qwen-kserve-workload-svc.{project.ns}.svc.cluster.local:8000"
    await cluster.set_status("LLMInferenceService", project.ns, "qwen", {
        "conditions": [{"type": "Ready", "status": "True"}], "addresses": [{"url": url}]})
    _, body = await api.call("GET", "/deployments/{id}", project.member, expect=200, id=d["id"])
    assert (body["status"], body["ready"], body["stopped"]) == ("ready", "True", False)
    assert body["spec"]["endpoint"] == url
    assert body["conditions"] == [{"type": "Ready", "status": "True"}]


async def test_detail_reads_inferenceservice_status_address(api: Api, project: Project, cluster: Cluster) -> None:
    d = await api.create(project.member, **triton("emb"))
    url = f"http://emb-predictor.{project.ns}.svc.cluster.local"
    await cluster.set_status("InferenceService", project.ns, "emb", {
        "conditions": [{"type": "PredictorReady", "status": "True"}, {"type": "Ready", "status": "True"}],
        "address": {"url": url}})
    _, body = await api.call("GET", "/deployments/{id}", project.member, expect=200, id=d["id"])
    assert body["status"] == "ready" and body["spec"]["endpoint"] == url
    assert [c["type"] for c in body["conditions"]] == ["PredictorReady", "Ready"]


async def test_ready_without_a_reported_service_has_no_endpoint(
    api: Api, project: Project, cluster: Cluster
) -> None:
    d = await api.create(project.member, **vllm("nosvc"))
    await cluster.set_status("LLMInferenceService", project.ns, "nosvc",
                             {"conditions": [{"type": "Ready", "status": "True"}]})
    _, body = await api.call("GET", "/deployments/{id}", project.member, expect=200, id=d["id"])
    assert body["status"] == "ready" and "endpoint" not in body["spec"]


async def test_detail_falls_back_to_the_catalog_when_the_workload_is_gone(
    api: Api, project: Project, cluster: Cluster
) -> None:
    d = await api.create(project.member, **vllm("fallback"))
    await cluster.delete("LLMInferenceService", project.ns, "fallback")
    _, body = await api.call("GET", "/deployments/{id}", project.member, expect=200, id=d["id"])
    assert body["id"] == d["id"] and "ready" not in body


async def test_detail_errors_401_403_404_and_500(api: Api, api_broken: Api, project: Project) -> None:
    d = await api.create(project.member, **triton())
    _, err = await api.call("GET", "/deployments/{id}", None, expect=401, id=d["id"])
    assert err["error"] == "unauthorized"
    _, err = await api.call("GET", "/deployments/{id}", project.observer, expect=403, id=d["id"])
    assert err["error"] == "forbidden"
    _, err = await api.call("GET", "/deployments/{id}", project.member, expect=404, id="deployment-nope")
    assert err["error"] == "not_found"
    _, err = await api_broken.call("GET", "/deployments/{id}", project.member, expect=500, id=d["id"])
    assert err == {"error": "internal_error", "message": "reading the deployment failed"}


async def test_admin_with_global_read_reads_another_projects_deployment(
    api: Api, project: Project, admin_token: str
) -> None:
    d = await api.create(project.member, **triton())
    _, body = await api.call("GET", "/deployments/{id}", admin_token, expect=200, id=d["id"])
    assert body["projectId"] == project.id


async def test_a_page_far_past_the_end_is_empty_not_a_database_error(api: Api, project: Project) -> None:
    """Found by schemathesis: the offset of page 4e23 overflowed the database's integers (500)."""
    await api.create(project.member, **triton())
    _, body = await api.call("GET", "/deployments?page=413152580614342974636032&page_size=5", project.member,
                             expect=200)
    assert (body["items"], body["total"], body["page"]) == ([], 1, 413152580614342974636032)


def _schema(schema: dict[str, Any]) -> Draft202012Validator:
    return Draft202012Validator({**schema, "components": OPENAPI["components"]})


async def test_the_schema_rejects_a_null_page_size_that_the_server_treats_as_absent(
    api: Api, project: Project
) -> None:
    param = next(p for p in OPENAPI["paths"]["/deployments"]["get"]["parameters"] if p["name"] == "page_size")
    assert not _schema(param["schema"]).is_valid(None) and not _schema(param["schema"]).is_valid(-1)
    assert "capped at 200" in param["description"]
    for _ in range(2):
        await api.create(project.member, **vllm())
    _, body = await api.call("GET", "/deployments?page_size=null", project.member, expect=200)
    assert (body["page_size"], len(body["items"])) == (0, 2)


async def test_an_empty_engine_id_is_refused_by_the_schema_and_by_the_server(api: Api, project: Project) -> None:
    schemas = OPENAPI["components"]["schemas"]
    for name in ("DeploymentCreate", "DeploymentUpdate"):
        errors = list(_schema({"$ref": f"#/components/schemas/{name}"}).iter_errors({"name": "x", "engineId": ""}))
        assert [e.path[-1] for e in errors] == ["engineId"], (name, errors)
    assert schemas["DeploymentCreate"]["properties"]["engineId"]["minLength"] == 1
    _, err = await api.call("POST", "/deployments", project.member, json=vllm(engineId=""), expect=400)
    assert "engineId" in err["message"]
    d = await api.create(project.member, **vllm())
    _, err = await api.call("PATCH", "/deployments/{id}", project.member, expect=400, id=d["id"],
                            json={"engineId": ""})
    assert "engineId" in err["message"]
