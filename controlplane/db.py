"""Catalog storage: SQLAlchemy 2 async tables, engine creation and ordered schema migrations.

SQLite (aiosqlite) is the embedded default, PostgreSQL (asyncpg) the production store; both run the
same migrations. Rows are never hard-deleted by the API: ``deleted_at`` marks them ("marked deleted").
"""

from __future__ import annotations

from collections.abc import Callable
from datetime import UTC, datetime

import sqlalchemy as sa
from sqlalchemy.engine import Connection
from sqlalchemy.ext.asyncio import AsyncEngine, create_async_engine

metadata = sa.MetaData()

engines = sa.Table(
    "engines",
    metadata,
    sa.Column("id", sa.String(64), primary_key=True),
    sa.Column("name", sa.String(255), nullable=False),
    sa.Column("project_id", sa.String(64), nullable=True),  # NULL: public
    sa.Column("runtime", sa.String(64), nullable=False),  # "vllm", "triton", ...
    sa.Column("backend_type", sa.String(64), nullable=False),  # InferenceService | LLMInferenceService
    sa.Column("config_name", sa.String(255), nullable=False),  # ServingRuntime / LLMInferenceServiceConfig
    sa.Column("model_format", sa.String(64), nullable=True),
    sa.Column("image", sa.Text, nullable=True),
    sa.Column("command", sa.JSON, nullable=True),
    sa.Column("args", sa.JSON, nullable=True),
    sa.Column("env", sa.JSON, nullable=True),
    sa.Column("resources", sa.JSON, nullable=True),
    sa.Column("engine_yaml", sa.Text, nullable=True),
    sa.Column("created_at", sa.DateTime(timezone=True), nullable=False),
    sa.Column("deleted_at", sa.DateTime(timezone=True), nullable=True),
)

models = sa.Table(
    "models",
    metadata,
    sa.Column("id", sa.String(64), primary_key=True),
    sa.Column("name", sa.String(255), nullable=False),
    sa.Column("project_id", sa.String(64), nullable=True),
    sa.Column("created_at", sa.DateTime(timezone=True), nullable=False),
    sa.Column("deleted_at", sa.DateTime(timezone=True), nullable=True),
)

artifacts = sa.Table(
    "artifacts",
    metadata,
    sa.Column("id", sa.String(64), primary_key=True),
    sa.Column("name", sa.String(255), nullable=False),
    sa.Column("project_id", sa.String(64), nullable=True),
    sa.Column("model_id", sa.String(64), nullable=True),
    sa.Column("uri", sa.Text, nullable=False),
    sa.Column("ready", sa.Boolean, nullable=False, server_default=sa.true()),
    sa.Column("lora", sa.Boolean, nullable=False, server_default=sa.false()),
    sa.Column("created_at", sa.DateTime(timezone=True), nullable=False),
    sa.Column("deleted_at", sa.DateTime(timezone=True), nullable=True),
)

deployments = sa.Table(
    "deployments",
    metadata,
    sa.Column("id", sa.String(64), primary_key=True),
    sa.Column("name", sa.String(255), nullable=False),
    sa.Column("description", sa.Text, nullable=False, server_default=""),
    sa.Column("status", sa.String(16), nullable=False),
    sa.Column("stopped", sa.Boolean, nullable=False, server_default=sa.false()),
    sa.Column("project_id", sa.String(64), nullable=False),
    sa.Column("project_name", sa.String(255), nullable=True),
    sa.Column("domain_id", sa.String(64), nullable=True),
    sa.Column("domain_name", sa.String(255), nullable=True),
    sa.Column("owner_user_id", sa.String(64), nullable=False),
    sa.Column("owner_name", sa.String(255), nullable=True),
    sa.Column("k8s_name", sa.String(63), nullable=False),
    sa.Column("backend_catalog", sa.String(16), nullable=True),  # "k8s", or NULL when created without one
    sa.Column("backend_type", sa.String(64), nullable=True),
    sa.Column("backend_uid", sa.String(64), nullable=True),  # metadata.uid of the workload we created
    sa.Column("scope", sa.String(16), nullable=False),  # "public" or "project": visibility of what it uses
    sa.Column("spec", sa.JSON, nullable=False),
    sa.Column("labels", sa.JSON, nullable=True),
    sa.Column("created_at", sa.DateTime(timezone=True), nullable=False),
    sa.Column("updated_at", sa.DateTime(timezone=True), nullable=False),
    sa.Column("deleted_at", sa.DateTime(timezone=True), nullable=True),
)

# One live deployment per workload name and project: this index is what makes concurrent creates of the
# same name resolve to exactly one winner (the loser's INSERT fails, nothing reaches Kubernetes).
live_name_index = sa.Index(
    "uq_deployments_live_k8s_name",
    deployments.c.project_id,
    deployments.c.k8s_name,
    unique=True,
    sqlite_where=deployments.c.deleted_at.is_(None),
    postgresql_where=deployments.c.deleted_at.is_(None),
)

sa.Index("ix_deployments_project", deployments.c.project_id, deployments.c.created_at)

schema_version = sa.Table(
    "schema_version",
    metadata,
    sa.Column("version", sa.Integer, primary_key=True),
    sa.Column("applied_at", sa.DateTime(timezone=True), nullable=False),
)


def _m1_initial(conn: Connection) -> None:
    """Version 1: catalog tables with their indexes (the live-name index is bound to ``deployments``).

    When the first schema change lands, freeze this step as explicit DDL: it must keep creating the
    version-1 schema even after the table definitions above move on.
    """
    for table in (engines, models, artifacts, deployments):
        table.create(conn)


MIGRATIONS: list[Callable[[Connection], None]] = [_m1_initial]
"""Append-only: migration N is ``MIGRATIONS[N - 1]``. Never edit one that has shipped."""


def utcnow() -> datetime:
    """Timestamps are stored in UTC with full precision (ordering); responses show RFC3339 seconds."""
    return datetime.now(UTC)


def _migrate_sync(conn: Connection) -> int:
    schema_version.create(conn, checkfirst=True)
    current = conn.execute(sa.select(sa.func.max(schema_version.c.version))).scalar() or 0
    for version, step in enumerate(MIGRATIONS, start=1):
        if version <= current:
            continue
        step(conn)
        conn.execute(schema_version.insert().values(version=version, applied_at=utcnow()))
        current = version
    return current


async def migrate(engine: AsyncEngine) -> int:
    """Bring the schema to the newest version in one transaction; returns that version."""
    async with engine.begin() as conn:
        if engine.dialect.name == "postgresql":
            # Two processes starting together must not both create the tables.
            await conn.execute(sa.text("SELECT pg_advisory_xact_lock(7231001)"))
        return await conn.run_sync(_migrate_sync)


def make_engine(url: str) -> AsyncEngine:
    """An async engine; SQLite gets a busy timeout so concurrent writers wait instead of failing."""
    if url.startswith("sqlite"):
        return create_async_engine(url, connect_args={"timeout": 30})
    return create_async_engine(url, pool_pre_ping=True)
