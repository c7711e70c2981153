"""Run a ragged batch of token sequences through one engine (sr_backend.engines: ONNX Runtime, OpenVINO).

Triton hands `execute()` many requests of different lengths. Sorting them by length and packing chunks under a
token budget pads each chunk only to its own longest row, so one long input does not inflate every short one.
Graphs come in three shapes: pooled (`[B, D]` per row: embeddings, sequence logits), pooled at several layers
(`[B, layers, D]`: an embedder whose card declares early exits; each row takes its own layer, so one forward
serves a batch that mixes layers) and per-token (`[B, L, C]`: token-classification logits, sliced back to each
row's own length).
This module has no Triton dependency: the in-process benchmark baseline uses exactly the same code path.
"""

from __future__ import annotations

import time
from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np
import onnxruntime as ort

from .engines import Engine
from .engines.ort_engine import OrtEngine

__all__ = ["BatchStats", "RaggedRunner", "Row", "plan_chunks"]


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


def plan_chunks(lengths: Sequence[int], max_batch_tokens: int) -> list[list[int]]:
    """Group row indices, longest first, so rows × longest ≤ max_batch_tokens (a row alone always fits)."""
    order = sorted(range(len(lengths)), key=lambda i: lengths[i], reverse=True)
    chunks: list[list[int]] = []
    current: list[int] = []
    width = 0
    for i in order:
        width = width or lengths[i]  # the first row of a chunk is its longest
        if current and (len(current) + 1) * width > max_batch_tokens:
            chunks.append(current)
            current, width = [], lengths[i]
        current.append(i)
    if current:
        chunks.append(current)
    return chunks


class RaggedRunner:
    """A graph `(input_ids, attention_mask[, token_type_ids]) -> [B, D] | [B, layers, D] | [B, L, C]` over ragged
    rows, on any engine (an ONNX Runtime session is taken as the onnxruntime fp32 engine)."""

    def __init__(self, engine: Engine | ort.InferenceSession, max_batch_tokens: int = 8192) -> None:
        self.engine: Engine = OrtEngine(engine) if isinstance(engine, ort.InferenceSession) else engine
        self.max_batch_tokens = max_batch_tokens
        self.per_token = self.engine.per_token
        self.inputs = self.engine.inputs

    def run(self, rows: Sequence[Row | np.ndarray]) -> tuple[list[np.ndarray], BatchStats]:
        items = [r if isinstance(r, Row) else Row(r) for r in rows]
        lengths = [int(r.ids.shape[0]) for r in items]
        chunks = plan_chunks(lengths, self.max_batch_tokens)
        out: list[np.ndarray] = [np.empty(0, dtype=np.float32)] * len(items)
        padded = 0
        started = time.perf_counter_ns()
        for chunk in chunks:
            width = max(lengths[i] for i in chunk)
            ids = np.zeros((len(chunk), width), dtype=np.int64)
            mask = np.zeros((len(chunk), width), dtype=np.int64)
            types = np.zeros((len(chunk), width), dtype=np.int64)
            for j, i in enumerate(chunk):
                ids[j, : lengths[i]] = items[i].ids
                mask[j, : lengths[i]] = 1
                if items[i].type_ids is not None:
                    types[j, : lengths[i]] = items[i].type_ids
            feed = {"input_ids": ids, "attention_mask": mask}
            if "token_type_ids" in self.inputs:
                feed["token_type_ids"] = types
            result = self.engine.forward(feed)
            for j, i in enumerate(chunk):
                if self.per_token:
                    out[i] = result[j, : lengths[i]]
                else:  # [B, layers, D]: this row's layer; [B, D]: the graph's one layer
                    out[i] = result[j, items[i].layer] if result.ndim == 3 else result[j]
            padded += ids.size
        forward_ns = time.perf_counter_ns() - started
        return out, BatchStats(len(items), sum(lengths), padded, forward_ns, len(chunks))

    def run_pooled(self, rows: Sequence[Row | np.ndarray]) -> tuple[np.ndarray, BatchStats]:
        """Pooled graphs only: the rows' vectors stacked as one [rows, D] array."""
        vectors, stats = self.run(rows)
        return np.stack(vectors), stats
