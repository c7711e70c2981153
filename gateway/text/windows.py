"""Windows over a long input's content tokens.

A model that reads in windows frames every window with the tokenizer's special tokens, so a
window of ``tokens`` holds ``tokens - envelope`` content tokens. Windows start every
``width - overlap`` tokens and the last ends at the content end, so every content token is read
and neighbours share exactly ``overlap`` tokens (the last may be shorter).
"""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class Window:
    """One framed window and where its content lies in the input."""

    ids: list[int]
    """Model input ids, special tokens included."""
    offsets: list[tuple[int, int]]
    """Code-point offsets per id (end exclusive); (0, 0) for special tokens."""
    type_ids: list[int]
    content_start: int
    """Index of the window's first content token in the input's content tokens."""
    content_end: int
    """One past the window's last content token."""
    start: int
    """Code point where the window's content starts in the input."""
    end: int
    """Code point where the window's content ends (exclusive)."""


def plan_windows(content_tokens: int, width: int, overlap: int) -> list[tuple[int, int]]:
    """Content-token ranges ``[start, end)`` of each window."""
    if width < 1:
        raise ValueError("a window must hold at least one content token")
    if not 0 <= overlap < width:
        raise ValueError(f"overlap must be at least 0 and below the window's {width} content tokens")
    spans: list[tuple[int, int]] = []
    start = 0
    stride = width - overlap
    while True:
        end = min(start + width, content_tokens)
        spans.append((start, end))
        if end >= content_tokens:
            return spans
        start += stride
