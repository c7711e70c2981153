"""The state a decisions request asks about: a string, an object whose keys are its parts, or an array.

`roles` says what each part is: omitted → each key names its part's role; `null` → no part has a role; an
object → a role (or null) per key. A question reads the whole state or the parts its `over` names; several parts
are read as `role:\\nvalue` blocks joined by blank lines, a part without a role as its value alone.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Literal

from ..errors import ApiError
from .questions import QuestionError, render

# Keys a span question reads by default, in order (the answer is what a guard scans first; then the user's words).
SPAN_DEFAULTS = ("answer", "response", "request", "user", "prompt")
OMITTED: Any = object()  # `roles` absent from the request (distinct from an explicit null)


@dataclass(frozen=True)
class Part:
    key: str | None  # None for a string or array state
    role: str | None
    text: str


@dataclass(frozen=True)
class View:
    """What one question reads: the rendered text and, when it is exactly one part, that part (span offsets)."""

    text: str
    keys: tuple[str | None, ...]
    parts: tuple[str, ...] = ()  # each part's own text, when the view holds several


@dataclass(frozen=True)
class State:
    kind: Literal["text", "object", "array"]
    parts: tuple[Part, ...]

    @property
    def keys(self) -> list[str]:
        return [p.key for p in self.parts if p.key is not None]

    def view(self, over: tuple[str, ...] | None) -> View:
        if over is None:
            return self._render(self.parts)
        if self.kind != "object":
            raise QuestionError(f"over names parts of an object state; this state is {_article(self.kind)}")
        unknown = [name for name in over if name not in self.keys]
        if unknown:
            raise QuestionError(f"over names unknown part{'s' if len(unknown) > 1 else ''} {unknown}; the state's "
                                f"parts are {self.keys}")
        wanted = set(over)
        return self._render(tuple(p for p in self.parts if p.key in wanted))

    def span_view(self, over: tuple[str, ...] | None) -> View:
        """Span offsets index one part, so a span question reads exactly one: its own text, never its rendered
        `role:\n…` block (offsets are code points of the part read)."""
        if over is not None:
            if len(over) != 1:
                raise QuestionError("a span question reads one part; over must name exactly one")
            self.view(over)  # the same errors as any question naming parts
            named = next(p for p in self.parts if p.key == over[0])
            return View(named.text, (named.key,))
        if len(self.parts) == 1:
            return View(self.parts[0].text, (self.parts[0].key,))
        by_role = {p.role: p for p in self.parts if p.role is not None}
        by_key = {p.key: p for p in self.parts}
        for name in SPAN_DEFAULTS:
            part = by_key.get(name) or by_role.get(name)
            if part is not None:
                return View(part.text, (part.key,))
        raise QuestionError(f"a span question reads one part; name it with over (parts: {self.keys})")

    @staticmethod
    def _render(parts: tuple[Part, ...]) -> View:
        if len(parts) == 1 and (parts[0].key is None or parts[0].role is None):
            return View(parts[0].text, (parts[0].key,))
        blocks = [f"{p.role}:\n{p.text}" if p.role else p.text for p in parts]
        return View("\n\n".join(blocks), tuple(p.key for p in parts),
                    tuple(p.text for p in parts) if len(parts) > 1 else ())


def _article(kind: str) -> str:
    return {"text": "a string", "array": "an array"}.get(kind, "an object")


def parse_state(value: Any, roles: Any = OMITTED, *, where: str = "state") -> State:
    """The state and its roles; anything malformed fails the request (400) naming the field."""
    if isinstance(value, str):
        if not value:
            raise ApiError("invalid_request", f"{where} must not be an empty string")
        _no_roles(roles, where, "a string")
        return State("text", (Part(None, None, value),))
    if isinstance(value, list):
        if not value:
            raise ApiError("invalid_request", f"{where} must not be an empty array")
        _no_roles(roles, where, "an array")
        return State("array", (Part(None, None, render(value)),))
    if not isinstance(value, dict) or isinstance(value, bool):
        raise ApiError("invalid_request", f"{where} must be a string, an object or an array")
    if not value:
        raise ApiError("invalid_request", f"{where} must have at least one part")
    if roles is OMITTED:
        role_of: dict[str, str | None] = {k: k for k in value}
    elif roles is None:
        role_of = dict.fromkeys(value)
    elif isinstance(roles, dict):
        unknown = [k for k in roles if k not in value]
        if unknown:
            raise ApiError("invalid_request", f"roles names parts the state does not have: {unknown}")
        bad = [k for k, r in roles.items() if r is not None and (not isinstance(r, str) or not r.strip())]
        if bad:
            raise ApiError("invalid_request", f"roles must be non-blank strings or null: {bad}")
        role_of = {k: roles.get(k) for k in value}
    else:
        raise ApiError("invalid_request", "roles must be an object or null")
    parts = []
    for key, part in value.items():
        if not key.strip():
            raise ApiError("invalid_request", f"{where} part names must not be blank")
        if part is None or (isinstance(part, str) and not part):
            raise ApiError("invalid_request", f"{where} part {key!r} is empty")
        parts.append(Part(key, role_of[key], render(part)))
    return State("object", tuple(parts))


def _no_roles(roles: Any, where: str, kind: str) -> None:
    if roles is not OMITTED and roles is not None:
        raise ApiError("invalid_request", f"roles names parts of an object state; {where} is {kind}")
