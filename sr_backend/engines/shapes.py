"""What an engine's graph output is, from its shape: one vector per row, one per token, or one per layer."""

from __future__ import annotations

from collections.abc import Sequence


def per_token_output(shape: Sequence[object]) -> bool:
    """Is a graph output `[B, L, C]` per token? Only if its second axis is the (dynamic) sequence: the pooled output
    of several layers, `[B, layers, D]`, has a fixed second axis and is one vector per layer, not per token."""
    return len(shape) == 3 and not isinstance(shape[1], int)
