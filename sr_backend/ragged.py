"""Run a ragged batch of token sequences through one engine (sr_backend.engines: ONNX Runtime, OpenVINO).

Triton hands `execute()` many requests of different lengths. Sorting them by length and packing chunks under a
token budget pads each chunk only to its own longest row, so one long input does not inflate every short one.
Graphs come in three shapes: pooled (`[B, D]` per row: embeddings, sequence logits), pooled at several layers
(`[B, layers, D]`: an embedder whose card declares early exits; each row takes its own layer, so one forward
serves a batch that mixes layers) and per-token (`[B, L, C]`: token-classification logits, sliced back to each
row's own length).
This module has no Triton dependency: the in-process benchmark baseline uses exactly the same code path.

Every chunk's shape is bucketed (`Buckets`): its width rounded up to one of a few lengths and its row count to one
of a few counts, the extra rows copies of a real one and the extra tokens masked. Engines keep per-shape state
(OpenVINO's compiled kernels, ONNX Runtime's memory patterns, oneDNN's primitives, allocator free lists), and
ragged batching made a new (rows, width) shape for nearly every execute: memory grew with the number of shapes
ever seen (issue 23: MiniLM on OpenVINO bf16, two instances 0.57 → 7.87 GB in 5 minutes of varied traffic).
With buckets an engine sees at most len(rows) × len(lengths) shapes (`engines/shapes.py` `DEFAULT_BUCKETS`, chosen
by measurement: its comment has the numbers).
"""

from __future__ import annotations

import time
from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np
import onnxruntime as ort

from .engines import Engine
from .engines.ort_engine import OrtEngine
from .engines.shapes import DEFAULT_BUCKETS, Buckets, bounded

__all__ = ["DEFAULT_BUCKETS", "BatchStats", "Buckets", "RaggedRunner", "Row", "bounded", "plan_chunks"]


@dataclass(frozen=True)
class BatchStats:
    rows: int
    tokens: int  # real tokens
    padded_tokens: int
    forward_ns: int
    chunks: int


@dataclass(frozen=True)
class Row:
    ids: np.ndarray  # int64 [L]
    type_ids: np.ndarray | None = None  # int64 [L]; segment ids of text pairs
    layer: int = -1  # multi-layer graphs: index into the layers axis (-1: the last, the default)


def plan_chunks(lengths: Sequence[int], max_batch_tokens: int, buckets: Buckets | None = None,
                max_batch_rows: int = 0) -> list[list[int]]:
    """Group row indices, longest first, so rows × longest ≤ max_batch_tokens and rows ≤ max_batch_rows (0: no
    row cap; a row alone always fits); with `buckets`, so the padded shape (bucketed rows × bucketed width) stays
    within both."""
    order = sorted(range(len(lengths)), key=lambda i: lengths[i], reverse=True)

    def most(longest: int) -> int:  # rows a chunk led by a row this long may hold
        width = longest if buckets is None else buckets.width(longest)
        limit = max_batch_tokens // width
        if max_batch_rows:
            limit = min(limit, max_batch_rows)
        return max(1, limit) if buckets is None else buckets.most_rows(limit)

    chunks: list[list[int]] = []
    current: list[int] = []
    limit = 0
    for i in order:
        if current and len(current) + 1 > limit:
            chunks.append(current)
            current = []
        if not current:  # the first row of a chunk is its longest
            limit = most(lengths[i])
        current.append(i)
    if current:
        chunks.append(current)
    return chunks


class RaggedRunner:
    """A graph `(input_ids, attention_mask[, token_type_ids]) -> [B, D] | [B, layers, D] | [B, L, C]` over ragged
    rows, on any engine (an ONNX Runtime session is taken as the onnxruntime fp32 engine). Chunk shapes are
    bucketed (`buckets`; None: each chunk padded only to its longest row, the unbounded old way). A chunk holds at
    most `max_batch_tokens` padded tokens and, where a graph's memory grows with rows rather than tokens,
    `max_batch_rows` rows (0: no cap; the config parameter of that name says why for its model)."""

    def __init__(self, engine: Engine | ort.InferenceSession, max_batch_tokens: int = 8192,
                 buckets: Buckets | str | None = "default", max_batch_rows: int = 0) -> None:
        self.engine: Engine = OrtEngine(engine) if isinstance(engine, ort.InferenceSession) else engine
        self.max_batch_tokens = max_batch_tokens
        self.max_batch_rows = max_batch_rows
        if isinstance(buckets, str):  # "default": the engine's own buckets where it names them
            buckets = (self.engine.shape_memory or DEFAULT_BUCKETS) if bounded() else None
        self.buckets = buckets
        self.per_token = self.engine.per_token
        self.inputs = self.engine.inputs

    def run(self, rows: Sequence[Row | np.ndarray]) -> tuple[list[np.ndarray], BatchStats]:
        items = [r if isinstance(r, Row) else Row(r) for r in rows]
        lengths = [int(r.ids.shape[0]) for r in items]
        chunks = plan_chunks(lengths, self.max_batch_tokens, self.buckets, self.max_batch_rows)
        out: list[np.ndarray] = [np.empty(0, dtype=np.float32)] * len(items)
        padded = 0
        started = time.perf_counter_ns()
        for chunk in chunks:
            width = max(lengths[i] for i in chunk)
            count = len(chunk)
            if self.buckets is not None:
                width, count = self.buckets.width(width), self.buckets.count(count)
            ids = np.zeros((count, width), dtype=np.int64)
            mask = np.zeros((count, width), dtype=np.int64)
            types = np.zeros((count, width), dtype=np.int64)
            # padding rows repeat the chunk's last real row: a real input runs in every graph without the empty
            # attention (all tokens masked) a zero row would be; their answers are dropped
            for j, i in enumerate(chunk + [chunk[-1]] * (count - len(chunk))):
                ids[j, : lengths[i]] = items[i].ids
                mask[j, : lengths[i]] = 1
                if items[i].type_ids is not None:
                    types[j, : lengths[i]] = items[i].type_ids
            feed = {"input_ids": ids, "attention_mask": mask}
            if "token_type_ids" in self.inputs:
                feed["token_type_ids"] = types
            result = self.engine.forward(feed)
            for j, i in enumerate(chunk):  # the padding rows' answers are not read
                if self.per_token:
                    out[i] = result[j, : lengths[i]]
                else:  # [B, layers, D]: this row's layer; [B, D]: the graph's one layer
                    out[i] = result[j, items[i].layer] if result.ndim == 3 else result[j]
            padded += ids.size
        forward_ns = time.perf_counter_ns() - started
        return out, BatchStats(len(items), sum(lengths), padded, forward_ns, len(chunks))

    def warm_shapes(self, max_width: int) -> list[tuple[int, int]]:
        """The (rows, width) chunks that need the most memory: the widest chunk the budget allows (attention grows
        with rows × width²) and the one with the most rows (per-row buffers); every other chunk fits in what these
        two allocate."""
        if self.buckets is None:
            return []
        widths = [w for w in self.buckets.lengths if w <= min(max_width, self.max_batch_tokens)] or [
            self.buckets.lengths[0]]
        widest, narrowest = widths[-1], widths[0]
        cap = self.max_batch_rows or self.max_batch_tokens
        return sorted({(self.buckets.most_rows(min(self.max_batch_tokens // w, cap)), w) for w in (widest, narrowest)},
                      key=lambda s: -s[1])

    def every_shape(self, max_width: int) -> list[tuple[int, int]]:
        """Every (rows, width) chunk shape the buckets allow within the token and row budgets, largest first."""
        if self.buckets is None:
            return []
        cap = self.max_batch_rows or self.max_batch_tokens
        return sorted(((r, w) for w in self.buckets.widths(min(max_width, self.max_batch_tokens))
                       for r in self.buckets.counts(min(cap, self.max_batch_tokens // w))),
                      key=lambda s: (-s[0] * s[1], -s[1]))

    def warm(self, max_width: int) -> list[tuple[int, int]]:
        """Run `warm_shapes` once, before the first request. An engine sizes its activation buffers by the largest
        chunk it has seen and keeps them (OpenVINO's memory manager grows, never shrinks), so without this an
        instance steps up whenever traffic brings a larger chunk than before, hours into a soak: pii-rampart on
        OpenVINO fp32, in-process, 40 MiB of heap in use after loading, 252 after its largest chunk, 262 after every
        other bucketed chunk of its budget too (369 shapes), and no more after a second pass over them; served, two
        steps of +12 and +27 MiB 17 and 27 minutes into a soak (docs/benchmarks.md, "Memory under a soak"). Warmed,
        the memory an instance holds once ready is its plateau. An engine that keeps memory per shape
        (`Engine.shape_memory`) runs every shape of its buckets instead, so that memory is taken at load too.
        Unbucketed (SR_BACKEND_UNBOUNDED=1), nothing runs."""
        every = self.engine.shape_memory is not None and self.buckets is self.engine.shape_memory
        shapes = self.every_shape(max_width) if every else self.warm_shapes(max_width)
        for rows, width in shapes:
            ids = np.ones((rows, width), dtype=np.int64)  # id 1 is in every vocabulary; the values do not matter
            feed = {"input_ids": ids, "attention_mask": np.ones_like(ids)}
            if "token_type_ids" in self.inputs:
                feed["token_type_ids"] = np.zeros_like(ids)
            self.engine.forward(feed)
        return shapes

    def run_pooled(self, rows: Sequence[Row | np.ndarray]) -> tuple[np.ndarray, BatchStats]:
        """Pooled graphs only: the rows' vectors stacked as one [rows, D] array."""
        vectors, stats = self.run(rows)
        return np.stack(vectors), stats
