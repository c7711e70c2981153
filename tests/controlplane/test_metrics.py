"""GET /deployments/{id}/metrics against a real Prometheus loaded with known history (promtool backfill)."""

from __future__ import annotations

import asyncio
import os
import socket
import ssl
import subprocess
import time
from collections.abc import AsyncIterator
from dataclasses import replace
from itertools import pairwise
from pathlib import Path
from typing import Any

import aiohttp
import pytest
import pytest_asyncio

from tests.controlplane.conftest import Api, Cluster, Keystone, Project, make_client, settings_for, vllm

pytestmark = pytest.mark.asyncio
METRICS = "/deployments/{id}/metrics"
KIND = "LLMInferenceService"
INTERVAL = 15
HISTORY_S = 3 * 3600 + 1200
# History also runs this far past "now": a query's last points then still have samples on both sides of their rate
# window. Ending the history at fixture time made the newest points extrapolate (flaky exact values).
FUTURE_S = 1800
RATES = {"cpu": 0.5, "rx": 1024.0, "tx": 2048.0, "prompt": 180.5, "gen": 72.3, "reqs": 4.0}
MEMORY = 8589934592
CHAT_FACTOR = 10.0
CHAT: dict[str, dict[str, Any]] = {}  # the metered-chat deployment, filled by the fixture
PROMETHEUS: dict[str, str] = {}  # its https URL, filled by the fixture


def env_dir() -> str:
    return os.environ["SR_TESTENV_DIR"]


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def openmetrics(ns: str, pods: dict[str, float], now: int) -> str:
    """History with exactly known rates: linear counters, a constant gauge, histograms in one bucket.
    Each pod's values are the base rates times its factor."""
    times = list(range(now - HISTORY_S, now + FUTURE_S, INTERVAL))
    ts0 = times[0]
    out: list[str] = []

    def family(name: str, kind: str, rows: list[tuple[str, str, float]]) -> None:
        out.append(f"# TYPE {name} {kind}")
        for sample, labels, per_s in rows:
            for t in times:
                value = per_s if kind == "gauge" else per_s * (t - ts0)
                out.append(f"{sample}{{{labels}}} {value} {t}")

    def each(make: Any) -> list[tuple[str, str, float]]:
        return [row for pod, k in pods.items() for row in make(f'namespace="{ns}",pod="{pod}"', pod, k)]

    family("container_cpu_usage_seconds", "counter", each(lambda sel, pod, k: [
        ("container_cpu_usage_seconds_total", f'{sel},container="main"', RATES["cpu"] * k),
        ("container_cpu_usage_seconds_total", f'namespace="elsewhere",pod="{pod}",container="main"', 9.0)]))
    family("container_memory_working_set_bytes", "gauge", each(lambda sel, pod, k: [
        ("container_memory_working_set_bytes", f'{sel},container="main"', MEMORY * k)]))
    family("container_network_receive_bytes", "counter", each(lambda sel, pod, k: [
        ("container_network_receive_bytes_total", f'{sel},interface="eth0"', RATES["rx"] * k)]))
    family("container_network_transmit_bytes", "counter", each(lambda sel, pod, k: [
        ("container_network_transmit_bytes_total", f'{sel},interface="eth0"', RATES["tx"] * k)]))
    for metric, low, high, avg in (("vllm:time_to_first_token_seconds", "0.1", "0.2", 0.14),
                                   ("vllm:time_per_output_token_seconds", "0.01", "0.03", 0.02)):
        family(metric, "histogram", each(lambda sel, pod, k, metric=metric, low=low, high=high, avg=avg: [
            (f"{metric}_bucket", f'{sel},le="{low}"', 0.0),
            (f"{metric}_bucket", f'{sel},le="{high}"', RATES["reqs"] * k),
            (f"{metric}_bucket", f'{sel},le="+Inf"', RATES["reqs"] * k),
            (f"{metric}_sum", sel, avg * RATES["reqs"] * k),
            (f"{metric}_count", sel, RATES["reqs"] * k)]))
    family("vllm:prompt_tokens", "counter", each(lambda sel, pod, k: [
        ("vllm:prompt_tokens_total", sel, RATES["prompt"] * k)]))
    family("vllm:generation_tokens", "counter", each(lambda sel, pod, k: [
        ("vllm:generation_tokens_total", sel, RATES["gen"] * k)]))
    return "\n".join(out) + "\n# EOF\n"


@pytest_asyncio.fixture(scope="module")
async def metered(
    env: dict[str, str], catalog_db: str, keystone: Keystone, cluster: Cluster, tmp_path_factory: Any
) -> AsyncIterator[tuple[Api, Project, dict[str, Any], dict[str, Any]]]:
    """A project with three deployments, Prometheus holding 3 h of history for the pods of two of them
    (``metered`` and ``metered-chat``, whose pod names share the prefix ``metered-``; its pods run ten times
    the load), and the control plane configured with that Prometheus."""
    project = await keystone.project()
    await cluster.provision(project.ns)
    tc0 = await make_client(settings_for(env, catalog_db))
    plain = Api(tc0)
    served = await plain.create(project.member, **vllm("metered"))
    quiet = await plain.create(project.member, **vllm("quiet"))
    chat = await plain.create(project.member, **vllm("metered-chat"))
    await tc0.close()
    pod = await cluster.add_pod(KIND, project.ns, "metered")
    chat_pod = await cluster.add_pod(KIND, project.ns, "metered-chat")
    CHAT[chat["id"]] = chat
    await cluster.set_status(KIND, project.ns, "metered", {
        "conditions": [{"type": "Ready", "status": "True"}], "addresses": [{"url": "http://metered.svc"}]})

    d: Path = tmp_path_factory.mktemp("prometheus")
    (d / "data.om").write_text(openmetrics(project.ns, {pod: 1.0, chat_pod: CHAT_FACTOR}, int(time.time())))
    (d / "prometheus.yml").write_text("global:\n  scrape_interval: 1m\n")
    certs = Path(env_dir()) / "certs"  # served over TLS with the test CA's certificate for 127.0.0.1
    (d / "web.yml").write_text(f"tls_server_config:\n  cert_file: {certs / 'server.crt'}\n"
                               f"  key_file: {certs / 'server.key'}\n")
    subprocess.run(["promtool", "tsdb", "create-blocks-from", "openmetrics", str(d / "data.om"), str(d / "data")],
                   check=True, capture_output=True)
    port = _free_port()
    proc = subprocess.Popen(
        ["prometheus", f"--config.file={d / 'prometheus.yml'}", f"--storage.tsdb.path={d / 'data'}",
         f"--web.listen-address=127.0.0.1:{port}", f"--web.config.file={d / 'web.yml'}"],
        stdout=subprocess.DEVNULL, stderr=(d / "prometheus.log").open("w"),
    )
    if run_dir := os.environ.get("SR_TESTENV_DIR"):  # tools/testenv/down.sh stops it even if pytest dies
        with open(Path(run_dir) / "pids", "a") as pids:
            pids.write(f"prometheus {proc.pid}\n")
    url = f"https://127.0.0.1:{port}"
    tls = ssl.create_default_context(cafile=str(certs / "ca.crt"))
    try:
        async with aiohttp.ClientSession() as http:
            for _ in range(100):
                try:
                    async with http.get(f"{url}/-/ready", ssl=tls) as r:
                        if r.status == 200:
                            break
                except aiohttp.ClientError:
                    pass
                await asyncio.sleep(0.1)
        settings = settings_for(env, catalog_db)
        tc = await make_client(replace(settings, prometheus_url=url, prometheus_ca_file=str(certs / "ca.crt")))
        PROMETHEUS["url"] = url
        yield Api(tc), project, served, quiet
        await tc.close()
    finally:
        proc.terminate()
        proc.wait(timeout=10)


@pytest.mark.parametrize(("query", "seconds", "step"), [
    ("?range=5m", 300, 15), ("?range=15m", 900, 15), ("?range=1h", 3600, 60), ("?range=3h", 10800, 180),
    ("", 1800, 30), ("?range=2d", 1800, 30)])
async def test_resource_series_have_the_exact_values_and_about_60_points_with_a_15s_minimum_step(
    metered: tuple[Api, Project, dict[str, Any], dict[str, Any]], query: str, seconds: int, step: int
) -> None:
    api, project, served, _ = metered
    _, body = await api.call("GET", METRICS + query, project.reader, expect=200, id=served["id"])
    assert body["stepSeconds"] == step
    assert "vllm" not in body
    for key, expected in (("cpu", RATES["cpu"]), ("memory", MEMORY), ("netRx", RATES["rx"]),
                          ("netTx", RATES["tx"])):
        series = body[key]
        assert abs(len(series) - (seconds // step + 1)) <= 1, (key, len(series))
        assert all(b[0] - a[0] == step for a, b in pairwise(series))
        assert all(v == pytest.approx(expected, rel=1e-9) for _, v in series), key


async def test_two_deployments_whose_pod_names_share_a_prefix_each_get_only_their_own_pods_series(
    metered: tuple[Api, Project, dict[str, Any], dict[str, Any]]
) -> None:
    api, project, served, _ = metered
    (chat,) = CHAT.values()
    for dep, factor in ((served, 1.0), (chat, CHAT_FACTOR)):
        _, body = await api.call("GET", METRICS + "?range=15m", project.reader, expect=200, id=dep["id"])
        for key, base in (("cpu", RATES["cpu"]), ("memory", MEMORY), ("netRx", RATES["rx"]), ("netTx", RATES["tx"])):
            assert body[key] and all(v == pytest.approx(base * factor, rel=1e-9) for _, v in body[key]), (
                dep["name"], key, body[key][:2])


async def test_runtime_vllm_adds_latency_and_throughput_when_the_service_exists(
    metered: tuple[Api, Project, dict[str, Any], dict[str, Any]]
) -> None:
    api, project, served, quiet = metered
    _, body = await api.call("GET", METRICS + "?range=1h&runtime=VLLM", project.member, expect=200,
                             id=served["id"])
    llm = body["vllm"]
    expected = {"ttftP50": 0.15, "ttftP95": 0.195, "ttftP99": 0.199, "ttftAvg": 0.14,
                "tpotP50": 0.02, "tpotP95": 0.029, "tpotP99": 0.0298, "tpotAvg": 0.02,
                "promptThroughput": 180.5, "generationThroughput": 72.3, "totalThroughput": 252.8}
    assert set(llm) == set(expected)
    for key, value in expected.items():
        assert llm[key] and all(v == pytest.approx(value, rel=1e-9) for _, v in llm[key]), key
    # No workload Service reported yet: resource series only.
    _, body = await api.call("GET", METRICS + "?runtime=vllm", project.member, expect=200, id=quiet["id"])
    assert "vllm" not in body and body["cpu"] == []


async def test_metrics_status_codes(
    env: dict[str, str], catalog_db: str, api: Api, api_nokube: Api, api_broken: Api,
    metered: tuple[Api, Project, dict[str, Any], dict[str, Any]]
) -> None:
    papi, project, served, _ = metered
    assert (await papi.call("GET", METRICS, None, id=served["id"]))[0] == 401
    assert (await papi.call("GET", METRICS, project.observer, id=served["id"]))[0] == 403
    await papi.call("GET", METRICS, project.member, expect=404, id="deployment-nope")
    catalog_only = await api_nokube.create(project.member, **vllm())
    _, err = await papi.call("GET", METRICS, project.member, expect=422, id=catalog_only["id"])
    assert err["error"] == "invalid_backend"
    _, err = await api.call("GET", METRICS, project.member, expect=503, id=served["id"])  # no Prometheus
    assert err["error"] == "unavailable"
    await api_nokube.call("GET", METRICS, project.member, expect=503, id=served["id"])
    await api_broken.call("GET", METRICS, project.member, expect=500, id=served["id"])
    settings = settings_for(env, catalog_db)
    dead_url = f"http://127.0.0.1:{_free_port()}"  # nothing listens there
    dead = await make_client(type(settings)(**{**settings.__dict__, "prometheus_url": dead_url}))
    try:
        _, err = await Api(dead).call("GET", METRICS, project.member, expect=502, id=served["id"])
        assert err["error"] == "prometheus_error" and "Prometheus query failed" in err["message"]
    finally:
        await dead.close()


async def test_prometheus_over_tls_is_trusted_only_with_its_ca_configured(
    env: dict[str, str], catalog_db: str, metered: tuple[Api, Project, dict[str, Any], dict[str, Any]]
) -> None:
    _, project, served, _ = metered
    system_cas = await make_client(replace(settings_for(env, catalog_db), prometheus_url=PROMETHEUS["url"]))
    try:
        _, err = await Api(system_cas).call("GET", METRICS, project.member, expect=502, id=served["id"])
        assert err["error"] == "prometheus_error" and "Certificate" in err["message"], err
    finally:
        await system_cas.close()
