"""Shapes: what an engine's graph output is (one vector per row, one per token, or one per layer), and which input
shapes an engine is ever given (`Buckets`: ragged chunks padded to a few shapes, so per-shape state stays bounded)."""

from __future__ import annotations

import bisect
import os
from collections.abc import Sequence
from dataclasses import dataclass


def per_token_output(shape: Sequence[object]) -> bool:
    """Is a graph output `[B, L, C]` per token? Only if its second axis is the (dynamic) sequence: the pooled output
    of several layers, `[B, layers, D]`, has a fixed second axis and is one vector per layer, not per token."""
    return len(shape) == 3 and not isinstance(shape[1], int)


UNBOUNDED_ENV = "SR_BACKEND_UNBOUNDED"  # "1": the old unbounded settings (A/B measurements only; tools/soak.py)


def bounded() -> bool:
    """Shape buckets and per-shape cache caps on (the default); SR_BACKEND_UNBOUNDED=1 turns both off, so a soak
    can show what they prevent and an A/B run can measure what they cost."""
    return os.environ.get(UNBOUNDED_ENV, "") not in ("1", "true", "yes")


@dataclass(frozen=True)
class Buckets:
    """The chunk shapes an engine ever sees: widths round up to one of `lengths` (past the last, to a multiple of
    `length_step`), row counts to one of `rows` (past the last, to a multiple of `row_step`)."""

    lengths: tuple[int, ...]
    rows: tuple[int, ...]
    length_step: int = 256
    row_step: int = 64

    @staticmethod
    def _up(n: int, steps: tuple[int, ...], step: int) -> int:
        i = bisect.bisect_left(steps, n)
        return steps[i] if i < len(steps) else -(-n // step) * step

    def width(self, n: int) -> int:
        return self._up(n, self.lengths, self.length_step)

    def count(self, n: int) -> int:
        return self._up(n, self.rows, self.row_step)

    def widths(self, most: int) -> list[int]:
        """Every width bucket ≤ most (past the last length, its multiples of length_step)."""
        return self._every(most, self.lengths, self.length_step)

    def counts(self, most: int) -> list[int]:
        """Every row-count bucket ≤ most (past the last count, its multiples of row_step)."""
        return self._every(most, self.rows, self.row_step)

    @classmethod
    def _every(cls, most: int, steps: tuple[int, ...], step: int) -> list[int]:
        return [s for s in steps if s <= most] + list(range(cls._up(steps[-1] + 1, steps, step), most + 1, step))

    def most_rows(self, n: int) -> int:
        """The largest row bucket ≤ n (at least 1): a chunk of up to this many rows stays within n once padded."""
        i = bisect.bisect_right(self.rows, n)
        if i < len(self.rows):
            return max(1, self.rows[i - 1]) if i else 1
        return max(self.rows[-1], n // self.row_step * self.row_step)


# MEASURED (docs/benchmarks.md "Memory under a soak"; `python -m tools.soak ab`): MiniLM on OpenVINO bf16, 1 thread,
# random ragged batches of 1-32 rows of 8-128 tokens, the sides interleaved batch by batch in one run on a shared
# 2-core host: steps of about 1.5x (rows 1,2,3,4,6,8,12,…; widths 8,16,24,32,48,64,96,…) ran at 0.91x the
# unbucketed rows/s and powers of two at 0.81x, because a padded row or token costs a whole one and a cached kernel
# saves nothing measurable (OpenVINO's kernel cache at 8, 64 or 5,000 entries: 11.9, 11.8, 11.5 rows/s). So the
# steps are fine (at most one row in eight and 16-32 tokens of padding past 8 rows / 64 tokens): a bounded set of
# shapes (≤ 24 row counts × 19 widths) that bounds every per-shape structure, for a few percent of padding.
DEFAULT_BUCKETS = Buckets(
    lengths=(8, 16, 24, 32, 40, 48, 64, 80, 96, 112, 128, 160, 192, 224, 256, 320, 384, 448, 512),
    rows=(1, 2, 3, 4, 5, 6, 7, 8, 10, 12, 14, 16, 20, 24, 28, 32, 40, 48, 56, 64, 80, 96, 112, 128))
# Steps of 1.5x: 144 shapes within 8,192 tokens instead of 369, for an engine that keeps memory per shape and so
# runs every one at load (torch_engine.py says what it costs and saves).
COARSE_BUCKETS = Buckets(lengths=(8, 16, 24, 32, 48, 64, 96, 128, 192, 256, 384, 512),
                         rows=(1, 2, 3, 4, 6, 8, 12, 16, 24, 32, 48, 64, 96, 128))
