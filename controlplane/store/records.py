"""The catalog's rows as typed, immutable records, and the pure decisions made on them (which workload kind a
record has, whose records a caller may see). Nothing here touches the database: the store builds records
from rows, everyone else reads fields by name with their types checked.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping
from dataclasses import dataclass
from datetime import UTC, datetime
from typing import Any

from controlplane.auth import Principal
from controlplane.errors import unprocessable
from controlplane.kube import KINDS, Kind

DELETING = "deleting"
"""The status of a record whose create failed after its workload was sent (never shown: the record is hidden)."""


def _utc(value: datetime) -> datetime:
    """SQLite hands back naive datetimes for what was stored as UTC; PostgreSQL aware ones. Records hold UTC."""
    return value.replace(tzinfo=UTC) if value.tzinfo is None else value.astimezone(UTC)


def _opt_utc(value: datetime | None) -> datetime | None:
    return None if value is None else _utc(value)


def _opt_dict(value: Any) -> dict[str, Any] | None:
    return None if value is None else dict(value)


@dataclass(frozen=True, slots=True)
class DeploymentRecord:
    """One row of ``deployments``. ``version`` is the row version every write compares and bumps."""

    id: str
    name: str
    description: str
    status: str
    stopped: bool
    project_id: str
    project_name: str | None
    domain_id: str | None
    domain_name: str | None
    owner_user_id: str
    owner_name: str | None
    k8s_name: str
    backend_catalog: str | None
    backend_type: str | None
    backend_uid: str | None
    scope: str
    spec: dict[str, Any]
    labels: dict[str, Any] | None
    created_at: datetime
    updated_at: datetime
    deleted_at: datetime | None = None
    version: int = 0
    ready: str | None = None
    conditions: list[dict[str, Any]] | None = None
    observed_at: datetime | None = None

    @classmethod
    def from_row(cls, row: Mapping[Any, Any]) -> DeploymentRecord:
        """A record from a row mapping (``Row._mapping``); JSON columns become plain dicts and lists."""
        conditions = row["conditions"]
        return cls(
            id=row["id"], name=row["name"], description=row["description"] or "", status=row["status"],
            stopped=bool(row["stopped"]), project_id=row["project_id"], project_name=row["project_name"],
            domain_id=row["domain_id"], domain_name=row["domain_name"], owner_user_id=row["owner_user_id"],
            owner_name=row["owner_name"], k8s_name=row["k8s_name"], backend_catalog=row["backend_catalog"],
            backend_type=row["backend_type"], backend_uid=row["backend_uid"], scope=row["scope"],
            spec=dict(row["spec"] or {}), labels=_opt_dict(row["labels"]), created_at=_utc(row["created_at"]),
            updated_at=_utc(row["updated_at"]), deleted_at=_opt_utc(row["deleted_at"]),
            version=int(row["version"] or 0), ready=row["ready"],
            conditions=None if conditions is None else [dict(c) for c in conditions],
            observed_at=_opt_utc(row["observed_at"]),
        )

    def values(self) -> dict[str, Any]:
        """Every column with its value, as an INSERT takes them."""
        return {f.name: getattr(self, f.name) for f in dataclasses.fields(self)}

    @property
    def live(self) -> bool:
        """Not marked deleted (a ``deleting`` record is marked deleted too)."""
        return self.deleted_at is None


@dataclass(frozen=True, slots=True)
class EngineRecord:
    """One row of ``engines``: the runtime a deployment runs on, and the container defaults it brings."""

    id: str
    name: str
    project_id: str | None
    runtime: str
    backend_type: str
    config_name: str
    model_format: str | None = None
    image: str | None = None
    command: list[str] | None = None
    args: list[str] | None = None
    env: list[dict[str, Any]] | None = None
    resources: dict[str, Any] | None = None
    engine_yaml: str | None = None

    @classmethod
    def from_row(cls, row: Mapping[Any, Any]) -> EngineRecord:
        """A record from a row mapping; the timestamps stay in the table (nothing reads them)."""
        return cls(
            id=row["id"], name=row["name"], project_id=row["project_id"], runtime=row["runtime"],
            backend_type=row["backend_type"], config_name=row["config_name"], model_format=row["model_format"],
            image=row["image"], command=row["command"], args=row["args"], env=row["env"],
            resources=_opt_dict(row["resources"]), engine_yaml=row["engine_yaml"],
        )


@dataclass(frozen=True, slots=True)
class ModelRecord:
    """One row of ``models``."""

    id: str
    name: str
    project_id: str | None

    @classmethod
    def from_row(cls, row: Mapping[Any, Any]) -> ModelRecord:
        return cls(id=row["id"], name=row["name"], project_id=row["project_id"])


@dataclass(frozen=True, slots=True)
class ArtifactRecord:
    """One row of ``artifacts``: weights (or a LoRA adapter) at ``uri``."""

    id: str
    name: str
    project_id: str | None
    model_id: str | None
    uri: str
    ready: bool
    lora: bool

    @classmethod
    def from_row(cls, row: Mapping[Any, Any]) -> ArtifactRecord:
        return cls(id=row["id"], name=row["name"], project_id=row["project_id"], model_id=row["model_id"],
                   uri=row["uri"], ready=bool(row["ready"]), lora=bool(row["lora"]))


def namespace(project_id: str) -> str:
    """One namespace per project, named after the project id (Keystone ids are DNS-safe hex)."""
    return project_id.lower()


def workload_kind(record: DeploymentRecord) -> Kind | None:
    """The KServe kind of a record's workload; ``None`` for a record created without Kubernetes."""
    if record.backend_catalog != "k8s" or record.backend_type not in KINDS:
        return None
    return KINDS[record.backend_type]


def require_kind(record: DeploymentRecord, code: str) -> Kind:
    """The workload kind, or 422 with ``code`` (the spec names invalid_backend or invalid_request)."""
    kind = workload_kind(record)
    if kind is None:
        raise unprocessable(f"deployment {record.id} has no valid Kubernetes workload", error=code)
    return kind


def visible_project(who: Principal, *, write: bool) -> str | None:
    """The one project whose live records the caller may see; ``None`` for every project (global readers'
    reads only: writes always stay in the token's own project)."""
    return who.owner if write or not who.global_read else None

