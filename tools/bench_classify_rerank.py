"""Classify (Rampart PII token head) and rerank (MiniLM bi-encoder, query + 8 documents): the gateway vs the served
engine in-process (sr_backend.engines.load_configured: the engine and precision of the config Triton loads) on the
same ONNX files, cores and ragged chunking, at concurrency 1/8/32.

The in-process side does the whole job without HTTP, JSON or gRPC: tokenization, one batched forward across
concurrent callers (Triton's policy), and the same readout code (BIO span decoding; cosine).

    .venv/bin/python -m tools.bench_classify_rerank [--requests 300] [--write]
"""

from __future__ import annotations

import argparse
import asyncio
from typing import Any

import numpy as np
import yaml

from gateway.heads import decode_spans, softmax
from sr_backend.ragged import RaggedRunner
from tools.bench_embeddings import load_tokenizer
from tools.benchlib import (
    ROOT,
    InProcessBatcher,
    free_port,
    gateway,
    gateway_cells,
    inprocess_load,
    render_comparison,
    served_baseline,
)
from tools.docs import replace_section

PII, EMBEDDER = "pii-rampart", "all-minilm-l6-v2"
NAMES = ["Tom Baker", "Jane Doe", "Ravi Patel", "Maria Garcia", "Chen Wei", "Olga Ivanova"]
CITIES = ["Boston", "Denver", "Austin", "Seattle", "Chicago", "Portland"]
DOCS = ["Open Settings, then Security, and choose Reset password.", "Our offices are closed on Sunday.",
        "Refunds are accepted within 30 days of purchase.", "The parcel ships within two business days.",
        "You can change your e-mail address in the account page.", "Prices include VAT where applicable.",
        "Contact support if the login link has expired.", "The museum opens at nine in the morning."]
QUERIES = ["How do I reset my password?", "When can I get a refund?", "How long does shipping take?",
           "How do I change my e-mail?", "Is VAT included?", "My login link expired, what now?"]


def pii_texts(n: int) -> list[str]:
    return [f"Hi, I'm {NAMES[i % 6]} from {CITIES[(i // 6) % 6]}. Write to {NAMES[i % 6].split()[0].lower()}{i}"
            f"@example.com or call 415-555-{i % 10000:04d} about order {i}." for i in range(n)]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--requests", type=int, default=300, help="requests per cell")
    parser.add_argument("--concurrency", default="1,8,32")
    parser.add_argument("--write", action="store_true", help="update docs/benchmarks.md")
    args = parser.parse_args()
    levels = [int(c) for c in args.concurrency.split(",")]
    repo = ROOT / "model_repository"
    pii_tok = load_tokenizer(str(repo / PII / "1" / "tokenizer.json"))
    emb_tok = load_tokenizer(str(repo / EMBEDDER / "1" / "tokenizer.json"))
    labels = yaml.safe_load((repo / PII / "card.yaml").read_text())["heads"][0]["labels"]
    texts = pii_texts(512)

    async def classify_work(batcher: InProcessBatcher, i: int) -> None:
        enc = pii_tok.encode(texts[i % len(texts)])
        (logits,) = await batcher.submit([np.asarray(enc.ids, dtype=np.int64)])
        keep = [k for k, s in enumerate(enc.sequence_ids) if s is not None]
        decode_spans(softmax(logits[keep]), [enc.offsets[k] for k in keep], labels, 0.5)

    async def rerank_work(batcher: InProcessBatcher, i: int) -> None:
        rows = [np.asarray(emb_tok.encode(t).ids, dtype=np.int64) for t in [QUERIES[i % len(QUERIES)], *DOCS]]
        vectors = await batcher.submit(rows)
        scores = np.stack(vectors[1:]) @ vectors[0]
        sorted(range(len(DOCS)), key=lambda k: -scores[k])

    workloads: dict[str, tuple[str, Any, Any, str]] = {
        "classify PII (≈35 tok)": (PII, classify_work,
                                   lambda i: {"model": PII, "input": texts[i % len(texts)]}, "/v1/classify"),
        "rerank 8 docs (bi-encoder)": (EMBEDDER, rerank_work,
                                       lambda i: {"model": EMBEDDER, "query": QUERIES[i % len(QUERIES)],
                                                  "documents": DOCS}, "/v1/rerank"),
    }
    rows: list[dict[str, Any]] = []
    baselines = {m: served_baseline(m) for m in (PII, EMBEDDER)}  # the served engine and precision, in-process
    for name, (model, work, _, _) in workloads.items():
        print(f"in-process baseline: {baselines[model].describe()}", flush=True)
        runner = RaggedRunner(baselines[model].engine, max_batch_tokens=8192)
        for c in levels:
            r = asyncio.run(inprocess_load(InProcessBatcher(runner.run), work, c, args.requests))
            rows.append({"set": name, "c": c, "side": "in-process", **r.summary()})
            print(rows[-1], flush=True)
    grpc_port = free_port()
    with gateway(["--triton-grpc-port", str(grpc_port), "--models", f"{PII},{EMBEDDER}"]) as (url, pid):
        triton = f"127.0.0.1:{grpc_port}"
        for name, (model, _, body, path) in workloads.items():
            rows += gateway_cells(url, pid, triton, model, path, body, name, levels, args.requests)
    table = render_comparison(rows, baselines=list(baselines.values()), requests=args.requests,
                              note="A rerank request is 9 model inputs (query + 8 documents).")
    print(table)
    if args.write:
        replace_section(ROOT / "docs" / "benchmarks.md", "bench_classify_rerank", table)


if __name__ == "__main__":
    main()
