"""Timing and choosing, for every kind of model `sr-gateway models tune` measures (sr_build.tune_text, tune_image):
median seconds per forward, each measurement in a fresh process, the instances × threads layouts of this host,
and the rule that picks a candidate or a layout (the smallest worst-case loss, earlier ones kept within MARGIN).
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np

from sr_common.cards import Card

MIN_SECONDS = 0.6  # per timed shape; at least MIN_REPEATS forwards
MIN_REPEATS = 3


class TuneError(RuntimeError):
    """A model that cannot be tuned (missing build, a precision its card refuses, no candidate passing), with why."""


@dataclass
class Candidate:
    engine: str
    precision: str
    recipe: str = ""  # int8: how the copy was quantised (dynamic | static)
    status: str = "pending"  # measured | rejected | unavailable
    reason: str = ""
    check: dict[str, float] = field(default_factory=dict)
    latency_ms: float = 0.0  # the kind's latency shape, one forward
    rows_per_s: float = 0.0  # the kind's throughput shape


def label(engine: str, precision: str, recipe: str = "") -> str:
    return f"{engine}/{precision}" + (f"-{recipe}" if precision == "int8" and recipe else "")


def load_engines() -> Any:
    """sr_backend.engines, imported when measuring starts (it brings the engines' registry, not this module's
    importers)."""
    from sr_backend import engines

    return engines


def softmax(x: np.ndarray) -> np.ndarray:
    """Probabilities over the last axis: the checks compare classifiers' answers as probabilities, not logits."""
    e = np.exp(x - x.max(axis=-1, keepdims=True))
    return np.asarray(e / e.sum(axis=-1, keepdims=True))


def time_forward(runner: Any, rows: list[np.ndarray], min_seconds: float | None = None) -> float:
    """Median seconds of one `runner.run(rows)` (after one warm-up)."""
    runner.run(rows)
    times: list[float] = []
    deadline = time.perf_counter() + (MIN_SECONDS if min_seconds is None else min_seconds)
    while len(times) < MIN_REPEATS or time.perf_counter() < deadline:
        started = time.perf_counter()
        runner.run(rows)
        times.append(time.perf_counter() - started)
    return float(np.median(times))


def cpu_layouts(cores: int, max_instances: int | None = None) -> list[tuple[int, int]]:
    """instances × threads: one instance per core (today's default first), and two instances with every core each
    (one request alone gets all the cores; threads sleep rather than spin, so two busy instances share them).
    Never one instance: a free instance is what keeps Triton's batcher from waiting up to 500 ms for a slot.
    `max_instances` (a card's cap: each instance holds its own copy of the weights) drops the layouts above it."""
    if cores == 1:
        return [(1, 1)]
    out = [(cores, 1), (2, cores)]
    if cores >= 4:
        out.append((2, cores // 2))
    return [(n, t) for n, t in out if max_instances is None or n <= max_instances] or [(1, cores)]


def isolated(fn: Any, *args: Any) -> Any:
    """Run one measurement in a fresh process: the thread pools of engines measured before (OpenVINO's TBB,
    ONNX Runtime's) would otherwise share the cores with the one being measured."""
    import multiprocessing
    from concurrent.futures import ProcessPoolExecutor

    with ProcessPoolExecutor(1, mp_context=multiprocessing.get_context("spawn")) as pool:
        return pool.submit(fn, *args).result()


def current_timing() -> tuple[float, int]:
    return MIN_SECONDS, MIN_REPEATS


def set_timing(timing: tuple[float, int]) -> None:
    global MIN_SECONDS, MIN_REPEATS
    MIN_SECONDS, MIN_REPEATS = timing


Runner = Callable[[str, str, Path, int, str], Any]  # (engine, precision, graph, threads, int8 recipe) -> `.run()`


def measure_layout(runner: Runner, engine: str, precision: str, onnx: Path, instances: int, threads: int,
                   latency_rows: Any, batch_rows: Any, timing: tuple[float, int],
                   recipe: str = "dynamic") -> dict[str, Any]:
    """One request alone on one instance (latency), and every instance busy with a batch at once (throughput).
    `runner`: the model kind's runner factory (a module-level function or a partial of one: it crosses into the
    measuring process)."""
    set_timing(timing)
    runners = [runner(engine, precision, onnx, threads, recipe) for _ in range(instances)]
    latency = time_forward(runners[0], latency_rows)
    for r in runners:
        r.run(batch_rows)
    done = [0] * instances
    stop = time.perf_counter() + max(MIN_SECONDS * 2, 1.0)

    def work(i: int) -> None:
        while time.perf_counter() < stop:
            runners[i].run(batch_rows)
            done[i] += 1

    started = time.perf_counter()
    workers = [threading.Thread(target=work, args=(i,)) for i in range(instances)]
    for w in workers:
        w.start()
    for w in workers:
        w.join()
    elapsed = time.perf_counter() - started
    return {"instances": instances, "threads": threads, "latency_ms": round(latency * 1000, 2),
            "rows_per_s": round(sum(done) * len(batch_rows) / elapsed, 1)}


MARGIN = 1.05  # a later candidate must beat an earlier one by more than this (noise on a shared host)


def choose_candidate(measured: list[Candidate]) -> Candidate:
    """The smallest worst-case loss on latency and throughput; earlier candidates (ONNX Runtime fp32 first)
    keep their place unless a later one is better by more than MARGIN."""
    best_latency = min(c.latency_ms for c in measured)
    best_rows = max(c.rows_per_s for c in measured)

    def regret(c: Candidate) -> float:
        return max(c.latency_ms / best_latency, best_rows / max(c.rows_per_s, 1e-9))

    least = min(regret(c) for c in measured)
    return next(c for c in measured if regret(c) <= least * MARGIN)


def choose_layout(layouts: list[dict[str, Any]]) -> dict[str, Any]:
    """Same rule as the engines: the smallest worst-case loss (latency ratio, throughput ratio) against the best
    of each, earlier layouts (one instance per core first: today's default) keeping their place within MARGIN."""
    best_latency = min(x["latency_ms"] for x in layouts)
    best_rows = max(x["rows_per_s"] for x in layouts)

    def regret(x: dict[str, Any]) -> float:
        return float(max(x["latency_ms"] / best_latency, best_rows / max(x["rows_per_s"], 1e-9)))

    least = min(regret(x) for x in layouts)
    return next(x for x in layouts if regret(x) <= least * MARGIN)


def report(card: Card, candidates: list[Candidate], timed: Any, say: Any) -> Candidate:
    """Log every candidate (`timed(c)`: its timings, also for a rejected one that was timed) and pick the best
    measured one; none measured is an error listing every candidate's reason."""
    for c in candidates:
        times = timed(c) if c.latency_ms else ""
        say(f"{card.id}: {label(c.engine, c.precision, c.recipe)}: {c.status}"
            + (f" {times}" if c.status == "measured" else f" ({c.reason}{'; measured ' + times if times else ''})")
            + (f" check {c.check}" if c.check else ""))
    measured = [c for c in candidates if c.status == "measured"]
    if not measured:
        reasons = "; ".join(f"{label(c.engine, c.precision, c.recipe)}: {c.reason}" for c in candidates)
        raise TuneError(f"{card.id}: no engine passed ({reasons})")
    return choose_candidate(measured)
