"""Per-request phase clock behind the `Server-Timing` header."""

from __future__ import annotations

import time
from dataclasses import dataclass, field

PHASES = ("parse", "tokenize", "queue", "forward", "post", "serialize")


@dataclass
class Timing:
    """Accumulates milliseconds per phase. queue/forward are set from Triton's own per-request timing."""

    started: float = field(default_factory=time.perf_counter)
    ms: dict[str, float] = field(default_factory=lambda: dict.fromkeys(PHASES, 0.0))
    total_ms: float | None = None
    _open: tuple[str, float] | None = None  # a phase begun and not yet charged

    def add(self, phase: str, since: float) -> float:
        """Charge the time since `since` to `phase`; returns now, so phases can be chained."""
        now = time.perf_counter()
        self.ms[phase] += (now - since) * 1000.0
        if self._open is not None and self._open[0] == phase:
            self._open = None
        return now

    def begin(self, phase: str) -> None:
        """Mark the start of a phase, so a request that fails inside it still shows where its time went."""
        self._open = (phase, time.perf_counter())

    def settle(self) -> None:
        """Charge a phase begun but not finished (the request failed in it) up to now."""
        if self._open is not None:
            phase, since = self._open
            self._open = None
            self.add(phase, since)

    def finish(self) -> None:
        self.total_ms = (time.perf_counter() - self.started) * 1000.0

    def header(self) -> str:
        if self.total_ms is None:
            self.finish()
        parts = [f"{name};dur={self.ms[name]:.3f}" for name in PHASES]
        parts.append(f"total;dur={self.total_ms:.3f}")
        return ", ".join(parts)


def charge(timing: Timing | None, phase: str, since: float) -> None:
    """Charge `phase` on the request's clock where there is one (readiness goldens and tools run without)."""
    if timing is not None:
        timing.add(phase, since)


def charge_model(timing: Timing | None, queue_ms: float, forward_ms: float) -> None:
    """Add Triton's own queue and forward time (from the backend's TIMING output) to the request's clock."""
    if timing is not None:
        timing.ms["queue"] += queue_ms
        timing.ms["forward"] += forward_ms
