"""The background reconciler against the real apiserver: the list follows the cluster without anyone
opening a detail page, drift is found (records without workload, workloads without record), deletes left
half-way are finished, and of several replicas exactly one reconciles, elected with a Lease."""

from __future__ import annotations

import asyncio
import time
import uuid
from collections.abc import AsyncIterator, Callable
from contextlib import asynccontextmanager
from dataclasses import replace
from datetime import UTC, datetime
from typing import Any

import pytest
import sqlalchemy as sa
from aiohttp.test_utils import TestClient
from kubernetes import client

from controlplane.app import RECONCILER
from controlplane.config import Settings
from controlplane.db import deployments, make_engine
from controlplane.reconciler import Reconciler
from tests.controlplane.conftest import Api, Cluster, Project, make_client, settings_for, vllm

pytestmark = pytest.mark.asyncio
KIND = "LLMInferenceService"
MANAGED = {"app.kubernetes.io/managed-by": "sr-controlplane"}
ID_LABEL = "sr-gateway.io/deployment-id"


async def until(check: Callable[[], Any], what: str, timeout: float = 15.0) -> Any:
    """Wait on observed state (no fixed sleeps): poll ``check`` until it returns something truthy."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        result = check()
        if asyncio.iscoroutine(result):
            result = await result
        if result:
            return result
        await asyncio.sleep(0.1)
    raise AssertionError(f"timed out waiting for {what}")


@asynccontextmanager
async def replicas(
    env: dict[str, str], db: str, lease: str, count: int, duration_s: float = 2.0
) -> AsyncIterator[list[TestClient[Any, Any]]]:
    settings = replace(settings_for(env, db), reconcile_interval_s=0.2, reconcile_lease_name=lease,
                       reconcile_lease_duration_s=duration_s, reconcile_lease_renew_s=duration_s / 4)
    clients = [await make_client(settings) for _ in range(count)]
    try:
        yield clients
    finally:
        for tc in clients:
            await tc.close()


def reconciler(tc: TestClient[Any, Any]) -> Reconciler:
    return tc.server.app[RECONCILER]


def is_leader(tc: TestClient[Any, Any]) -> bool:
    return bool(reconciler(tc).telemetry.leader._value.get())


async def test_the_list_follows_the_cluster_without_anyone_reading_the_detail(
    env: dict[str, str], catalog_db: str, project: Project, cluster: Cluster
) -> None:
    async with replicas(env, catalog_db, f"lease-{uuid.uuid4().hex[:8]}", 1) as (tc,):
        api = Api(tc)
        d = await api.create(project.member, **vllm("fresh"))
        url = "http://fresh.svc"
        await cluster.set_status(KIND, project.ns, "fresh", {
            "conditions": [{"type": "Ready", "status": "True", "reason": "Up"}], "addresses": [{"url": url}]})

        async def listed() -> dict[str, Any] | None:
            _, body = await api.call("GET", "/deployments", project.member, expect=200)
            item = next(x for x in body["items"] if x["id"] == d["id"])
            return item if item["status"] == "ready" and item["spec"].get("endpoint") == url else None

        item = await until(listed, "the list to show the workload ready")
        assert "ready" not in item and "conditions" not in item  # the list still carries no live fields
        engine = make_engine(catalog_db)
        async with engine.connect() as conn:
            row = (await conn.execute(sa.select(deployments).where(deployments.c.id == d["id"]))).one()
        await engine.dispose()
        assert row.ready == "True" and row.conditions == [{"type": "Ready", "status": "True", "reason": "Up"}]
        assert row.observed_at is not None

        await api.call("POST", "/deployments/{id}/stop", project.member, expect=200, id=d["id"])
        await until(listed_status(api, project, d["id"], "stopped"), "the list to show the stop finished")


def listed_status(api: Api, project: Project, dep_id: str, status: str) -> Callable[[], Any]:
    async def check() -> bool:
        _, body = await api.call("GET", "/deployments", project.member, expect=200)
        return any(x["id"] == dep_id and x["status"] == status for x in body["items"])
    return check


async def test_drift_is_reported_and_a_delete_left_half_way_is_finished(
    env: dict[str, str], catalog_db: str, api: Api, api_nokube: Api, project: Project, cluster: Cluster
) -> None:
    gone = await api.create(project.member, **vllm("gone"))
    await cluster.delete(KIND, project.ns, "gone")  # record without workload
    await cluster.create(KIND, project.ns, "stray", labels={**MANAGED, ID_LABEL: "deployment-nobody"})
    kept = await api.create(project.member, **vllm("kept-behind"))
    # Deleted where Kubernetes is not configured: the record is marked deleted, the workload stays.
    await api_nokube.call("DELETE", "/deployments/{id}", project.member, expect=204, id=kept["id"])
    assert await cluster.get(KIND, project.ns, "kept-behind") is not None

    async with replicas(env, catalog_db, f"lease-{uuid.uuid4().hex[:8]}", 1) as (tc,):
        rec = reconciler(tc)
        await until(lambda: gone["id"] in rec.found["records_without_workload"]
                    and f"{project.ns}/stray" in rec.found["workloads_without_record"], "drift to be reported")
        await until(lambda: _absent(cluster, project.ns, "kept-behind"), "the half-done delete to be finished")
        async with tc.get("/metrics") as resp:
            text = await resp.text()
        assert 'sr_cp_reconciler_drift{kind="records_without_workload"}' in text
        assert "sr_cp_reconciler_lag_seconds" in text and "sr_cp_reconciler_leader 1.0" in text
    assert await cluster.get(KIND, project.ns, "stray") is not None  # no record: left alone for the grace period


async def _absent(cluster: Cluster, ns: str, name: str) -> bool:
    return await cluster.get(KIND, ns, name) is None


async def test_of_two_replicas_exactly_one_reconciles_and_the_other_takes_over_when_it_goes(
    env: dict[str, str], catalog_db: str, cluster: Cluster
) -> None:
    lease = f"lease-{uuid.uuid4().hex[:8]}"
    coord = client.CoordinationV1Api(cluster.api)
    async with replicas(env, catalog_db, lease, 2, duration_s=1.0) as pair:
        await until(lambda: sum(is_leader(tc) for tc in pair) == 1, "one leader")
        for _ in range(5):  # and it stays one over several passes
            assert sum(is_leader(tc) for tc in pair) == 1
            await asyncio.sleep(0.2)
        leader, follower = sorted(pair, key=is_leader, reverse=True)
        obj = await cluster.run(coord.read_namespaced_lease, lease, cluster.controlplane_namespace)
        assert obj.spec.holder_identity == reconciler(leader).election.identity
        await leader.close()
        await until(lambda: is_leader(follower), "the follower to take over", timeout=10)
        obj = await cluster.run(coord.read_namespaced_lease, lease, cluster.controlplane_namespace)
        assert obj.spec.holder_identity == reconciler(follower).election.identity


async def test_with_the_default_settings_the_leader_renews_on_its_own_timer_well_within_the_lease(
    env: dict[str, str], catalog_db: str, cluster: Cluster
) -> None:
    """Defaults: a 30 s pass interval, a 15 s Lease. Renewing only once per pass would let the Lease lapse
    between passes; the election renews every 5 s instead."""
    defaults = Settings()
    assert defaults.reconcile_lease_duration_s >= 2 * defaults.reconcile_lease_renew_s
    assert defaults.reconcile_interval_s > defaults.reconcile_lease_duration_s  # the case that used to lapse
    lease = f"lease-{uuid.uuid4().hex[:8]}"
    coord = client.CoordinationV1Api(cluster.api)
    settings = replace(settings_for(env, catalog_db), reconcile_interval_s=defaults.reconcile_interval_s,
                       reconcile_lease_name=lease)
    tc = await make_client(settings)
    try:
        await until(lambda: is_leader(tc), "the only replica to lead")
        first = (await cluster.run(coord.read_namespaced_lease, lease, cluster.controlplane_namespace)).spec

        async def renewed() -> bool:
            now = (await cluster.run(coord.read_namespaced_lease, lease, cluster.controlplane_namespace)).spec
            return bool(now.renew_time != first.renew_time)

        await until(renewed, "a renewal before the next pass", timeout=2 * defaults.reconcile_lease_renew_s + 2)
        assert is_leader(tc)
    finally:
        await tc.close()


async def test_a_lease_renewed_by_another_replica_is_not_taken_over_because_its_clock_looks_old(
    env: dict[str, str], catalog_db: str, cluster: Cluster
) -> None:
    """The holder's renewTime comes from another machine's clock (here: years behind). Only a Lease that
    stayed unchanged for its duration, measured on this replica's own clock, may be taken over."""
    lease = f"lease-{uuid.uuid4().hex[:8]}"
    coord = client.CoordinationV1Api(cluster.api)
    long_ago = datetime(2001, 1, 1, 0, 0, 0, 1, tzinfo=UTC)  # microseconds: the apiserver wants them written
    body = client.V1Lease(metadata=client.V1ObjectMeta(name=lease), spec=client.V1LeaseSpec(
        holder_identity="replica-elsewhere", lease_duration_seconds=15, renew_time=long_ago, acquire_time=long_ago))
    await cluster.run(coord.create_namespaced_lease, cluster.controlplane_namespace, body)
    tc = await make_client(replace(settings_for(env, catalog_db), reconcile_interval_s=30.0,
                                   reconcile_lease_name=lease))
    try:
        election = reconciler(tc).election
        await until(lambda: election._observed is not None, "the first look at the Lease")
        await until(lambda: election._observed_at and time.monotonic() - election._observed_at
                    > election.renew_s + 0.5, "a second look at the unchanged Lease", timeout=15)
        obj = await cluster.run(coord.read_namespaced_lease, lease, cluster.controlplane_namespace)
        assert obj.spec.holder_identity == "replica-elsewhere" and not is_leader(tc)
    finally:
        await tc.close()
