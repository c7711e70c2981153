"""OpenVINO on the CPU: fp32 or bf16 inference precision (AMX / AVX-512-BF16 kernels; a CPU without native bf16
is refused rather than silently run at another precision), or int8: an IR NNCF quantised (post-training, calibrated
on real request texts; FakeQuantize before every MatMul, VNNI/AMX int8 kernels, the rest fp32)."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import numpy as np

from . import EngineError
from .shapes import bounded, per_token_output

# The CPU plugin keeps compiled kernels per input shape in a runtime cache of 5,000 entries by default: under
# ragged traffic that is a new entry per (rows, width), about 2-3 MB each, and gigabytes per instance (issue 23).
RUNTIME_CACHE_CAPACITY = 8

_HINT = {"fp32": "f32", "bf16": "bf16", "int8": "f32"}  # int8: the quantised ops run int8, the others f32


class OpenVinoEngine:
    """Memory (issue 23): the CPU plugin's per-shape runtime cache (CPU_RUNTIME_CACHE_CAPACITY, 5,000 by default)
    grew MiniLM bf16 0.51 → 2.46 GB in 60 s of random shapes in-process, and served instances by ≈ 0.3 GB a minute.
    A hit saves nothing measurable: with bucketed shapes, 8, 64 and 5,000 entries ran at 11.9, 11.8 and 11.5 rows/s
    (interleaved in one run, 1 thread, MiniLM bf16, shared 2-core AMX host). So the cache holds 8 entries. With the
    runner's buckets, in-process MiniLM bf16 went 419 → 429 MB from 15 to 75 s of random shapes (unbounded:
    419 → 596); served instances grew +0.2 to +7.8 MiB/min over a 20-minute soak instead of ≈ 300, a slow creep
    whose cause is not found yet (docs/benchmarks.md "Memory under a soak")."""

    name = "openvino"

    def __init__(self, compiled: Any, precision: str, inputs: frozenset[str], per_token: bool) -> None:
        self.compiled = compiled
        self.precision = precision
        self.inputs = inputs
        self.per_token = per_token
        self.request = compiled.create_infer_request()
        self.config: dict[str, Any] = {}

    @classmethod
    def from_file(cls, onnx: Path, precision: str, threads: int) -> OpenVinoEngine:
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
