"""A rollout drops no request (issue 24): the pod's termination sequence as the kubelet runs it, scripted against a
real served stack and timed by the rendered manifest.

Pod A is the production pod: `sr-gateway triton` (the Triton container) and `sr-gateway serve --triton-url` (the
gateway container). Pod B (`serve`, Triton as its child) keeps serving. Steady load goes through a stand-in
Service that sends to the endpoints of both. Then pod A is deleted: it leaves the endpoints, both containers' preStop
hooks run, each container gets SIGTERM when its own preStop ends, and anything left at the grace period is killed.
The manifest's numbers are what makes that safe (Triton's preStop outlasts the gateway's preStop plus drain, all
inside terminationGracePeriodSeconds); this test runs the sequence with them, so a manifest that let Triton stop
during the drain fails here with a failed in-flight request, not only in the render test.
"""

from __future__ import annotations

import asyncio
import signal
import subprocess
import time
from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any

import httpx
import pytest
from prometheus_client.parser import text_string_to_metric_families

from k8s.render import render

from .conftest import READY_S, free_port, start, stop, wait_for
from .test_serve_process import copy_model

# manifest seconds -> test seconds. 1: the manifest's own numbers (a scaled-down run measured the machine's load,
# not the manifest: on a busy 2-core runner the in-flight request alone took 9.5 s)
SCALE = 1.0
MODEL = "good"


@dataclass(frozen=True)
class Termination:
    """The pod's shutdown numbers from the rendered manifest (seconds)."""

    gateway_pre_stop: float
    drain: float
    triton_pre_stop: float
    grace: float


def _sleep(container: dict[str, Any]) -> float:
    command = container["lifecycle"]["preStop"]["exec"]["command"]
    assert command[0] == "sleep", command
    return float(command[1])


def termination() -> Termination:
    docs = render("cpu")
    deployment = next(d for d in docs if d["kind"] == "Deployment" and d["metadata"]["name"] == "sr-gateway")
    spec = deployment["spec"]["template"]["spec"]
    containers = {c["name"]: c for c in spec["containers"]}
    config = next(d for d in docs if d["kind"] == "ConfigMap" and d["metadata"]["name"] == "sr-gateway")["data"]
    return Termination(gateway_pre_stop=_sleep(containers["gateway"]),
                       drain=float(config["SR_GATEWAY_SHUTDOWN_S"]),
                       triton_pre_stop=_sleep(containers["triton"]),
                       grace=float(spec["terminationGracePeriodSeconds"]))


@dataclass
class Pods:
    a_url: str
    a_gateway: subprocess.Popen  # type: ignore[type-arg]
    a_triton: subprocess.Popen  # type: ignore[type-arg]
    b_url: str


def _ready(url: str) -> bool:
    return bool(httpx.get(url + "/health", timeout=2).status_code == 200)


@pytest.fixture(scope="module")
def pods(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Pods]:
    repo = tmp_path_factory.mktemp("rollout-repo")
    copy_model(repo, MODEL)
    t = termination()
    grpc = free_port()
    a_triton = start(["triton", "--grpc-port", str(grpc), "--model-repository", str(repo)], "rollout-a-triton.log")
    a_port, b_port = free_port(), free_port()
    a_gateway = start(["serve", "--triton-url", f"127.0.0.1:{grpc}", "--port", str(a_port),
                       "--model-repository", str(repo)], "rollout-a-gateway.log",
                      env={"SR_GATEWAY_SHUTDOWN_S": str(t.drain * SCALE)})
    b = start(["serve", "--port", str(b_port), "--model-repository", str(repo)], "rollout-b.log")
    pods = Pods(f"http://127.0.0.1:{a_port}", a_gateway, a_triton, f"http://127.0.0.1:{b_port}")
    try:
        wait_for(lambda: _ready(pods.a_url), READY_S, "pod A's gateway", a_gateway)
        wait_for(lambda: _ready(pods.b_url), READY_S, "pod B", b)
        yield pods
    finally:
        for proc in (a_gateway, b, a_triton):
            stop(proc)


async def _queued(client: httpx.AsyncClient, url: str) -> bool:
    metrics = text_string_to_metric_families((await client.get(url + "/metrics")).text)
    return any(s.value > 0 for f in metrics if f.name == "sr_gateway_queue_depth" for s in f.samples
               if s.labels.get("model") == MODEL)


async def _exited(proc: subprocess.Popen, by: float) -> float | None:  # type: ignore[type-arg]
    """Monotonic time the process was seen gone, or None if it still ran at ``by``."""
    while time.monotonic() < by:
        if proc.poll() is not None:
            return time.monotonic()
        await asyncio.sleep(0.02)
    return None


def test_deleting_a_pod_under_steady_load_fails_no_request_and_triton_outlives_the_gateways_drain(
    pods: Pods,
) -> None:
    t = termination()
    assert t.triton_pre_stop > t.gateway_pre_stop + t.drain, "the render test covers this; the run needs it too"

    async def run() -> dict[str, Any]:
        out: dict[str, Any] = {"steady": [], "probes": [], "late": []}
        endpoints = [pods.a_url, pods.b_url]
        stop_load = asyncio.Event()
        fresh = httpx.Limits(max_keepalive_connections=0)  # probes and late callers open new connections
        async with httpx.AsyncClient(timeout=60) as client, httpx.AsyncClient(timeout=5, limits=fresh) as new:

            async def steady() -> None:
                i = 0
                while not stop_load.is_set():
                    url = endpoints[i % len(endpoints)]
                    i += 1
                    try:
                        r = await client.post(url + "/v1/embeddings", json={"model": MODEL, "input": [f"steady {i}"]})
                        out["steady"].append((url, r.status_code))
                    except httpx.HTTPError as exc:
                        out["steady"].append((url, repr(exc)))
                    await asyncio.sleep(0.01)

            async def probe() -> None:  # the kubelet's readiness probe of pod A's gateway, every 20 ms
                while True:
                    try:
                        ok = (await new.get(pods.a_url + "/health")).status_code == 200
                    except httpx.HTTPError:
                        ok = False
                    out["probes"].append((time.monotonic(), ok))
                    await asyncio.sleep(0.02)

            load = asyncio.create_task(steady())
            probing = asyncio.create_task(probe())
            while sum(1 for url, _ in out["steady"] if url == pods.a_url) < 20:  # both pods take load
                await asyncio.sleep(0.05)
            # pod A deleted: it leaves the endpoints and both preStop hooks start
            deleted = time.monotonic()
            endpoints.remove(pods.a_url)
            # a request that still reached A (a stale endpoint somewhere) just before its gateway gets SIGTERM
            texts = [f"in flight during the drain {i} " * 8 for i in range(64)]
            await asyncio.sleep(max(0.0, t.gateway_pre_stop * SCALE - 0.3))
            in_flight = asyncio.create_task(client.post(pods.a_url + "/v1/embeddings",
                                                        json={"model": MODEL, "input": texts}))
            while not await _queued(client, pods.a_url):
                assert not in_flight.done(), "the in-flight request finished before SIGTERM could be sent"
                await asyncio.sleep(0.01)
            out["ready_before_sigterm"] = all(ok for _, ok in out["probes"])
            sigterm = time.monotonic()
            pods.a_gateway.send_signal(signal.SIGTERM)  # the gateway's preStop ended
            triton_sigterm = sigterm - t.gateway_pre_stop * SCALE + t.triton_pre_stop * SCALE

            async def triton_pre_stop_ends() -> None:  # the kubelet's own timer, whatever the gateway is doing
                await asyncio.sleep(max(0.0, triton_sigterm - time.monotonic()))
                out["gateway_running_at_triton_sigterm"] = pods.a_gateway.poll() is None
                pods.a_triton.send_signal(signal.SIGTERM)

            triton_stop = asyncio.create_task(triton_pre_stop_ends())
            while not any(when > sigterm and not ok for when, ok in out["probes"]):
                await asyncio.sleep(0.01)
            for _ in range(5):  # new callers, once readiness went false
                try:
                    r = await new.post(pods.a_url + "/v1/embeddings", json={"model": MODEL, "input": ["late"]})
                    out["late"].append(r.status_code)
                except httpx.ConnectError:
                    out["late"].append("refused")
            try:
                response = await in_flight
                out["in_flight"] = (response.status_code, len(response.json().get("data", [])))
            except httpx.HTTPError as exc:
                out["in_flight"] = repr(exc)
            out["in_flight_s"] = time.monotonic() - sigterm
            gateway_exit = await _exited(pods.a_gateway, deleted + t.grace * SCALE)
            out["gateway_exit_s"] = (gateway_exit or time.monotonic()) - sigterm
            out["triton_sigterm_s"] = triton_sigterm - sigterm
            await triton_stop
            out["triton_exit"] = await _exited(pods.a_triton, deleted + t.grace * SCALE + 30 * SCALE)
            out["grace_end"] = deleted + t.grace * SCALE
            stop_load.set()
            await load
            probing.cancel()
        return out

    out = asyncio.run(run())
    failed = [(url, status) for url, status in out["steady"] if status != 200]
    assert not failed, f"{len(failed)} of {len(out['steady'])} requests failed: {failed[:5]}"
    assert out["ready_before_sigterm"], "pod A went unready before its gateway got SIGTERM"
    assert out["in_flight"] == (200, 64), f"the request in flight at SIGTERM did not complete: {out['in_flight']}"
    assert out["late"] and all(s in ("refused", 503) for s in out["late"]), out["late"]
    assert not out["gateway_running_at_triton_sigterm"], (
        f"the gateway had not finished its drain when Triton got SIGTERM: it exited {out['gateway_exit_s']:.1f} s "
        f"after its SIGTERM, Triton's came at {out['triton_sigterm_s']:.1f} s (the in-flight request took "
        f"{out['in_flight_s']:.1f} s)")
    assert pods.a_gateway.returncode == 0
    assert out["triton_exit"] is not None and out["triton_exit"] <= out["grace_end"], "Triton outlived the grace"
    assert pods.a_triton.returncode == 0
