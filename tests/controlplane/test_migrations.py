"""Catalog schema migrations (Alembic), on the backend SR_CP_TEST_DB selects: an empty database, one
populated at an older revision, and one populated by the pre-Alembic migrator all end at the newest
revision with their rows kept, and the result is exactly the schema the code's table definitions describe."""

from __future__ import annotations

from datetime import UTC, datetime
from typing import Any

import pytest
import sqlalchemy as sa
from alembic import command
from alembic.autogenerate import compare_metadata
from alembic.runtime.migration import MigrationContext
from sqlalchemy.engine import Connection

from controlplane.catalog import import_catalog
from controlplane.db import (
    alembic_config,
    current_revision,
    deployments,
    head_revision,
    make_engine,
    metadata,
    migrate,
)
from tests.controlplane.conftest import _fresh_db, public_catalog

pytestmark = pytest.mark.asyncio
NOW = datetime(2026, 9, 21, tzinfo=UTC)


def _schema_diff(conn: Connection) -> list[Any]:
    return list(compare_metadata(MigrationContext.configure(conn), metadata))


def _v1_row(dep_id: str) -> dict[str, Any]:
    """A deployment as the version-1 schema stored it (no row version yet)."""
    return {"id": dep_id, "name": "old", "description": "", "status": "ready", "stopped": False,
            "project_id": "p1", "owner_user_id": "u1", "k8s_name": "old", "backend_catalog": "k8s",
            "backend_type": "LLMInferenceService", "backend_uid": "uid-1", "scope": "public",
            "spec": {"k8sName": "old", "replicas": 2}, "labels": {"a": "b"}, "created_at": NOW, "updated_at": NOW}


async def test_an_empty_database_migrates_to_the_newest_revision_matching_the_code_tables(
    env: dict[str, str], tmp_path_factory: pytest.TempPathFactory
) -> None:
    async for url in _fresh_db(env, tmp_path_factory, "mig_empty"):
        engine = make_engine(url)
        assert await migrate(engine) == head_revision()
        assert await migrate(engine) == head_revision()  # a second start changes nothing
        async with engine.connect() as conn:
            assert await conn.run_sync(_schema_diff) == []
        await engine.dispose()


@pytest.mark.parametrize("origin", ["revision 0001", "pre-alembic migrator"])
async def test_a_populated_older_database_is_upgraded_keeping_every_row(
    env: dict[str, str], tmp_path_factory: pytest.TempPathFactory, origin: str
) -> None:
    async for url in _fresh_db(env, tmp_path_factory, "mig_old"):
        engine = make_engine(url)
        async with engine.begin() as conn:
            await conn.run_sync(lambda c: command.upgrade(alembic_config(c), "0001"))
            if origin == "pre-alembic migrator":  # its bookkeeping instead of Alembic's
                await conn.execute(sa.text("DROP TABLE alembic_version"))
                await conn.execute(sa.text(
                    "CREATE TABLE schema_version (version INTEGER PRIMARY KEY, applied_at TIMESTAMP NOT NULL)"))
                await conn.execute(sa.text("INSERT INTO schema_version VALUES (1, CURRENT_TIMESTAMP)"))
            v1 = sa.table("deployments", *(sa.column(k, deployments.c[k].type) for k in _v1_row("x")))
            await conn.execute(v1.insert().values(**_v1_row("deployment-old1")))
            await conn.execute(v1.insert().values(**{**_v1_row("deployment-old2"), "k8s_name": "old2"}))
        await import_catalog(engine, public_catalog())  # engines/models/artifacts unchanged since 0001

        assert await migrate(engine) == head_revision()
        async with engine.connect() as conn:
            assert await conn.run_sync(current_revision) == head_revision()
            assert await conn.run_sync(_schema_diff) == []
            rows = (await conn.execute(sa.select(deployments).order_by(deployments.c.id))).all()
        assert [(r.id, r.k8s_name, r.spec, r.labels, r.backend_uid, r.version) for r in rows] == [
            ("deployment-old1", "old", {"k8sName": "old", "replicas": 2}, {"a": "b"}, "uid-1", 0),
            ("deployment-old2", "old2", {"k8sName": "old", "replicas": 2}, {"a": "b"}, "uid-1", 0),
        ]
        await engine.dispose()
