"""Run a ragged batch of token sequences through one ONNX Runtime session.

Triton hands `execute()` many requests of different lengths. Sorting them by length and packing chunks under a
token budget pads each chunk only to its own longest row, so one long input does not inflate every short one.
This module has no Triton dependency: the in-process benchmark baseline uses exactly the same code path.
"""

from __future__ import annotations

import os
import time
from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np
import onnxruntime as ort


@dataclass(frozen=True)
class BatchStats:
    rows: int
    tokens: int  # real tokens
    padded_tokens: int
    forward_ns: int
    chunks: int


def make_session(path: str, threads: int = 0) -> ort.InferenceSession:
    options = ort.SessionOptions()
    options.intra_op_num_threads = threads or (os.cpu_count() or 1)
    options.inter_op_num_threads = 1
    options.execution_mode = ort.ExecutionMode.ORT_SEQUENTIAL
    options.graph_optimization_level = ort.GraphOptimizationLevel.ORT_ENABLE_ALL
    return ort.InferenceSession(path, sess_options=options, providers=["CPUExecutionProvider"])


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


class PooledEncoder:
    """An ONNX graph `(input_ids, attention_mask) -> [rows, dim]` run over ragged rows."""

    def __init__(self, session: ort.InferenceSession, max_batch_tokens: int = 8192) -> None:
        self.session = session
        self.max_batch_tokens = max_batch_tokens
        self.output = session.get_outputs()[0].name

    def run(self, rows: Sequence[np.ndarray]) -> tuple[np.ndarray, BatchStats]:
        lengths = [int(r.shape[0]) for r in rows]
        chunks = plan_chunks(lengths, self.max_batch_tokens)
        out: np.ndarray | None = None
        padded = 0
        started = time.perf_counter_ns()
        for chunk in chunks:
            width = max(lengths[i] for i in chunk)
            ids = np.zeros((len(chunk), width), dtype=np.int64)
            mask = np.zeros((len(chunk), width), dtype=np.int64)
            for j, i in enumerate(chunk):
                ids[j, : lengths[i]] = rows[i]
                mask[j, : lengths[i]] = 1
            vectors = self.session.run([self.output], {"input_ids": ids, "attention_mask": mask})[0]
            if out is None:
                out = np.empty((len(rows), vectors.shape[1]), dtype=np.float32)
            out[chunk] = vectors
            padded += ids.size
        forward_ns = time.perf_counter_ns() - started
        assert out is not None, "run() needs at least one row"
        stats = BatchStats(len(rows), sum(lengths), padded, forward_ns, len(chunks))
        return out, stats
