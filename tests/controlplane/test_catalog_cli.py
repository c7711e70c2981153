"""The ``sr-controlplane`` CLI: migrations and catalog import of the shipped catalog file."""

from __future__ import annotations

import os
import re
import subprocess
import sys
import tomllib
from pathlib import Path
from typing import Any

import pytest
import sqlalchemy as sa
import yaml

from controlplane.catalog import SAMPLE_CATALOG, CatalogError, image_pin_problem, import_catalog
from controlplane.db import engines, head_revision, make_engine, metadata

REPO = Path(__file__).resolve().parents[2]

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
    assert "kind: ClusterServingRuntime" in rows["engine-sr-gateway-triton"].engine_yaml
    assert rows["engine-sr-gateway-triton"].image == "sr-gateway:0.1.0"
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


async def test_the_shipped_catalog_describes_the_runtime_k8s_ships_and_pins_the_project_version() -> None:
    catalog = yaml.safe_load(SAMPLE_CATALOG.read_text(encoding="utf-8"))
    engine = next(e for e in catalog["engines"] if e["id"] == "engine-sr-gateway-triton")
    shipped = next(yaml.safe_load_all((REPO / "k8s/base/kserve.yaml").read_text(encoding="utf-8")))
    assert yaml.safe_load(engine["yaml"]) == shipped
    assert shipped["kind"] == "ClusterServingRuntime" and shipped["metadata"]["name"] == engine["configName"]
    version = tomllib.loads((REPO / "pyproject.toml").read_text(encoding="utf-8"))["project"]["version"]
    assert engine["image"] == f"sr-gateway:{version}"
    assert [c["image"] for c in shipped["spec"]["containers"]] == [f"sr-gateway:{version}"]


@pytest.mark.parametrize(("image", "problem"), [
    ("sr-gateway:latest", "is tagged :latest"),
    ("sr-gateway", "has no tag"),
    ("registry.example.com:5000/sr-gateway", "has no tag"),
    ("sr-gateway:", "has no tag"),
])
@pytest.mark.parametrize("where", ["image", "yaml"])
async def test_the_catalog_loader_refuses_an_untagged_or_latest_image(
    tmp_path: Path, image: str, problem: str, where: str
) -> None:
    entry: dict[str, Any] = {"id": "e-img", "name": "n", "runtime": "vllm", "backend": "LLMInferenceService",
                             "configName": "c"}
    if where == "image":
        entry["image"] = image
    else:
        entry["yaml"] = yaml.safe_dump({"spec": {"template": {"containers": [
            {"name": "main", "image": "vllm:0.6.0"}, {"name": "side", "image": image}]}}})
    engine = make_engine(f"sqlite+aiosqlite:///{tmp_path / 'c.db'}")
    async with engine.begin() as conn:
        await conn.run_sync(metadata.create_all)
    with pytest.raises(CatalogError, match=f"e-img: image '{re.escape(image)}' {problem}"):
        await import_catalog(engine, {"engines": [entry]})
    await engine.dispose()


@pytest.mark.parametrize("image", ["sr-gateway:0.1.0", "registry.example.com:5000/team/vllm:v0.6.3",
                                   f"vllm@sha256:{'a' * 64}"])
async def test_a_version_tag_or_a_digest_pins_an_image(image: str) -> None:
    assert image_pin_problem(image) is None
