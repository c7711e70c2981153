"""PyTorch on the CPU: the graph `torch.export` wrote beside model.onnx at build time (`model.pt2`, the same module
the ONNX came from), at fp32 or under bf16 autocast (oneDNN's AVX512-BF16 / AMX kernels). A candidate like any other
engine: where it is faster than OpenVINO and ONNX Runtime on a host and passes the card's check, `models tune`
serves it there. A CPU without native bf16 is refused at bf16 rather than run emulated (0.16x fp32 on an AVX2 host).
Loading the program needs no model code, so a model directory stays data."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import numpy as np

from . import EngineError
from .heap import malloc_trim
from .host import detect
from .shapes import COARSE_BUCKETS, Buckets, per_token_output


def program_path(onnx: Path) -> Path:
    """Where the build put the exported program of a graph: model.onnx → model.pt2."""
    return onnx.with_suffix(".pt2")


class TorchEngine:
    """PyTorch's CPU tensors come from glibc malloc: every new shape frees and allocates blocks of new sizes, and
    glibc keeps the freed pages in its per-thread heaps. MiniLM fp32, 1 thread, random ragged batches (bucketed):
    568 → 604 MB over 45 s and rising; with malloc_trim(0) after each forward flat at 551-552 MB and no slower
    (14 vs 6 batches in the same 45 s on a shared, loaded host). oneDNN's primitive cache is bounded already
    (1,024 entries); capping it at 64 (ONEDNN_PRIMITIVE_CACHE_CAPACITY) changed nothing (bf16, bucketed: 658 vs
    640 MB after 45 s). Counted exactly (`tools.soak distinct`, glibc heap in use, 2026-12-02): bf16 keeps 0.68 MiB
    per new bucketed shape with the default cache and 0.37 with capacity 0, and a second pass over the same shapes
    adds nothing in either, so the growth is bounded by the bucket set; but capacity 0 recompiles every primitive on
    every forward: 12.2 vs 20.3 rows/s side by side (1 thread, same random batches, 150 s). So it keeps its
    default, unlike OpenVINO's engine, where 0 costs nothing.

    Bounded is not flat: served, bf16 kept rising for 30 minutes as traffic brought shapes it had not run
    (docs/benchmarks.md). So at bf16 the engine names `shape_memory` and the runner runs every shape at load.
    MiniLM, 1 thread, AMD EPYC with AVX512-BF16, 2026-12-03: every shape of the default buckets (369 within 8,192
    tokens) takes the heap from 219 to 347 MiB (0.36 MiB a shape) and about 2.5 minutes to run once, too long a
    start; the coarser steps of `COARSE_BUCKETS` (144 shapes of up to 512 tokens and as many rows as their lengths
    list) take it from 207 to 262 MiB in 42 s, and a second pass adds nothing. Every shape a chunk can have (153 for
    MiniLM's 256-token window, the long runs of short rows included) takes about 55 s at load; after it, 40 ragged
    batches add 0.0 MiB, against 24.4 MiB with only the largest chunk warmed (tests/gateway/test_memory_bounds.py).
    The coarser padding costs 6 % of the default buckets' speed (35.8 vs 38.2 rows/s, random ragged batches, sides
    interleaved, 240 s; `tools.soak ab`). fp32 keeps 0.03 MiB a shape (120 shapes: 210 → 213 MiB), so it
    keeps the default buckets and warms only the largest chunks, as the other engines do."""

    name = "torch"

    def __init__(self, module: Any, precision: str, inputs: list[str], per_token: bool) -> None:
        self.module = module
        self.precision = precision
        self.order = inputs  # the program's positional inputs, by name
        self.inputs = frozenset(inputs)
        self.per_token = per_token
        self.trim = malloc_trim()
        self.shape_memory: Buckets | None = COARSE_BUCKETS if precision == "bf16" else None

    @classmethod
    def from_file(cls, onnx: Path, precision: str, threads: int) -> TorchEngine:
        path = program_path(onnx)
        if not path.is_file():
            raise EngineError(f"{path} is missing: the torch engine runs the program `sr-gateway models build` "
                              "exports beside model.onnx (models built from PyTorch weights only)")
        try:
            import torch
        except ImportError as exc:
            raise EngineError("the torch engine needs PyTorch (the `export` extra)") from exc
        host = detect()
        if precision == "bf16" and not host.native_bf16:
            raise EngineError(f"this CPU has no native bf16 (ISA flags: {' '.join(host.flags) or 'none listed'})")
        if threads:
            torch.set_num_threads(threads)
        program = torch.export.load(str(path))
        inputs = [spec.arg.name for spec in program.graph_signature.input_specs
                  if spec.kind == torch.export.graph_signature.InputKind.USER_INPUT]
        output = next(iter(n for n in program.graph.nodes if n.op == "output")).args[0][0]
        shape = [d if isinstance(d, int) else None for d in output.meta["val"].shape]
        return cls(program.module(), precision, inputs, per_token_output(shape))

    def forward(self, feed: dict[str, np.ndarray]) -> np.ndarray:
        import torch

        args = [torch.from_numpy(feed[name]) for name in self.order]
        with torch.inference_mode(), torch.autocast("cpu", torch.bfloat16, enabled=self.precision == "bf16"):
            out = self.module(*args)
        answer = np.array(out.float().numpy(), dtype=np.float32)  # a copy: the tensor is freed before the trim
        del out, args
        if self.trim is not None:
            self.trim(0)
        return answer

    def forward_all(self, feed: dict[str, np.ndarray]) -> dict[str, np.ndarray]:
        raise EngineError("the torch engine serves text graphs (one output)")
