"""Keeping the event loop free: CPU-heavy input preparation of large requests runs on a worker thread."""

from __future__ import annotations

import asyncio
from collections.abc import Callable
from typing import Any, TypeVar

R = TypeVar("R")

INLINE_CHARS = 16 * 1024  # requests with more text than this are tokenized on a worker thread


async def off_loop_if_large(chars: int, fn: Callable[..., R], *args: Any) -> R:
    """Tokenize small requests inline (a thread hop costs more than they do) and large ones on a worker thread,
    so one long input never stalls every other request on the event loop."""
    if chars <= INLINE_CHARS:
        return fn(*args)
    return await asyncio.to_thread(fn, *args)
