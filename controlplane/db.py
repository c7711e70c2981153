"""Catalog storage: SQLAlchemy 2 async tables, engine creation and Alembic schema migrations.

SQLite (aiosqlite) is the embedded default, PostgreSQL (asyncpg) the production store; both run the
same migrations (controlplane/migrations). Rows are never hard-deleted by the API: ``deleted_at`` marks
them ("marked deleted"). ``deployments.version`` is bumped by every write and checked by it.
"""

from __future__ import annotations

from datetime import UTC, datetime
from pathlib import Path

import sqlalchemy as sa
from alembic import command
from alembic.config import Config
from alembic.runtime.migration import MigrationContext
from alembic.script import ScriptDirectory
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
    sa.Column("version", sa.Integer, nullable=False, server_default="0"),  # row version (compare-and-set)
    sa.Column("ready", sa.String(16), nullable=True),  # KServe Ready as last observed by the reconciler
    sa.Column("conditions", sa.JSON, nullable=True),
    sa.Column("observed_at", sa.DateTime(timezone=True), nullable=True),  # when the cluster was last read
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

MIGRATIONS_DIR = Path(__file__).with_name("migrations")
LEGACY_VERSION_TABLE = "schema_version"
"""The pre-Alembic migrator's bookkeeping; a database it left at version 1 is revision 0001."""


def alembic_config(conn: Connection) -> Config:
    cfg = Config()
    cfg.set_main_option("script_location", str(MIGRATIONS_DIR))
    cfg.attributes["connection"] = conn
    return cfg


def head_revision() -> str:
    """The newest revision of the migration history."""
    head = ScriptDirectory(str(MIGRATIONS_DIR)).get_current_head()
    assert head is not None
    return head


def current_revision(conn: Connection) -> str | None:
    """The revision a database is at (``None``: never migrated by Alembic)."""
    return MigrationContext.configure(conn).get_current_revision()


def utcnow() -> datetime:
    """Timestamps are stored in UTC with full precision (ordering); responses show RFC3339 seconds."""
    return datetime.now(UTC)


def _migrate_sync(conn: Connection) -> str:
    cfg = alembic_config(conn)
    if current_revision(conn) is None and sa.inspect(conn).has_table(LEGACY_VERSION_TABLE):
        command.stamp(cfg, "0001")  # created by the pre-Alembic migrator: its version 1 is our 0001
    command.upgrade(cfg, "head")
    return current_revision(conn) or ""


async def migrate(engine: AsyncEngine) -> str:
    """Bring the schema to the newest revision in one transaction; returns that revision."""
    async with engine.begin() as conn:
        if engine.dialect.name == "postgresql":
            # Two processes starting together must not both create the tables.
            await conn.execute(sa.text("SELECT pg_advisory_xact_lock(7231001)"))
        return await conn.run_sync(_migrate_sync)


async def ping(engine: AsyncEngine) -> None:
    """Readiness: one round trip to the catalog database (raises when it does not answer)."""
    async with engine.connect() as conn:
        await conn.execute(sa.text("SELECT 1"))


def make_engine(url: str) -> AsyncEngine:
    """An async engine; SQLite gets a busy timeout so concurrent writers wait instead of failing."""
    if url.startswith("sqlite"):
        return create_async_engine(url, connect_args={"timeout": 30})
    return create_async_engine(url, pool_pre_ping=True)
