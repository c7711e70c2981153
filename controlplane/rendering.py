"""The spec's deployment object, rendered from a catalog row (plus live fields when the caller read them)."""

from __future__ import annotations

from datetime import UTC, datetime
from typing import Any


def rfc3339(value: datetime) -> str:
    """Responses show UTC seconds; the catalog keeps full precision for ordering."""
    if value.tzinfo is None:
        value = value.replace(tzinfo=UTC)
    return value.astimezone(UTC).strftime("%Y-%m-%dT%H:%M:%SZ")


def render(row: Any, live: dict[str, Any] | None = None) -> dict[str, Any]:
    """The deployment object of the spec; ``live`` adds ready/conditions read from KServe."""
    spec = {k: val for k, val in dict(row.spec).items() if val not in (None, "", [], {})}
    out: dict[str, Any] = {
        "id": row.id,
        "name": row.name,
        "description": row.description or "",
        "status": row.status,
        "projectId": row.project_id,
        "ownerUserId": row.owner_user_id,
        "backend": {
            "catalog": row.backend_catalog or "",
            "type": row.backend_type or "",
            "id": f"{row.project_id}/{row.k8s_name}",
        },
        "spec": spec,
        "stopped": bool(row.stopped),
        "createdAt": rfc3339(row.created_at),
        "updatedAt": rfc3339(row.updated_at),
    }
    for key, col in (("projectName", "project_name"), ("domainId", "domain_id"),
                     ("domainName", "domain_name"), ("ownerName", "owner_name")):
        if getattr(row, col):
            out[key] = getattr(row, col)
    if row.labels:
        out["labels"] = dict(row.labels)
    if live:
        if live.get("ready"):
            out["ready"] = live["ready"]
        if live.get("conditions"):
            out["conditions"] = live["conditions"]
    return out
