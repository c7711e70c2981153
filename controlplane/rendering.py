"""The spec's deployment object, rendered from a catalog record (plus live fields when the caller read them)."""

from __future__ import annotations

from datetime import UTC, datetime
from typing import Any

from controlplane.store.records import DeploymentRecord


def rfc3339(value: datetime) -> str:
    """Responses show UTC seconds; the catalog keeps full precision for ordering."""
    if value.tzinfo is None:
        value = value.replace(tzinfo=UTC)
    return value.astimezone(UTC).strftime("%Y-%m-%dT%H:%M:%SZ")


def render(record: DeploymentRecord, live: dict[str, Any] | None = None) -> dict[str, Any]:
    """The deployment object of the spec; ``live`` adds ready/conditions read from KServe."""
    spec = {k: val for k, val in record.spec.items() if val not in (None, "", [], {})}
    out: dict[str, Any] = {
        "id": record.id,
        "name": record.name,
        "description": record.description or "",
        "status": record.status,
        "projectId": record.project_id,
        "ownerUserId": record.owner_user_id,
        "backend": {
            "catalog": record.backend_catalog or "",
            "type": record.backend_type or "",
            "id": f"{record.project_id}/{record.k8s_name}",
        },
        "spec": spec,
        "stopped": record.stopped,
        "createdAt": rfc3339(record.created_at),
        "updatedAt": rfc3339(record.updated_at),
    }
    optional = {"projectName": record.project_name, "domainId": record.domain_id,
                "domainName": record.domain_name, "ownerName": record.owner_name}
    out.update({key: val for key, val in optional.items() if val})
    if record.labels:
        out["labels"] = dict(record.labels)
    if live:
        if live.get("ready"):
            out["ready"] = live["ready"]
        if live.get("conditions"):
            out["conditions"] = live["conditions"]
    return out
