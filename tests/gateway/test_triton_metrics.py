"""Child mode with `--triton-metrics-port`: the child tritonserver's Prometheus metrics are on, on their own port and
on loopback unless told otherwise (issue 24: a pod's scraper reads Triton's metrics; gRPC stays on loopback), and the
backend's per-instance memory gauge is among them. Off by default: no metrics port at all."""

from __future__ import annotations

import socket
import subprocess
from pathlib import Path

import httpx
from prometheus_client.parser import text_string_to_metric_families

from .conftest import MODEL, free_port, start, stop, wait_for


def listening(port: int, host: str) -> bool:
    with socket.socket() as s:
        s.settimeout(1)
        return s.connect_ex((host, port)) == 0


def other_address() -> str:
    """An address of this host other than loopback (where a wider bind would be seen), else loopback's 127.0.0.2."""
    with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as s:
        try:
            s.connect(("192.0.2.1", 9))  # TEST-NET-1: no packet is sent for a UDP connect
            found = s.getsockname()[0]
        except OSError:
            found = "127.0.0.2"
    return found if found != "127.0.0.1" else "127.0.0.2"


def test_triton_metrics_in_child_mode_are_served_on_their_port_on_loopback_with_the_instance_gauge() -> None:
    port, metrics = free_port(), free_port()
    proc = start(["serve", "--port", str(port), "--models", MODEL, "--triton-metrics-port", str(metrics)],
                 "triton-metrics.log")
    url = f"http://127.0.0.1:{port}"
    try:
        wait_for(lambda: httpx.get(url + "/health", timeout=5).json()["status"] == "ready", 240, "gateway", proc)
        assert httpx.post(url + "/v1/embeddings", json={"model": MODEL, "input": ["metrics"]}).status_code == 200
        text = httpx.get(f"http://127.0.0.1:{metrics}/metrics", timeout=10).text
        families = {f.name: f for f in text_string_to_metric_families(text)}
        success = [s for s in families["nv_inference_request_success"].samples if s.labels.get("model") == MODEL]
        assert success and sum(s.value for s in success) >= 1
        resident = [s for s in families["sr_gateway_model_instance_resident_bytes"].samples
                    if s.labels.get("model") == MODEL]
        assert resident and all(s.value > 50e6 for s in resident)
        assert not listening(metrics, other_address()), "metrics must bind to loopback unless told otherwise"
    finally:
        stop(proc)


def test_without_the_flag_the_child_triton_opens_no_metrics_port() -> None:
    port = free_port()
    proc = start(["serve", "--port", str(port), "--models", MODEL], "triton-metrics-off.log")
    url = f"http://127.0.0.1:{port}"
    try:
        wait_for(lambda: httpx.get(url + "/health", timeout=5).json()["status"] == "ready", 240, "gateway", proc)
        found = subprocess.run(["pgrep", "-P", str(proc.pid), "-f", "tritonserver"], capture_output=True, text=True)
        (triton,) = found.stdout.split()
        args = Path(f"/proc/{triton}/cmdline").read_text().split("\0")
        assert "--allow-metrics=false" in args and not any(a.startswith("--metrics-port") for a in args)
    finally:
        stop(proc)
