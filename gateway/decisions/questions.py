"""Questions of a decisions request: validated by hand so each failure names its field in the reference's words.

A question uses exactly one form — `criteria`, or the router-config list of its type (`choices`, `levels`,
`labels`) — and only its type's fields. An invalid question is answered in place
(`{"type", "error": "invalid_question", "message"}`); its siblings are answered normally.
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any, Literal

import orjson

from ..cards import DecisionSpec
from ..errors import QuestionCode

TYPES = ("choice", "noul", "score", "set", "span", "box", "track")
MIN_OPTIONS, MAX_OPTIONS = 2, 255
MIN_LEVELS, MAX_LEVELS = 2, 10
MIN_LABELS, MAX_LABELS = 1, 255
NOUL_KEYS = ("false", "true")

COMMON = {"type", "instructions", "over", "require_full_input", "overflow", "preset"}
# Each type's own fields: the criteria form, its list form, and what else it takes.
FIELDS: dict[str, set[str]] = {
    "choice": {"criteria", "choices"},
    "noul": {"criteria", "choices"},
    "score": {"criteria", "levels"},
    "set": {"criteria", "labels", "threshold"},
    "span": {"criteria", "labels", "threshold"},
    "box": {"at"},
    "track": {"rate"},
}
LIST_FORM = {"choice": "choices", "noul": "choices", "score": "levels", "set": "labels", "span": "labels"}
PRESET_FIELDS = {"preset", "type", "over", "threshold"}


@dataclass(frozen=True)
class Option:
    key: str
    description: str | None  # rendered text; None: the key alone says it (or the family's default for noul)


@dataclass(frozen=True)
class Question:
    id: str
    type: str
    instructions: str
    options: tuple[Option, ...] = ()  # choice options; noul (false, true); score levels "0".."K-1"; set/span labels
    threshold: float | None = None
    preset: str | None = None
    over: tuple[str, ...] | None = None
    overflow: Literal["window", "truncate"] | None = None
    require_full_input: bool = False
    extra: dict[str, Any] = field(default_factory=dict)  # box/track fields

    @property
    def keys(self) -> list[str]:
        return [o.key for o in self.options]


@dataclass(frozen=True)
class Invalid:
    id: str
    type: str | None
    message: str
    code: QuestionCode = "invalid_question"


class QuestionError(ValueError):
    def __init__(self, message: str, code: QuestionCode = "invalid_question") -> None:
        super().__init__(message)
        self.code = code


def render(value: Any) -> str:
    """Object/array instructions and descriptions are read as canonical JSON text."""
    if isinstance(value, str):
        return value
    try:
        return orjson.dumps(value, option=orjson.OPT_SORT_KEYS).decode()
    except TypeError:  # integers beyond 64 bits are valid JSON (orjson refuses them): the stdlib writes them
        return json.dumps(value, sort_keys=True, separators=(",", ":"), ensure_ascii=False)


def _text(value: Any, what: str, *, nullable: bool = False) -> str | None:
    if value is None:
        if nullable:
            return None
        raise QuestionError(f"{what} must not be null")
    if isinstance(value, bool) or not isinstance(value, str | dict | list):
        raise QuestionError(f"{what} must be a string, an object or an array")
    text = render(value)
    if isinstance(value, str) and not value.strip():
        raise QuestionError(f"{what} must not be blank")
    if not isinstance(value, str) and not value:
        raise QuestionError(f"{what} must not be empty")
    return text


def _keyed(items: list[tuple[Any, Any]], what: str, low: int, high: int, noun: str) -> tuple[Option, ...]:
    if not low <= len(items) <= high:
        raise QuestionError(f"{what} must name {low} to {high} {noun}")
    seen: set[str] = set()
    out = []
    for key, description in items:
        if not isinstance(key, str):
            raise QuestionError(f"{what} keys must be strings")
        if not key.strip():
            raise QuestionError(f"{what} keys must not be blank")
        if key in seen:
            raise QuestionError(f"{what} name {key!r} twice")
        seen.add(key)
        out.append(Option(key, _text(description, f"the description of {key!r}", nullable=True)))
    return tuple(out)


def _list_form(value: Any, what: str) -> list[tuple[Any, Any]]:
    if not isinstance(value, list):
        raise QuestionError(f"{what} must be a list of {{key, description}} objects")
    items = []
    for entry in value:
        if not isinstance(entry, dict) or "key" not in entry or set(entry) - {"key", "description"}:
            raise QuestionError(f"{what} entries must be objects with a key and an optional description")
        items.append((entry["key"], entry.get("description")))
    return items


def _options(qtype: str, raw: Mapping[str, Any]) -> tuple[Option, ...]:
    listed = LIST_FORM[qtype]
    if "criteria" in raw and listed in raw:
        raise QuestionError(f"use criteria or {listed}, not both")
    form = "criteria" if "criteria" in raw else listed
    value = raw.get(form)
    if qtype == "noul":
        if value is None:
            return (Option("false", None), Option("true", None))
        items = list(value.items()) if form == "criteria" and isinstance(value, dict) else (
            _list_form(value, form) if form == "choices" else None)
        if items is None:
            raise QuestionError("criteria must be an object with the keys false and true")
        keys = [k for k, _ in items]
        if any(k not in NOUL_KEYS for k in keys) or len(set(keys)) != len(keys):
            raise QuestionError(f"noul {form} take only the keys false and true")
        given = dict(items)
        return tuple(Option(k, _text(given.get(k), f"the description of {k!r}", nullable=True)) for k in NOUL_KEYS)
    if value is None:
        raise QuestionError(f"{qtype} questions need criteria or {listed}")
    if qtype == "score":
        if not isinstance(value, list):
            raise QuestionError(f"{form} must be a list of level descriptions")
        if not MIN_LEVELS <= len(value) <= MAX_LEVELS:
            raise QuestionError(f"{form} must list {MIN_LEVELS} to {MAX_LEVELS} levels")
        return tuple(Option(str(i), _text(v, f"level {i}")) for i, v in enumerate(value))
    low, high, noun = (MIN_OPTIONS, MAX_OPTIONS, "options") if qtype == "choice" else (MIN_LABELS, MAX_LABELS,
                                                                                       "labels")
    if form == "criteria":
        if not isinstance(value, dict):
            raise QuestionError(f"criteria must be an object of {noun} to descriptions")
        return _keyed(list(value.items()), "criteria", low, high, noun)
    return _keyed(_list_form(value, form), form, low, high, noun)


def _over(value: Any) -> tuple[str, ...] | None:
    if value is None:
        return None
    names = [value] if isinstance(value, str) else value
    if not isinstance(names, list) or not names or not all(isinstance(n, str) and n for n in names):
        raise QuestionError("over must name a state part or a non-empty list of them")
    return tuple(names)


def validate(qid: str, raw: Any, spec: DecisionSpec, model_id: str) -> Question | Invalid:
    """One question against the card's types and presets; never raises."""
    qtype = raw.get("type") if isinstance(raw, dict) else None
    shown = qtype if isinstance(qtype, str) and qtype in TYPES else None
    try:
        if not isinstance(raw, dict):
            raise QuestionError("a question must be an object")
        return _validate(qid, raw, spec, model_id)
    except QuestionError as exc:
        return Invalid(qid, shown, str(exc), exc.code)


def _validate(qid: str, raw: dict[str, Any], spec: DecisionSpec, model_id: str) -> Question:
    qtype = raw.get("type")
    if qtype not in TYPES:
        raise QuestionError(f"type must be one of {list(spec.question_types)}")
    if qtype in ("box", "track") and qtype not in spec.question_types:
        raise QuestionError(f"model {model_id} does not answer {qtype} questions",
                            "box_unsupported" if qtype == "box" else "track_unsupported")
    if qtype not in spec.question_types:
        raise QuestionError(f"model {model_id} does not answer {qtype} questions; it answers "
                            f"{list(spec.question_types)}")
    preset = raw.get("preset")
    if preset is not None:
        if not isinstance(preset, str) or not preset:
            raise QuestionError("preset must be a non-empty string")
        own = set(raw) - PRESET_FIELDS
        if preset in spec.presets:
            return _preset(qid, raw, spec, model_id)
        if not own:  # a bare preset the card does not define
            raise QuestionError(f"model {model_id} has no preset {preset!r}; presets: {sorted(spec.presets)}")
        # A typed question naming a preset the card does not list is answered as written (System One 5.0).
    unknown = sorted(set(raw) - COMMON - FIELDS[qtype])
    if unknown:
        raise QuestionError(f"{qtype} questions do not take {unknown}")
    if "instructions" not in raw:
        raise QuestionError("instructions are required")
    instructions = _text(raw["instructions"], "instructions")
    assert instructions is not None
    threshold = raw.get("threshold")
    if threshold is not None and (isinstance(threshold, bool) or not isinstance(threshold, int | float)
                                  or not 0 <= threshold <= 1):
        raise QuestionError("threshold must be a number from 0 to 1")
    full = raw.get("require_full_input", False)
    if not isinstance(full, bool):
        raise QuestionError("require_full_input must be true or false")
    overflow = raw.get("overflow")
    if overflow is not None and overflow not in ("window", "truncate"):
        raise QuestionError("overflow must be 'window' or 'truncate'")
    if full and overflow == "truncate":
        raise QuestionError("require_full_input cannot be used with overflow 'truncate'")
    options = _options(qtype, raw) if qtype in LIST_FORM else ()
    extra = {k: raw[k] for k in FIELDS[qtype] if k in raw and k not in ("criteria", "threshold") and
             k != LIST_FORM.get(qtype)}
    _moments(extra)
    return Question(qid, qtype, instructions, options, None if threshold is None else float(threshold),
                    preset if isinstance(preset, str) else None, _over(raw.get("over")), overflow, full, extra)


def _moments(extra: dict[str, Any]) -> None:
    """`at` (box) is a moment of the state's video in seconds; `rate` (track) samples it 1 or 2 times a second."""
    at = extra.get("at")
    if "at" in extra and (isinstance(at, bool) or not isinstance(at, int | float) or not 0 <= at < float("inf")):
        raise QuestionError("at must be a number of seconds from 0 (a moment of the state's video)")
    rate = extra.get("rate")
    if "rate" in extra and (isinstance(rate, bool) or rate not in (1, 2)):
        raise QuestionError("rate must be 1 or 2 (samples a second)")


def _preset(qid: str, raw: dict[str, Any], spec: DecisionSpec, model_id: str) -> Question:
    """A named question from the card: only `type`, `over` and `threshold` may be given beside it."""
    name = raw["preset"]
    definition = dict(spec.presets[name])
    if raw["type"] != definition.get("type"):
        raise QuestionError(f"preset {name!r} is a {definition.get('type')} question, not {raw['type']}")
    extra = sorted(set(raw) - PRESET_FIELDS)
    if extra and not set(extra) <= COMMON | FIELDS[raw["type"]]:
        raise QuestionError(f"preset questions take only {sorted(PRESET_FIELDS)}, not {extra}")
    definition.pop("description", None)
    merged: dict[str, Any] = {**definition, **{k: raw[k] for k in ("over", "threshold") if k in raw}}
    merged.pop("preset", None)
    question = _validate(qid, merged, spec, model_id)
    return Question(question.id, question.type, question.instructions, question.options, question.threshold, name,
                    question.over, question.overflow, question.require_full_input, question.extra)


def answer_ids(questions: list[Question | Invalid]) -> dict[str, str]:
    """Every answer id a request produces (a set adds `<id>.<label>`), mapped to the question that makes it."""
    out: dict[str, str] = {}
    for q in questions:
        out.setdefault(q.id, q.id)
        if isinstance(q, Question) and q.type == "set":
            for key in q.keys:
                out.setdefault(f"{q.id}.{key}", q.id)
    return out


def check_collisions(questions: list[Question | Invalid]) -> list[Question | Invalid]:
    """A set whose `<id>.<label>` is another question's id is invalid (the answers would overwrite each other)."""
    ids = {q.id for q in questions}
    out: list[Question | Invalid] = []
    for q in questions:
        if isinstance(q, Question) and q.type == "set":
            clash = next((k for k in q.keys if f"{q.id}.{k}" in ids), None)
            if clash is not None:
                out.append(Invalid(q.id, q.type, f"label {clash!r} answers as {q.id}.{clash}, which is another "
                                                 "question's id"))
                continue
        out.append(q)
    return out
