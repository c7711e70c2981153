"""Deadlines: `deadline_ms` counted from the request's arrival, turned into what each Triton call may still wait."""

from __future__ import annotations

import time

from ..timing import Timing


def deadline_ns(deadline_ms: float | None, timing: Timing | None) -> int | None:
    """Unix-ns deadline measured from the request's arrival (the handler start)."""
    if deadline_ms is None:
        return None
    elapsed = time.perf_counter() - timing.started if timing is not None else 0.0
    # any finite number above 0 is a valid deadline_ms; past a year it is as good as none (and int(inf) fails)
    return time.time_ns() + int((min(deadline_ms, 365 * 86_400_000.0) / 1000 - elapsed) * 1e9)


def timeout_us(deadline: int | None) -> int | None:
    """Microseconds left until `deadline` (None: no deadline); 0 when it has passed, so nothing is sent."""
    if deadline is None:
        return None
    left = deadline - time.time_ns()
    return 0 if left <= 0 else max(1, left // 1000)
