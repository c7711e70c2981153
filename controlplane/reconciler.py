"""Background reconciliation: keeps each record's status, ``ready``, conditions and endpoint in step with
the cluster (so the list is fresh without anyone opening a detail page), finishes deletes that stopped
half-way and creates that failed after their workload was sent (``deleting`` records: the workload, then the
record), reports records whose workload vanished, and deletes workloads that have had no record for
``orphan_grace_s``.

Several replicas may run; only the holder of a ``coordination.k8s.io`` Lease reconciles. The holder renews
it on its own timer (every ``lease_renew_s``, at most half the lease duration), whatever the reconcile
interval; another replica takes over once it has seen no renewal for ``lease_duration_s`` on its own clock.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import os
import socket
import time
import uuid
from datetime import UTC, datetime
from typing import Any

from sqlalchemy.ext.asyncio import AsyncEngine

from controlplane import workload
from controlplane.db import utcnow
from controlplane.errors import ApiError
from controlplane.kube import KINDS, ClusterView, KubeBackend
from controlplane.store import DELETING, DeploymentRecord, DeploymentStore, StaleRow, namespace, workload_kind
from controlplane.telemetry import Telemetry

log = logging.getLogger(__name__)
MANAGED_SELECTOR = f"app.kubernetes.io/managed-by={workload.MANAGED_BY}"


def live_view(obj: dict[str, Any], live_pods: int | None) -> dict[str, Any]:
    """What a workload object says, as catalog values: status, stopped, ready, conditions, endpoint.
    ``live_pods`` is only needed (and only asked for) when a stop was requested."""
    conds = workload.conditions(obj)
    ready = workload.ready_value(conds)
    stopped = False
    if workload.is_stop_requested(obj):
        stopped = live_pods == 0
        status = "stopped" if stopped else "stopping"
    else:
        status = "ready" if ready == "True" else "pending"
    ep = workload.endpoint(obj) if status in ("ready", "stopping") else None
    return {"status": status, "stopped": stopped, "ready": ready, "conditions": conds or None, "endpoint": ep}


def catalog_changes(record: DeploymentRecord, view: dict[str, Any]) -> dict[str, Any] | None:
    """The catalog values that bring ``record`` in line with a workload's :func:`live_view`; ``None`` when the
    record already says the same (no write, so no row version is spent on a pass that changed nothing)."""
    spec = dict(record.spec)
    if (record.status, record.stopped, record.ready, record.conditions, spec.get("endpoint")) == (
        view["status"], view["stopped"], view["ready"], view["conditions"], view["endpoint"]
    ):
        return None
    spec["endpoint"] = view["endpoint"]
    return {"status": view["status"], "stopped": view["stopped"], "spec": spec, "ready": view["ready"],
            "conditions": view["conditions"]}


def _rfc3339_micro(value: datetime) -> str:
    return value.astimezone(UTC).strftime("%Y-%m-%dT%H:%M:%S.%fZ")


class LeaderElection:
    """One holder of a Lease at a time, renewed on its own timer (every ``renew_s``), independent of how long
    a reconcile pass or its interval takes.

    Expiry never compares the Lease's ``renewTime`` (another machine's clock) with this machine's clock: as
    client-go does, a replica notes on its own monotonic clock when it last saw the Lease record change, and
    takes over only when it has seen no change for ``leaseDurationSeconds``. The leader stops acting once its
    last successful renewal is ``duration_s - renew_s / 2`` old, before any other replica can take over.
    """

    def __init__(
        self, cluster: ClusterView, namespace: str, name: str, duration_s: float, identity: str,
        renew_s: float | None = None,
    ) -> None:
        self.cluster, self.namespace, self.name = cluster, namespace, name
        self.duration_s, self.identity = duration_s, identity
        self.renew_s = renew_s if renew_s is not None else duration_s / 3
        self._observed: tuple[Any, ...] | None = None
        self._observed_at = 0.0
        self._renewed_at: float | None = None

    @property
    def is_leader(self) -> bool:
        """Whether this replica renewed the Lease recently enough to act as the leader."""
        deadline = self.duration_s - self.renew_s / 2
        return self._renewed_at is not None and time.monotonic() - self._renewed_at < deadline

    async def run(self, on_change: Any = None) -> None:
        """Acquire or renew every ``renew_s`` until cancelled; errors only delay the next try."""
        while True:
            try:
                await self.acquire()
            except asyncio.CancelledError:
                raise
            except Exception:
                log.exception("leader election: acquiring or renewing the Lease failed")
            if on_change is not None:
                on_change(self.is_leader)
            await asyncio.sleep(self.renew_s)

    async def acquire(self) -> bool:
        """One try: renew when we hold the Lease, take it when it is free or its holder stopped renewing."""
        now = time.monotonic()
        lease = await self.cluster.read_lease(self.namespace, self.name)
        spec: dict[str, Any] = (lease or {}).get("spec") or {}
        holder = spec.get("holderIdentity")
        seen = (holder, spec.get("renewTime"), ((lease or {}).get("metadata") or {}).get("resourceVersion"))
        if seen != self._observed:
            self._observed, self._observed_at = seen, now
        duration = float(spec.get("leaseDurationSeconds") or self.duration_s)
        expired = not holder or now - self._observed_at > duration
        if lease is not None and holder != self.identity and not expired:
            self._renewed_at = None
            return False
        wall = datetime.now(UTC)  # written for people and other tools; never compared with a clock here
        body: dict[str, Any] = {
            "apiVersion": "coordination.k8s.io/v1", "kind": "Lease",
            "metadata": {"name": self.name, "namespace": self.namespace},
            "spec": {
                "holderIdentity": self.identity,
                "leaseDurationSeconds": max(1, round(self.duration_s)),
                "renewTime": _rfc3339_micro(wall),
                "acquireTime": spec.get("acquireTime") if holder == self.identity else _rfc3339_micro(wall),
                "leaseTransitions": int(spec.get("leaseTransitions") or 0) + (0 if holder == self.identity else 1),
            },
        }
        if lease is not None:
            body["metadata"]["resourceVersion"] = lease["metadata"]["resourceVersion"]
        try:
            await self.cluster.write_lease(self.namespace, body)
        except ApiError as err:
            if err.status == 409:
                self._renewed_at = None
                return False  # another replica renewed or took it first
            raise
        self._renewed_at = now  # measured from before the write: conservative
        return True


class Reconciler:
    """Runs :meth:`reconcile_once` every ``interval_s`` while this replica holds the Lease."""

    def __init__(
        self,
        engine: AsyncEngine,
        kube: KubeBackend,
        telemetry: Telemetry,
        *,
        interval_s: float,
        lease_namespace: str,
        lease_name: str,
        lease_duration_s: float,
        lease_renew_s: float | None = None,
        orphan_grace_s: float = 600.0,
    ) -> None:
        self.store = DeploymentStore(engine)
        self.kube = kube
        self.cluster = ClusterView(kube)
        self.interval_s = interval_s
        identity = f"{socket.gethostname()}-{os.getpid()}-{uuid.uuid4().hex[:6]}"
        self.election = LeaderElection(self.cluster, lease_namespace, lease_name, lease_duration_s, identity,
                                       lease_renew_s)
        self.telemetry = telemetry
        self.last_success: float | None = None
        self.started = time.monotonic()
        self.found: dict[str, list[str]] = {"records_without_workload": [], "workloads_without_record": []}
        self.orphan_grace_s = orphan_grace_s
        self._orphan_seen: dict[str, float] = {}  # uid of a managed workload with no record -> first seen
        telemetry.reconcile_lag.set_function(self.lag)

    def lag(self) -> float:
        """Seconds since the last complete pass (since start while none completed); 0 when not the leader."""
        if not self.telemetry.leader._value.get():
            return 0.0
        return time.monotonic() - (self.last_success or self.started)

    async def run(self) -> None:
        """The background loops: the election on its own timer, and a pass every ``interval_s`` while this
        replica is the leader; errors are logged and retried at the next tick, never fatal."""
        election = asyncio.create_task(self.election.run(self._leader_changed))
        try:
            while True:
                leader = self.election.is_leader
                self._leader_changed(leader)
                if not leader:  # look again soon: a new leader starts its first pass without waiting long
                    await asyncio.sleep(min(self.interval_s, self.election.renew_s))
                    continue
                try:
                    await self.reconcile_once()
                    self.last_success = time.monotonic()
                except asyncio.CancelledError:
                    raise
                except Exception:
                    log.exception("reconcile pass failed; retrying in %.1f s", self.interval_s)
                await asyncio.sleep(self.interval_s)
        finally:
            election.cancel()
            await asyncio.gather(election, return_exceptions=True)

    def _leader_changed(self, leader: bool) -> None:
        self.telemetry.leader.set(1 if leader else 0)

    async def reconcile_once(self) -> None:
        """One pass over every live Kubernetes-backed record and every managed workload."""
        rows = await self.store.kubernetes_backed()
        objects: dict[tuple[str, str, str], dict[str, Any]] = {}
        for kind in KINDS.values():
            for obj in await self.cluster.managed_workloads(kind, MANAGED_SELECTOR):
                meta = obj.get("metadata") or {}
                objects[(kind.name, meta.get("namespace", ""), meta.get("name", ""))] = obj
        live_ids = {r.id for r in rows if r.deleted_at is None}
        owners = {workload.deployment_id(obj) for obj in objects.values()}
        # records marked deleted are read only for the workloads still in the cluster that no live record owns
        deleted_ids = {r.id for r in rows if r.deleted_at is not None} | await self.store.deleted_among(
            o for o in owners if o and o not in live_ids)
        for row in rows:  # a failed create's record goes once no workload of it is left (deleted below first)
            if row.status == DELETING and row.id not in owners:
                log.warning("reconciler: the failed create %s left no workload; removing its record", row.id)
                await self.store.erase_deleting(row.id)
        vanished: list[str] = []
        for row in rows:
            row_kind = workload_kind(row)
            if row.deleted_at is not None or row_kind is None:
                continue
            found = objects.get((row_kind.name, namespace(row.project_id), row.k8s_name))
            if found is None or (row.backend_uid and (found.get("metadata") or {}).get("uid") != row.backend_uid):
                vanished.append(row.id)
                continue
            await self._sync(row, found)
        orphans: list[str] = []
        seen: dict[str, float] = {}
        now = time.monotonic()
        for (kind_name, ns, name), obj in objects.items():
            owner = workload.deployment_id(obj)
            if owner in live_ids:
                continue
            uid = (obj.get("metadata") or {}).get("uid")
            if owner in deleted_ids:  # a delete that stopped half-way, or a create that failed: finish it
                log.warning("reconciler: deleting workload %s/%s of deleted deployment %s", ns, name, owner)
                await self.kube.delete(KINDS[kind_name], ns, name, uid)
                continue
            orphans.append(f"{ns}/{name}")
            first = seen[str(uid)] = self._orphan_seen.get(str(uid), now)
            if 0 <= self.orphan_grace_s <= now - first:
                log.warning("reconciler: deleting workload %s/%s of unknown deployment %s: no record for %.0f s",
                            ns, name, owner, now - first)
                try:
                    await self.kube.delete(KINDS[kind_name], ns, name, uid)
                except ApiError as err:  # e.g. a namespace no longer bound to us: the others still get done
                    log.warning("reconciler: could not delete %s/%s: %s %s", ns, name, err.status, err.message)
        self._orphan_seen = seen
        if vanished or orphans:
            log.warning("reconciler: %d record(s) without workload %s, %d workload(s) without record %s",
                        len(vanished), vanished, len(orphans), orphans)
        self.found = {"records_without_workload": vanished, "workloads_without_record": orphans}
        self.telemetry.drift.labels(kind="records_without_workload").set(len(vanished))
        self.telemetry.drift.labels(kind="workloads_without_record").set(len(orphans))

    async def _sync(self, row: DeploymentRecord, obj: dict[str, Any]) -> None:
        """Store what the workload says when it differs from the record (row-version guarded)."""
        kind = workload_kind(row)
        assert kind is not None
        pods = None
        if workload.is_stop_requested(obj):
            pods = await self.kube.count_live_pods(kind, namespace(row.project_id), row.k8s_name)
        changes = catalog_changes(row, live_view(obj, pods))
        if changes is None:
            return
        with contextlib.suppress(StaleRow):  # a user write came first; the next pass reads the new row
            await self.store.write(row, {**changes, "observed_at": utcnow()})
