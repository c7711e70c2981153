"""What one more question costs: a decisions call with 1, 4 or 8 questions about one text, on the multilingual
encoder (decision-multilingual: trained presets and ad-hoc zero-shot questions), C 1 and 8.

The card reads the state once (`usage: state_once`): every question is answered from the same embedding of the text,
so a question adds its head (a preset) or its option texts (ad-hoc: embedded once, then cached) and its scoring, not
a forward of the text. This measures that claim on the served stack: requests/s, latency and the Server-Timing split
(forward = Triton, own = the gateway's work) per question count. Every request asks about a new text, the result
cache is off, and option texts are warmed before each cell (as a running router's would be).

    .venv/bin/python -m tools.bench_questions [--requests 200] [--write]
    .venv/bin/python -m tools.bench_questions --pairs [--requests 300]

`--pairs` prices the two-part presets instead: one relevance question (its parts read as written and with E5's
prefixes, four encoder rows) against one grounded question (two rows) about the same (first, second) texts, the
relevance preset's train pairs, alternating presets in two rounds per concurrency.
"""

from __future__ import annotations

import argparse
import asyncio
from collections.abc import Callable
from typing import Any

from tools.benchlib import ROOT, gateway, http_load, machine
from tools.docs import replace_section

MODEL = "decision-multilingual"
TOPICS = ["如何在 Python 里合并两个有序列表", "the derivative of x squared", "香蕉面包的做法",
          "the causes of the French revolution", "路由器密码怎么重置", "the best way to learn Spanish",
          "为什么天空是蓝色的", "a cover letter for a nurse position"]
QUESTIONS: dict[str, Any] = {
    "jailbreak": {"type": "noul", "preset": "jailbreak"},
    "pii": {"type": "noul", "preset": "pii"},
    "domain": {"type": "choice", "preset": "domain"},
    "language": {"type": "choice", "preset": "language"},
    "difficulty": {"type": "score", "preset": "difficulty"},
    "wants_code": {"type": "noul", "instructions": "Does the request ask for program code?"},
    "tone": {"type": "choice", "instructions": "What tone does the request take?",
             "choices": [{"key": "formal", "description": "formal, polite"},
                         {"key": "casual", "description": "casual, chatty"},
                         {"key": "urgent", "description": "urgent, demanding"}]},
    "needs": {"type": "set", "instructions": "What does a good answer need?",
              "labels": [{"key": "steps", "description": "step-by-step instructions"},
                         {"key": "example", "description": "a worked example"},
                         {"key": "sources", "description": "references or sources"}]},
}
COUNTS = (1, 4, 8)


def text(i: int) -> str:
    return f"{TOPICS[i % len(TOPICS)]} ({i}) — please answer in detail, my email is user{i}@example.com."


def body(count: int, offset: int = 0) -> Callable[[int], dict[str, Any]]:
    """Request i: the first `count` questions about text i + offset (a new text every request)."""
    questions = dict(list(QUESTIONS.items())[:count])
    return lambda i: {"model": MODEL, "state": text(i + offset), "questions": questions}


def pair_body(preset: str, pairs: list[tuple[str, str]]) -> Callable[[int], dict[str, Any]]:
    parts = ("request", "candidate") if preset == "relevance" else ("context", "answer")
    return lambda i: {"model": MODEL, "state": dict(zip(parts, pairs[i % len(pairs)], strict=True)),
                      "questions": {"q": {"type": "noul", "preset": preset}}}


def bench_pairs(levels: list[int], requests: int) -> None:
    from sr_build.presets import DATA, load_lines

    lines = [line for line in load_lines(DATA / "relevance.jsonl") if line["split"] == "train"]
    pairs = [(line["state"]["request"], line["state"]["candidate"]) for line in lines]
    print(machine(), flush=True)
    with gateway(["--models", MODEL, "--result-cache", "off"]) as (url, _pid):
        for preset in ("relevance", "grounded"):
            asyncio.run(http_load(url, "/v1/decisions", pair_body(preset, pairs), 4, 64))
        for c in levels:
            for round_ in range(2):
                for preset in ("grounded", "relevance"):
                    run = asyncio.run(http_load(url, "/v1/decisions", pair_body(preset, pairs), c, requests))
                    print({"preset": preset, "c": c, "round": round_, **run.summary()}, flush=True)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--requests", type=int, default=200, help="requests per cell")
    parser.add_argument("--concurrency", default="1,8")
    parser.add_argument("--write", action="store_true", help="update docs/benchmarks.md")
    parser.add_argument("--pairs", action="store_true", help="relevance (4 rows) against grounded (2 rows)")
    args = parser.parse_args()
    levels = [int(c) for c in args.concurrency.split(",")]
    if args.pairs:
        bench_pairs(levels, args.requests)
        return
    rows: list[dict[str, Any]] = []
    with gateway(["--models", MODEL, "--result-cache", "off"]) as (url, _pid):
        asyncio.run(http_load(url, "/v1/decisions", body(len(QUESTIONS), 10**6), 4, 32))  # options, heads, buffers
        offset = 0
        for c in levels:
            for count in COUNTS:
                offset += args.requests
                run = asyncio.run(http_load(url, "/v1/decisions", body(count, offset), c, args.requests))
                rows.append({"questions": count, "c": c, **run.summary()})
                print(rows[-1], flush=True)
    table = render(rows, args.requests)
    print(table)
    if args.write:
        replace_section(ROOT / "docs" / "benchmarks.md", "bench_questions", table)


def render(rows: list[dict[str, Any]], requests: int) -> str:
    names = ", ".join(QUESTIONS)
    lines = [f"Machine: {machine()}. {MODEL}, result cache off, {requests} requests per cell, closed loop, a new text "
             f"(≈ 20 tokens, Chinese and English) per request; the first N of: {names}. Forward = Server-Timing "
             f"`forward` (Triton), own = total − queue − forward (the gateway's work).", "",
             "| C | questions | req/s | p50 / p99 ms | forward p50 ms | own p50 ms | errors | cost vs 1 question |",
             "|---|---|---|---|---|---|---|---|"]
    for c in sorted({r["c"] for r in rows}):
        cells = [r for r in rows if r["c"] == c]
        one = next(r for r in cells if r["questions"] == 1)
        for r in cells:
            lines.append(f"| {c} | {r['questions']} | {r['throughput']:.1f} | {r['p50_ms']:.1f} / {r['p99_ms']:.1f} | "
                         f"{r['forward_p50_ms']:.2f} | {r['own_p50_ms']:.2f} | {r['errors']:.0f} | "
                         f"{one['throughput'] / r['throughput']:.2f}× |")
    return "\n".join(lines)


if __name__ == "__main__":
    main()
