"""Engines, models and artifacts: loaded from a YAML catalog file and looked up with visibility rules.

Each entry is public (no ``project``) or owned by one project. A deployment may only combine resources
that are all public or all owned by the caller's project. The database side (upserts, visibility-checked
lookups) is :mod:`controlplane.store.catalog`.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import yaml
from sqlalchemy.ext.asyncio import AsyncEngine

from controlplane.store.catalog import upsert_entries

SAMPLE_CATALOG = Path(__file__).with_name("catalog.yaml")
BACKEND_TYPES = ("InferenceService", "LLMInferenceService")


class CatalogError(ValueError):
    """The catalog file is malformed; the message names the entry."""


def image_pin_problem(ref: str) -> str | None:
    """Why an image reference is not pinned (``None`` when it is): an untagged or ``:latest`` image changes
    under a running deployment on the next pull, so every pod of one deployment could run different code."""
    if "@" in ref:
        return None if ref.split("@", 1)[1] else "has an empty digest"
    last = ref.rsplit("/", 1)[-1]
    if ":" not in last or not last.split(":", 1)[1]:
        return "has no tag"
    if last.split(":", 1)[1] == "latest":
        return "is tagged :latest"
    return None


def _images(node: Any) -> list[str]:
    """Every container ``image`` in a parsed Kubernetes document (any nesting, any container list)."""
    if isinstance(node, dict):
        found = [node["image"]] if isinstance(node.get("image"), str) else []
        return found + [img for key, val in node.items() if key != "image" for img in _images(val)]
    if isinstance(node, list):
        return [img for item in node for img in _images(item)]
    return []


def _check_images(e: dict[str, Any]) -> None:
    refs = [e["image"]] if e.get("image") is not None else []
    if e.get("yaml"):
        try:
            docs = list(yaml.safe_load_all(str(e["yaml"])))
        except yaml.YAMLError as exc:
            raise CatalogError(f"engine {e['id']}: yaml is not valid YAML ({exc})") from exc
        refs += _images(docs)
    for ref in refs:
        problem = image_pin_problem(str(ref)) if isinstance(ref, str) and ref else "is not a non-empty string"
        if problem:
            raise CatalogError(f"engine {e['id']}: image {ref!r} {problem}; pin a version tag or a digest")


def _engine_row(e: dict[str, Any]) -> dict[str, Any]:
    for key in ("id", "name", "runtime", "backend", "configName"):
        if not e.get(key):
            raise CatalogError(f"engine {e.get('id', '?')}: missing {key}")
    _check_images(e)
    return {
        "id": str(e["id"]),
        "name": str(e["name"]),
        "project_id": e.get("project"),
        "runtime": str(e["runtime"]).lower(),
        "backend_type": str(e["backend"]),
        "config_name": str(e["configName"]),
        "model_format": e.get("modelFormat"),
        "image": e.get("image"),
        "command": e.get("command"),
        "args": e.get("args"),
        "env": e.get("env"),
        "resources": e.get("resources"),
        "engine_yaml": e.get("yaml"),
    }


def _model_row(m: dict[str, Any]) -> dict[str, Any]:
    if not m.get("id") or not m.get("name"):
        raise CatalogError(f"model {m.get('id', '?')}: id and name are required")
    return {"id": str(m["id"]), "name": str(m["name"]), "project_id": m.get("project")}


def _artifact_row(a: dict[str, Any]) -> dict[str, Any]:
    if not a.get("id") or not a.get("name") or not a.get("uri"):
        raise CatalogError(f"artifact {a.get('id', '?')}: id, name and uri are required")
    return {
        "id": str(a["id"]),
        "name": str(a["name"]),
        "project_id": a.get("project"),
        "model_id": a.get("modelId"),
        "uri": str(a["uri"]),
        "ready": bool(a.get("ready", True)),
        "lora": bool(a.get("lora", False)),
    }


async def import_catalog(engine: AsyncEngine, data: dict[str, Any]) -> dict[str, int]:
    """Insert or update every entry of a parsed catalog document in one transaction; returns counts."""
    return await upsert_entries(
        engine,
        engine_rows=[_engine_row(e) for e in data.get("engines") or []],
        model_rows=[_model_row(m) for m in data.get("models") or []],
        artifact_rows=[_artifact_row(a) for a in data.get("artifacts") or []],
    )


async def import_catalog_file(engine: AsyncEngine, path: str | Path) -> dict[str, int]:
    """Parse a YAML catalog file and import it."""
    data = yaml.safe_load(Path(path).read_text(encoding="utf-8")) or {}
    if not isinstance(data, dict):
        raise CatalogError("catalog file must be a mapping with engines/models/artifacts")
    return await import_catalog(engine, data)

