"""Error codes and the one place that maps them to HTTP statuses."""

from __future__ import annotations

from typing import Any, Literal, get_args

from .text.errors import InputTooLong

# The one typed set of error codes: a misspelled code is a type error, and a test holds the OpenAPI enums to these.
ErrorCode = Literal["invalid_request", "model_not_found", "request_too_large", "unsupported_media_type",
                    "unsupported_surface", "overloaded", "internal_error", "not_ready"]
ItemCode = Literal["invalid_input", "max_length_exceeded", "scan_budget_exceeded", "invalid_model_output",
                   "deadline_exceeded", "unavailable"]
QuestionCode = Literal["invalid_question", "question_images_unsupported", "box_unsupported", "track_unsupported",
                       "box_needs_image", "box_target_ambiguous", "box_video_too_long"]

# Request-level codes (the whole request fails) → HTTP status.
STATUS: dict[ErrorCode, int] = {
    "invalid_request": 400,
    "model_not_found": 404,
    "request_too_large": 413,
    "unsupported_media_type": 415,
    "unsupported_surface": 422,
    "overloaded": 429,
    "internal_error": 500,
    "not_ready": 503,
}

# Item-level codes: one input fails inside a 200 answer, its siblings are answered.
ITEM_ERRORS: frozenset[str] = frozenset(get_args(ItemCode))
QUESTION_ERRORS: frozenset[str] = frozenset(get_args(QuestionCode))

RETRY_AFTER = {"overloaded": "1", "not_ready": "5"}

# System One answers a request whose question failed as a whole; its status comes from the first failed question.
QUESTION_STATUS: dict[ItemCode | QuestionCode, int] = {
    "invalid_question": 422, "question_images_unsupported": 422, "box_unsupported": 422, "track_unsupported": 422,
    "box_needs_image": 422, "box_target_ambiguous": 422,
    "max_length_exceeded": 400, "scan_budget_exceeded": 400, "invalid_input": 400, "box_video_too_long": 400,
    "invalid_model_output": 500, "unavailable": 503, "deadline_exceeded": 504,
}
SYSTEMONE_OVERLOADED = 529  # vllm-sr/5.0: an overloaded process (429 elsewhere)


class ApiError(Exception):
    """A request-level failure; rendered as {"error": {"code", "message"}} with the mapped status."""

    def __init__(self, code: ErrorCode, message: str, *, status: int | None = None, reason: str | None = None,
                 limit: int | None = None) -> None:
        """`status` overrides the code's status only for routing errors (unknown path 404, method 405).
        `reason` and `limit` say which limit failed the request (System One shows them as flat fields)."""
        if code not in STATUS:
            raise ValueError(f"unknown error code {code}")
        super().__init__(message)
        self.code: str = code  # subclasses (System One's rendered errors) carry codes of their own
        self.message = message
        self.status = status or STATUS[code]
        self.reason = reason
        self.limit = limit

    def body(self) -> dict[str, Any]:
        return {"error": {"code": self.code, "message": self.message}}

    def headers(self) -> dict[str, str]:
        """Retry-After for the codes a client should retry (1 s overloaded, 5 s not ready)."""
        return {"Retry-After": RETRY_AFTER[self.code]} if self.code in RETRY_AFTER else {}


class ItemError(Exception):
    """One input failed; its siblings are still answered."""

    def __init__(self, code: ItemCode, message: str) -> None:
        if code not in ITEM_ERRORS:
            raise ValueError(f"unknown item error code {code}")
        super().__init__(message)
        self.code = code
        self.message = message


def no_answer(error: ItemError | None = None) -> ItemError:
    """Why an input has no answer: its own error, else the model gave none (invalid_model_output)."""
    return error or ItemError("invalid_model_output", "no answer")


def too_long(exc: InputTooLong) -> ItemError:
    """The item error of an input over its budget: every surface answers it the same way."""
    return ItemError(exc.code, exc.message)
