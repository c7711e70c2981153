"""In-process engines: rows/s and achieved GFLOP/s of each engine × precision × shape against this host's peak.

Every engine runs through the same ragged runner the Triton backend uses (sr_backend.ragged.RaggedRunner over
sr_backend.engines: ONNX Runtime, OpenVINO, PyTorch's `torch.export` program), one instance with all the cores as
threads. FLOPs per forward are counted from the graph:
every MatMul/Gemm with a constant weight [K, N] costs 2·K·N per token, and each attention layer (one Softmax)
2·2·L·d per token for QKᵀ and AV (d = the first weight's K, L = the padded length). The peak is nominal: cores ×
the clock /proc/cpuinfo reports × the FLOPs per cycle the ISA offers for that precision (see
sr_backend/engines/host.py), so "fraction of peak" says how much of the CPU an engine leaves unused. The load
the host carried during the run (load average and the CPU share other processes took) is written beside the table.

    .venv/bin/python -m tools.bench_engines [--models all-minilm-l6-v2] [--seconds 1.0] [--write]
"""

from __future__ import annotations

import argparse
import os
import time
from pathlib import Path
from typing import Any

import numpy as np
import onnx
from tokenizers import Tokenizer

from sr_backend.engines import SUPPORTED, EngineError, int8_path, load_engine
from sr_backend.engines.host import Host, detect
from sr_backend.ragged import RaggedRunner
from tools.benchlib import ROOT, machine
from tools.docs import replace_section

REPO = ROOT / "model_repository"
TOKENS = (16, 128, 256)
BATCHES = (1, 32)


def graph_flops(path: Path) -> tuple[float, int, int]:
    """(weight FLOPs per token, attention layers, model width) read from the ONNX graph."""
    model = onnx.load(str(path), load_external_data=False)
    shapes = {init.name: list(init.dims) for init in model.graph.initializer}
    per_token, width, layers = 0.0, 0, 0
    for node in model.graph.node:
        if node.op_type in ("MatMul", "Gemm") and len(node.input) > 1 and len(shapes.get(node.input[1], [])) == 2:
            k, n = shapes[node.input[1]]
            per_token += 2.0 * k * n
            width = width or k
        elif node.op_type == "MatMulNBits":  # int4 weights: K and N are attributes
            attrs = {a.name: a.i for a in node.attribute}
            per_token += 2.0 * attrs.get("K", 0) * attrs.get("N", 0)
            width = width or attrs.get("K", 0)
        elif node.op_type == "Softmax":
            layers += 1
    return per_token, layers, width


def forward_flops(per_token: float, layers: int, width: int, rows: int, tokens: int) -> float:
    return rows * tokens * (per_token + layers * 4.0 * tokens * width)


class LoadMeter:
    """What else the host ran meanwhile: busy CPU from /proc/stat minus the CPU of this process and of the children
    it started and reaped (measurement processes, servers under test): report after they have exited."""

    def __init__(self) -> None:
        self.start_busy, self.start_total = self._stat()
        self.start_own = self._own()
        self.load_before = os.getloadavg()[0]

    @staticmethod
    def _own() -> float:
        t = os.times()
        return t.user + t.system + t.children_user + t.children_system

    @staticmethod
    def _stat() -> tuple[float, float]:
        fields = [float(x) for x in Path("/proc/stat").read_text().splitlines()[0].split()[1:]]
        idle = fields[3] + fields[4]
        total = sum(fields[:8])
        return (total - idle) / os.sysconf("SC_CLK_TCK"), total / os.sysconf("SC_CLK_TCK")

    def report(self) -> dict[str, float]:
        busy, total = self._stat()
        own = self._own() - self.start_own
        cpus = total - self.start_total
        others = max(busy - self.start_busy - own, 0.0)
        return {"load_before": self.load_before, "load_after": os.getloadavg()[0],
                "others_share": others / cpus if cpus else 0.0}


def _rows(vocab: int, rows: int, tokens: int, seed: int) -> list[np.ndarray]:
    rng = np.random.default_rng(seed)
    return [np.array([101, *rng.integers(2000, min(vocab, 29000), tokens - 2), 102], dtype=np.int64)
            for _ in range(rows)]


def time_cell(runner: RaggedRunner, rows: list[np.ndarray], seconds: float) -> float:
    """Median seconds per forward of `rows` (one warm-up, at least three runs)."""
    runner.run(rows)
    times: list[float] = []
    deadline = time.perf_counter() + seconds
    while len(times) < 3 or time.perf_counter() < deadline:
        started = time.perf_counter()
        runner.run(rows)
        times.append(time.perf_counter() - started)
    return float(np.median(times))


def isolated(fn: Any, *args: Any) -> list[dict[str, Any]]:
    """Run one engine's cells in a fresh process: thread pools of engines measured earlier (OpenVINO's TBB,
    oneDNN's OpenMP) otherwise keep cores busy and slow the next one down by up to 10×."""
    import multiprocessing
    from concurrent.futures import ProcessPoolExecutor

    with ProcessPoolExecutor(1, mp_context=multiprocessing.get_context("spawn")) as pool:
        return pool.submit(fn, *args).result()  # type: ignore[no-any-return]


def bench_model(model: str, host: Host, seconds: float, threads: int,
                shapes: tuple[list[int], list[int]] = (list(TOKENS), list(BATCHES))) -> list[dict[str, Any]]:
    onnx_path = REPO / model / "1" / "model.onnx"
    out: list[dict[str, Any]] = []
    for engine, precision in sorted(SUPPORTED):
        recipe = "dynamic"
        if (engine, precision) == ("onnxruntime", "int8"):
            from sr_backend.engines.ort_engine import ensure_int8

            ensure_int8(onnx_path, int8_path(onnx_path))
        elif (engine, precision) == ("openvino", "int8"):  # NNCF, calibrated like `models tune` does
            from gateway.cards import discover
            from sr_backend.engines.openvino_engine import ensure_int8_nncf
            from sr_build.tune_samples import calibration_feeds

            recipe = "nncf"
            card = discover(REPO, [model])[0]
            ensure_int8_nncf(onnx_path, int8_path(onnx_path, recipe), calibration_feeds(card, onnx_path))
        out += isolated(bench_engine, model, engine, precision, host, seconds, threads, shapes, recipe)
    return out


def bench_engine(model: str, engine: str, precision: str, host: Host, seconds: float, threads: int,
                 shapes: tuple[list[int], list[int]], recipe: str = "dynamic") -> list[dict[str, Any]]:
    onnx_path = REPO / model / "1" / "model.onnx"
    per_token, layers, width = graph_flops(onnx_path)
    vocab = Tokenizer.from_file(str(onnx_path.with_name("tokenizer.json"))).get_vocab_size()  # ids the model embeds
    base = {"model": model, "engine": engine, "precision": precision}
    out: list[dict[str, Any]] = []
    try:
        runner = RaggedRunner(load_engine(engine, precision, onnx_path, threads, recipe=recipe),
                              max_batch_tokens=1 << 20)
    except EngineError as exc:
        out.append({**base, "status": f"unavailable: {exc}"})
        print(out[-1], flush=True)
        return out
    peak, _ = host.peak_gflops(precision)
    for tokens in shapes[0]:
        for batch in shapes[1]:
            rows = _rows(vocab, batch, tokens, tokens * 1000 + batch)
            seconds_per = time_cell(runner, rows, seconds)
            gflops = forward_flops(per_token, layers, width, batch, tokens) / seconds_per / 1e9
            out.append({**base, "status": "ok", "tokens": tokens, "batch": batch,
                        "rows_per_s": batch / seconds_per, "ms": seconds_per * 1000, "gflops": gflops,
                        "peak": peak, "fraction": gflops / peak})
            print(out[-1], flush=True)
    return out


def render(results: list[dict[str, Any]], host: Host, load: dict[str, float], threads: int, seconds: float) -> str:
    peaks = "; ".join(f"{p}: {host.peak_gflops(p)[0]:.0f} ({host.peak_gflops(p)[1]})" for p in ("fp32", "int8",
                                                                                                 "bf16"))
    noisy = load["others_share"] > 0.1 or load["load_before"] > host.cores
    lines = [
        f"Machine: {machine()}. ISA flags: {' '.join(host.flags) or 'none of ' + ', '.join(('avx2', 'avx512f'))}. "
        f"Date: {time.strftime('%Y-%m-%d %H:%M UTC', time.gmtime())}. One instance, {threads} threads, median of "
        f"≥ 3 forwards over ≥ {seconds:g} s per cell. Peak GFLOP/s (GOP/s for int8) — {peaks}.",
        "",
        f"Load observed: 1-minute load average {load['load_before']:.2f} before, {load['load_after']:.2f} after; "
        f"other processes took {load['others_share']:.0%} of the CPU during the run."
        + (" **Noisy: the machine was shared while this ran; treat ratios, not absolute numbers, as the result.**"
           if noisy else ""),
        "",
        "| model | engine | precision | tokens | batch | rows/s | ms / forward | GFLOP/s | fraction of peak | "
        "× onnxruntime fp32 |",
        "|---|---|---|---|---|---|---|---|---|---|",
    ]
    base = {(r["model"], r["tokens"], r["batch"]): r["rows_per_s"] for r in results
            if r["status"] == "ok" and r["engine"] == "onnxruntime" and r["precision"] == "fp32"}
    for r in results:
        if r["status"] != "ok":
            lines.append(f"| {r['model']} | {r['engine']} | {r['precision']} | — | — | — | — | — | — | "
                         f"{r['status']} |")
            continue
        ratio = r["rows_per_s"] / base[(r["model"], r["tokens"], r["batch"])]
        lines.append(f"| {r['model']} | {r['engine']} | {r['precision']} | {r['tokens']} | {r['batch']} | "
                     f"{r['rows_per_s']:.1f} | {r['ms']:.1f} | {r['gflops']:.1f} | {r['fraction']:.0%} | "
                     f"{ratio:.2f}× |")
    lines += ["", "![achieved fraction of peak per engine](bench_engines.png)"]
    return "\n".join(lines)


def plot(results: list[dict[str, Any]], path: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    ok = [r for r in results if r["status"] == "ok"]
    shapes = sorted({(r["tokens"], r["batch"]) for r in ok})
    series = sorted({(r["model"], r["engine"], r["precision"]) for r in ok})
    fig, ax = plt.subplots(figsize=(10, 4.5))
    width = 0.8 / max(len(series), 1)
    for i, key in enumerate(series):
        values = [next((r["fraction"] * 100 for r in ok if (r["model"], r["engine"], r["precision"]) == key
                        and (r["tokens"], r["batch"]) == s), 0.0) for s in shapes]
        ax.bar([j + i * width for j in range(len(shapes))], values, width, label=" ".join(key))
    ax.set_xticks([j + 0.4 - width / 2 for j in range(len(shapes))])
    ax.set_xticklabels([f"{t} tok × {b}" for t, b in shapes])
    ax.set_ylabel("achieved % of the host's peak for the precision")
    ax.set_title("In-process engines (tools/bench_engines.py)")
    ax.legend(fontsize=8)
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--models", default="all-minilm-l6-v2", help="comma-separated text models")
    parser.add_argument("--seconds", type=float, default=1.0, help="timing window per cell")
    parser.add_argument("--threads", type=int, default=0, help="0 = every core")
    parser.add_argument("--tokens", default=",".join(map(str, TOKENS)), help="sequence lengths")
    parser.add_argument("--batches", default=",".join(map(str, BATCHES)), help="batch sizes")
    parser.add_argument("--write", action="store_true", help="update docs/benchmarks.md and docs/bench_engines.png")
    args = parser.parse_args()
    shapes = ([int(t) for t in args.tokens.split(",")], [int(b) for b in args.batches.split(",")])
    host = detect()
    threads = args.threads or host.cores
    meter = LoadMeter()
    results = [r for m in args.models.split(",") for r in bench_model(m, host, args.seconds, threads, shapes)]
    table = render(results, host, meter.report(), threads, args.seconds)
    print(table)
    if args.write:
        plot(results, ROOT / "docs" / "bench_engines.png")
        replace_section(ROOT / "docs" / "benchmarks.md", "bench_engines", table)


if __name__ == "__main__":
    main()
