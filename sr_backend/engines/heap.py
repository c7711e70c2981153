"""glibc's heap under an engine: what it keeps after a forward frees its activations, and the two ways to give it
back (measured per engine; each engine's docstring says which it uses and why)."""

from __future__ import annotations

import ctypes
import ctypes.util
from collections.abc import Callable

from .shapes import bounded

M_MMAP_THRESHOLD = -3  # mallopt's parameter (malloc.h)
MMAP_THRESHOLD = 128 * 1024  # glibc's initial value: a block this large or larger is its own mapping


def _libc() -> ctypes.CDLL | None:
    name = ctypes.util.find_library("c")
    try:
        return ctypes.CDLL(name) if name else None
    except OSError:
        return None


def malloc_trim() -> Callable[[int], int] | None:
    """glibc's malloc_trim (None elsewhere, or unbounded()): gives the heap's free pages back to the OS."""
    libc = _libc() if bounded() else None
    return getattr(libc, "malloc_trim", None)


def fix_mmap_threshold() -> bool:
    """Keep every block of 128 KiB or more a mapping of its own, returned to the OS when freed (True if set).

    glibc raises its mmap threshold to the size of each mapped block that is freed (up to 32 MiB), so after the
    first large free, an engine's activation buffers come from the heap instead, and a heap fragmented by buffers
    of many sizes is never given back. Fixing the threshold (mallopt also turns that adjustment off) costs a page
    fault per page of each large buffer per run, which an engine whose arena is given back after every run pays
    anyway. Process-wide: a Triton Python-backend stub serves one model instance. Not set under unbounded()."""
    libc = _libc() if bounded() else None
    mallopt = getattr(libc, "mallopt", None)
    return bool(mallopt is not None and mallopt(M_MMAP_THRESHOLD, MMAP_THRESHOLD) == 1)
