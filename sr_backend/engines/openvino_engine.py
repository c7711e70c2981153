"""OpenVINO on the CPU: fp32 or bf16 inference precision (AMX / AVX-512-BF16 kernels; a CPU without native bf16
is refused rather than silently run at another precision), or int8: an IR NNCF quantised (post-training, calibrated
on real request texts; FakeQuantize before every MatMul, VNNI/AMX int8 kernels, the rest fp32)."""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any

import numpy as np

from . import EngineError
from .shapes import Buckets, bounded, per_token_output

# The CPU plugin keeps compiled kernels per input shape in a runtime cache of 5,000 entries by default: under
# ragged traffic that is a new entry per (rows, width), about 2-3 MB each, and gigabytes per instance (issue 23).
RUNTIME_CACHE_CAPACITY = 8
# oneDNN, inside the CPU plugin, keeps a second, process-wide cache of compiled primitives (1,024 by default), also
# one entry per shape, that the plugin's capacity does not reach: the creep left after the cap (the class docstring).
# Read once per process from the environment, on the plugin's first primitive: set before the plugin loads.
PRIMITIVE_CACHE_ENV = "ONEDNN_PRIMITIVE_CACHE_CAPACITY"
PRIMITIVE_CACHE_CAPACITY = 0

_HINT = {"fp32": "f32", "bf16": "bf16", "int8": "f32"}  # int8: the quantised ops run int8, the others f32


class OpenVinoEngine:
    """Memory (issue 23): two per-shape caches, both capped. The CPU plugin's runtime cache
    (CPU_RUNTIME_CACHE_CAPACITY, 5,000 by default) grew MiniLM bf16 0.51 → 2.46 GB in 60 s of random shapes
    in-process, and served instances by ≈ 0.3 GB a minute; a hit saves nothing measurable (bucketed, 8, 64 and 5,000
    entries: 11.9, 11.8, 11.5 rows/s, interleaved, 1 thread), so it holds 8. That left a creep of 10–20 MiB/min per
    served MiniLM instance: oneDNN's own process-wide primitive cache (1,024 entries by default), one set of JIT
    kernels per shape, out of the plugin's reach. Found with glibc's heap counters (`tools.soak distinct`: heap in
    use, not RSS): the creep was heap in use, not freed pages (malloc_trim gave back < 2 MiB; MALLOC_ARENA_MAX made
    no difference), it stopped once every bucketed shape had been seen (176 shapes, 4 passes: 201.7, 201.7, 202.2,
    202.0 MiB) and one fixed set of shapes did not grow at all. MiniLM, largest shape first, then 40 new shapes:
    bf16 0.84 MiB per new shape with oneDNN's default, 0.07 with ONEDNN_PRIMITIVE_CACHE_CAPACITY=0 (fp32: 1.35 →
    0.60; what fp32 keeps per shape, 24 MiB for 40 shapes, is still bounded by the bucket set: a second pass adds
    nothing). Speed unchanged: random bucketed batches, three processes side by side, 1 thread: 3.89 rows/s at
    1,024 entries, 3.89 at 0, 3.87 at 64 (heap in use after 45 batches: 88, 74, 77 MiB). So the cache holds 0
    entries (docs/benchmarks.md "Memory under a soak")."""

    name = "openvino"
    shape_memory: Buckets | None = None  # its kernel cache is capped (above)

    def __init__(self, compiled: Any, precision: str, inputs: frozenset[str], per_token: bool) -> None:
        self.compiled = compiled
        self.precision = precision
        self.inputs = inputs
        self.per_token = per_token
        self.request = compiled.create_infer_request()
        self.config: dict[str, Any] = {}

    @classmethod
    def from_file(cls, onnx: Path, precision: str, threads: int) -> OpenVinoEngine:
        if bounded():  # an operator's own value wins; the first engine of a process sets it for all its engines
            os.environ.setdefault(PRIMITIVE_CACHE_ENV, str(PRIMITIVE_CACHE_CAPACITY))
        try:
            import openvino as ov
        except ImportError as exc:
            raise EngineError("the openvino engine needs the `engines` extra: pip install -e '.[engines]'") from exc
        core = ov.Core()
        capabilities = set(core.get_property("CPU", "OPTIMIZATION_CAPABILITIES"))
        if precision == "bf16" and "BF16" not in capabilities:
            raise EngineError(f"this CPU has no native bf16 (OpenVINO capabilities: {sorted(capabilities)})")
        model = core.read_model(str(onnx))
        # DYNAMIC_QUANTIZATION_GROUP_SIZE 0: on CPUs with VNNI/AVX-512 the CPU plugin otherwise quantises the
        # activations of fully connected layers to int8 on the fly (group size 32 by default), so "f32" would not
        # be fp32: measured on the PII tagger, logits moved by 0.2 and two tokens changed label. The precision a
        # config names is the precision that runs. ENABLE_CPU_PINNING off: every Triton instance is its own process
        # and each pinned its threads from core 0 on, so two 1-thread instances shared one core (measured: served
        # MiniLM at 2 x 1, 128 tokens, C=32: 104.6 req/s pinned, 185.2 unpinned; in-process speed unchanged).
        config: dict[str, Any] = {"INFERENCE_PRECISION_HINT": _HINT[precision], "PERFORMANCE_HINT": "LATENCY",
                                  "NUM_STREAMS": 1, "DYNAMIC_QUANTIZATION_GROUP_SIZE": 0,
                                  "ENABLE_CPU_PINNING": False}
        if bounded():  # the per-shape kernel cache, capped (the class docstring has the numbers)
            config["CPU_RUNTIME_CACHE_CAPACITY"] = RUNTIME_CACHE_CAPACITY
        if threads:
            config["INFERENCE_NUM_THREADS"] = threads
        compiled = core.compile_model(model, "CPU", config)
        inputs = frozenset(i.get_any_name() for i in model.inputs)
        per_token = per_token_output([d.get_length() if d.is_static else None
                                      for d in model.outputs[0].get_partial_shape()])
        engine = cls(compiled, precision, inputs, per_token)
        engine.config = config  # what it was compiled with (the compiled model does not report every key)
        return engine

    def forward(self, feed: dict[str, np.ndarray]) -> np.ndarray:
        result = self.request.infer(feed)
        return np.array(result[self.compiled.output(0)], dtype=np.float32)

    def forward_all(self, feed: dict[str, np.ndarray]) -> dict[str, np.ndarray]:
        result = self.request.infer(feed)
        return {out.get_any_name(): np.array(result[out], dtype=np.float32) for out in self.compiled.outputs}


def ensure_int8_nncf(source: Path, target: Path, calibration: list[dict[str, np.ndarray]]) -> bool:
    """OpenVINO's int8 IR of `source` (target.xml + .bin) unless it was made from this graph, these calibration
    rows and this NNCF version (recorded beside it); True if made. NNCF's transformer preset keeps the ops that
    lose most (softmax, layer norm, the attention's scaling) in fp32; whether the result is good enough is the
    card's int8 check in `sr-gateway models tune`, not assumed here."""
    import nncf
    import openvino as ov

    from .ort_engine import calibration_digest

    if not calibration:
        raise EngineError("OpenVINO int8 needs calibration rows")
    stamp = target.with_name(target.name + ".recipe")
    want = (f"nncf {nncf.__version__} transformer calibration {calibration_digest(calibration)}\n"
            f"{source.stat().st_size} {source.stat().st_mtime_ns}\n")
    if target.is_file() and target.with_suffix(".bin").is_file() and stamp.is_file() and stamp.read_text() == want:
        return False
    model = ov.Core().read_model(str(source))
    quantised = nncf.quantize(model, nncf.Dataset(calibration), model_type=nncf.ModelType.TRANSFORMER,
                              subset_size=len(calibration))
    partial = target.with_name(target.stem + ".partial.xml")
    ov.save_model(quantised, str(partial), compress_to_fp16=False)
    partial.with_suffix(".bin").replace(target.with_suffix(".bin"))
    partial.replace(target)
    stamp.write_text(want)
    return True
