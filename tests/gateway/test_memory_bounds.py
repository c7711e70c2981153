"""What a new input shape leaves behind on OpenVINO (issue 23), in a fresh process per run: oneDNN reads its
primitive-cache capacity once per process, so each measurement needs its own (`python -m tools.soak distinct`).

The probe forwards the largest of 48 bucketed shapes first, then 8, then 40 shapes it has not seen, then all 48
again, and reads the heap in use (glibc's mallinfo2: exact, where RSS keeps freed pages). Measured on this repo's
MiniLM (Intel AMX host, 1 thread): bounded bf16 0.07 MiB per new shape, fp32 0.60; with oneDNN's default
primitive cache (1,024 entries) 0.84 and 1.35; on the old settings (SR_BACKEND_UNBOUNDED=1) 1.57 and 2.02.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

from sr_backend.engines.host import detect

ROOT = Path(__file__).resolve().parents[2]
# MiB a new shape may leave behind: between the bounded and the unbounded measurements above, so either side failing
# means the settings changed. fp32's 0.6 is per-shape state the caps do not reach (docs/benchmarks.md); the second
# pass below shows it is still bounded by the bucket set.
MOST_PER_SHAPE = {"bf16": 0.3, "fp32": 1.0}


def _distinct(precision: str, unbounded: bool) -> dict[str, Any]:
    env = {k: v for k, v in os.environ.items() if k not in ("SR_BACKEND_UNBOUNDED", "ONEDNN_PRIMITIVE_CACHE_CAPACITY")}
    args = [sys.executable, "-m", "tools.soak", "distinct", "--engine", "openvino", "--precision", precision]
    done = subprocess.run(args + (["--unbounded"] if unbounded else []), cwd=ROOT, env=env, capture_output=True,
                          text=True, timeout=600, check=True)
    return json.loads(done.stdout.strip().splitlines()[-1])  # type: ignore[no-any-return]


@pytest.mark.parametrize("precision", ["fp32", "bf16"])
def test_a_new_input_shape_leaves_little_behind_on_openvino_and_the_old_settings_left_more(precision: str) -> None:
    if not (ROOT / "model_repository" / "all-minilm-l6-v2" / "1" / "model.onnx").is_file():
        pytest.fail("model repository is not built: run `make models`")
    if precision == "bf16" and not detect().native_bf16:
        pytest.skip("this CPU has no native bf16 (the engine refuses it)")
    bounded = _distinct(precision, unbounded=False)
    heap = bounded["heap_in_use_mib"]
    assert bounded["mib_per_new_shape"] <= MOST_PER_SHAPE[precision], bounded
    # every shape a second time: nothing more (the state is bounded by the shapes seen, not by the forwards run)
    assert heap["all_twice"] <= heap["all_once"] + 1.0, bounded
    old = _distinct(precision, unbounded=True)
    assert old["mib_per_new_shape"] > MOST_PER_SHAPE[precision], old


_WARM_PROBE = """
import json, sys
import numpy as np
from sr_backend.engines import load_engine
from sr_backend.ragged import RaggedRunner, Row
from tools.soak import heap_in_use, ROOT
warm = sys.argv[1] == "warm"
onnx = ROOT / "model_repository" / "all-minilm-l6-v2" / "1" / "model.onnx"
runner = RaggedRunner(load_engine("openvino", "fp32", onnx, 1), 4096)
rng = np.random.default_rng(3)
runner.run([Row(rng.integers(2000, 29000, 12))])
before = heap_in_use()
if warm:
    runner.warm(256)
warmed = heap_in_use()
# traffic: the widest chunk the budget allows, the one with the most rows, then ragged batches of every size
batches = [[Row(rng.integers(2000, 29000, 256)) for _ in range(16)], [Row(rng.integers(2000, 29000, 5))
                                                                       for _ in range(512)]]
batches += [[Row(rng.integers(2000, 29000, int(n))) for n in rng.integers(3, 200, int(k))]
            for k in rng.integers(1, 40, 8)]
for batch in batches:
    runner.run(batch)
print(json.dumps({"before": before, "warmed": warmed, "after_traffic": heap_in_use()}))
"""


def _probe(script: str, mode: str, timeout: int = 600) -> dict[str, float]:
    """Runs a probe script in a fresh interpreter (a process's heap is what is measured) with the served settings."""
    env = {k: v for k, v in os.environ.items() if k not in ("SR_BACKEND_UNBOUNDED", "ONEDNN_PRIMITIVE_CACHE_CAPACITY")}
    done = subprocess.run([sys.executable, "-c", script, mode], cwd=ROOT, env={**env, "PYTHONPATH": str(ROOT)},
                          capture_output=True, text=True, timeout=timeout, check=True)
    return json.loads(done.stdout.strip().splitlines()[-1])  # type: ignore[no-any-return]


def test_an_instance_warmed_at_load_holds_its_plateau_before_the_first_request() -> None:
    """RaggedRunner.warm runs the largest chunks at load: traffic afterwards, the largest chunks included, adds
    almost nothing, while an unwarmed runner steps up by the buffers the largest chunk needs (the served steps of
    docs/benchmarks.md "Memory under a soak")."""
    if not (ROOT / "model_repository" / "all-minilm-l6-v2" / "1" / "model.onnx").is_file():
        pytest.fail("model repository is not built: run `make models`")
    cold = _probe(_WARM_PROBE, "cold")
    warm = _probe(_WARM_PROBE, "warm")
    assert cold["after_traffic"] - cold["before"] > 50, cold  # the largest chunk's buffers, taken under traffic
    assert warm["warmed"] - warm["before"] > 50, warm  # ... taken at load instead
    # after warming: per-shape state only (fp32 ≈ 0.6 MiB a new shape, a dozen shapes here)
    assert warm["after_traffic"] - warm["warmed"] < 16, warm


_ORT_PROBE = """
import json, os, sys
import numpy as np
from sr_backend.engines import load_engine, ort_engine
from sr_backend.ragged import RaggedRunner
from tools.soak import ROOT, anon_rss, random_rows
if sys.argv[1] == "glibc-default":
    ort_engine.fix_mmap_threshold = lambda: False
onnx = ROOT / "model_repository" / "pii-rampart" / "1" / "model.onnx"
runner = RaggedRunner(load_engine("onnxruntime", "fp32", onnx, 1))
rng = np.random.default_rng(23)
mib = lambda: anon_rss(os.getpid()) / 2**20
for _ in range(8):
    runner.run(random_rows(rng))
warm = mib()
for _ in range(int(sys.argv[2])):
    runner.run(random_rows(rng))
print(json.dumps({"warm": warm, "after": mib()}))
"""


def _ort_probe(mode: str, batches: int) -> dict[str, float]:
    env = {k: v for k, v in os.environ.items() if k != "SR_BACKEND_UNBOUNDED"}
    done = subprocess.run([sys.executable, "-c", _ORT_PROBE, mode, str(batches)], cwd=ROOT,
                          env={**env, "PYTHONPATH": str(ROOT)}, capture_output=True, text=True, timeout=600, check=True)
    return json.loads(done.stdout.strip().splitlines()[-1])  # type: ignore[no-any-return]


def test_onnx_runtime_gives_each_runs_activations_back_to_the_os_not_only_to_glibc() -> None:
    """The arena ONNX Runtime shrinks after every run goes back to glibc, which kept it (its mmap threshold rises
    past the buffers' sizes after the first large free): pii-rampart on ragged batches held 50-100 MB more after
    a minute, and a CI soak failed on it. heap.fix_mmap_threshold keeps large blocks mapped, so they are unmapped when
    freed (the OrtEngine docstring has the numbers)."""
    if not (ROOT / "model_repository" / "pii-rampart" / "1" / "model.onnx").is_file():
        pytest.fail("model repository is not built: run `make models`")
    fixed = _ort_probe("fixed", 20)
    assert fixed["after"] - fixed["warm"] < 8, fixed  # measured: +0.3 MiB
    # what the fix prevents, so this test can fail (measured: 91.6 → 112.1 MiB, the fixed side 54.7 → 55.0)
    default = _ort_probe("glibc-default", 20)
    assert default["after"] > fixed["after"] + 24, (default, fixed)


_TORCH_PROBE = """
import json, sys
import numpy as np
from sr_backend.engines import load_engine
from sr_backend.ragged import RaggedRunner, Row
from tools.soak import ROOT, heap_in_use, random_rows
onnx = ROOT / "model_repository" / "all-minilm-l6-v2" / "1" / "model.onnx"
runner = RaggedRunner(load_engine("torch", "bf16", onnx, 1))
rng = np.random.default_rng(11)
if sys.argv[1] == "warm":
    runner.warm(256)
else:
    runner.run([Row(np.ones(256, dtype=np.int64)) for _ in range(32)])  # the largest chunk only
warmed = heap_in_use()
for k in range(40):  # ragged traffic: 1-32 rows of 8-128 tokens, every fourth batch up to 256
    runner.run(random_rows(rng, high=256 if k % 4 == 0 else 128))
print(json.dumps({"warmed": warmed, "after_traffic": heap_in_use()}))
"""


def test_pytorch_bf16_takes_every_shapes_memory_at_load_so_traffic_adds_none() -> None:
    """PyTorch bf16 keeps about 0.36 MiB per input shape it has run (oneDNN's primitives), so served it kept rising
    for 30 minutes as traffic brought new shapes; warmed over every shape of its coarse buckets at load
    (TorchEngine.shape_memory), ragged traffic afterwards adds nothing. Measured (MiniLM, 1 thread, AMD EPYC with
    AVX512-BF16, 2026-12-03): warmed, +0.0 MiB after the traffic below (78 s in all); warmed with the largest chunk
    only, +24.4 MiB."""
    if not detect().native_bf16:
        pytest.skip("this CPU has no native bf16 (the engine refuses it)")
    if not (ROOT / "model_repository" / "all-minilm-l6-v2" / "1" / "model.pt2").is_file():
        pytest.fail("model repository is not built with its PyTorch program: run `make models`")
    warm = _probe(_TORCH_PROBE, "warm", timeout=900)
    assert warm["after_traffic"] - warm["warmed"] < 2.0, warm

