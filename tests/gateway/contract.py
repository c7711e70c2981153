"""Validate responses against gateway/openapi.yaml (the contract): OpenAPI 3.0 → JSON Schema (nullable, $ref)."""

from __future__ import annotations

import copy
import re
from functools import cache
from pathlib import Path
from typing import Any

import jsonschema
import yaml

OPENAPI = Path(__file__).resolve().parents[2] / "gateway" / "openapi.yaml"


@cache
def document() -> dict[str, Any]:
    return yaml.safe_load(OPENAPI.read_text())


def _convert(node: Any) -> Any:
    """nullable: true → type [T, null]; OpenAPI 3.0's boolean exclusiveMinimum → draft-4 semantics kept."""
    if isinstance(node, dict):
        out = {k: _convert(v) for k, v in node.items() if k not in ("nullable", "example")}
        if node.get("nullable"):
            if "type" in out:
                out["type"] = [out["type"], "null"]
            if "enum" in out:
                out["enum"] = [*out["enum"], None]
            if "$ref" in out or "oneOf" in out:
                out = {"anyOf": [out, {"type": "null"}]}
        return out
    if isinstance(node, list):
        return [_convert(v) for v in node]
    return node


@cache
def _root() -> dict[str, Any]:
    return _convert(copy.deepcopy(document()))


def schema_for(path: str, method: str, status: int, media: str = "application/json") -> dict[str, Any]:
    op = document()["paths"][path][method.lower()]
    responses = op["responses"]
    response = responses.get(str(status)) or responses.get("default")
    assert response is not None, f"{method} {path} does not document status {status}"
    if "$ref" in response:
        response = document()["components"]["responses"][response["$ref"].rsplit("/", 1)[1]]
    schema = response["content"][media]["schema"]
    return {"$ref": schema["$ref"]} if "$ref" in schema else schema


def check(path: str, method: str, status: int, body: Any, headers: Any = None) -> None:
    """Raise if body (and Server-Timing, when documented) does not match the contract for this status."""
    schema = _convert(schema_for(path, method, status))
    root = _root()
    resolver_schema = {**schema, "components": root["components"]}
    jsonschema.Draft4Validator(resolver_schema).validate(body)
    op = document()["paths"][path][method.lower()]
    response = op["responses"][str(status)]
    if "$ref" in response:
        response = document()["components"]["responses"][response["$ref"].rsplit("/", 1)[1]]
    if "Server-Timing" in response.get("headers", {}) and headers is not None:
        pattern = document()["components"]["headers"]["ServerTiming"]["schema"]["pattern"]
        jsonschema.validate(headers.get("Server-Timing"), {"type": "string", "pattern": pattern})


PHASES = ["parse", "tokenize", "queue", "forward", "post", "serialize", "total"]


def timings(response: Any) -> dict[str, float]:
    """Server-Timing of a response as {phase: ms}, after checking every phase is there, in order, with 3 decimals."""
    parts = [p.split(";dur=") for p in response.headers["Server-Timing"].split(", ")]
    assert [name for name, _ in parts] == PHASES
    assert all(re.fullmatch(r"\d+\.\d{3}", v) for _, v in parts)
    return {name: float(v) for name, v in parts}
