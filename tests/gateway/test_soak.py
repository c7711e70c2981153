"""A short soak (issue 23): a real served stack on the engines this host's tuner chose (the built repository's
generated configs), a varied mixed load on every text surface, and the resident memory of the gateway, tritonserver
and every model instance sampled throughout (the bound is checked on anonymous RSS: see below). Before the fix
the model instances grew with every new input shape (OpenVINO's per-shape kernel cache, oneDNN's primitive cache):
+0.3 GB a minute per MiniLM instance under real traffic.

The stack is `tools.soak.Stack` (`sr-gateway serve --models …`, Triton as its child) rather than conftest's
`serving()`: the soak samples that process tree by pid and serves only the models its load uses — MiniLM,
pii-rampart and decision-zeroshot, and decision-multilingual with its encoder and the LM its relevance and grounded
heads read (each decisions request to it asks one of those presets: one LM prefill). It runs before any other
test (conftest's `pytest_collection_modifyitems`), so its stack and the session's do not share the machine's memory.
Run with SR_BACKEND_UNBOUNDED=1 in the environment to see it fail on the old settings.
"""

from __future__ import annotations

import asyncio
import json
import re
from pathlib import Path

import httpx
import pytest
from prometheus_client.parser import text_string_to_metric_families

from tools.soak import ANON, LM_TARGETS, SURFACES, WITH_LM, Stack, growth, soak

from .conftest import LOGS

REPO = Path(__file__).resolve().parents[2] / "model_repository"
WARMUP_S = 60.0  # the first minute fills what every process allocates once (weights, arenas, the first shapes)
LOAD_S = 150.0  # with the stack's start, the whole test stays under four minutes
MOST_GROWTH = 0.05  # after warm-up, anonymous RSS may grow by 5 % (below: "kept growing"),
LEAST_MIB = 8.0  # or 8 MiB where that is more: tritonserver's heap is ≈ 11 MiB, and 5 % of it (0.6 MiB) is noise
WINDOW_S = 30.0  # the half minute right after warm-up, and the last half minute


def window(samples: list[dict[str, float]], name: str, start: float, end: float) -> list[float]:
    return [row[name] for row in samples if name in row and start <= row["t"] <= end]


def test_no_served_process_keeps_growing_after_warm_up_under_a_varied_mixed_load() -> None:
    if not (REPO / "all-minilm-l6-v2" / "1" / "model.onnx").is_file():
        pytest.fail("model repository is not built: run `make models`")
    with Stack(WITH_LM, LOGS / "soak-gateway.log") as stack:
        load, samples = asyncio.run(soak(stack, SURFACES, callers=8, seconds=LOAD_S, sample_s=5.0,
                                         targets=LM_TARGETS))
        exposition = httpx.get(stack.url + "/metrics", timeout=30).text
    summary = load.summary()
    record = {"summary": summary, "growth": growth(samples, WARMUP_S), "samples": samples}
    (LOGS / "soak-samples.json").write_text(json.dumps(record, indent=1))  # what a failure is read from
    assert all(s["requests"] > 0 for s in summary.values()), summary
    assert sum(s["errors"] for s in summary.values()) == 0, (summary, load.statuses)
    names = sorted({k for row in samples for k in row if k != "t" and not k.startswith(ANON)})
    instances = [n for n in names if n not in ("gateway", "tritonserver")]
    # every model the load reaches runs in at least one instance (decision-* run in the gateway, not in Triton)
    served = {"all-minilm-l6-v2", "pii-rampart", "multilingual-e5-small", "qwen-coder-state"}
    assert {re.sub(r"(_\d+)+$", "", n) for n in instances} == served, names  # Triton's names: <model>_<group>_<n>
    assert "tritonserver" in names and "gateway" in names, names
    # anonymous RSS (heap and private memory: what a leak or a per-shape cache grows), not RSS: RSS also counts
    # file-backed pages the kernel drops and reads back as other processes on the host need memory (measured:
    # every instance −80 MiB at once, mid-soak), which would fail or pass this test by chance.
    # "Kept growing": the end more than the allowance above the end of warm-up. Every instance ran its largest
    # chunks at load (sr_backend.ragged RaggedRunner.warm), so a larger batch than any before no longer steps an
    # engine's buffers up mid-soak (before that: a MiniLM instance +42 MiB between 70 and 80 s, pii-rampart +30 and
    # +15 MiB, which made this test pass 2 runs in 3 with a laxer rule); the old settings grow +45 MiB per 45 s.
    assert all(ANON + n in samples[-1] for n in names), samples[-1]
    # Held memory, not one sample: an engine that gives each run's activations back (ONNX Runtime shrinks its
    # arena after every run, PyTorch trims the heap) swings between samples. A fresh-clone CI run whose tuner chose
    # ONNX Runtime for pii-rampart failed the earlier point rule (167.8 MiB at 60 s, 188.5 at 150 s) while that
    # instance swung between 157 and 210 MiB within half a minute. So a process "kept growing" when the least it
    # held in the last half minute is more than the most it held in the half minute after warm-up (plus the
    # allowance): memory that is never given back rose. A per-shape cache or a leak lifts the floor past the earlier
    # peak (the old settings: +70 to +105 MiB per 45 s on every MiniLM instance); a swing does not.
    kept_growing = {}
    for n in names:
        then = window(samples, ANON + n, WARMUP_S, WARMUP_S + WINDOW_S)
        now = window(samples, ANON + n, LOAD_S - WINDOW_S, LOAD_S)
        assert then and now, (n, then, now)
        if min(now) > max(then) + max(max(then) * MOST_GROWTH, LEAST_MIB):
            kept_growing[n] = (f"held {min(then):.1f}–{max(then):.1f} MiB after warm-up, "
                               f"{min(now):.1f}–{max(now):.1f} at the end")
    assert not kept_growing, (f"anonymous RSS: {kept_growing}; {growth(samples, WARMUP_S)}")
    # the same memory on the gateway's /metrics, one series per model instance, as the sampler saw it
    gauges = {s.labels["instance"]: s.value for family in text_string_to_metric_families(exposition)
              if family.name == "sr_gateway_model_instance_resident_bytes" for s in family.samples}
    assert sorted(gauges) == sorted(instances), gauges
    for name, value in gauges.items():
        assert abs(value / 2**20 - samples[-1][name]) < 0.25 * samples[-1][name], (name, value, samples[-1][name])
