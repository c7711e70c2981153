"""One real tritonserver and one real gateway per test session, serving the real MiniLM weights.

Triton runs via `sr-gateway triton` and the gateway via `sr-gateway serve --triton-url`, so tests can also read
Triton's own gRPC statistics. The model repository must be built (`make models`; `make test` does it).
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import socket
import subprocess
import sys
import time
from collections.abc import Iterator
from concurrent.futures import Future, ThreadPoolExecutor
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import httpx
import pytest

ROOT = Path(__file__).resolve().parents[2]
BIN = Path(sys.executable).parent
MODEL = "all-minilm-l6-v2"
LOGS = ROOT / ".cache" / "test-logs"


def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    """The short soak (test_soak.py) runs first, before the session's shared stack starts: its own stack serves
    every text model and the LM (≈ 9 GB), and beside the shared stack (as much again) only 4.7 GB of this project's
    24 GB machines stayed free (measured 2026-12-07). The sort is stable: every other test keeps its order."""
    items.sort(key=lambda item: item.path.name != "test_soak.py")


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


# How long a served stack may take to load every model, run each text instance's largest chunks (RaggedRunner.warm)
# and pass its golden answers: a bound for a stuck start, not a speed check. A loaded 2-core host took 170 s for
# every card; CI's own runs take less.
READY_S = 420.0


def wait_for(check, timeout: float, what: str, proc: subprocess.Popen | None = None) -> None:  # type: ignore[type-arg]
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if proc is not None and proc.poll() is not None:
            raise RuntimeError(f"{what} exited with {proc.returncode}; see {LOGS}")
        try:
            if check():
                return
        except Exception:
            pass
        time.sleep(0.25)
    raise TimeoutError(f"{what} not ready after {timeout} s; see {LOGS}")


def start(args: list[str], log_name: str, env: dict[str, str] | None = None) -> subprocess.Popen:  # type: ignore[type-arg]
    LOGS.mkdir(parents=True, exist_ok=True)
    log = (LOGS / log_name).open("w")
    return subprocess.Popen([str(BIN / "sr-gateway"), *args], stdout=log, stderr=subprocess.STDOUT,
                            env={**os.environ, **(env or {})}, cwd=ROOT)


def stop(proc: subprocess.Popen) -> int:  # type: ignore[type-arg]
    if proc.poll() is None:
        proc.terminate()
        try:
            proc.wait(60)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()
    return int(proc.returncode)


def log_tail(log_name: str, lines: int = 40) -> str:
    """The end of a served process's log, attached to a failure: CI keeps only what pytest prints."""
    path = LOGS / log_name
    text = path.read_text(errors="replace") if path.is_file() else "(no log)"
    return f"last {lines} lines of {path}:\n" + "\n".join(text.splitlines()[-lines:])


@contextlib.contextmanager
def serving(repo: Path, log_name: str, what: str, settled: tuple[str, ...] = ("ready", "failed"),
            timeout: float = READY_S) -> Iterator[str]:
    """`sr-gateway serve` over its own model repository (Triton as its child) until /health settles; yields the
    base URL and asserts a clean exit afterwards."""
    port = free_port()
    proc = start(["serve", "--port", str(port), "--model-repository", str(repo)], log_name)
    url = f"http://127.0.0.1:{port}"
    try:
        wait_for(lambda: httpx.get(url + "/health", timeout=2).json()["status"] in settled, timeout, what, proc)
        yield url
    except Exception as exc:
        exc.add_note(log_tail(log_name))
        raise
    finally:
        assert stop(proc) == 0, f"{what} did not exit cleanly"


async def model_stats(client: Any, model: str = MODEL) -> dict[str, Any]:
    """Triton's own statistics for one model (`tritonclient.grpc.aio` client): inference/execution counts etc."""
    return (await client.get_inference_statistics(model, as_json=True))["model_stats"][0]  # type: ignore[no-any-return]


def _counts(stats: dict[str, Any]) -> tuple[int, int, int, int]:
    requests = stats.get("inference_stats", {})
    return (int(stats.get("inference_count", 0)), int(stats.get("execution_count", 0)),
            int(requests.get("success", {}).get("count", 0)), int(requests.get("fail", {}).get("count", 0)))


async def settled_stats(client: Any, model: str = MODEL, inferences: int | None = None,
                        timeout: float = 30.0) -> dict[str, Any]:
    """A model's statistics once Triton has recorded everything sent so far.

    The Python backend records a request's statistics just after its response has gone out, so a read taken right
    after an answer may miss that request. Wait until `inference_count` reaches `inferences` (when the caller knows
    it) and the counts read the same five times in a row, 50 ms apart.
    """
    deadline = time.monotonic() + timeout
    seen = [await model_stats(client, model)]
    while (len(seen) < 5 or len({_counts(s) for s in seen[-5:]}) > 1
           or (inferences is not None and _counts(seen[-1])[0] < inferences)):
        assert time.monotonic() < deadline, f"Triton's statistics for {model} never settled: {_counts(seen[-1])}"
        await asyncio.sleep(0.05)
        seen.append(await model_stats(client, model))
    return seen[-1]


@pytest.fixture(scope="session")
def triton_url() -> Iterator[str]:
    import tritonclient.grpc as grpcclient

    port = free_port()
    proc = start(["triton", "--grpc-port", str(port)], "triton.log")
    url = f"127.0.0.1:{port}"
    client = grpcclient.InferenceServerClient(url)
    try:
        wait_for(client.is_server_live, 120, "tritonserver", proc)
        yield url
    finally:
        stop(proc)


def serve_gateway(triton_url: str, log_name: str, *flags: str, timeout: float = READY_S) -> Iterator[str]:
    """A gateway over the session's Triton (with `flags`), yielded once ready; it must exit cleanly afterwards."""
    port = free_port()
    proc = start(["serve", "--triton-url", triton_url, "--port", str(port), *flags], log_name)
    url = f"http://127.0.0.1:{port}"
    try:
        wait_for(lambda: httpx.get(url + "/health", timeout=2).json()["status"] in ("ready", "failed"), timeout,
                 log_name, proc)
        health = httpx.get(url + "/health").json()
        assert health["status"] == "ready", f"the gateway ({log_name}) is not ready: {health}"
        yield url
    except Exception as exc:
        exc.add_note(log_tail(log_name))
        raise
    finally:
        code = stop(proc)
    assert code == 0, f"the gateway ({log_name}) did not exit cleanly"


@pytest.fixture(scope="session")
def gateway_url(triton_url: str) -> Iterator[str]:
    port = free_port()
    proc = start(["serve", "--triton-url", triton_url, "--port", str(port)], "gateway.log")
    url = f"http://127.0.0.1:{port}"
    try:
        wait_for(lambda: httpx.get(url + "/health", timeout=2).json()["status"] in ("ready", "failed"), READY_S,
                 "gateway", proc)
        health = httpx.get(url + "/health").json()
        assert health["status"] == "ready", f"the gateway is not ready: {health}"
        yield url
    finally:
        code = stop(proc)
    assert code == 0, "the gateway did not exit cleanly"


@pytest.fixture(scope="session")
def http(gateway_url: str) -> Iterator[httpx.Client]:
    with httpx.Client(base_url=gateway_url, timeout=60) as client:
        yield client


# -- random-weight fixtures (cross-encoder, NLI classifier, grounded token head), served by their own gateway --------
CROSS = "tiny-cross-encoder"
NLI = "tiny-nli"
GROUNDED = "tiny-grounded"


@dataclass
class Served:
    repo: Path
    url: str = ""
    proc: subprocess.Popen | None = None  # type: ignore[type-arg]
    procs: list[subprocess.Popen] = field(default_factory=list)  # type: ignore[type-arg]


def _build_and_serve(served: Served) -> Served:
    for tool, name in (("tools.make_cross_encoder_fixture", CROSS), ("tools.make_nli_fixture", NLI),
                       ("tools.make_grounded_fixture", GROUNDED)):
        with (LOGS / f"{tool.rsplit('.', 1)[1]}.log").open("w") as log:
            subprocess.run([sys.executable, "-m", tool, str(served.repo), "--name", name], cwd=ROOT, stdout=log,
                           stderr=subprocess.STDOUT, check=True, timeout=300)
    port = free_port()
    proc = start(["serve", "--port", str(port), "--model-repository", str(served.repo)], "serve-fixtures.log")
    served.procs.append(proc)
    served.url = f"http://127.0.0.1:{port}"
    wait_for(lambda: httpx.get(served.url + "/health", timeout=2).json()["status"] in ("ready", "failed"), READY_S,
             "gateway (fixtures)", proc)
    served.proc = proc
    return served


@pytest.fixture(scope="session", autouse=True)
def _fixtures_started_early(request: pytest.FixtureRequest,
                            tmp_path_factory: pytest.TempPathFactory) -> Iterator[Future[Served] | None]:
    """Builds the fixtures and starts their server before the shared gateway (session fixtures run first), when any
    collected test needs them."""
    if not any("fixtures_served" in getattr(item, "fixturenames", ()) for item in request.session.items):
        yield None
        return
    LOGS.mkdir(parents=True, exist_ok=True)
    served = Served(tmp_path_factory.mktemp("fixture-repo"))
    with ThreadPoolExecutor(1) as pool:
        future = pool.submit(_build_and_serve, served)
        yield future
        future.exception()  # let a start in progress finish, so its process can be stopped
        for proc in served.procs:
            stop(proc)


@pytest.fixture(scope="session")
def fixtures_served(_fixtures_started_early: Future[Served] | None) -> Iterator[Served]:
    assert _fixtures_started_early is not None
    served = _fixtures_started_early.result(timeout=400)
    health = httpx.get(served.url + "/health").json()
    assert health["status"] == "ready", f"the fixtures' gateway is not ready: {health}"
    yield served
    assert served.proc is not None and stop(served.proc) == 0, "the fixtures' gateway did not exit cleanly"
