"""Shared benchmark plumbing: start a gateway, closed-loop HTTP load, percentiles, machine description."""

from __future__ import annotations

import asyncio
import json
import os
import platform
import resource
import signal
import socket
import subprocess
import sys
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import aiohttp
import numpy as np

ROOT = Path(__file__).resolve().parents[1]


def machine() -> str:
    cpu = "unknown CPU"
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                cpu = line.split(":", 1)[1].strip()
                break
    except OSError:
        pass
    mem = os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES") / 2**30
    system = f"{platform.system()} {platform.release()}"
    return f"{cpu}, {os.cpu_count()} cores, {mem:.0f} GiB, {system}, Python {platform.python_version()}"


def isa() -> str:
    """This CPU's ISA flags that decide the kernels (sr_backend.engines.host), for every table's header."""
    from sr_backend.engines.host import detect

    return " ".join(detect().flags) or "none of " + ", ".join(ISA_NAMES)


ISA_NAMES = ("avx2", "avx512", "vnni", "amx")


@dataclass(frozen=True)
class Baseline:
    """An in-process baseline for one model: the engine and precision of the config Triton serves it with
    (sr_backend.engines.load_configured), one instance with `threads` threads (default: every core, the same
    cores the served instances share), so the comparison is like with like."""

    model: str
    engine: Any  # sr_backend.engines.Engine
    served: dict[str, str]  # engine, precision, instances, threads of the served config
    threads: int

    def describe(self) -> str:
        s = self.served
        return (f"{self.model} {s['engine']}/{s['precision']} (served: {s['instances']} instance(s) × {s['threads']} "
                f"thread(s); in-process: 1 × {self.threads})")


def served_baseline(model: str, threads: int = 0) -> Baseline:
    from sr_backend.engines import load_configured, served_choice

    model_dir = ROOT / "model_repository" / model
    threads = threads or os.cpu_count() or 1
    return Baseline(model, load_configured(model_dir, threads), served_choice(model_dir), threads)


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


@contextmanager
def gateway(extra: list[str] | None = None, env: dict[str, str] | None = None) -> Iterator[tuple[str, int]]:
    """`sr-gateway serve` (Triton as its child) on a free loopback port; yields (url, pid)."""
    port = free_port()
    log = open(ROOT / ".cache" / "bench-gateway.log", "w")  # noqa: SIM115
    proc = subprocess.Popen([str(Path(sys.executable).parent / "sr-gateway"), "serve", "--port", str(port),
                             *(extra or [])], stdout=log, stderr=subprocess.STDOUT, cwd=ROOT,
                            env={**os.environ, **(env or {})})
    url = f"http://127.0.0.1:{port}"
    try:
        deadline = time.monotonic() + 240
        while True:
            if proc.poll() is not None or time.monotonic() > deadline:
                raise RuntimeError(f"gateway did not become ready; see {log.name}")
            try:
                import urllib.request

                with urllib.request.urlopen(url + "/health", timeout=2) as r:
                    if r.status == 200:
                        break
            except Exception:
                time.sleep(0.5)
        yield url, proc.pid
    finally:
        proc.send_signal(signal.SIGTERM)
        try:
            proc.wait(60)
        except subprocess.TimeoutExpired:
            proc.kill()


@dataclass
class Run:
    latencies_ms: list[float] = field(default_factory=list)
    own_ms: list[float] = field(default_factory=list)  # gateway total - queue - forward
    forward_ms: list[float] = field(default_factory=list)  # Server-Timing forward (Triton)
    wall_s: float = 0.0
    errors: int = 0

    def summary(self) -> dict[str, float]:
        lat = np.array(self.latencies_ms)
        out = {"requests": float(len(lat)), "throughput": len(lat) / self.wall_s if self.wall_s else 0.0,
               "p50_ms": float(np.percentile(lat, 50)), "p99_ms": float(np.percentile(lat, 99)),
               "errors": float(self.errors)}
        if self.own_ms:
            out["own_p50_ms"] = float(np.percentile(self.own_ms, 50))
            out["own_p99_ms"] = float(np.percentile(self.own_ms, 99))
        if self.forward_ms:
            out["forward_p50_ms"] = float(np.percentile(self.forward_ms, 50))
        return out


def server_timing(header: str) -> dict[str, float]:
    return {k: float(v) for k, v in (p.split(";dur=") for p in header.split(", "))}


def item_failed(answer: bytes) -> bool:
    """A 200 answer can still carry a failed item (the spec's per-input `error`, e.g. an embeddings input over its
    max_length): that request did no model work and counts as an error, not as a fast answer."""
    if b'"error"' not in answer:
        return False
    data = json.loads(answer).get("data")
    return isinstance(data, list) and any(isinstance(d, dict) and "error" in d for d in data)


async def http_load(url: str, path: str, bodies: Callable[[int], dict[str, Any]], concurrency: int,
                    requests: int) -> Run:
    """Closed loop: `concurrency` callers, each sends its next request when the previous answered."""
    run = Run()
    counter = iter(range(requests))
    connector = aiohttp.TCPConnector(limit=concurrency)
    async with aiohttp.ClientSession(connector=connector) as session:

        async def caller() -> None:
            for i in counter:
                started = time.perf_counter()
                async with session.post(url + path, json=bodies(i)) as r:
                    answer = await r.read()
                    run.latencies_ms.append((time.perf_counter() - started) * 1000)
                    if r.status != 200 or item_failed(answer):
                        run.errors += 1
                        continue
                    t = server_timing(r.headers["Server-Timing"])
                    run.own_ms.append(t["total"] - t["queue"] - t["forward"])
                    run.forward_ms.append(t["forward"])

        started = time.perf_counter()
        await asyncio.gather(*(caller() for _ in range(concurrency)))
        run.wall_s = time.perf_counter() - started
    return run


def rss_mib(pid: int) -> float:
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1]) / 1024
    return 0.0


class InProcessBatcher:
    """The in-process baseline's scheduler: callers submit rows, one worker thread runs whatever is queued as one
    ragged batch (up to max_rows), like Triton's dynamic batcher with one model instance."""

    def __init__(self, run: Callable[[list[np.ndarray]], tuple[list[np.ndarray], Any]], max_rows: int = 128) -> None:
        self.run = run
        self.max_rows = max_rows
        self.queue: asyncio.Queue[tuple[np.ndarray, asyncio.Future[np.ndarray]]] = asyncio.Queue()

    async def submit(self, rows: list[np.ndarray]) -> list[np.ndarray]:
        loop = asyncio.get_running_loop()
        futures = [loop.create_future() for _ in rows]
        for row, fut in zip(rows, futures, strict=True):
            await self.queue.put((row, fut))
        return list(await asyncio.gather(*futures))

    async def worker(self) -> None:
        from concurrent.futures import ThreadPoolExecutor

        loop = asyncio.get_running_loop()
        with ThreadPoolExecutor(1) as pool:
            while True:
                batch = [await self.queue.get()]
                while not self.queue.empty() and len(batch) < self.max_rows:
                    batch.append(self.queue.get_nowait())
                outputs, _ = await loop.run_in_executor(pool, self.run, [row for row, _ in batch])
                for (_, fut), out in zip(batch, outputs, strict=True):
                    fut.set_result(out)


async def inprocess_load(batcher: InProcessBatcher, work: Callable[[InProcessBatcher, int], Any], concurrency: int,
                         requests: int) -> Run:
    """Closed loop against the in-process baseline: `work(batcher, i)` does one request's whole job."""
    run = Run()
    counter = iter(range(requests))

    async def caller() -> None:
        for i in counter:
            started = time.perf_counter()
            await work(batcher, i)
            run.latencies_ms.append((time.perf_counter() - started) * 1000)

    task = asyncio.create_task(batcher.worker())
    started = time.perf_counter()
    await asyncio.gather(*(caller() for _ in range(concurrency)))
    run.wall_s = time.perf_counter() - started
    task.cancel()
    return run


def triton_counts(url: str, model: str) -> tuple[int, int]:
    """(inference_count, execution_count) from Triton's own statistics."""
    import tritonclient.grpc as grpcclient

    stats = grpcclient.InferenceServerClient(url).get_inference_statistics(model, as_json=True)["model_stats"][0]
    return int(stats.get("inference_count", 0)), int(stats.get("execution_count", 0))


ROLES = {"tritonserver": "Triton", "triton_python_b": "models"}  # /proc comm names (15 chars) → role


def cpu_by_role(root: int) -> dict[str, float]:
    """CPU seconds so far of the gateway process tree, by role (gateway, Triton core, model stubs), and of this
    load generator: where a request's CPU goes when everything shares the same cores."""
    procs: dict[int, tuple[str, int, float]] = {}
    tick = os.sysconf("SC_CLK_TCK")
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        try:
            stat = (entry / "stat").read_text()
        except OSError:
            continue
        fields = stat[stat.rindex(")") + 2:].split()
        procs[int(entry.name)] = (stat[stat.index("(") + 1:stat.rindex(")")], int(fields[1]),
                                  (int(fields[11]) + int(fields[12])) / tick)
    tree, grew = {root}, True
    while grew:
        grew = False
        for pid, (_, parent, _) in procs.items():
            if parent in tree and pid not in tree:
                tree.add(pid)
                grew = True
    out = {"gateway": 0.0, "Triton": 0.0, "models": 0.0}
    for pid in tree & procs.keys():
        name, _, seconds = procs[pid]
        out["gateway" if pid == root else ROLES.get(name, "models")] += seconds
    usage = resource.getrusage(resource.RUSAGE_SELF)
    out["client"] = usage.ru_utime + usage.ru_stime
    return out


def render_comparison(rows: list[dict[str, Any]], *, baselines: list[Baseline], requests: int, note: str) -> str:
    """A Markdown table of gateway vs in-process cells (rows carry set, c, side and Run.summary() fields), headed
    by the machine and method every comparison shares. Rows with side "triton" (Triton called directly over
    gRPC, no gateway) add a column that separates Triton's own cost from the gateway's."""
    direct = {(r["set"], r["c"]): r for r in rows if r["side"] == "triton"}
    engines = "; ".join(b.describe() for b in baselines)
    header = (f"Machine: {machine()}. ISA flags: {isa()}. Date: {time.strftime('%Y-%m-%d %H:%M UTC', time.gmtime())}. "
              f"In-process: the served engine and precision of each model (sr_backend.engines.load_configured on the "
              f"config Triton loads), one instance with every core: {engines}; Triton: those configs. {requests} "
              f"requests per cell, closed loop; the load generator runs on the same cores. Gateway own time = "
              f"Server-Timing total − queue − forward. CPU ms per request: gateway process / Triton core / model "
              f"instances / load generator, from /proc over the cell. {note}")
    extra = " Triton alone req/s (ratio) |" if direct else ""
    lines = [header, "",
             "| workload | C | in-process req/s | gateway req/s | ratio |" + extra + " in-process p50 / p99 ms "
             "| gateway p50 / p99 ms | gateway own time p50 / p99 ms | Triton rows per execute "
             "| CPU ms/req gw / Triton / models / client |",
             "|---|---|---|---|---|" + ("---|" if direct else "") + "---|---|---|---|---|"]
    base = {(r["set"], r["c"]): r for r in rows if r["side"] == "in-process"}
    for r in (r for r in rows if r["side"] == "gateway"):
        b = base[(r["set"], r["c"])]
        alone = ""
        if direct:
            d = direct.get((r["set"], r["c"]))
            alone = f" {d['throughput']:.1f} ({d['throughput'] / b['throughput']:.2f}×) |" if d else " – |"
        cpu = r.get("cpu_ms", {})
        split = " / ".join(f"{cpu.get(k, 0):.2f}" for k in ("gateway", "Triton", "models", "client"))
        lines.append(
            f"| {r['set']} | {r['c']} | {b['throughput']:.1f} | {r['throughput']:.1f} | "
            f"{r['throughput'] / b['throughput']:.2f}× |{alone} {b['p50_ms']:.1f} / {b['p99_ms']:.1f} | "
            f"{r['p50_ms']:.1f} / {r['p99_ms']:.1f} | {r.get('own_p50_ms', 0):.2f} / {r.get('own_p99_ms', 0):.2f} | "
            f"{r['batch']:.1f} | {split} |")
    return "\n".join(lines)


def gateway_cells(url: str, pid: int, triton: str, model: str, path: str, body: Callable[[int], dict[str, Any]],
                  name: str, levels: list[int], requests: int) -> list[dict[str, Any]]:
    """One warm-up, then a closed-loop cell per concurrency level, with Triton's batching ratio for the cell and
    the CPU each process spent per request."""
    asyncio.run(http_load(url, path, body, 8, 32))
    rows = []
    for c in levels:
        before, cpu_before = triton_counts(triton, model), cpu_by_role(pid)
        r = asyncio.run(http_load(url, path, body, c, requests))
        after, cpu_after = triton_counts(triton, model), cpu_by_role(pid)
        cpu = {k: 1000 * (cpu_after[k] - cpu_before[k]) / requests for k in cpu_after}
        rows.append({"set": name, "c": c, "side": "gateway", **r.summary(), "cpu_ms": cpu,
                     "batch": (after[0] - before[0]) / max(after[1] - before[1], 1)})
        print(rows[-1], flush=True)
    return rows


async def triton_load(triton: str, model: str, output: str, ids: Callable[[int], np.ndarray], concurrency: int,
                      requests: int) -> Run:
    """Closed loop straight at Triton through the gateway's own `Inference` over `gateway.triton.Triton` (gRPC,
    concurrent sequences coalesced into requests of rows as the gateway sends them), with no HTTP and no surface:
    each call tokenizes (`ids`) and runs one sequence. Separates Triton's cost from the rest of the gateway's."""
    from gateway.inference import Inference
    from gateway.triton import Triton

    client = Inference(Triton(triton))
    run = Run()
    counter = iter(range(requests))

    async def caller() -> None:
        for i in counter:
            started = time.perf_counter()
            await client.infer(model, output, ids(i).tolist())
            run.latencies_ms.append((time.perf_counter() - started) * 1000)

    started = time.perf_counter()
    await asyncio.gather(*(caller() for _ in range(concurrency)))
    run.wall_s = time.perf_counter() - started
    await client.close()
    return run
