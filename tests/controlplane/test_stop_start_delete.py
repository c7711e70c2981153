"""POST .../stop, POST .../start and DELETE /deployments/{id}, with the test playing KServe's pods."""

from __future__ import annotations

from collections.abc import AsyncIterator
from contextlib import asynccontextmanager

import pytest
import sqlalchemy as sa

from controlplane.db import deployments, make_engine
from tests.controlplane.conftest import Api, Cluster, Project, triton, vllm

pytestmark = pytest.mark.asyncio
STOP, START, ONE = "/deployments/{id}/stop", "/deployments/{id}/start", "/deployments/{id}"
ANN = "serving.kserve.io/stop"


async def test_stop_is_stopping_while_pods_remain_and_stopped_once_they_have_exited(
    api: Api, project: Project, cluster: Cluster
) -> None:
    d = await api.create(project.member, **vllm("stopme", replicas=2))
    url = "http://stopme.svc"
    await cluster.set_status("LLMInferenceService", project.ns, "stopme", {
        "conditions": [{"type": "Ready", "status": "True"}], "addresses": [{"url": url}]})
    pods = [await cluster.add_pod("LLMInferenceService", project.ns, "stopme", i) for i in range(2)]
    await api.call("GET", ONE, project.member, expect=200, id=d["id"])

    _, body = await api.call("POST", STOP, project.member, expect=200, id=d["id"])
    assert (body["status"], body["stopped"]) == ("stopping", False)
    assert body["spec"]["endpoint"] == url and body["spec"]["replicas"] == 2
    obj = await cluster.get("LLMInferenceService", project.ns, "stopme")
    assert obj is not None and obj["metadata"]["annotations"][ANN] == "true"
    assert obj["spec"]["replicas"] == 2  # configuration kept for the next start

    await cluster.remove_pod(project.ns, pods[0])
    _, body = await api.call("GET", ONE, project.member, expect=200, id=d["id"])
    assert (body["status"], body["stopped"]) == ("stopping", False)
    await cluster.remove_pod(project.ns, pods[1])
    _, body = await api.call("GET", ONE, project.member, expect=200, id=d["id"])
    assert (body["status"], body["stopped"]) == ("stopped", True)
    assert "endpoint" not in body["spec"]


async def test_stop_without_pods_is_stopped_at_once_and_start_removes_the_stop_marker_and_is_pending(
    api: Api, project: Project, cluster: Cluster
) -> None:
    d = await api.create(project.member, **triton("idle", replicas=3))
    _, body = await api.call("POST", STOP, project.member, expect=200, id=d["id"])
    assert (body["status"], body["stopped"]) == ("stopped", True)
    _, body = await api.call("POST", START, project.member, expect=200, id=d["id"])
    assert (body["status"], body["stopped"]) == ("pending", False)
    obj = await cluster.get("InferenceService", project.ns, "idle")
    assert obj is not None and ANN not in (obj["metadata"].get("annotations") or {})  # the spec: removed
    assert obj["spec"]["predictor"]["minReplicas"] == 3


async def test_a_runtime_update_while_stopped_reports_pending_and_the_workload_stays_stopped(
    api: Api, project: Project, cluster: Cluster
) -> None:
    d = await api.create(project.member, **vllm("sleepy"))
    await api.call("POST", STOP, project.member, expect=200, id=d["id"])
    _, body = await api.call("PATCH", ONE, project.member, json={"replicas": 2}, expect=200, id=d["id"])
    assert (body["status"], body["stopped"]) == ("pending", False)  # the spec: runtime change -> pending
    obj = await cluster.get("LLMInferenceService", project.ns, "sleepy")
    assert obj is not None and obj["metadata"]["annotations"][ANN] == "true" and obj["spec"]["replicas"] == 2
    _, body = await api.call("GET", ONE, project.member, expect=200, id=d["id"])
    assert (body["status"], body["stopped"]) == ("stopped", True)  # live: still stopped, no pods


@pytest.mark.parametrize("path", [STOP, START])
async def test_stop_and_start_status_codes(
    api: Api, api_nokube: Api, api_broken: Api, project: Project, cluster: Cluster, path: str
) -> None:
    d = await api.create(project.member, **vllm())
    name = d["spec"]["k8sName"]
    _, err = await api.call("POST", path, None, expect=401, id=d["id"])
    _, err = await api.call("POST", path, project.unscoped, expect=401, id=d["id"])
    _, err = await api.call("POST", path, project.reader, expect=403, id=d["id"])
    assert err["error"] == "forbidden"
    _, err = await api.call("POST", path, project.member, expect=404, id="deployment-nope")
    _, err = await api_nokube.call("POST", path, project.member, expect=503, id=d["id"])
    assert err["error"] == "unavailable"
    catalog_only = await api_nokube.create(project.member, **vllm())
    _, err = await api.call("POST", path, project.member, expect=422, id=catalog_only["id"])
    assert err["error"] == "invalid_backend"
    _, err = await api_broken.call("POST", path, project.member, expect=500, id=d["id"])
    assert err["error"] == "internal_error"
    async with cluster.rbac_revoked():
        _, err = await api.call("POST", path, project.member, expect=403, id=d["id"])
        assert "Kubernetes refused" in err["message"]
    await cluster.delete("LLMInferenceService", project.ns, name)
    await cluster.create("LLMInferenceService", project.ns, name)
    _, err = await api.call("POST", path, project.member, expect=409, id=d["id"])
    assert err["error"] == "conflict"
    obj = await cluster.get("LLMInferenceService", project.ns, name)
    assert obj is not None and ANN not in (obj["metadata"].get("annotations") or {})
    await cluster.delete("LLMInferenceService", project.ns, name)
    _, err = await api.call("POST", path, project.member, expect=404, id=d["id"])
    assert err["error"] == "not_found"


async def test_delete_removes_the_workload_first_then_marks_the_record_deleted(
    api: Api, project: Project, cluster: Cluster, catalog_db: str
) -> None:
    d = await api.create(project.member, **vllm("bye"))
    _, body = await api.call("DELETE", ONE, project.member, expect=204, id=d["id"])
    assert body is None
    assert await cluster.get("LLMInferenceService", project.ns, "bye") is None
    await api.call("GET", ONE, project.member, expect=404, id=d["id"])
    _, listing = await api.call("GET", "/deployments", project.member, expect=200)
    assert listing["total"] == 0
    engine = make_engine(catalog_db)
    async with engine.connect() as conn:
        row = (await conn.execute(sa.select(deployments).where(deployments.c.id == d["id"]))).one()
    await engine.dispose()
    assert row.deleted_at is not None  # marked deleted, not erased
    again = await api.create(project.member, **vllm("bye"))  # the name is free again
    assert again["id"] != d["id"]
    await api.call("DELETE", ONE, project.member, expect=404, id=d["id"])


async def test_delete_of_a_deployment_whose_workload_is_gone_is_404_and_still_removes_the_record(
    api: Api, project: Project, cluster: Cluster
) -> None:
    d = await api.create(project.member, **vllm("vanished"))
    await cluster.delete("LLMInferenceService", project.ns, "vanished")
    _, err = await api.call("DELETE", ONE, project.member, expect=404, id=d["id"])
    assert err["error"] == "not_found" and "does not exist" in err["message"]
    await api.call("GET", ONE, project.member, expect=404, id=d["id"])
    _, listing = await api.call("GET", "/deployments", project.member, expect=200)
    assert d["id"] not in [x["id"] for x in listing["items"]]
    again = await api.create(project.member, **vllm("vanished"))  # the name is free again
    assert again["id"] != d["id"]


@asynccontextmanager
async def catalog_refuses_deletion(db: str, dep_id: str) -> AsyncIterator[None]:
    """A real database trigger makes marking this one record deleted fail (the write after the workload
    delete), on SQLite and PostgreSQL alike."""
    engine = make_engine(db)
    async with engine.begin() as conn:
        if engine.dialect.name == "sqlite":
            await conn.execute(sa.text(
                f"CREATE TRIGGER refuse_delete BEFORE UPDATE OF deleted_at ON deployments "
                f"WHEN NEW.id = '{dep_id}' BEGIN SELECT RAISE(ABORT, 'injected failure'); END"))
        else:
            await conn.execute(sa.text(
                "CREATE FUNCTION refuse_delete() RETURNS trigger AS $$ BEGIN "
                "RAISE EXCEPTION 'injected failure'; END $$ LANGUAGE plpgsql"))
            await conn.execute(sa.text(
                f"CREATE TRIGGER refuse_delete BEFORE UPDATE ON deployments FOR EACH ROW "
                f"WHEN (NEW.id = '{dep_id}' AND NEW.deleted_at IS NOT NULL) EXECUTE FUNCTION refuse_delete()"))
    try:
        yield
    finally:
        async with engine.begin() as conn:
            if engine.dialect.name == "sqlite":
                await conn.execute(sa.text("DROP TRIGGER refuse_delete"))
            else:
                await conn.execute(sa.text("DROP TRIGGER refuse_delete ON deployments"))
                await conn.execute(sa.text("DROP FUNCTION refuse_delete()"))
        await engine.dispose()


async def test_a_delete_whose_catalog_write_failed_after_the_workload_went_is_finished_by_the_next_call(
    api: Api, project: Project, cluster: Cluster, catalog_db: str
) -> None:
    d = await api.create(project.member, **vllm("halfway"))
    async with catalog_refuses_deletion(catalog_db, d["id"]):
        _, err = await api.call("DELETE", ONE, project.member, expect=500, id=d["id"])
        assert err == {"error": "internal_error", "message": "deleting the deployment failed"}
    assert await cluster.get("LLMInferenceService", project.ns, "halfway") is None
    await api.call("GET", ONE, project.member, expect=200, id=d["id"])  # half done: record still live
    _, err = await api.call("DELETE", ONE, project.member, expect=404, id=d["id"])  # the spec's 404 ...
    await api.call("GET", ONE, project.member, expect=404, id=d["id"])  # ... and the record is gone
    await api.create(project.member, **vllm("halfway"))


async def test_without_kubernetes_delete_needs_no_project_scope_but_write_permission(
    api_nokube: Api, project: Project
) -> None:
    d = await api_nokube.create(project.member, **vllm())
    _, err = await api_nokube.call("DELETE", ONE, project.unscoped, expect=403, id=d["id"])
    assert err["error"] == "forbidden"  # not "unauthorized": the spec asks for project scope only with Kubernetes
    await api_nokube.call("DELETE", ONE, project.member, expect=204, id=d["id"])


async def test_delete_failures_keep_both_the_record_and_the_workload(
    api: Api, api_broken: Api, project: Project, cluster: Cluster
) -> None:
    d = await api.create(project.member, **vllm("stay"))
    async with cluster.rbac_revoked():
        _, err = await api.call("DELETE", ONE, project.member, expect=403, id=d["id"])
        assert err["error"] == "forbidden"
    await api.call("GET", ONE, project.member, expect=200, id=d["id"])
    assert await cluster.get("LLMInferenceService", project.ns, "stay") is not None
    await cluster.delete("LLMInferenceService", project.ns, "stay")
    await cluster.create("LLMInferenceService", project.ns, "stay")
    _, err = await api.call("DELETE", ONE, project.member, expect=409, id=d["id"])
    assert err["error"] == "conflict"
    assert await cluster.get("LLMInferenceService", project.ns, "stay") is not None
    await api.call("GET", ONE, project.member, expect=200, id=d["id"])
    _, err = await api.call("DELETE", ONE, None, expect=401, id=d["id"])
    _, err = await api.call("DELETE", ONE, project.unscoped, expect=401, id=d["id"])
    _, err = await api.call("DELETE", ONE, project.reader, expect=403, id=d["id"])
    _, err = await api_broken.call("DELETE", ONE, project.member, expect=500, id=d["id"])
    assert err == {"error": "internal_error", "message": "deleting the deployment failed"}
