"""A short soak (issue 23): a real served stack on the engines this host's tuner chose (the built repository's
generated configs), a varied mixed load on every text surface, and the resident memory of the gateway, tritonserver
and every model instance sampled throughout. Before the fix the model instances grew with every new input shape
(OpenVINO's per-shape kernel cache, allocator arenas): +0.3 GB a minute per MiniLM instance under real traffic.

The stack is `tools.soak.Stack` (`sr-gateway serve --models …`, Triton as its child) rather than conftest's
`serving()`: the soak samples that process tree by pid and serves only the models its load uses. Run with
SR_BACKEND_UNBOUNDED=1 in the environment to see it fail on the old settings.
"""

from __future__ import annotations

import asyncio
from pathlib import Path

import httpx
import pytest
from prometheus_client.parser import text_string_to_metric_families

from tools.soak import MODELS, SURFACES, Stack, growth, rss_at, soak

from .conftest import LOGS

REPO = Path(__file__).resolve().parents[2] / "model_repository"
WARMUP_S = 60.0  # the first minute fills what every process allocates once (weights, arenas, the first shapes)
LOAD_S = 150.0  # with the stack's start, the whole test stays under four minutes
MOST_GROWTH = 0.05  # RSS at the end may be at most 5 % above RSS at minute 1


def test_no_served_process_keeps_growing_after_warm_up_under_a_varied_mixed_load() -> None:
    if not (REPO / "all-minilm-l6-v2" / "1" / "model.onnx").is_file():
        pytest.fail("model repository is not built: run `make models`")
    with Stack(MODELS, LOGS / "soak-gateway.log") as stack:
        load, samples = asyncio.run(soak(stack, SURFACES, callers=8, seconds=LOAD_S, sample_s=5.0))
        exposition = httpx.get(stack.url + "/metrics", timeout=30).text
    summary = load.summary()
    assert all(s["requests"] > 0 for s in summary.values()), summary
    assert sum(s["errors"] for s in summary.values()) == 0, (summary, load.statuses)
    names = sorted({k for row in samples for k in row if k != "t"})
    instances = [n for n in names if n.startswith(("all-minilm-l6-v2_", "pii-rampart_"))]
    assert len(instances) >= 2 and "tritonserver" in names and "gateway" in names, names
    grew = {n: (rss_at(samples, n, WARMUP_S), rss_at(samples, n, LOAD_S)) for n in names}
    kept_growing = {n: f"{a:.0f} → {b:.0f} MiB" for n, (a, b) in grew.items() if b > a * (1 + MOST_GROWTH)}
    assert not kept_growing, f"RSS at {LOAD_S:.0f} s vs {WARMUP_S:.0f} s: {kept_growing}; {growth(samples, WARMUP_S)}"
    # the same memory on the gateway's /metrics, one series per model instance, as the sampler saw it
    gauges = {s.labels["instance"]: s.value for family in text_string_to_metric_families(exposition)
              if family.name == "sr_gateway_model_instance_resident_bytes" for s in family.samples}
    assert sorted(gauges) == sorted(instances), gauges
    for name, value in gauges.items():
        assert abs(value / 2**20 - samples[-1][name]) < 0.25 * samples[-1][name], (name, value, samples[-1][name])
