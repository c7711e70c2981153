"""Decisions and the router's call: the gateway vs the served engine in-process doing the same work, C 1/8/32.

Workloads:
- three routing questions (domain choice, reasoning noul, difficulty score) over one request text;
- a `states` batch of 16 candidate passages, one relevance noul each (two-part states);
- the router's call: domain classify + injection classify + PII span decisions + the three routing questions, as
  one /v1/bundle, and the same four calls sent separately (concurrently) — one "request" is the whole call;
- the result cache: the three routing questions over a pool of 32 texts, with --result-cache all vs off.

The in-process side does the decisions work without HTTP, JSON or gRPC: tokenization, one batched ONNX Runtime
forward across concurrent callers on the engine and precision Triton serves the embedder with
(sr_backend.engines.load_configured), option texts embedded once and cached, and the family's own scoring code.

    .venv/bin/python -m tools.bench_decisions [--requests 200] [--write]
"""

from __future__ import annotations

import argparse
import asyncio
import time
from pathlib import Path
from typing import Any

import aiohttp
import numpy as np

from gateway.cards import load_card
from gateway.decisions.families.zeroshot import ZeroShot
from gateway.decisions.questions import Question, validate
from gateway.decisions.state import parse_state
from gateway.runtime import ServedModel
from sr_backend.ragged import RaggedRunner
from tools.benchlib import (
    ROOT,
    InProcessBatcher,
    Run,
    free_port,
    gateway,
    gateway_cells,
    inprocess_load,
    machine,
    render_comparison,
    served_baseline,
    server_timing,
)
from tools.docs import replace_section
from tools.reference_examples import routing_request

DECIDER, EMBEDDER = "decision-zeroshot", "all-minilm-l6-v2"
MODELS = "all-minilm-l6-v2,pii-rampart,decision-zeroshot,domain-zeroshot,prompt-guard"
TOPICS = ["merge two sorted lists in Python", "the derivative of x squared", "a good recipe for banana bread",
          "the causes of the French revolution", "how to reset a router password", "the best way to learn Spanish",
          "why the sky is blue", "a cover letter for a nurse position"]
ROUTING: dict[str, Any] = routing_request(DECIDER)["questions"]  # the spec's example: domain, reasoning, difficulty
RELEVANCE = {"type": "noul", "instructions": "Does the candidate passage contain information that helps answer the "
                                             "request?"}
PASSAGES = [f"Passage {i}: " + ("Refunds are accepted within 30 days of purchase." if i % 3 == 0 else
                                "Our offices close on public holidays and weekends.") for i in range(64)]


def request_text(i: int) -> str:
    return f"Please explain {TOPICS[i % len(TOPICS)]} (request {i}). My email is user{i}@example.com."


def routing_body(i: int) -> dict[str, Any]:
    return {"model": DECIDER, "state": request_text(i), "questions": ROUTING}


def batch_body(i: int) -> dict[str, Any]:
    return {"model": DECIDER, "states": {f"doc_{k}": {"state": {"request": f"How long is the refund window? ({i})",
                                                                "candidate": PASSAGES[(i + k) % len(PASSAGES)]},
                                                      "questions": {"relevance": RELEVANCE}} for k in range(16)}}


def router_tasks(i: int) -> list[tuple[str, str, dict[str, Any]]]:
    text = request_text(i)
    return [("domain", "classify", {"model": "domain-zeroshot", "input": [text]}),
            ("injection", "classify", {"model": "prompt-guard", "input": [text]}),
            ("pii", "decisions", {"model": DECIDER, "state": text,
                                  "questions": {"pii": {"type": "span", "preset": "pii"}}}),
            ("routing", "decisions", routing_body(i))]


def bundle_body(i: int) -> dict[str, Any]:
    return {"tasks": [{"id": tid, surface: body} for tid, surface, body in router_tasks(i)]}


async def separate_load(url: str, concurrency: int, requests: int) -> Run:
    """The router's call as four concurrent HTTP calls; one request = all four answered."""
    run = Run()
    counter = iter(range(requests))
    async with aiohttp.ClientSession(connector=aiohttp.TCPConnector(limit=4 * concurrency)) as session:

        async def one(path: str, body: dict[str, Any]) -> tuple[int, float]:
            async with session.post(url + path, json=body) as r:
                await r.read()
                t = server_timing(r.headers["Server-Timing"])
                return r.status, t["total"] - t["queue"] - t["forward"]

        async def caller() -> None:
            for i in counter:
                started = time.perf_counter()
                done = await asyncio.gather(*(one(f"/v1/{s}", b) for _, s, b in router_tasks(i)))
                run.latencies_ms.append((time.perf_counter() - started) * 1000)
                run.errors += sum(status != 200 for status, _ in done)
                run.own_ms.append(sum(own for _, own in done))

        started = time.perf_counter()
        await asyncio.gather(*(caller() for _ in range(concurrency)))
        run.wall_s = time.perf_counter() - started
    return run


class InProcessDecisions:
    """The zero-shot family's work in process: embeddings from one batched ONNX Runtime session."""

    def __init__(self, batcher: InProcessBatcher) -> None:
        card = load_card(ROOT / "model_repository" / DECIDER / "card.yaml")
        self.model = ServedModel(card.model_copy(update={"directory": ROOT / "model_repository" / DECIDER}))
        self.family = ZeroShot(self.model)
        self.encoder = self.model.text_encoder()
        self.batcher = batcher
        self.options: dict[str, np.ndarray] = {}
        assert card.decisions is not None
        self.spec = card.decisions

    def questions(self, raw: dict[str, Any]) -> list[Question]:
        out = [validate(k, v, self.spec, DECIDER) for k, v in raw.items()]
        return [q for q in out if isinstance(q, Question)]

    async def answer(self, states: list[Any], questions: list[Question]) -> list[np.ndarray]:
        views = [parse_state(s).view(None) for s in states]
        texts = {v.text for v in views} | {p for v in views for p in v.parts[:2]}
        wanted = [t for q in questions for t in self.family.option_texts(q) if t not in self.options]
        todo = list(dict.fromkeys([*texts, *wanted]))
        rows = [np.asarray(self.encoder.encode(t, max_tokens=256, overflow="truncate").ids, dtype=np.int64)
                for t in todo]
        vectors = dict(zip(todo, await self.batcher.submit(rows), strict=True))
        for t in wanted:
            self.options[t] = vectors[t]
        out = []
        for v in views:
            for q in questions:
                cos = np.asarray([float(vectors[v.text] @ self.options[t]) for t in self.family.option_texts(q)])
                pair = float(vectors[v.parts[0]] @ vectors[v.parts[1]]) if self.family._paired(q, v) else None
                out.append(self.family.probabilities(q, cos, pair))
        return out


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--requests", type=int, default=200, help="requests per cell")
    parser.add_argument("--concurrency", default="1,8,32")
    parser.add_argument("--write", action="store_true", help="update docs/benchmarks.md")
    args = parser.parse_args()
    levels = [int(c) for c in args.concurrency.split(",")]
    baseline = served_baseline(EMBEDDER)
    print(f"in-process baseline: {baseline.describe()}", flush=True)
    runner = RaggedRunner(baseline.engine, max_batch_tokens=8192)
    rows: list[dict[str, Any]] = []
    routing = "decisions: 3 routing questions"
    batch = "decisions: 16-state relevance batch"
    for name, work in ((routing, "routing"), (batch, "batch")):
        for c in levels:
            decider = InProcessDecisions(InProcessBatcher(runner.run))
            questions = decider.questions(ROUTING if work == "routing" else {"relevance": RELEVANCE})

            async def job(_: InProcessBatcher, i: int, d: InProcessDecisions = decider, w: str = work,
                          qs: list[Question] = questions) -> None:
                states = [request_text(i)] if w == "routing" else [
                    e["state"] for e in batch_body(i)["states"].values()]
                await d.answer(states, qs)

            r = asyncio.run(inprocess_load(decider.batcher, job, c, args.requests))
            rows.append({"set": name, "c": c, "side": "in-process", **r.summary()})
            print(rows[-1], flush=True)
    grpc_port = free_port()
    router: list[dict[str, Any]] = []
    with gateway(["--triton-grpc-port", str(grpc_port), "--models", MODELS]) as (url, pid):
        triton = f"127.0.0.1:{grpc_port}"
        rows += gateway_cells(url, pid, triton, EMBEDDER, "/v1/decisions", routing_body, routing, levels,
                              args.requests)
        rows += gateway_cells(url, pid, triton, EMBEDDER, "/v1/decisions", batch_body, batch, levels, args.requests)
        bundle = gateway_cells(url, pid, triton, EMBEDDER, "/v1/bundle", bundle_body, "router call", levels,
                               args.requests)
        for c, b in zip(levels, bundle, strict=True):
            s = asyncio.run(separate_load(url, c, args.requests)).summary()
            router.append({"c": c, "bundle": b, "separate": s})
            print(router[-1], flush=True)
    cache: list[dict[str, Any]] = []
    for policy in ("off", "all"):
        with gateway(["--models", MODELS, "--result-cache", policy]) as (url, pid):
            pool = lambda i: routing_body(i % 32)  # noqa: E731 - 32 distinct texts, asked again and again
            for c in levels:
                from tools.benchlib import http_load

                asyncio.run(http_load(url, "/v1/decisions", pool, 8, 64))
                s = asyncio.run(http_load(url, "/v1/decisions", pool, c, args.requests)).summary()
                cache.append({"policy": policy, "c": c, **s})
                print(cache[-1], flush=True)
    table = render_comparison(rows, baselines=[baseline], requests=args.requests,
                              note="A routing request is 1 state + 3 questions (8 option texts, cached after the "
                                   "first); a batch request is 16 two-part states (48 texts).")
    table += "\n\n" + render_router(router, cache, args.requests)
    print(table)
    if args.write:
        replace_section(ROOT / "docs" / "benchmarks.md", "bench_decisions", table)


def render_router(router: list[dict[str, Any]], cache: list[dict[str, Any]], requests: int) -> str:
    lines = [f"The router's call (domain classify + injection classify + PII spans + 3 routing questions) as one "
             f"bundle vs four separate concurrent calls; {requests} calls per cell, same gateway. Machine: "
             f"{machine()}.", "",
             "| C | bundle calls/s | separate calls/s | bundle ÷ separate | bundle p50 / p99 ms "
             "| separate p50 / p99 ms |", "|---|---|---|---|---|---|"]
    for r in router:
        b, s = r["bundle"], r["separate"]
        lines.append(f"| {r['c']} | {b['throughput']:.1f} | {s['throughput']:.1f} | "
                     f"{b['throughput'] / s['throughput']:.2f}× | {b['p50_ms']:.1f} / {b['p99_ms']:.1f} | "
                     f"{s['p50_ms']:.1f} / {s['p99_ms']:.1f} |")
    lines += ["", "Result cache: the 3 routing questions over 32 distinct texts asked again and again "
                  "(`--result-cache off` vs `all`).", "",
              "| C | off req/s | all req/s | off p50 ms | all p50 ms |", "|---|---|---|---|---|"]
    by = {(x["policy"], x["c"]): x for x in cache}
    for c in sorted({x["c"] for x in cache}):
        off, on = by[("off", c)], by[("all", c)]
        lines.append(f"| {c} | {off['throughput']:.1f} | {on['throughput']:.1f} | {off['p50_ms']:.1f} | "
                     f"{on['p50_ms']:.1f} |")
    return "\n".join(lines)


if __name__ == "__main__":
    Path(ROOT / ".cache").mkdir(exist_ok=True)
    main()
