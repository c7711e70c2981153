"""Embeddings throughput and latency: the gateway (HTTP → gRPC → Triton) vs in-process ONNX Runtime.

Both sides run the same ONNX file with the same thread count and the same ragged chunking code
(sr_backend.encoder.RaggedRunner). The in-process baseline batches concurrent callers the way Triton's dynamic
batcher does (everything queued, up to max_batch_size, in one run), with no HTTP, JSON or gRPC: it is the ceiling.
Load is closed-loop: C callers, one text per request. Results go to docs/benchmarks.md between markers.

    .venv/bin/python -m tools.bench_embeddings [--requests 600] [--write]
"""

from __future__ import annotations

import argparse
import asyncio
import os
import time
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from typing import Any

import numpy as np
import tritonclient.grpc as grpcclient
from tokenizers import Tokenizer

from sr_backend.encoder import RaggedRunner, make_session
from tools.benchlib import ROOT, Run, free_port, gateway, http_load, machine
from tools.docs import replace_section

MODEL = "all-minilm-l6-v2"
VERSION_DIR = ROOT / "model_repository" / MODEL / "1"
WORDS = """router model request answer token batch latency queue server client vector cosine search index password
account settings security billing invoice shipping parcel delivery weather travel music guitar market stock price
report summary question support policy refund window office""".split()  # noqa: SIM905 (readable as prose)


def make_texts(tokenizer: Tokenizer, target_tokens: int, count: int, seed: int) -> list[str]:
    """Distinct texts whose tokenization (with [CLS]/[SEP]) is close to target_tokens."""
    rng = np.random.default_rng(seed)
    texts = []
    for i in range(count):
        words = [str(WORDS[j]) for j in rng.integers(0, len(WORDS), size=target_tokens)]
        text = f"{i} " + " ".join(words)
        while len(tokenizer.encode(text).ids) > target_tokens:
            text = text.rsplit(" ", 1)[0]
        texts.append(text)
    return texts


async def inprocess_load(encoder: RaggedRunner, tokenizer: Tokenizer, texts: Callable[[int], str],
                         concurrency: int, requests: int, max_batch: int = 128) -> Run:
    """Callers tokenize and enqueue; one worker runs whatever is queued as one ragged batch (Triton's policy)."""
    run = Run()
    queue: asyncio.Queue[tuple[np.ndarray, asyncio.Future[np.ndarray]]] = asyncio.Queue()
    pool = ThreadPoolExecutor(1)
    loop = asyncio.get_running_loop()

    async def worker() -> None:
        while True:
            batch = [await queue.get()]
            while not queue.empty() and len(batch) < max_batch:
                batch.append(queue.get_nowait())
            vectors, _ = await loop.run_in_executor(pool, encoder.run_pooled, [ids for ids, _ in batch])
            for (_, fut), vec in zip(batch, vectors, strict=True):
                fut.set_result(vec)

    counter = iter(range(requests))

    async def caller() -> None:
        for i in counter:
            started = time.perf_counter()
            ids = np.asarray(tokenizer.encode(texts(i)).ids, dtype=np.int64)
            fut: asyncio.Future[np.ndarray] = loop.create_future()
            await queue.put((ids, fut))
            await fut
            run.latencies_ms.append((time.perf_counter() - started) * 1000)

    task = asyncio.create_task(worker())
    started = time.perf_counter()
    await asyncio.gather(*(caller() for _ in range(concurrency)))
    run.wall_s = time.perf_counter() - started
    task.cancel()
    pool.shutdown()
    return run


def cycle(texts: list[str]) -> Callable[[int], str]:
    return lambda i: texts[i % len(texts)]


def body(texts: list[str]) -> Callable[[int], dict[str, Any]]:
    return lambda i: {"input": texts[i % len(texts)]}


def triton_counts(url: str) -> tuple[int, int]:
    stats = grpcclient.InferenceServerClient(url).get_inference_statistics(MODEL, as_json=True)["model_stats"][0]
    return int(stats.get("inference_count", 0)), int(stats.get("execution_count", 0))


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--requests", type=int, default=600, help="requests per cell")
    parser.add_argument("--concurrency", default="1,8,32")
    parser.add_argument("--write", action="store_true", help="update docs/benchmarks.md")
    args = parser.parse_args()
    levels = [int(c) for c in args.concurrency.split(",")]
    threads = os.cpu_count() or 1
    tokenizer = Tokenizer.from_file(str(VERSION_DIR / "tokenizer.json"))
    tokenizer.no_padding()
    tokenizer.no_truncation()
    sets = {"short (16 tok)": make_texts(tokenizer, 16, 4096, 1),
            "medium (128 tok)": make_texts(tokenizer, 128, 4096, 2)}
    encoder = RaggedRunner(make_session(str(VERSION_DIR / "model.onnx"), threads), max_batch_tokens=8192)
    rows: list[dict[str, Any]] = []
    for name, texts in sets.items():
        encoder.run_pooled([np.asarray(tokenizer.encode(t).ids, dtype=np.int64) for t in texts[:64]])  # warm up
        for c in levels:
            r = asyncio.run(inprocess_load(encoder, tokenizer, cycle(texts), c, args.requests))
            rows.append({"set": name, "c": c, "side": "in-process", **r.summary()})
            print(rows[-1], flush=True)
    del encoder
    grpc_port = free_port()
    with gateway(["--triton-grpc-port", str(grpc_port), "--threads", str(threads)]) as (url, _):
        triton = f"127.0.0.1:{grpc_port}"
        for name, texts in sets.items():
            asyncio.run(http_load(url, "/v1/embeddings", body(texts), 8, 64))  # warm up
            for c in levels:
                before = triton_counts(triton)
                r = asyncio.run(http_load(url, "/v1/embeddings", body(texts), c, args.requests))
                after = triton_counts(triton)
                inferences, executions = after[0] - before[0], after[1] - before[1]
                rows.append({"set": name, "c": c, "side": "gateway", **r.summary(),
                             "batch": inferences / max(executions, 1)})
                print(rows[-1], flush=True)
    table = render(rows, args.requests, threads)
    print(table)
    if args.write:
        replace_section(ROOT / "docs" / "benchmarks.md", "bench_embeddings", table)


def render(rows: list[dict[str, Any]], requests: int, threads: int) -> str:
    lines = [
        f"Machine: {machine()}. Date: {time.strftime('%Y-%m-%d')}. ONNX Runtime intra-op threads: {threads} on both "
        f"sides. {requests} requests per cell, one text per request, closed loop; the load generator runs on the "
        "same cores.",
        "",
        "| texts | C | in-process req/s | gateway req/s | ratio | in-process p50 / p99 ms | gateway p50 / p99 ms "
        "| gateway own time p50 / p99 ms | Triton rows per execute |",
        "|---|---|---|---|---|---|---|---|---|",
    ]
    base = {(r["set"], r["c"]): r for r in rows if r["side"] == "in-process"}
    for r in (r for r in rows if r["side"] == "gateway"):
        b = base[(r["set"], r["c"])]
        lines.append(
            f"| {r['set']} | {r['c']} | {b['throughput']:.1f} | {r['throughput']:.1f} | "
            f"{r['throughput'] / b['throughput']:.2f}× | {b['p50_ms']:.1f} / {b['p99_ms']:.1f} | "
            f"{r['p50_ms']:.1f} / {r['p99_ms']:.1f} | {r.get('own_p50_ms', 0):.2f} / {r.get('own_p99_ms', 0):.2f} | "
            f"{r['batch']:.1f} |")
    return "\n".join(lines)


if __name__ == "__main__":
    main()
