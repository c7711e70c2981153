"""The /v1/decisions request as parsed: its options and top-level members, before any entry is read.

`state`, `questions`, `roles` and the batch's entries stay loose here (`Any`): they are checked by hand where they
are read (entries.py, questions.py, state.py), so the messages use the reference's words.
"""

from __future__ import annotations

from typing import Any

from pydantic import Field, StrictBool, StrictInt, StrictStr

from ..errors import ApiError
from ..execution.requests import MIN_DEADLINE_MS, Strict, parse


class DecisionOptions(Strict):
    deadline_ms: float | StrictInt | None = Field(default=None, ge=MIN_DEADLINE_MS)
    return_meta: StrictBool = False
    max_tokens: StrictInt | None = Field(default=None, ge=1)
    long_context: StrictBool = False


class DecisionRequest(Strict):
    """Top level; `state`, `questions`, `roles` and entries are checked by hand for the reference's messages."""

    model: StrictStr | None = None
    state: Any = None
    questions: Any = None
    roles: Any = None
    images: list[Any] | None = None
    videos: list[Any] | None = None
    states: Any = None
    assets: dict[str, Any] | None = None
    options: DecisionOptions = DecisionOptions()


def parse_request(body: Any) -> DecisionRequest:
    """The request, in one of its two forms: a state with its questions, or a batch (`states`), never both."""
    req = parse(DecisionRequest, body)
    top = {k for k in ("state", "questions", "images", "videos") if k in req.model_fields_set}
    if "states" in req.model_fields_set:
        if top:
            raise ApiError("invalid_request", f"a batch request (states) has no top-level {sorted(top)}: use one "
                                              "form or the other")
    else:
        for name in ("state", "questions"):
            if name not in req.model_fields_set:
                raise ApiError("invalid_request", f"{name} is required")
    return req
