"""Engines, models and artifacts in the database: the visibility-checked lookups a deployment's create and
update make, and the catalog import's upserts. The YAML side (parsing, checks) is :mod:`controlplane.catalog`.
"""

from __future__ import annotations

from typing import Any

import sqlalchemy as sa
from sqlalchemy.ext.asyncio import AsyncConnection, AsyncEngine

from controlplane.db import artifacts, engines, models, utcnow
from controlplane.store.records import ArtifactRecord, EngineRecord, ModelRecord


async def _find_visible(
    conn: AsyncConnection, table: sa.Table, item_id: str, project_id: str | None
) -> sa.RowMapping | None:
    """A live entry that is public or owned by ``project_id``; ``None`` otherwise (no existence leak)."""
    public: sa.ColumnElement[bool] = table.c.project_id.is_(None)
    visible = sa.or_(public, table.c.project_id == project_id) if project_id else public
    stmt = sa.select(table).where(table.c.id == item_id, table.c.deleted_at.is_(None), visible)
    return (await conn.execute(stmt)).mappings().first()


async def find_engine(conn: AsyncConnection, engine_id: str, project_id: str | None) -> EngineRecord | None:
    """The engine ``engine_id`` if the project may use it."""
    row = await _find_visible(conn, engines, engine_id, project_id)
    return None if row is None else EngineRecord.from_row(row)


async def find_model(conn: AsyncConnection, model_id: str, project_id: str | None) -> ModelRecord | None:
    """The model ``model_id`` if the project may use it."""
    row = await _find_visible(conn, models, model_id, project_id)
    return None if row is None else ModelRecord.from_row(row)


async def find_artifact(conn: AsyncConnection, artifact_id: str, project_id: str | None) -> ArtifactRecord | None:
    """The artifact ``artifact_id`` if the project may use it."""
    row = await _find_visible(conn, artifacts, artifact_id, project_id)
    return None if row is None else ArtifactRecord.from_row(row)


async def _upsert(conn: AsyncConnection, table: sa.Table, row: dict[str, Any]) -> None:
    exists = await conn.scalar(sa.select(sa.func.count()).select_from(table).where(table.c.id == row["id"]))
    if exists:
        await conn.execute(table.update().where(table.c.id == row["id"]).values(**row, deleted_at=None))
    else:
        await conn.execute(table.insert().values(**row, created_at=utcnow()))


async def upsert_entries(
    engine: AsyncEngine,
    *,
    engine_rows: list[dict[str, Any]],
    model_rows: list[dict[str, Any]],
    artifact_rows: list[dict[str, Any]],
) -> dict[str, int]:
    """Insert or update (and undelete) every entry, all in one transaction; returns counts per table."""
    plan = [(engines, engine_rows), (models, model_rows), (artifacts, artifact_rows)]
    async with engine.begin() as conn:
        for table, rows in plan:
            for row in rows:
                await _upsert(conn, table, row)
    return {table.name: len(rows) for table, rows in plan}
