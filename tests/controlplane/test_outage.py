"""The Kubernetes API goes away mid-test: every workload operation is 502, nothing is half-written,
and once the API is back the catalog and the cluster agree and work resumes."""

from __future__ import annotations

import pytest
import sqlalchemy as sa

from controlplane.db import deployments, make_engine
from tests.controlplane.conftest import Api, Cluster, Project, vllm

pytestmark = pytest.mark.asyncio
ONE = "/deployments/{id}"


async def _live_rows(db: str, project_id: str) -> dict[str, tuple[str, int, bool]]:
    engine = make_engine(db)
    async with engine.connect() as conn:
        rows = (await conn.execute(sa.select(deployments).where(
            deployments.c.project_id == project_id, deployments.c.deleted_at.is_(None)))).all()
    await engine.dispose()
    return {r.k8s_name: (r.status, r.spec["replicas"], r.stopped) for r in rows}


async def test_with_the_kubernetes_api_stopped_writes_are_502_reads_fall_back_and_nothing_is_half_written(
    api: Api, project: Project, cluster: Cluster, catalog_db: str
) -> None:
    a = await api.create(project.member, **vllm("kept"))
    b = await api.create(project.member, **vllm("doomed"))
    before = await _live_rows(catalog_db, project.id)

    with cluster.apiserver_down():
        calls = [
            ("POST", "/deployments", vllm("newcomer"), {}),
            ("PATCH", ONE, {"replicas": 4}, {"id": a["id"]}),
            ("POST", "/deployments/{id}/stop", None, {"id": a["id"]}),
            ("POST", "/deployments/{id}/start", None, {"id": a["id"]}),
            ("DELETE", ONE, None, {"id": b["id"]}),
        ]
        for method, path, body, args in calls:
            _, err = await api.call(method, path, project.member, json=body, expect=502, **args)
            assert err["error"] == "backend_unavailable", (method, path)
        _, err = await api.call("GET", "/deployments/{id}/pods", project.member, expect=502, id=a["id"])
        assert err["error"] == "backend_unavailable"
        async with api.http.get(f"/api/v1/deployments/{a['id']}/logs",
                                headers={"x-keystone-token": project.member}) as resp:
            assert resp.status == 502 and (await resp.json())["error"] == "backend_unavailable"
        async with api.http.get(f"/api/v1/deployments/{a['id']}/exec",
                                headers={"x-keystone-token": project.member}) as resp:
            assert resp.status == 502 and (await resp.json())["error"] == "backend_unavailable"
        # reads still answer from the catalog, without live fields
        _, detail = await api.call("GET", ONE, project.member, expect=200, id=a["id"])
        assert "ready" not in detail and detail["status"] == "pending"
        _, listing = await api.call("GET", "/deployments", project.member, expect=200)
        assert listing["total"] == 2
        assert await _live_rows(catalog_db, project.id) == before

    objs = {o["metadata"]["name"]: o for o in await cluster.list("LLMInferenceService", project.ns)}
    assert set(objs) == set(before) == {"kept", "doomed"}
    assert objs["kept"]["spec"]["replicas"] == 1
    assert objs["kept"]["metadata"]["annotations"]["serving.kserve.io/stop"] == "false"

    # Back: the same requests now succeed, and the name that failed to be created is free.
    await api.create(project.member, **vllm("newcomer"))
    await api.call("PATCH", ONE, project.member, json={"replicas": 4}, expect=200, id=a["id"])
    await api.call("DELETE", ONE, project.member, expect=204, id=b["id"])
    names = {o["metadata"]["name"] for o in await cluster.list("LLMInferenceService", project.ns)}
    assert names == set(await _live_rows(catalog_db, project.id)) == {"kept", "newcomer"}
