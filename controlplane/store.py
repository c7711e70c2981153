"""The deployments catalog as the endpoints use it: who sees which record (the one visibility filter),
which workload kind a record has (the one kind check), and writes that never overwrite a concurrent one.

Every write is a compare-and-set on ``deployments.version``; a lost race raises :class:`StaleRow` and
the caller merges onto the newer row. Writers of one deployment in this process also take turns through
:meth:`DeploymentStore.lock`, so the row version only has to arbitrate between replicas.
"""

from __future__ import annotations

import asyncio
from typing import Any

import sqlalchemy as sa
from sqlalchemy.ext.asyncio import AsyncConnection, AsyncEngine

from controlplane.auth import Principal
from controlplane.db import deployments, utcnow
from controlplane.errors import not_found, unprocessable
from controlplane.kube import KINDS, Kind
from controlplane.telemetry import audit

# The status of a record whose create failed after its workload was sent (never shown: the record is hidden).
DELETING = "deleting"
WRITE_ATTEMPTS = 5  # read-merge-write rounds before a concurrent-write conflict is reported as 409


class StaleRow(Exception):
    """The catalog row changed between read and write (its version moved on)."""


def namespace(project_id: str) -> str:
    """One namespace per project, named after the project id (Keystone ids are DNS-safe hex)."""
    return project_id.lower()


def workload_kind(row: Any) -> Kind | None:
    """The KServe kind of a record's workload; ``None`` for a record created without Kubernetes."""
    if row.backend_catalog != "k8s" or row.backend_type not in KINDS:
        return None
    return KINDS[row.backend_type]


def require_kind(row: Any, code: str) -> Kind:
    """The workload kind, or 422 with ``code`` (the spec names invalid_backend or invalid_request)."""
    kind = workload_kind(row)
    if kind is None:
        raise unprocessable(f"deployment {row.id} has no valid Kubernetes workload", error=code)
    return kind


def visible(who: Principal, *, write: bool) -> list[sa.ColumnElement[bool]]:
    """Live records the caller may see: their project's, or every project's for global readers (reads)."""
    where: list[sa.ColumnElement[bool]] = [deployments.c.deleted_at.is_(None)]
    if write or not who.global_read:
        where.append(deployments.c.project_id == who.owner)
    return where


class DeploymentStore:
    """Catalog reads and guarded writes of deployment records."""

    def __init__(self, engine: AsyncEngine) -> None:
        self.db = engine
        self._locks: dict[str, asyncio.Lock] = {}

    async def get(self, dep_id: str, who: Principal, *, write: bool, conn: AsyncConnection | None = None) -> Any:
        """A live deployment the caller may see (write: only in the token's project); 404 otherwise."""
        if "\x00" in dep_id:  # no stored id has one, and PostgreSQL refuses it in a query
            raise not_found(f"deployment {dep_id!r} not found")
        stmt = sa.select(deployments).where(deployments.c.id == dep_id, *visible(who, write=write))
        if conn is None:
            async with self.db.connect() as own:
                row = (await own.execute(stmt)).first()
        else:
            row = (await conn.execute(stmt)).first()
        if row is None:
            raise not_found(f"deployment {dep_id} not found")
        if row.project_id != who.owner:  # only global read gets here: every such read is audited
            audit("cross_project_read", who=who, deployment=dep_id, result="read", target_project=row.project_id)
        return row

    async def fetch(self, dep_id: str) -> Any:
        """The record as stored now, deleted or not (``None`` when there is none)."""
        async with self.db.connect() as conn:
            return (await conn.execute(sa.select(deployments).where(deployments.c.id == dep_id))).first()

    async def page(self, who: Principal, page: int, page_size: int) -> tuple[int, list[Any]]:
        """(total, rows of the page), newest first; ``page_size`` 0 means everything."""
        where = visible(who, write=False)
        if who.global_read:
            audit("cross_project_read", who=who, deployment=None, result="list", target_project="*")
        async with self.db.connect() as conn:
            total = await conn.scalar(sa.select(sa.func.count()).select_from(deployments).where(*where))
            total = int(total or 0)
            offset = (page - 1) * page_size
            if page_size and offset >= total:
                return total, []  # past the end (also keeps offsets beyond the database's integers out)
            stmt = sa.select(deployments).where(*where).order_by(deployments.c.created_at.desc(), deployments.c.id)
            if page_size:
                stmt = stmt.limit(page_size).offset(offset)
            rows = (await conn.execute(stmt)).all()
        return total, list(rows)

    async def all_visible(self, who: Principal) -> list[Any]:
        """Every record the caller may read."""
        if who.global_read:
            audit("cross_project_read", who=who, deployment=None, result="api_schemas", target_project="*")
        async with self.db.connect() as conn:
            return list((await conn.execute(sa.select(deployments).where(*visible(who, write=False)))).all())

    async def insert(self, record: dict[str, Any]) -> None:
        """Add a record (IntegrityError when the live-name index already has the name)."""
        async with self.db.begin() as conn:
            await conn.execute(deployments.insert().values(**record))

    async def remove(self, dep_id: str) -> None:
        """Erase a record that never got a workload (its create failed)."""
        async with self.db.begin() as conn:
            await conn.execute(deployments.delete().where(deployments.c.id == dep_id))

    async def set_backend_uid(self, dep_id: str, uid: str | None) -> None:
        """Record the uid of the workload created for this record (the precondition of later writes)."""
        async with self.db.begin() as conn:
            await conn.execute(
                deployments.update().where(deployments.c.id == dep_id)
                .values(backend_uid=uid, version=deployments.c.version + 1)
            )

    async def write(self, row: Any, values: dict[str, Any]) -> None:
        """Compare-and-set on the row version read with ``row``; :class:`StaleRow` when another write won."""
        async with self.db.begin() as conn:
            res = await conn.execute(
                deployments.update()
                .where(deployments.c.id == row.id, deployments.c.version == row.version,
                       deployments.c.deleted_at.is_(None))
                .values(**values, version=row.version + 1, updated_at=utcnow())
            )
        if res.rowcount != 1:
            raise StaleRow(row.id)

    async def mark_deleting(self, dep_id: str) -> None:
        """A create failed or was cancelled after its workload was sent: the workload may exist. The record leaves
        every listing and frees its name at once; the reconciler deletes any workload carrying its id, then the
        record (:meth:`erase_deleting`)."""
        now = utcnow()
        async with self.db.begin() as conn:
            await conn.execute(
                deployments.update().where(deployments.c.id == dep_id)
                .values(status=DELETING, deleted_at=now, updated_at=now, version=deployments.c.version + 1)
            )

    async def erase_deleting(self, dep_id: str) -> None:
        """Remove a ``deleting`` record once no workload of it is left."""
        async with self.db.begin() as conn:
            await conn.execute(
                deployments.delete().where(deployments.c.id == dep_id, deployments.c.status == DELETING)
            )

    async def mark_deleted(self, dep_id: str) -> None:
        """Mark a record deleted (never erased): it leaves every listing and its name is free again."""
        now = utcnow()
        async with self.db.begin() as conn:
            await conn.execute(
                deployments.update().where(deployments.c.id == dep_id, deployments.c.deleted_at.is_(None))
                .values(deleted_at=now, updated_at=now, version=deployments.c.version + 1)
            )

    async def is_live(self, dep_id: str) -> bool:
        """Whether a deployment record exists and is not marked deleted."""
        async with self.db.connect() as conn:
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
