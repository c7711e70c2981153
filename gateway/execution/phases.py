"""Where a request's model time went: waiting in Triton's queue or in a forward, from Triton-side timestamps."""

from __future__ import annotations

from ..triton import Result


def phase_times(results: list[Result], submitted_ns: int) -> tuple[float, float]:
    """(queue_ms, forward_ms) of one request from Triton-side timestamps.

    forward: the time covered by its inputs' executions, from the start of each execute() in Triton until the
    answer is back (readout included), overlapping executions counted once. queue: the rest of the time from the
    first submission until the last answer: waiting before the first forward and between forwards.
    """
    if not results:
        return 0.0, 0.0
    spans = sorted((max(r.execution.started_ns, submitted_ns), r.received_ns) for r in results)
    forward = 0
    start, end = spans[0]
    for s, e in spans[1:]:
        if s > end:
            forward += end - start
            start, end = s, e
        else:
            end = max(end, e)
    forward += end - start
    span = max(r.received_ns for r in results) - submitted_ns
    return max(0.0, (span - forward) / 1e6), forward / 1e6
