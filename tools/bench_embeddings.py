"""Embeddings throughput and latency: the gateway (HTTP → gRPC → Triton) vs the served engine in-process.

Both sides run the same ONNX file on the same engine and precision (the in-process side loads it with
sr_backend.engines.load_configured from the config Triton serves: configs/tuned.pbtxt where `models tune` generated
one), on the same cores, with the same ragged chunking code (sr_backend.ragged.RaggedRunner). The in-process
baseline batches concurrent callers the way Triton's dynamic batcher does (everything queued, up to max_batch_size
rows, in one run), with no HTTP, JSON or gRPC: it is the ceiling. Load is closed-loop: C callers, one text per
request. Results go to docs/benchmarks.md between markers.

    .venv/bin/python -m tools.bench_embeddings [--model M] [--tokens 16,128] [--requests 600] [--write]

Another model than MiniLM (e.g. multilingual-e5-small) writes its own section, `bench_embeddings <model>`.
"""

from __future__ import annotations

import argparse
import asyncio
from typing import Any

import numpy as np
from tokenizers import Tokenizer

from gateway.cards import load_card
from sr_backend.ragged import RaggedRunner
from tools.benchlib import (
    ROOT,
    InProcessBatcher,
    free_port,
    gateway,
    gateway_cells,
    inprocess_load,
    render_comparison,
    served_baseline,
    triton_load,
)
from tools.docs import replace_section

MODEL = "all-minilm-l6-v2"
WORDS = """router model request answer token batch latency queue server client vector cosine search index password
account settings security billing invoice shipping parcel delivery weather travel music guitar market stock price
report summary question support policy refund window office""".split()  # noqa: SIM905 (readable as prose)


def load_tokenizer(path: str) -> Tokenizer:
    tokenizer = Tokenizer.from_file(path)
    tokenizer.no_padding()
    tokenizer.no_truncation()
    return tokenizer


def make_texts(tokenizer: Tokenizer, target_tokens: int, count: int, seed: int) -> list[str]:
    """Distinct texts whose tokenization (with [CLS]/[SEP]) is close to target_tokens."""
    rng = np.random.default_rng(seed)
    texts = []
    for i in range(count):
        words = [f"{i}", *(str(WORDS[j]) for j in rng.integers(0, len(WORDS), size=target_tokens))]
        low, high = 1, len(words)  # the most words whose text fits (by bisection: a word may be several tokens)
        while low < high:
            mid = (low + high + 1) // 2
            if len(tokenizer.encode(" ".join(words[:mid])).ids) <= target_tokens:
                low = mid
            else:
                high = mid - 1
        texts.append(" ".join(words[:low]))
    return texts


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--requests", type=int, default=600, help="requests per cell")
    parser.add_argument("--concurrency", default="1,8,32")
    parser.add_argument("--write", action="store_true", help="update docs/benchmarks.md")
    parser.add_argument("--model", default=MODEL, help="a served embedding model of the repository")
    parser.add_argument("--tokens", default="16,128", help="text lengths in tokens, one set each")
    parser.add_argument("--gateway-args", default="", help="extra `sr-gateway serve` flags, e.g. '--threads 2'")
    args = parser.parse_args()
    levels = [int(c) for c in args.concurrency.split(",")]
    model = args.model
    tokenizer = load_tokenizer(str(ROOT / "model_repository" / model / "1" / "tokenizer.json"))
    names = {16: "short", 128: "medium", 512: "long"}
    # a card that reads every text after a prefix (E5's "query: ") counts the prefix's tokens in the input
    card = load_card(ROOT / "model_repository" / model / "card.yaml")
    embedding = card.embedding

    def read(text: str) -> list[int]:  # the ids the gateway sends for `text` (its default input type)
        return list(tokenizer.encode(embedding.prefixed(text, None) if embedding else text).ids)

    extra = len(read("x")) - len(tokenizer.encode("x").ids)
    sets = {f"{names.get(n, 'text')} ({n} tok)": make_texts(tokenizer, n - extra, 4096, seed)
            for seed, n in enumerate((int(t) for t in args.tokens.split(",")), start=1)}
    baseline = served_baseline(model)
    print(f"in-process baseline: {baseline.describe()}", flush=True)
    runner = RaggedRunner(baseline.engine, max_batch_tokens=8192)
    rows: list[dict[str, Any]] = []
    for name, texts in sets.items():
        runner.run([np.asarray(read(t), dtype=np.int64) for t in texts[:64]])  # warm up

        async def work(batcher: InProcessBatcher, i: int, texts: list[str] = texts) -> None:
            await batcher.submit([np.asarray(read(texts[i % len(texts)]), dtype=np.int64)])

        for c in levels:
            r = asyncio.run(inprocess_load(InProcessBatcher(runner.run), work, c, args.requests))
            rows.append({"set": name, "c": c, "side": "in-process", **r.summary()})
            print(rows[-1], flush=True)
    del runner
    grpc_port = free_port()
    with gateway(["--triton-grpc-port", str(grpc_port), "--models", model, *args.gateway_args.split()]) as (url, pid):
        triton = f"127.0.0.1:{grpc_port}"
        for name, texts in sets.items():
            def body(i: int, texts: list[str] = texts) -> dict[str, Any]:
                return {"model": model, "input": texts[i % len(texts)]}

            def ids(i: int, texts: list[str] = texts) -> np.ndarray:
                return np.asarray(read(texts[i % len(texts)]), dtype=np.int64)

            rows += gateway_cells(url, pid, triton, model, "/v1/embeddings", body, name, levels, args.requests)
            for c in levels:
                r = asyncio.run(triton_load(triton, model, "EMBEDDING", ids, c, args.requests))
                rows.append({"set": name, "c": c, "side": "triton", **r.summary()})
                print(rows[-1], flush=True)
    table = render_comparison(rows, baselines=[baseline], requests=args.requests, note="One text per request.")
    print(table)
    if args.write:
        section = "bench_embeddings" if model == MODEL else f"bench_embeddings {model}"
        replace_section(ROOT / "docs" / "benchmarks.md", section, table)


if __name__ == "__main__":
    main()
