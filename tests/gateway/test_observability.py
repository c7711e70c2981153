"""What an operator sees: JSON request logs behind --log-format, and a Grafana dashboard whose every query names
metrics that a running gateway and Triton actually export (scraped here, after real traffic). The stack runs with
the flags and ConfigMap of the rendered k8s pod, so these tests also show that configuration works."""

from __future__ import annotations

import json
import re
import subprocess
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest

from k8s.render import render

from .conftest import BIN, LOGS, MODEL, READY_S, ROOT, free_port, start, stop, wait_for
from .contract import timings

DASHBOARD = ROOT / "k8s" / "base" / "sr-gateway-dashboard.json"
METRIC = re.compile(r"\b(?:sr_gateway|nv)_[a-z0-9_]+\b")


def pod() -> tuple[list[str], dict[str, str], list[str]]:
    """The rendered sr-gateway pod (cpu overlay): the Triton container's args (`sr-gateway triton`), the gateway's env
    (its ConfigMap) and args."""
    docs = render("cpu")
    deployment = next(d for d in docs if d["kind"] == "Deployment" and d["metadata"]["name"] == "sr-gateway")
    containers = {c["name"]: c for c in deployment["spec"]["template"]["spec"]["containers"]}
    config = next(d for d in docs if d["kind"] == "ConfigMap" and d["metadata"]["name"] == "sr-gateway")["data"]
    assert containers["gateway"]["envFrom"] == [{"configMapRef": {"name": "sr-gateway"}}]
    assert containers["triton"]["command"][-1] == "sr-gateway"
    return containers["triton"]["args"], dict(config), containers["gateway"]["args"]


@pytest.fixture(scope="module")
def stack() -> Iterator[dict[str, Any]]:
    """The pod as the manifests configure it, run here: the Triton container's command (`sr-gateway triton` with its
    flags) and the gateway (its ConfigMap as environment: external Triton, JSON logs). Local differences: loopback
    and free ports, the repository path."""
    grpc, metrics, port = free_port(), free_port(), free_port()
    triton_args, config, gateway_args = pod()
    local = {"--model-repository": str(ROOT / "model_repository"), "--grpc-port": str(grpc),
             "--metrics-port": str(metrics), "--metrics-address": "127.0.0.1"}
    args = [f"{a.split('=')[0]}={local[a.split('=')[0]]}" if a.split("=")[0] in local else a for a in triton_args]
    assert args[0] == "triton" and {f"--metrics-port={metrics}", f"--grpc-port={grpc}"} <= set(args)
    triton = start(args, "observability-triton.log")
    env = {**config, "SR_GATEWAY_HOST": "127.0.0.1", "SR_GATEWAY_PORT": str(port), "SR_GATEWAY_MODELS": MODEL,
           "SR_GATEWAY_TRITON_URL": f"127.0.0.1:{grpc}",
           "SR_GATEWAY_MODEL_REPOSITORY": str(ROOT / "model_repository")}
    assert config["SR_GATEWAY_TRITON_URL"] == "127.0.0.1:8001" and config["SR_GATEWAY_LOG_FORMAT"] == "json"
    gateway = start(gateway_args, "observability-gateway.log", env=env)
    url = f"http://127.0.0.1:{port}"
    try:
        wait_for(lambda: httpx.get(url + "/health", timeout=2).json()["status"] == "ready", READY_S, "gateway", gateway)
        yield {"url": url, "triton_metrics": f"http://127.0.0.1:{metrics}/metrics", "log": LOGS /
               "observability-gateway.log"}
    finally:
        assert stop(gateway) == 0
        assert stop(triton) == 0


def log_lines(path: Path) -> list[dict[str, Any]]:
    return [json.loads(line) for line in path.read_text().splitlines() if line.strip()]


def test_json_logs_have_one_line_per_request_with_id_surface_model_status_and_total(stack: dict[str, Any]) -> None:
    r = httpx.post(stack["url"] + "/v1/embeddings", json={"model": MODEL, "input": ["log me"]},
                   headers={"X-Request-Id": "obs-request-1"})
    assert r.status_code == 200 and r.headers["X-Request-Id"] == "obs-request-1"
    bad = httpx.post(stack["url"] + "/v1/embeddings", json={"model": MODEL})
    assert bad.status_code == 400
    generated = bad.headers["X-Request-Id"]
    assert re.fullmatch(r"[0-9a-f]{32}", generated)

    def lines_for(request_id: str) -> list[dict[str, Any]]:
        return [x for x in log_lines(stack["log"]) if x.get("request_id") == request_id]

    wait_for(lambda: lines_for("obs-request-1") and lines_for(generated), 10, "request log lines")
    (ok,) = lines_for("obs-request-1")
    assert ok["surface"] == "embeddings" and ok["model"] == MODEL and ok["status"] == 200
    assert ok["logger"] == "sr_gateway.request" and ok["level"] == "info" and ok["path"] == "/v1/embeddings"
    assert ok["total_ms"] == pytest.approx(timings(r)["total"], abs=1e-3)
    (failed,) = lines_for(generated)
    assert failed["status"] == 400 and failed["surface"] == "embeddings" and failed["model"] is None
    # every line the gateway wrote is JSON, start-up and model readiness included
    records = log_lines(stack["log"])
    assert any(x["message"] == f"model {MODEL} is ready" for x in records)


def test_an_unknown_log_format_stops_the_start_with_a_clear_error() -> None:
    done = subprocess.run([str(BIN / "sr-gateway"), "serve", "--log-format", "xml"], capture_output=True,
                          text=True, timeout=60)
    assert done.returncode == 2
    assert "invalid setting log_format (SR_GATEWAY_LOG_FORMAT): 'xml' is not text or json" in done.stderr


def _exported(stack: dict[str, Any]) -> set[str]:
    with httpx.Client(timeout=30) as client:
        for _ in range(4):
            client.post(stack["url"] + "/v1/embeddings", json={"model": MODEL, "input": ["a", "b c", "d e f"]})
        texts = [client.get(stack["url"] + "/metrics").text, client.get(stack["triton_metrics"]).text]
    # series names as Prometheus stores them: the exposition's own (a parser may rename counters to *_total)
    return {line.split("{")[0].split(" ")[0] for text in texts for line in text.splitlines()
            if line and not line.startswith("#")}


def test_every_dashboard_query_names_metrics_the_gateway_and_triton_export(stack: dict[str, Any]) -> None:
    dashboard = json.loads(DASHBOARD.read_text())
    exported = _exported(stack)
    used: set[str] = set()
    for panel in dashboard["panels"]:
        names = {n for t in panel["targets"] for n in METRIC.findall(t["expr"])}
        assert names, f"panel {panel['title']!r} queries no gateway or Triton metric"
        missing = names - exported
        assert not missing, f"panel {panel['title']!r} queries metrics nobody exports: {sorted(missing)}"
        used |= names
    # what an operator watches is all there: surfaces, phases, Triton queue/compute/batches, states, restarts, queue,
    # memory per model instance
    for needed in ("sr_gateway_requests_total", "sr_gateway_phase_duration_seconds_sum",
                   "nv_inference_queue_duration_us", "nv_inference_compute_infer_duration_us",
                   "nv_inference_exec_count", "sr_gateway_model_ready", "sr_gateway_triton_restarts_total",
                   "sr_gateway_queue_depth", "sr_gateway_max_queue", "sr_gateway_model_instance_resident_bytes"):
        assert needed in used, needed


def test_the_manifests_provision_the_dashboard_to_grafana() -> None:
    (config_map,) = [d for d in render("cpu") if d["kind"] == "ConfigMap"
                     and d["metadata"]["name"] == "sr-gateway-grafana-dashboard"]
    assert config_map["metadata"]["labels"]["grafana_dashboard"] == "1"
    assert json.loads(config_map["data"]["sr-gateway-dashboard.json"]) == json.loads(DASHBOARD.read_text())


