"""`sr-gateway serve` as it runs in production: Triton as a supervised child, several models, golden-gated
readiness, and a SIGTERM that drains in-flight requests before stopping Triton."""

from __future__ import annotations

import asyncio
import re
import shutil
import signal
import subprocess
from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest
import yaml
from prometheus_client.parser import text_string_to_metric_families

from .conftest import ROOT, free_port, start, stop, wait_for
from .contract import check

SOURCE = ROOT / "model_repository" / "all-minilm-l6-v2"


def copy_model(repo: Path, name: str, *, tamper_golden: bool = False) -> None:
    target = repo / name
    (target / "1").mkdir(parents=True)
    for f in ("model.onnx", "tokenizer.json"):
        (target / "1" / f).symlink_to(SOURCE / "1" / f)
    shutil.copy(SOURCE / "1" / "model.py", target / "1" / "model.py")
    config = (SOURCE / "config.pbtxt").read_text()
    (target / "config.pbtxt").write_text(re.sub(r'name: "[^"]+"', f'name: "{name}"', config, count=1))
    card = yaml.safe_load((SOURCE / "card.yaml").read_text())
    card["id"] = name
    if tamper_golden:
        card["golden"]["expected"]["embeddings"][0][0] += 0.01
    (target / "card.yaml").write_text(yaml.safe_dump(card))


@pytest.fixture(scope="module")
def served(tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[str, subprocess.Popen]]:  # type: ignore[type-arg]
    repo = tmp_path_factory.mktemp("repo")
    copy_model(repo, "good")
    copy_model(repo, "bad", tamper_golden=True)
    port = free_port()
    proc = start(["serve", "--port", str(port), "--model-repository", str(repo)], "serve-child.log",
                 env={"SR_GATEWAY_SHUTDOWN_S": "20"})
    url = f"http://127.0.0.1:{port}"

    def settled() -> bool:
        models = httpx.get(url + "/health", timeout=2).json().get("models", {})
        return bool(models) and all(m["status"] in ("ready", "failed") for m in models.values())

    try:
        wait_for(settled, 180, "gateway (child mode)", proc)
        yield url, proc
    finally:
        stop(proc)


def test_a_golden_mismatch_fails_that_model_only(served: tuple[str, subprocess.Popen]) -> None:  # type: ignore[type-arg]
    url, _ = served
    health = httpx.get(url + "/health")
    check("/health", "get", 503, health.json())
    body = health.json()
    assert health.status_code == 503 and body["status"] == "degraded" and body["model"] is None
    assert body["models"]["good"] == {"status": "ready", "reason": None}
    assert body["models"]["bad"]["status"] == "failed"
    assert "GoldenMismatch" in body["models"]["bad"]["reason"]
    models = httpx.get(url + "/v1/models").json()
    check("/v1/models", "get", 200, models)
    bad = next(m for m in models["data"] if m["id"] == "bad")
    assert bad["golden"]["status"] == "failed" and bad["ready"] is False


def test_several_models_require_a_model_name(served: tuple[str, subprocess.Popen]) -> None:  # type: ignore[type-arg]
    url, _ = served
    r = httpx.post(url + "/v1/embeddings", json={"input": "x"})
    assert r.status_code == 400 and r.json()["error"]["message"] == "model is required: this runtime serves bad, good"
    r = httpx.post(url + "/v1/embeddings", json={"model": "bad", "input": "x"})
    check("/v1/embeddings", "post", 503, r.json(), r.headers)
    assert r.status_code == 503 and r.json()["error"]["code"] == "not_ready" and r.headers["Retry-After"] == "5"
    r = httpx.post(url + "/v1/embeddings", json={"model": "good", "input": "x"})
    assert r.status_code == 200


def test_sigterm_drains_in_flight_requests_then_stops_triton(served: tuple[str, subprocess.Popen]) -> None:  # type: ignore[type-arg]
    url, proc = served
    triton_pids = subprocess.run(["pgrep", "-P", str(proc.pid), "-f", "tritonserver"], capture_output=True,
                                 text=True).stdout.split()
    assert triton_pids, "the gateway should supervise a tritonserver child"

    async def run() -> httpx.Response:
        async with httpx.AsyncClient(timeout=60) as client:
            texts = [f"draining request {i} " * 10 for i in range(256)]
            pending = asyncio.create_task(client.post(url + "/v1/embeddings", json={"model": "good", "input": texts}))
            for _ in range(600):  # until the gateway has inputs of it in Triton (not a fixed sleep: machines differ)
                metrics = text_string_to_metric_families((await client.get(url + "/metrics")).text)
                if any(s.value > 0 for f in metrics if f.name == "sr_gateway_queue_depth" for s in f.samples
                       if s.labels.get("model") == "good"):
                    break
                await asyncio.sleep(0.02)
            assert not pending.done(), "the request finished before SIGTERM could be sent"
            proc.send_signal(signal.SIGTERM)
            return await pending

    response = asyncio.run(run())
    assert response.status_code == 200 and len(response.json()["data"]) == 256
    assert all("embedding" in d for d in response.json()["data"])
    assert proc.wait(60) == 0
    for pid in triton_pids:
        assert not Path(f"/proc/{pid}").exists() or "zombie" in Path(f"/proc/{pid}/status").read_text().lower()


def test_when_triton_dies_with_no_restarts_left_every_model_fails_with_the_reason_and_http_keeps_answering(
        tmp_path: Path) -> None:
    copy_model(tmp_path, "solo")
    port = free_port()
    proc = start(["serve", "--port", str(port), "--model-repository", str(tmp_path)], "serve-triton-dies.log",
                 env={"SR_GATEWAY_TRITON_RESTART_LIMIT": "0"})  # restarts: tests/gateway/test_self_healing.py
    url = f"http://127.0.0.1:{port}"
    try:
        wait_for(lambda: httpx.get(url + "/health", timeout=2).status_code == 200, 180, "gateway", proc)
        (triton_pid,) = subprocess.run(["pgrep", "-P", str(proc.pid), "-f", "tritonserver"], capture_output=True,
                                       text=True).stdout.split()
        subprocess.run(["kill", "-KILL", triton_pid], check=True)
        wait_for(lambda: httpx.get(url + "/health", timeout=2).json()["status"] == "failed", 30, "failure", proc)
        health = httpx.get(url + "/health")
        check("/health", "get", 503, health.json())
        assert health.status_code == 503 and "tritonserver exited" in health.json()["reason"]
        r = httpx.post(url + "/v1/embeddings", json={"input": "x"})
        assert r.status_code == 503 and "tritonserver exited" in r.json()["error"]["message"]
        assert httpx.get(url + "/health/live").status_code == 200
    finally:
        assert stop(proc) == 0
