"""The ``sr-controlplane`` CLI: migrations and catalog import of the shipped catalog file."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest
import sqlalchemy as sa

from controlplane.db import engines, head_revision, make_engine

pytestmark = pytest.mark.asyncio


def cli(*args: str, db: str) -> subprocess.CompletedProcess[str]:
    env = {**os.environ, "SR_CP_DATABASE_URL": db}
    return subprocess.run([sys.executable, "-m", "controlplane.cli", *args], env=env, capture_output=True,
                          text=True, timeout=60, check=False)


async def test_migrate_is_idempotent_and_import_loads_the_shipped_engines(db_url: str, tmp_path: Path) -> None:
    db = db_url.replace("/catalog.db", "/cli.db") if db_url.startswith("sqlite") else db_url
    assert cli("migrate", db=db).stdout.strip() == f"schema revision {head_revision()}"
    assert cli("migrate", db=db).stdout.strip() == f"schema revision {head_revision()}"
    out = cli("catalog", "import", db=db)
    assert out.returncode == 0, out.stderr
    engine = make_engine(db)
    async with engine.connect() as conn:
        rows = {r.id: r for r in (await conn.execute(sa.select(engines))).all()}
    await engine.dispose()
    assert rows["engine-sr-gateway-triton"].backend_type == "InferenceService"
    assert "kind: ServingRuntime" in rows["engine-sr-gateway-triton"].engine_yaml
    assert rows["engine-vllm"].backend_type == "LLMInferenceService"


async def test_a_malformed_catalog_file_is_refused_without_partial_import(db_url: str, tmp_path: Path) -> None:
    bad = tmp_path / "bad.yaml"
    bad.write_text("engines:\n  - id: e-ok\n    name: ok\n    runtime: vllm\n    backend: LLMInferenceService\n"
                   "    configName: c\n  - id: e-bad\n    name: missing fields\n")
    db = f"sqlite+aiosqlite:///{tmp_path / 'c.db'}"
    out = cli("catalog", "import", str(bad), db=db)
    assert out.returncode != 0 and "e-bad" in out.stderr
    engine = make_engine(db)
    async with engine.connect() as conn:
        count = await conn.scalar(sa.select(sa.func.count()).select_from(engines))
    await engine.dispose()
    assert count == 0
