"""Which moments of a video a question reads: `box` with `at` one (seconds from the start), `track` every sampled
time, `rate` (1, the default, or 2) times a second from 0 up to the end, and every other question an overview of
`OVERVIEW_FRAMES` frames spread evenly over the video (the first frame when its length is unknown). Each sampled
frame is held (scaled) until the request is answered, so one request samples at most `MAX_REQUEST_FRAMES` frames
across its entries (a 30-s track at rate 2 and an overview: 64)."""

from __future__ import annotations

import math

RATES = (1, 2)
DEFAULT_RATE = 1
MAX_REQUEST_FRAMES = 64
OVERVIEW_FRAMES = 4


def track_times(seconds: float, rate: int) -> list[float]:
    """0, 1/rate, 2/rate, … while a frame is on screen (before the end); a clip shorter than a step reads 0."""
    count = max(1, math.ceil(seconds * rate - 1e-9))
    return [round(k / rate, 6) for k in range(count)]


def times(question_type: str, extra: dict[str, object], seconds: float) -> list[float]:
    if question_type == "track":
        rate = extra.get("rate", DEFAULT_RATE)
        assert isinstance(rate, int)
        return track_times(seconds, rate)
    at = extra["at"]
    assert isinstance(at, int | float)
    return [float(at)]


def overview_times(seconds: float | None) -> list[float]:
    """The middles of OVERVIEW_FRAMES equal stretches of the video; [0] when its length is unknown."""
    if seconds is None:
        return [0.0]
    return sorted({round((k + 0.5) * seconds / OVERVIEW_FRAMES, 6) for k in range(OVERVIEW_FRAMES)})
