"""Deployment records in the database: who sees which record (the one visibility filter), and writes that
never overwrite a concurrent one.

Every write is a compare-and-set on ``deployments.version``; a lost race raises :class:`StaleRow` and the
caller merges onto the newer record. Writers of one deployment in this process also take turns through
:meth:`DeploymentStore.lock`, so the row version only has to arbitrate between replicas.
"""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator, Iterable
from contextlib import asynccontextmanager
from typing import Any

import sqlalchemy as sa
from sqlalchemy.ext.asyncio import AsyncConnection, AsyncEngine

from controlplane.auth import Principal
from controlplane.db import deployments, utcnow
from controlplane.errors import not_found
from controlplane.store.catalog import find_artifact, find_engine, find_model
from controlplane.store.records import (
    DELETING,
    ArtifactRecord,
    DeploymentRecord,
    EngineRecord,
    ModelRecord,
    visible_project,
)
from controlplane.telemetry import audit

WRITE_ATTEMPTS = 5  # read-merge-write rounds before a concurrent-write conflict is reported as 409


class StaleRow(Exception):
    """The catalog row changed between read and write (its version moved on)."""


def visible(who: Principal, *, write: bool) -> list[sa.ColumnElement[bool]]:
    """The visibility filter as a WHERE clause: live records of :func:`visible_project` (or of every project)."""
    where: list[sa.ColumnElement[bool]] = [deployments.c.deleted_at.is_(None)]
    project = visible_project(who, write=write)
    if project is not None:
        where.append(deployments.c.project_id == project)
    return where


async def _records(conn: AsyncConnection, stmt: sa.Select[Any]) -> list[DeploymentRecord]:
    return [DeploymentRecord.from_row(row) for row in (await conn.execute(stmt)).mappings()]


async def _visible_deployment(
    conn: AsyncConnection, dep_id: str, who: Principal, *, write: bool
) -> DeploymentRecord:
    if "\x00" in dep_id:  # no stored id has one, and PostgreSQL refuses it in a query
        raise not_found(f"deployment {dep_id!r} not found")
    found = await _records(conn, sa.select(deployments).where(deployments.c.id == dep_id, *visible(who, write=write)))
    if not found:
        raise not_found(f"deployment {dep_id} not found")
    record = found[0]
    if record.project_id != who.owner:  # only global read gets here: every such read is audited
        audit("cross_project_read", who=who, deployment=dep_id, result="read", target_project=record.project_id)
    return record


class CatalogReads:
    """Reads one decision makes together (a deployment and the engine, model and artifacts it names), on one
    connection: one transaction, so they see one state of the catalog where the database gives one."""

    def __init__(self, conn: AsyncConnection) -> None:
        self._conn = conn

    async def deployment(self, dep_id: str, who: Principal, *, write: bool) -> DeploymentRecord:
        """As :meth:`DeploymentStore.get`."""
        return await _visible_deployment(self._conn, dep_id, who, write=write)

    async def engine(self, engine_id: str, project: str | None) -> EngineRecord | None:
        """The engine if it is public or the project's; ``None`` otherwise (no existence leak)."""
        return await find_engine(self._conn, engine_id, project)

    async def model(self, model_id: str, project: str | None) -> ModelRecord | None:
        """The model if it is public or the project's."""
        return await find_model(self._conn, model_id, project)

    async def artifact(self, artifact_id: str, project: str | None) -> ArtifactRecord | None:
        """The artifact if it is public or the project's."""
        return await find_artifact(self._conn, artifact_id, project)


class DeploymentStore:
    """Every read and guarded write of deployment records, and the catalog reads that go with them."""

    def __init__(self, engine: AsyncEngine) -> None:
        self._db = engine
        self._locks: dict[str, asyncio.Lock] = {}

    @asynccontextmanager
    async def reads(self) -> AsyncIterator[CatalogReads]:
        """Reads that belong together (validating a create or an update), on one connection."""
        async with self._db.connect() as conn:
            yield CatalogReads(conn)

    async def get(self, dep_id: str, who: Principal, *, write: bool) -> DeploymentRecord:
        """A live deployment the caller may see (write: only in the token's project); 404 otherwise."""
        async with self._db.connect() as conn:
            return await _visible_deployment(conn, dep_id, who, write=write)

    async def fetch(self, dep_id: str) -> DeploymentRecord | None:
        """The record as stored now, deleted or not (``None`` when there is none)."""
        async with self._db.connect() as conn:
            found = await _records(conn, sa.select(deployments).where(deployments.c.id == dep_id))
        return found[0] if found else None

    async def page(self, who: Principal, page: int, page_size: int) -> tuple[int, list[DeploymentRecord]]:
        """(total, records of the page), newest first; ``page_size`` 0 means everything."""
        where = visible(who, write=False)
        if who.global_read:
            audit("cross_project_read", who=who, deployment=None, result="list", target_project="*")
        async with self._db.connect() as conn:
            total = await conn.scalar(sa.select(sa.func.count()).select_from(deployments).where(*where))
            total = int(total or 0)
            offset = (page - 1) * page_size
            if page_size and offset >= total:
                return total, []  # past the end (also keeps offsets beyond the database's integers out)
            stmt = sa.select(deployments).where(*where).order_by(deployments.c.created_at.desc(), deployments.c.id)
            if page_size:
                stmt = stmt.limit(page_size).offset(offset)
            return total, await _records(conn, stmt)

    async def all_visible(self, who: Principal) -> list[DeploymentRecord]:
        """Every record the caller may read."""
        if who.global_read:
            audit("cross_project_read", who=who, deployment=None, result="api_schemas", target_project="*")
        async with self._db.connect() as conn:
            return await _records(conn, sa.select(deployments).where(*visible(who, write=False)))

    async def kubernetes_backed(self) -> list[DeploymentRecord]:
        """The records a reconciler pass compares with the cluster: every live one created with a Kubernetes
        workload, and every ``deleting`` one (a failed create whose workload may exist). Records marked deleted are
        not read here — the catalog keeps them for good, and reading them all on every pass cost ≈ 5 KiB each
        (0.5 GiB a pass for 100,000 deployments ever made); :meth:`deleted_among` names the few a pass needs."""
        query = sa.select(deployments).where(
            deployments.c.backend_catalog == "k8s",
            sa.or_(deployments.c.deleted_at.is_(None), deployments.c.status == DELETING))
        async with self._db.connect() as conn:
            return await _records(conn, query)

    async def deleted_among(self, ids: Iterable[str]) -> set[str]:
        """Which of `ids` are records marked deleted: asked for the owners of the workloads in the cluster that no
        live record owns, so a delete that stopped half-way is finished without reading the catalog's history."""
        wanted = sorted(set(ids))
        found: set[str] = set()
        async with self._db.connect() as conn:
            for start in range(0, len(wanted), 500):  # bounded IN lists
                result = await conn.execute(sa.select(deployments.c.id).where(
                    deployments.c.id.in_(wanted[start:start + 500]), deployments.c.deleted_at.is_not(None)))
                found.update(row[0] for row in result)
        return found

    async def insert(self, record: DeploymentRecord) -> None:
        """Add a record (IntegrityError when the live-name index already has the name). Unset columns are left
        out, so they get SQL NULL or their server default (a JSON column given ``None`` would hold JSON null)."""
        values = {key: val for key, val in record.values().items() if val is not None}
        async with self._db.begin() as conn:
            await conn.execute(deployments.insert().values(**values))

    async def remove(self, dep_id: str) -> None:
        """Erase a record that never got a workload (its create failed)."""
        async with self._db.begin() as conn:
            await conn.execute(deployments.delete().where(deployments.c.id == dep_id))

    async def set_backend_uid(self, dep_id: str, uid: str | None) -> None:
        """Record the uid of the workload created for this record (the precondition of later writes)."""
        async with self._db.begin() as conn:
            await conn.execute(
                deployments.update().where(deployments.c.id == dep_id)
                .values(backend_uid=uid, version=deployments.c.version + 1)
            )

    async def write(self, record: DeploymentRecord, values: dict[str, Any]) -> None:
        """Compare-and-set on the row version read with ``record``; :class:`StaleRow` when another write won."""
        async with self._db.begin() as conn:
            res = await conn.execute(
                deployments.update()
                .where(deployments.c.id == record.id, deployments.c.version == record.version,
                       deployments.c.deleted_at.is_(None))
                .values(**values, version=record.version + 1, updated_at=utcnow())
            )
        if res.rowcount != 1:
            raise StaleRow(record.id)

    async def mark_deleting(self, dep_id: str) -> None:
        """A create failed or was cancelled after its workload was sent: the workload may exist. The record leaves
        every listing and frees its name at once; the reconciler deletes any workload carrying its id, then the
        record (:meth:`erase_deleting`)."""
        now = utcnow()
        async with self._db.begin() as conn:
            await conn.execute(
                deployments.update().where(deployments.c.id == dep_id)
                .values(status=DELETING, deleted_at=now, updated_at=now, version=deployments.c.version + 1)
            )

    async def erase_deleting(self, dep_id: str) -> None:
        """Remove a ``deleting`` record once no workload of it is left."""
        async with self._db.begin() as conn:
            await conn.execute(
                deployments.delete().where(deployments.c.id == dep_id, deployments.c.status == DELETING)
            )

    async def mark_deleted(self, dep_id: str) -> None:
        """Mark a record deleted (never erased): it leaves every listing and its name is free again."""
        now = utcnow()
        async with self._db.begin() as conn:
            await conn.execute(
                deployments.update().where(deployments.c.id == dep_id, deployments.c.deleted_at.is_(None))
                .values(deleted_at=now, updated_at=now, version=deployments.c.version + 1)
            )

    async def is_live(self, dep_id: str) -> bool:
        """Whether a deployment record exists and is not marked deleted."""
        async with self._db.connect() as conn:
            hit = await conn.scalar(
                sa.select(deployments.c.id).where(deployments.c.id == dep_id, deployments.c.deleted_at.is_(None))
            )
        return hit is not None

    def lock(self, dep_id: str) -> asyncio.Lock:
        """Writers of one deployment in this process take turns (the row version covers other replicas)."""
        lock = self._locks.get(dep_id)
        if lock is None:
            if len(self._locks) > 10_000:
                self._locks = {k: v for k, v in self._locks.items() if v.locked()}
            lock = self._locks[dep_id] = asyncio.Lock()
        return lock
