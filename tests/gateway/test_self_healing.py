"""Self-healing with real processes: a killed Python-backend stub, a killed tritonserver, a killed gateway and an
external Triton that goes away, each under load. Every wait is on observed state (health, /proc, /dev/shm)."""

from __future__ import annotations

import signal
import subprocess
import threading
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path

import httpx
import pytest
from prometheus_client.parser import text_string_to_metric_families

from gateway.cards import load_card
from gateway.supervisor import SHM, STUB, group_members

from .conftest import MODEL, READY_S, ROOT, free_port, start, stop, wait_for
from .contract import check
from .precision import repository_at, served

FAST = {"SR_GATEWAY_TRITON_CHECK_S": "0.2", "SR_GATEWAY_TRITON_RESTART_BACKOFF_S": "0.2",
        "SR_GATEWAY_TRITON_RESTART_LIMIT": "2", "SR_GATEWAY_LIVENESS_FAILED_S": "2"}


def children(pid: int, name: str) -> list[int]:
    out = subprocess.run(["pgrep", "-P", str(pid), "-f", name], capture_output=True, text=True).stdout
    return [int(p) for p in out.split()]


def stubs(pgid: int) -> dict[int, list[str]]:
    """pid → argv of each live Python-backend stub in tritonserver's process group."""
    found = {}
    for pid in group_members(pgid):
        try:
            argv = Path(f"/proc/{pid}/cmdline").read_bytes().decode().split("\0")
        except OSError:
            continue
        if argv[0].endswith(STUB):
            found[pid] = argv
    return found


def shm_regions(gateway_pid: int) -> set[str]:
    return {p.name for p in SHM.glob(f"srgw-{gateway_pid}-*")}


def metric(url: str, name: str, **labels: str) -> float:
    text = httpx.get(url + "/metrics", timeout=5).text
    return sum(s.value for f in text_string_to_metric_families(text) for s in f.samples
               if s.name == name and all(s.labels.get(k) == v for k, v in labels.items()))


@dataclass
class Observed:
    """Background load and /health polling while a process is killed: what clients and operators saw."""

    url: str
    load: bool = True
    statuses: list[tuple[str, str | None]] = field(default_factory=list)
    responses: list[tuple[int, str | None, str | None]] = field(default_factory=list)  # status, code, Retry-After
    stop: threading.Event = field(default_factory=threading.Event)

    def _load(self) -> None:
        with httpx.Client(base_url=self.url, timeout=30) as client:
            while not self.stop.is_set():
                try:
                    r = client.post("/v1/embeddings", json={"model": MODEL, "input": ["self healing"] * 4})
                except httpx.HTTPError:
                    continue
                code = r.json().get("error", {}).get("code") if r.status_code != 200 else None
                self.responses.append((r.status_code, code, r.headers.get("Retry-After")))

    def _health(self) -> None:
        with httpx.Client(base_url=self.url, timeout=5) as client:
            while not self.stop.is_set():
                body = client.get("/health").json()
                if not self.statuses or self.statuses[-1] != (body["status"], body["reason"]):
                    self.statuses.append((body["status"], body["reason"]))
                self.stop.wait(0.05)

    def __enter__(self) -> Observed:
        self.threads = [threading.Thread(target=self._health)]
        if self.load:
            self.threads.append(threading.Thread(target=self._load))
        for t in self.threads:
            t.start()
        return self

    def __exit__(self, *_: object) -> None:
        self.stop.set()
        for t in self.threads:
            t.join(60)

    def seen(self, status: str) -> bool:
        return any(s == status for s, _ in self.statuses)


def health(url: str) -> dict:  # type: ignore[type-arg]
    return httpx.get(url + "/health", timeout=5).json()  # type: ignore[no-any-return]


@pytest.fixture(scope="module")
def two_instances(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """MiniLM on the engine this host's tuner chose, as two instances whatever layout the tuner picked (these tests
    kill one of two): a repository of its own (precision.repository_at)."""
    card = load_card(ROOT / "model_repository" / MODEL / "card.yaml")
    repo = tmp_path_factory.mktemp("two-instances")
    repository_at(repo, ROOT / "model_repository", {MODEL: {**served(card), "instances": "2"}})
    return repo


@pytest.fixture(scope="module")
def child(two_instances: Path) -> Iterator[tuple[str, subprocess.Popen]]:  # type: ignore[type-arg]
    port = free_port()
    proc = start(["serve", "--port", str(port), "--models", MODEL, "--model-repository", str(two_instances)],
                 "self-healing.log", env=FAST)
    url = f"http://127.0.0.1:{port}"
    try:
        wait_for(lambda: health(url)["status"] == "ready", READY_S, "gateway (child Triton)", proc)
        yield url, proc
    finally:
        (triton,) = children(proc.pid, "tritonserver") or (None,)
        assert stop(proc) == 0
        if triton is not None:
            wait_for(lambda: not group_members(triton), 30, "tritonserver's group to be gone")
        assert not shm_regions(proc.pid), "the stopped gateway left shared-memory regions"


def test_a_killed_idle_stub_degrades_its_model_which_is_reloaded_and_ready_again_with_nothing_left_behind(
        child: tuple[str, subprocess.Popen]) -> None:  # type: ignore[type-arg]
    url, proc = child
    (triton,) = children(proc.pid, "tritonserver")
    before = stubs(triton)
    assert len(before) == 2, f"two instances expected, found {before}"
    victim = min(before)
    with Observed(url, load=False) as seen:
        subprocess.run(["kill", "-KILL", str(victim)], check=True)
        wait_for(lambda: seen.seen("degraded"), 30, "degraded status")
        wait_for(lambda: seen.statuses[-1][0] == "ready", 60, "recovery")  # degraded was seen: this is after
    wait_for(lambda: not set(stubs(triton)) & set(before), 30, "the replaced instances to exit")
    degraded = next(reason for status, reason in seen.statuses if status == "degraded")
    assert degraded is not None and "1 of 2 Triton instances running" in degraded
    assert metric(url, "sr_gateway_model_reloads_total", model=MODEL, reason="instance_lost") == 1
    assert children(proc.pid, "tritonserver") == [triton], "an idle instance is replaced without a restart"
    assert sorted(a[8] for a in stubs(triton).values()) == sorted(a[8] for a in before.values())
    assert health(url)["triton"]["restarts"] == 0
    with Observed(url) as load:
        wait_for(lambda: len(load.responses) > 10, 30, "load after recovery")
    assert {s for s, _, _ in load.responses} == {200}


def test_a_stub_killed_while_running_a_request_gets_tritonserver_restarted_so_nothing_hangs_or_stays(
        child: tuple[str, subprocess.Popen]) -> None:  # type: ignore[type-arg]
    url, proc = child
    (triton,) = children(proc.pid, "tritonserver")
    before = stubs(triton)
    texts = [f"a long input number {i} " * 40 for i in range(256)]
    with Observed(url) as seen, httpx.Client(base_url=url, timeout=120) as client:
        result: list[httpx.Response] = []
        big = threading.Thread(target=lambda: result.append(
            client.post("/v1/embeddings", json={"model": MODEL, "input": texts})))
        big.start()
        # both instances are busy with it (its inputs fill several batches) once the queue is non-empty
        wait_for(lambda: metric(url, "sr_gateway_queue_depth", model=MODEL) > 128, 30, "inputs in Triton")
        subprocess.run(["kill", "-KILL", str(min(before))], check=True)
        big.join(90)
        assert not big.is_alive(), "the request held by the dead instance must not hang"
        wait_for(lambda: health(url)["status"] == "ready" and children(proc.pid, "tritonserver") not in ([], [triton]),
                 120, "restart and recovery")
        served = len(seen.responses)
        wait_for(lambda: len(seen.responses) > served + 10, 30, "load after recovery")
    (answer,) = result
    assert answer.status_code == 200
    errors = [d["error"] for d in answer.json()["data"] if "error" in d]
    assert errors and set(errors) == {"unavailable"}, errors
    assert seen.seen("degraded") and seen.seen("loading")
    body = health(url)
    assert body["triton"]["restarts"] == 1 and body["triton"]["last_exit"] == (
        f"restarted by the gateway: the replaced instances of model {MODEL} did not unload within 15 s "
        "(a request was lost with the dead instance)")
    assert not group_members(triton), "nothing of the old tritonserver is left"
    assert all(code == "not_ready" and retry == "5" for status, code, retry in seen.responses if status == 503)
    assert {s for s, _, _ in seen.responses[-10:]} == {200}


def test_a_killed_tritonserver_is_restarted_clean_and_its_models_come_back(
        child: tuple[str, subprocess.Popen]) -> None:  # type: ignore[type-arg]
    url, proc = child
    (old,) = children(proc.pid, "tritonserver")
    old_stubs = stubs(old)
    restarts = health(url)["triton"]["restarts"]
    with Observed(url) as seen:
        wait_for(lambda: len(seen.responses) > 20, 30, "load")
        subprocess.run(["kill", "-KILL", str(old)], check=True)
        wait_for(lambda: seen.seen("loading"), 30, "loading status")
        wait_for(lambda: health(url)["status"] == "ready", 120, "recovery")
        served = len(seen.responses)
        wait_for(lambda: len(seen.responses) > served + 10, 30, "load after recovery")
    assert seen.seen("warming")
    loading = next(reason for status, reason in seen.statuses if status == "loading")
    assert loading is not None and "tritonserver exited with code -9" in loading
    body = health(url)
    check("/health", "get", 200, body)
    assert body["triton"] == {"mode": "child", "live": True, "restarts": restarts + 1,
                              "last_exit": "tritonserver exited with code -9"}
    assert metric(url, "sr_gateway_triton_restarts_total") == restarts + 1
    assert metric(url, "sr_gateway_triton_last_exit_info", reason="tritonserver exited with code -9") == 1
    unavailable = [(code, retry) for status, code, retry in seen.responses if status == 503]
    assert unavailable and all(r == ("not_ready", "5") for r in unavailable)
    assert {s for s, _, _ in seen.responses[-10:]} == {200}
    # nothing of the old Triton survives: not its stubs, not their shared memory
    assert not group_members(old) and not any(Path(f"/proc/{pid}").exists() for pid in old_stubs
                                              if pid not in group_members(old))
    (new,) = children(proc.pid, "tritonserver")
    live = {argv[2] for argv in stubs(new).values()}
    assert len(live) == 2 and shm_regions(proc.pid) == live


def test_exits_beyond_the_restart_limit_fail_every_model_with_the_reason(
        child: tuple[str, subprocess.Popen]) -> None:  # type: ignore[type-arg]
    url, proc = child
    for _ in range(3):  # the limit is 2 restarts per window; earlier tests used one or two of them
        (triton,) = children(proc.pid, "tritonserver")
        subprocess.run(["kill", "-KILL", str(triton)], check=True)

        def settled(old: int = triton) -> bool:
            status = health(url)["status"]
            return status == "failed" or (status == "ready" and children(proc.pid, "tritonserver") not in ([], [old]))
        wait_for(settled, 120, "restart or failure", proc)
        if health(url)["status"] == "failed":
            break
    body = health(url)
    check("/health", "get", 503, body)
    assert body["status"] == "failed" and body["triton"]["restarts"] == 2
    assert body["reason"] == "tritonserver exited with code -9; not restarted again: 2 restarts within 600 s"
    r = httpx.post(url + "/v1/embeddings", json={"input": "x"})
    assert r.status_code == 503 and r.json()["error"]["code"] == "not_ready"
    assert not children(proc.pid, "tritonserver") and not group_members(triton)
    # given up for good: after --liveness-failed-s, liveness fails so Kubernetes replaces the process
    wait_for(lambda: httpx.get(url + "/health/live").status_code == 503, 30, "liveness to fail", proc)
    live = httpx.get(url + "/health/live").json()
    check("/health/live", "get", 503, live)
    assert live["status"] == "failed" and "not restarted again: 2 restarts within 600 s" in live["reason"]


def test_a_killed_gateway_takes_tritonserver_and_its_stubs_down(two_instances: Path) -> None:
    port = free_port()
    proc = start(["serve", "--port", str(port), "--models", MODEL, "--model-repository", str(two_instances)],
                 "self-healing-killed.log", env=FAST)
    url = f"http://127.0.0.1:{port}"
    try:
        wait_for(lambda: health(url)["status"] == "ready", 180, "gateway", proc)
        (triton,) = children(proc.pid, "tritonserver")
        assert len(stubs(triton)) == 2 and len(shm_regions(proc.pid)) == 2
        proc.send_signal(signal.SIGKILL)
        proc.wait(10)
        wait_for(lambda: not group_members(triton), 60, "tritonserver and its stubs to exit")
        assert not shm_regions(proc.pid)
    finally:
        stop(proc)


def test_with_an_external_triton_the_gateway_waits_for_it_and_recovers_without_restarting_it() -> None:
    grpc = free_port()
    triton = start(["triton", "--grpc-port", str(grpc)], "self-healing-external-triton.log")
    port = free_port()
    gateway = start(["serve", "--port", str(port), "--models", MODEL, "--triton-url", f"127.0.0.1:{grpc}"],
                    "self-healing-external.log", env=FAST)
    url = f"http://127.0.0.1:{port}"
    try:
        wait_for(lambda: health(url)["status"] == "ready", 180, "gateway", gateway)
        with Observed(url) as seen:
            wait_for(lambda: len(seen.responses) > 20, 30, "load")
            assert stop(triton) == 0
            wait_for(lambda: health(url)["status"] == "loading", 30, "loading status", gateway)
            body = health(url)
            check("/health", "get", 503, body)
            assert body["reason"] == f"Triton at 127.0.0.1:{grpc} is not live; waiting for it"
            assert body["triton"] == {"mode": "external", "live": False, "restarts": 0, "last_exit": None}
            r = httpx.post(url + "/v1/embeddings", json={"input": "x"})
            assert r.status_code == 503 and r.json()["error"]["code"] == "not_ready" and r.headers["Retry-After"]
            assert not children(gateway.pid, "."), "the gateway must not start anything in external mode"
            triton = start(["triton", "--grpc-port", str(grpc)], "self-healing-external-triton2.log")
            wait_for(lambda: health(url)["status"] == "ready", 120, "recovery", gateway)
            served = len(seen.responses)
            wait_for(lambda: len(seen.responses) > served + 10, 30, "load after recovery")
        assert {s for s, _, _ in seen.responses[-10:]} == {200}
        assert all(code == "not_ready" and retry == "5" for status, code, retry in seen.responses if status == 503)
        assert health(url)["triton"]["restarts"] == 0
    finally:
        assert stop(gateway) == 0
        stop(triton)
