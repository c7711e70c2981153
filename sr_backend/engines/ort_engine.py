"""ONNX Runtime on the CPU: the fp32 graph, or an int8 copy of it (VNNI kernels where the CPU has them, AVX2 u8s8
otherwise), quantised dynamically (activation ranges measured per forward) or statically (activation ranges
calibrated once on real texts, QDQ)."""

from __future__ import annotations

import os
from pathlib import Path

import numpy as np
import onnxruntime as ort

from .heap import fix_mmap_threshold
from .shapes import Buckets, bounded, per_token_output


def run_options() -> ort.RunOptions | None:
    """Every run gives the CPU arena's memory back at its end (bounded(); the OrtEngine docstring has the numbers)."""
    if not bounded():
        return None
    options = ort.RunOptions()
    options.add_run_config_entry("memory.enable_memory_arena_shrinkage", "cpu:0")
    return options


def make_session(path: str, threads: int = 0) -> ort.InferenceSession:
    options = ort.SessionOptions()
    options.intra_op_num_threads = threads or (os.cpu_count() or 1)
    options.inter_op_num_threads = 1
    options.execution_mode = ort.ExecutionMode.ORT_SEQUENTIAL
    options.graph_optimization_level = ort.GraphOptimizationLevel.ORT_ENABLE_ALL
    # Idle pool threads sleep instead of spinning: in a server the cores they would burn belong to the gateway,
    # gRPC and the other models between forwards.
    options.add_session_config_entry("session.intra_op.allow_spinning", "0")
    return ort.InferenceSession(path, sess_options=options, providers=["CPUExecutionProvider"])


class OrtEngine:
    """ONNX Runtime's CPU arena keeps the peak of every run and, under ragged traffic, fragments across shapes:
    MiniLM fp32 at 1 thread on random ragged batches (1-32 rows of 8-128 tokens, bucketed) held 520 MB after 45 s;
    with the arena shrunk at the end of each run (`memory.enable_memory_arena_shrinkage`) 184-211 MB; with the
    arena off 181-355 MB (glibc keeps some of what it frees); the memory-pattern cache off changed nothing (435 MB),
    and with bucketed shapes it holds a bounded number of plans, so it stays on. Shrinking costs a free per run;
    throughput in docs/benchmarks.md "Memory under a soak".

    The shrunk arena's blocks go back to glibc, not to the OS: pii-rampart fp32, 1 thread, random ragged batches
    through the RaggedRunner (`tools.soak shapes`, 120 s) rose 166 → 275 MB RSS while the heap in use stayed at
    34 MB (`tools.soak distinct`, 120 shapes: 0.004 MiB per new shape), and a CI soak failed on it. With the mmap
    threshold fixed (heap.fix_mmap_threshold) 108.8 → 108.9 MB; with malloc_trim after every run 106.9 → 107.4 MB
    but 142 batches in the 120 s against 162. The threshold costs nothing measurable: two 60-s pairs on the same
    batches, 86 and 80 batches without it, 88 and 73 with it (a shared 2-core host). So the threshold is fixed."""

    name = "onnxruntime"
    shape_memory: Buckets | None = None  # its arena shrinks after every run (above)

    def __init__(self, session: ort.InferenceSession, precision: str = "fp32") -> None:
        self.session = session
        self.precision = precision
        out = session.get_outputs()[0]
        self.output = out.name
        self.per_token = per_token_output(out.shape)
        self.inputs = frozenset(i.name for i in session.get_inputs())
        self.run_options = run_options()
        fix_mmap_threshold()

    @classmethod
    def from_file(cls, path: Path, precision: str, threads: int) -> OrtEngine:
        return cls(make_session(str(path), threads), precision)

    def forward(self, feed: dict[str, np.ndarray]) -> np.ndarray:
        return np.asarray(self.session.run([self.output], feed, self.run_options)[0])

    def forward_all(self, feed: dict[str, np.ndarray]) -> dict[str, np.ndarray]:
        names = [o.name for o in self.session.get_outputs()]
        return {n: np.asarray(v) for n, v in zip(names, self.session.run(names, feed, self.run_options), strict=True)}


QUANT_RECIPE = "dynamic QInt8 MatMul per-channel reduce-range v1"
STATIC_RECIPE = "static QDQ QUInt8 activations / QInt8 per-channel weights MatMul reduce-range MinMax v1"
RECIPES = {"dynamic": QUANT_RECIPE, "static": STATIC_RECIPE}
QUANT_OPS = ("MatMul",)  # text models; the image conv nets' int8 also quantises Conv and Gemm (sr_build/tune.py)


def calibration_digest(calibration: list[dict[str, np.ndarray]]) -> str:
    import hashlib

    digest = hashlib.sha256()
    for feed in calibration:
        for name in sorted(feed):
            digest.update(name.encode() + np.ascontiguousarray(feed[name]).tobytes())
    return digest.hexdigest()[:16]


def ensure_int8(source: Path, target: Path, recipe: str = "dynamic",
                calibration: list[dict[str, np.ndarray]] | None = None,
                op_types: tuple[str, ...] = QUANT_OPS) -> bool:
    """Quantise unless `target` was made from this `source` by this recipe (and, static, these calibration rows;
    dynamic, these op types: recorded beside it); True if made."""
    stamp = target.with_name(target.name + ".recipe")
    rows = f" calibration {calibration_digest(calibration)}" if recipe == "static" and calibration else ""
    ops = f" ops {','.join(op_types)}" if recipe == "dynamic" and op_types != QUANT_OPS else ""
    want = f"{RECIPES[recipe]}{rows}{ops}\n{source.stat().st_size} {source.stat().st_mtime_ns}\n"
    if target.is_file() and stamp.is_file() and stamp.read_text() == want:
        return False
    if recipe == "static":
        if not calibration:
            raise ValueError("static int8 needs calibration rows")
        quantize_int8_static(source, target, calibration)
    else:
        quantize_int8(source, target, op_types)
    stamp.write_text(want)
    return True


def quantize_int8(source: Path, target: Path, op_types: tuple[str, ...] = QUANT_OPS) -> None:
    """Dynamic quantisation of the MatMul weights (per channel, signed 7-bit range); activations are quantised per
    forward. The reduced range avoids the u8s8 saturation of AVX2 kernels without VNNI (measured on MiniLM: min
    cosine 0.990 vs 0.985 at full range). Written to a temporary name first so a crash never leaves a half file."""
    from onnxruntime.quantization import QuantType, quantize_dynamic

    partial = target.with_name(target.name + ".partial")
    quantize_dynamic(str(source), str(partial), weight_type=QuantType.QInt8, per_channel=True, reduce_range=True,
                     op_types_to_quantize=list(op_types))
    partial.replace(target)


def quantize_int8_static(source: Path, target: Path, calibration: list[dict[str, np.ndarray]]) -> None:
    """Static quantisation (QDQ) of the MatMuls: weights per channel (signed, reduced range, as the dynamic recipe),
    activations with fixed ranges measured (min/max) on the calibration feeds, so no per-forward range pass runs.
    Transformers' activation outliers make this the less accurate recipe; the tuner's check decides."""
    from onnxruntime.quantization import (
        CalibrationDataReader,
        CalibrationMethod,
        QuantFormat,
        QuantType,
        quantize_static,
    )

    class Feeds(CalibrationDataReader):
        def __init__(self) -> None:
            self.feeds = iter(calibration)

        def get_next(self) -> dict[str, np.ndarray] | None:
            return next(self.feeds, None)

    partial = target.with_name(target.name + ".partial")
    quantize_static(str(source), str(partial), Feeds(), quant_format=QuantFormat.QDQ, op_types_to_quantize=["MatMul"],
                    per_channel=True, reduce_range=True, activation_type=QuantType.QUInt8,
                    weight_type=QuantType.QInt8, calibrate_method=CalibrationMethod.MinMax)
    partial.replace(target)
