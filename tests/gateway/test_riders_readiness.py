"""Models that ride on another (zero-shot cards over MiniLM's Triton model, a decisions family over its tagger) are
ready only while what they ride on is: /health, /v1/models and request resolution all say so (no server needed)."""

from __future__ import annotations

from pathlib import Path

import pytest

from gateway.cards import discover
from gateway.decisions.families import family
from gateway.errors import ApiError
from gateway.metrics import Metrics
from gateway.runtime import Runtime
from gateway.settings import Settings
from gateway.surfaces.info import health_body, model_card

REPO = Path(__file__).resolve().parents[2] / "model_repository"
MODELS = ["all-minilm-l6-v2", "pii-rampart", "decision-zeroshot", "domain-zeroshot"]


def all_ready() -> Runtime:
    runtime = Runtime(Settings(model_repository=REPO), discover(REPO, MODELS), Metrics())
    family(runtime.models["decision-zeroshot"])  # built at warm-up in a serving process: names its tagger
    for model in runtime.models.values():
        runtime.set_status(model, "ready")
    return runtime


def test_riders_are_ready_while_what_they_ride_on_is() -> None:
    runtime = all_ready()
    code, body = health_body(runtime)
    assert code == 200 and body["status"] == "ready"
    assert all(model_card(m, runtime)["ready"] for m in runtime.models.values())


@pytest.mark.parametrize("rider", ["decision-zeroshot", "domain-zeroshot"])
def test_a_model_riding_on_minilm_is_not_ready_while_minilm_is_not(rider: str) -> None:
    runtime = all_ready()
    runtime.set_status(runtime.models["all-minilm-l6-v2"], "degraded", "1 of 2 Triton instances running")
    code, body = health_body(runtime)
    assert code == 503 and body["status"] == "degraded"
    shown = body["models"][rider]
    assert shown["status"] == "degraded" and "all-minilm-l6-v2" in shown["reason"]
    assert "1 of 2 Triton instances running" in shown["reason"]
    card = model_card(runtime.models[rider], runtime)
    assert card["ready"] is False and card["status"] == "degraded"
    with pytest.raises(ApiError) as refused:
        runtime.resolve(rider, "decisions" if rider == "decision-zeroshot" else "classify")
    assert refused.value.code == "not_ready" and "all-minilm-l6-v2" in refused.value.message
    gauge = runtime.metrics.child(runtime.metrics.model_ready, rider)
    assert gauge._value.get() == 0  # the exported sr_gateway_model_ready sample


def test_a_rider_shows_what_it_rides_on_while_that_loads_again_and_recovers_with_it() -> None:
    runtime = all_ready()
    minilm = runtime.models["all-minilm-l6-v2"]
    runtime.set_status(minilm, "loading", "Triton no longer has the model loaded; loading it")
    _, body = health_body(runtime)
    assert body["status"] == "loading" and body["models"]["domain-zeroshot"]["status"] == "loading"
    runtime.set_status(minilm, "ready")
    code, body = health_body(runtime)
    assert code == 200 and body["models"]["domain-zeroshot"] == {"status": "ready", "reason": None}
    assert runtime.resolve("domain-zeroshot", "classify").id == "domain-zeroshot"


def test_a_decisions_model_is_not_ready_while_its_tagger_is_not() -> None:
    runtime = all_ready()
    runtime.set_status(runtime.models["pii-rampart"], "failed", "the golden check failed")
    _, body = health_body(runtime)
    assert body["models"]["decision-zeroshot"]["status"] == "degraded"
    assert "pii-rampart" in body["models"]["decision-zeroshot"]["reason"]
    assert body["models"]["domain-zeroshot"]["status"] == "ready"  # it reads no tagger
