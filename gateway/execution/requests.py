"""Reading request objects: strict pydantic models, and validation errors as the spec's one-line messages."""

from __future__ import annotations

from typing import Any, Literal, TypeVar

from pydantic import BaseModel, ConfigDict, Field, StrictBool, StrictInt, ValidationError

from ..errors import ApiError

M = TypeVar("M", bound=BaseModel)


class Strict(BaseModel):
    """Request objects: unknown members are errors, and no type coercion ("5" is not 5, 1 is not true)."""

    model_config = ConfigDict(extra="forbid", strict=True, frozen=True)


# The smallest deadline_ms taken: one microsecond. A smaller positive number in JSON can round to 0.0 (1e-400) or
# to a deadline no input can meet; one stated bound keeps the document and the server in step (schemathesis).
MIN_DEADLINE_MS = 0.001


class TextOptions(Strict):
    """Options of surfaces that read each text up to a token budget (embeddings, rerank)."""

    overflow: Literal["reject", "truncate"] = "reject"
    max_tokens: StrictInt | None = Field(default=None, ge=1)
    deadline_ms: float | StrictInt | None = Field(default=None, ge=MIN_DEADLINE_MS)
    return_meta: StrictBool = False


def _location(loc: tuple[Any, ...]) -> str:
    out = ""
    for part in loc:
        out += f"[{part}]" if isinstance(part, int) else (f".{part}" if out else str(part))
    return out or "body"


def validation_message(exc: ValidationError) -> str:
    unknown = [_location(e["loc"]) for e in exc.errors() if e["type"] == "extra_forbidden"]
    if unknown:
        return f"unknown member{'s' if len(unknown) > 1 else ''}: {', '.join(unknown)}"
    parts = []
    for e in exc.errors()[:5]:
        # union errors name each branch; the last element of loc is then a type name, which helps no one
        loc = tuple(p for p in e["loc"] if not (isinstance(p, str) and ("[" in p or p in {"str", "list"})))
        parts.append(f"{_location(loc)}: {e['msg']}")
    return "; ".join(parts)


def parse(model: type[M], body: Any) -> M:
    if not isinstance(body, dict):
        raise ApiError("invalid_request", "the request body must be a JSON object")
    try:
        return model.model_validate(body)
    except ValidationError as exc:
        raise ApiError("invalid_request", validation_message(exc)) from exc
