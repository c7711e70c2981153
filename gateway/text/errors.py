"""Errors a single input can fail with; the surfaces answer them in place for that item."""

from __future__ import annotations

from typing import Literal

ErrorCode = Literal["max_length_exceeded", "scan_budget_exceeded"]


class InputTooLong(Exception):
    """An input holds more tokens than its budget allows (``code`` is the API error code)."""

    def __init__(self, code: ErrorCode, message: str, *, tokens: int, budget: int, lower_bound: bool) -> None:
        super().__init__(message)
        self.code: ErrorCode = code
        self.message = message
        self.tokens = tokens
        """Tokens counted, special tokens included; a lower bound when ``lower_bound``."""
        self.budget = budget
        self.lower_bound = lower_bound


class UnsupportedTokenizer(ValueError):
    """The tokenizer frames texts in a way the encoder cannot reproduce around a cut."""
