"""The catalog store without the test environment: typed records and the pure decisions made on them, and
the store's queries on a local SQLite catalog (aiosqlite, the embedded backend the service supports).

The suite on the real environment (tools/testenv) covers the same store through the API on SQLite and
PostgreSQL; these tests pin what the store promises on its own, and run under plain ``pytest`` too.
"""

from __future__ import annotations

import dataclasses
import logging
from collections.abc import AsyncIterator
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

import pytest
import pytest_asyncio
import sqlalchemy as sa
from sqlalchemy.exc import IntegrityError
from sqlalchemy.ext.asyncio import AsyncEngine

from controlplane.auth import GLOBAL_READ, Principal
from controlplane.catalog import import_catalog
from controlplane.db import deployments, make_engine, migrate
from controlplane.errors import ApiError
from controlplane.kube import KINDS
from controlplane.reconciler import catalog_changes
from controlplane.rendering import render
from controlplane.store import (
    DELETING,
    DeploymentRecord,
    DeploymentStore,
    EngineRecord,
    StaleRow,
    namespace,
    require_kind,
    visible_project,
    workload_kind,
)
from controlplane.workload import build_spec

NEEDS_TESTENV = False  # see conftest: these run with and without tools/testenv

T0 = datetime(2026, 1, 2, 3, 4, 5, 678901, tzinfo=UTC)
READ = frozenset({"deployment:read"})
WRITE = frozenset({"deployment:read", "deployment:write"})


def principal(project: str | None, permissions: frozenset[str] = WRITE) -> Principal:
    return Principal(user_id=f"user-{project}", user_name="someone", project_id=project, project_name=None,
                     domain_id=None, domain_name=None, roles=frozenset({"member"}), permissions=permissions)


def record(dep_id: str = "deployment-a", project: str = "p1", **changes: Any) -> DeploymentRecord:
    base = DeploymentRecord(
        id=dep_id, name="Chat", description="", status="pending", stopped=False, project_id=project,
        project_name="Project One", domain_id=None, domain_name=None, owner_user_id="u1", owner_name="ann",
        k8s_name=f"chat-{dep_id[-1]}", backend_catalog="k8s", backend_type="InferenceService", backend_uid=None,
        scope="public", spec={"engineId": "e-public", "replicas": 1, "endpoint": None, "lora": None},
        labels={"team": "a"}, created_at=T0, updated_at=T0,
    )
    return dataclasses.replace(base, **changes)


# -- pure: records, visibility, kinds, rendering, reconciling ---------------------------------------------


def test_a_record_from_a_sqlite_row_holds_utc_timestamps_and_plain_json_values() -> None:
    row = {**record().values(), "created_at": T0.replace(tzinfo=None), "updated_at": T0.replace(tzinfo=None),
           "stopped": 0, "version": 3, "conditions": ({"type": "Ready", "status": "True"},), "labels": None}
    got = DeploymentRecord.from_row(row)
    assert got.created_at == T0 and got.created_at.tzinfo is UTC
    assert got.stopped is False and got.version == 3 and got.labels is None
    assert got.conditions == [{"type": "Ready", "status": "True"}]
    assert type(got.spec) is dict


def test_a_record_is_frozen() -> None:
    with pytest.raises(dataclasses.FrozenInstanceError):
        record().status = "ready"  # type: ignore[misc]


def test_members_see_their_own_project_and_global_readers_every_project_but_only_when_reading() -> None:
    member, admin = principal("p1", READ), principal("admin", READ | {GLOBAL_READ})
    assert visible_project(member, write=False) == "p1"
    assert visible_project(member, write=True) == "p1"
    assert visible_project(admin, write=False) is None
    assert visible_project(admin, write=True) == "admin"


def test_a_record_created_without_kubernetes_has_no_workload_kind_and_requiring_one_answers_422() -> None:
    assert workload_kind(record()) is KINDS["InferenceService"]
    for bare in (record(backend_catalog=None), record(backend_type="Deployment")):
        assert workload_kind(bare) is None
        with pytest.raises(ApiError) as err:
            require_kind(bare, "invalid_backend")
        assert (err.value.status, err.value.error) == (422, "invalid_backend")


def test_a_namespace_is_the_lowercased_project_id() -> None:
    assert namespace("AbC123") == "abc123"


def test_rendering_a_record_drops_empty_spec_fields_and_shows_utc_seconds() -> None:
    out = render(record(updated_at=T0 + timedelta(hours=1)), {"ready": "True", "conditions": []})
    assert out["spec"] == {"engineId": "e-public", "replicas": 1}
    assert (out["createdAt"], out["updatedAt"]) == ("2026-01-02T03:04:05Z", "2026-01-02T04:04:05Z")
    assert out["backend"] == {"catalog": "k8s", "type": "InferenceService", "id": "p1/chat-a"}
    assert out["projectName"] == "Project One" and out["ownerName"] == "ann" and "domainId" not in out
    assert out["labels"] == {"team": "a"} and out["ready"] == "True" and "conditions" not in out


def test_the_reconciler_writes_nothing_when_the_record_already_says_what_the_workload_says() -> None:
    view = {"status": "pending", "stopped": False, "ready": None, "conditions": None, "endpoint": None}
    assert catalog_changes(record(), view) is None


def test_the_reconciler_writes_the_live_view_and_keeps_the_rest_of_the_spec() -> None:
    conds = [{"type": "Ready", "status": "True"}]
    view = {"status": "ready", "stopped": False, "ready": "True", "conditions": conds, "endpoint": "http://x"}
    changes = catalog_changes(record(), view)
    assert changes == {"status": "ready", "stopped": False, "ready": "True", "conditions": conds,
                       "spec": {"engineId": "e-public", "replicas": 1, "endpoint": "http://x", "lora": None}}
    assert record().spec["endpoint"] is None  # the record itself is left as it was read


def test_a_workload_takes_the_engine_records_defaults_unless_the_deployment_overrides_them() -> None:
    engine = EngineRecord(id="e", name="E", project_id=None, runtime="triton", backend_type="InferenceService",
                          config_name="triton-rt", image="reg/triton:1", args=["--a"],
                          env=[{"name": "X", "value": "1"}], resources={"cpu": "2", "memory": "4Gi"})
    spec = {"modelUri": "oci://reg/m@sha256:" + "ab" * 32, "replicas": 2, "args": ["--b"],
            "env": [{"name": "X", "value": "2"}], "resources": {"cpu": "1"}}
    model = build_spec("InferenceService", spec, engine)["predictor"]["model"]
    assert model["modelFormat"] == {"name": "triton"} and model["runtime"] == "triton-rt"
    assert model["image"] == "reg/triton:1" and model["args"] == ["--b"]
    assert model["env"] == [{"name": "X", "value": "2"}]
    assert model["resources"]["limits"] == {"cpu": "1", "memory": "4Gi"}


# -- the store on a local SQLite catalog --------------------------------------------------------------------


@pytest_asyncio.fixture
async def engine(tmp_path: Path) -> AsyncIterator[AsyncEngine]:
    db = make_engine(f"sqlite+aiosqlite:///{tmp_path / 'catalog.db'}")
    await migrate(db)
    await import_catalog(db, {
        "engines": [
            {"id": "e-public", "name": "Public", "runtime": "triton", "backend": "InferenceService",
             "configName": "triton-rt", "args": ["--x"], "resources": {"cpu": "1"}},
            {"id": "e-p2", "name": "Theirs", "project": "p2", "runtime": "vllm",
             "backend": "LLMInferenceService", "configName": "vllm-rt"},
        ],
        "models": [{"id": "m-p1", "name": "Mine", "project": "p1"}],
        "artifacts": [{"id": "a-public", "name": "W", "uri": "oci://reg/w:1", "lora": True}],
    })
    yield db
    await db.dispose()


async def test_catalog_reads_find_public_and_own_entries_as_typed_records_and_hide_other_projects(
    engine: AsyncEngine,
) -> None:
    async with DeploymentStore(engine).reads() as reads:
        public = await reads.engine("e-public", "p1")
        assert public == EngineRecord(id="e-public", name="Public", project_id=None, runtime="triton",
                                      backend_type="InferenceService", config_name="triton-rt", args=["--x"],
                                      resources={"cpu": "1"})
        assert await reads.engine("e-p2", "p1") is None
        assert (await reads.engine("e-p2", "p2")) is not None
        assert await reads.model("m-p1", "p1") is not None and await reads.model("m-p1", None) is None
        art = await reads.artifact("a-public", None)
        assert art is not None and art.ready is True and art.lora is True


async def test_a_write_on_a_stale_record_raises_and_one_merged_onto_the_newer_record_succeeds(
    engine: AsyncEngine,
) -> None:
    store = DeploymentStore(engine)
    await store.insert(record())
    read_a = await store.get("deployment-a", principal("p1"), write=True)
    read_b = await store.get("deployment-a", principal("p1"), write=True)
    await store.write(read_a, {"status": "ready"})
    with pytest.raises(StaleRow):
        await store.write(read_b, {"description": "lost"})
    newer = await store.get("deployment-a", principal("p1"), write=True)
    assert (newer.version, newer.status) == (read_b.version + 1, "ready")
    await store.write(newer, {"description": "merged"})
    stored = await store.fetch("deployment-a")
    assert stored is not None and (stored.version, stored.status, stored.description) == (2, "ready", "merged")
    assert stored.updated_at > T0 and stored.updated_at.tzinfo is UTC


async def test_members_get_404_for_another_projects_record_and_a_global_reads_is_audited(
    engine: AsyncEngine, caplog: pytest.LogCaptureFixture,
) -> None:
    store = DeploymentStore(engine)
    await store.insert(record())
    with pytest.raises(ApiError) as err:
        await store.get("deployment-a", principal("p2"), write=False)
    assert err.value.status == 404
    admin = principal("admin", READ | {GLOBAL_READ})
    with caplog.at_level(logging.INFO, logger="controlplane.audit"):
        assert (await store.get("deployment-a", admin, write=False)).id == "deployment-a"
    assert [r.getMessage() for r in caplog.records] == ["cross_project_read deployment-a by user-admin: read"]
    with pytest.raises(ApiError):
        await store.get("deployment-a", admin, write=True)  # global read never reaches writes


async def test_pages_are_newest_first_and_a_page_past_the_end_is_empty_with_the_total(engine: AsyncEngine) -> None:
    store = DeploymentStore(engine)
    for i, letter in enumerate("abc"):
        await store.insert(record(f"deployment-{letter}", created_at=T0 + timedelta(seconds=i)))
    await store.insert(record("deployment-z", project="p2"))
    total, items = await store.page(principal("p1", READ), 1, 2)
    assert total == 3 and [r.id for r in items] == ["deployment-c", "deployment-b"]
    assert await store.page(principal("p1", READ), 3, 2) == (3, [])
    assert [r.id for r in (await store.page(principal("p1", READ), 1, 0))[1]] == [
        "deployment-c", "deployment-b", "deployment-a"]
    assert {r.id for r in await store.all_visible(principal("p2", READ))} == {"deployment-z"}


async def test_a_live_name_is_unique_per_project_until_the_record_is_marked_deleted(engine: AsyncEngine) -> None:
    store = DeploymentStore(engine)
    await store.insert(record("deployment-a"))
    with pytest.raises(IntegrityError):
        await store.insert(record("deployment-b", k8s_name="chat-a"))
    await store.insert(record("deployment-c", project="p2", k8s_name="chat-a"))  # another project's name
    await store.mark_deleted("deployment-a")
    assert not await store.is_live("deployment-a")
    await store.insert(record("deployment-b", k8s_name="chat-a"))
    assert [r.id for r in (await store.page(principal("p1", READ), 1, 0))[1]] == ["deployment-b"]


async def test_a_reconciler_pass_reads_live_and_deleting_records_and_deleted_ones_only_by_owner_id(
    engine: AsyncEngine,
) -> None:
    store = DeploymentStore(engine)
    await store.insert(record("deployment-a"))
    await store.insert(record("deployment-b"))
    await store.insert(record("deployment-n", backend_catalog=None, backend_type=None))
    await store.mark_deleting("deployment-a")
    await store.mark_deleted("deployment-b")
    seen = {r.id: r for r in await store.kubernetes_backed()}
    assert set(seen) == {"deployment-a"}  # a record marked deleted is not read on every pass
    assert seen["deployment-a"].status == DELETING and not seen["deployment-a"].live
    # ... only when a workload in the cluster names it
    assert await store.deleted_among(["deployment-b", "deployment-a", "deployment-x"]) == {"deployment-a",
                                                                                          "deployment-b"}
    assert await store.deleted_among([]) == set()
    await store.erase_deleting("deployment-a")
    await store.erase_deleting("deployment-b")  # marked deleted, not deleting: kept for good
    assert await store.fetch("deployment-a") is None
    kept = await store.fetch("deployment-b")
    assert kept is not None and kept.deleted_at is not None and kept.deleted_at.tzinfo is UTC


async def test_a_marked_deleted_record_refuses_writes(engine: AsyncEngine) -> None:
    store = DeploymentStore(engine)
    await store.insert(record())
    read = await store.get("deployment-a", principal("p1"), write=True)
    await store.mark_deleted("deployment-a")
    with pytest.raises(StaleRow):
        await store.write(read, {"status": "ready"})


async def test_setting_the_backend_uid_bumps_the_version_so_older_reads_lose(engine: AsyncEngine) -> None:
    store = DeploymentStore(engine)
    await store.insert(record())
    read = await store.get("deployment-a", principal("p1"), write=True)
    await store.set_backend_uid("deployment-a", "uid-1")
    with pytest.raises(StaleRow):
        await store.write(read, {"status": "ready"})
    stored = await store.fetch("deployment-a")
    assert stored is not None and (stored.backend_uid, stored.version) == ("uid-1", 1)


async def test_a_new_record_leaves_unset_columns_null_and_starts_at_version_zero(engine: AsyncEngine) -> None:
    store = DeploymentStore(engine)
    await store.insert(record(labels=None))
    async with engine.connect() as conn:  # SQL NULL, not JSON null: what the record's None means
        nulls = await conn.scalar(sa.select(sa.func.count()).select_from(deployments).where(
            deployments.c.conditions.is_(None), deployments.c.labels.is_(None), deployments.c.ready.is_(None)))
    assert nulls == 1
    stored = await store.fetch("deployment-a")
    assert stored is not None and (stored.version, stored.conditions, stored.labels) == (0, None, None)
