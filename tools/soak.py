"""Memory under a long, varied load (issue 23), served and in-process.

    python -m tools.soak serve --minutes 20 [--callers 16] [--out .cache/soak]   # a served stack, every surface
    python -m tools.soak serve --tune all-minilm-l6-v2=torch/bf16 ...   # one model held to an engine/precision
    python -m tools.soak serve --models all-minilm-l6-v2,pii-rampart,decision-zeroshot,multilingual-e5-small,\
        qwen-coder-state,decision-multilingual --decider decision-zeroshot,decision-multilingual \
        --preset-decider decision-multilingual   # the LM under load too (relevance and grounded read it)
    python -m tools.soak serve --minutes 12 --trim-at-end   # then malloc_trim(0) in each process: freed or in use?
    python -m tools.soak shapes --engine openvino --precision bf16 --seconds 60 [--unbounded]   # one engine
    python -m tools.soak ab --engine openvino --precision bf16 --seconds 120    # bucketed vs not, interleaved
    python -m tools.soak distinct --engine openvino --precision bf16 --shapes 48   # what a new shape leaves behind

`serve` starts its own `sr-gateway serve` on a free loopback port (Triton is its child), sends a closed-loop mix of
embeddings, classify, rerank and decisions requests (texts of 3–120 words, 1–16 inputs, 2–20 documents) from
`--callers` callers until the time is up, and samples the resident memory of the gateway, tritonserver and every
model instance (`triton_python_backend_stub`) every `--sample-s` seconds (RSS, and anonymous RSS as
"anon:<process>"): only the process tree it started. It
writes soak.json (samples, growth per minute after warm-up, requests, errors, latency percentiles) and soak.png.
`shapes` runs one engine in-process on random ragged batches (every batch a new shape, as Triton's ragged batching
gives) and prints its RSS timeline; `--unbounded` sets SR_BACKEND_UNBOUNDED=1 (no buckets, no cache caps: the old
settings). `ab` runs one engine with and without buckets, alternating batch by batch, and prints the throughput
ratio (one run, so a shared machine's noise hits both sides alike). `distinct` gives one engine `--shapes` input
shapes it has not seen (bucketed ones; the largest first, so buffers sized by the largest shape are full before
the count starts), then all of them again, and prints the heap in use (glibc's
mallinfo2: exact, unlike RSS, which keeps freed pages) after each pass: what each new shape leaves behind.
"""

from __future__ import annotations

import argparse
import asyncio
import ctypes
import ctypes.util
import json
import os
import random
import subprocess
import sys
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np

ROOT = Path(__file__).resolve().parents[1]
EMBEDDER, TAGGER, DECIDER = "all-minilm-l6-v2", "pii-rampart", "decision-zeroshot"
SURFACES = ("embeddings", "classify", "rerank", "decisions")
MODELS = f"{EMBEDDER},{TAGGER},{DECIDER}"
# decision-multilingual with what it reads through: its encoder, and the LM its relevance and grounded heads read
PRESET_DECIDER = "decision-multilingual"
WITH_LM = f"{MODELS},multilingual-e5-small,qwen-coder-state,{PRESET_DECIDER}"
_PROSE = ("the order was charged twice and my parcel never arrived please refund the second payment to my card "
          "write a python function that merges two sorted lists explain its running time and the memory it needs "
          "our offices close on public holidays refunds are accepted within thirty days of purchase contact "
          "jane.doe@example.com or call the support line on weekdays between nine and five the derivative of x "
          "squared is two x a good recipe for banana bread needs ripe bananas flour butter sugar eggs and an oven "
          "why is the sky blue rayleigh scattering of sunlight by molecules in the atmosphere")
WORDS = _PROSE.split()


# -- the load ----------------------------------------------------------------------------------------------------------
def text(rng: random.Random, low: int = 3, high: int = 120) -> str:
    return " ".join(rng.choice(WORDS) for _ in range(rng.randint(low, high)))


@dataclass(frozen=True)
class Targets:
    """The models each surface of the load calls (one picked at random per request), so one soak can hold every
    served model under load at once."""
    embedders: tuple[str, ...] = (EMBEDDER,)  # embeddings and rerank
    classifiers: tuple[str, ...] = (TAGGER,)
    deciders: tuple[str, ...] = (DECIDER,)
    preset_deciders: tuple[str, ...] = ()  # asked their two-part presets (relevance, grounded: the LM reads them)

    def of(self, surface: str) -> tuple[str, ...]:
        return {"embeddings": self.embedders, "rerank": self.embedders, "classify": self.classifiers,
                "decisions": self.deciders}[surface]


DEFAULT_TARGETS = Targets()
# WITH_LM under load: both deciders asked ad-hoc questions, and the multilingual one its two-part presets too
LM_TARGETS = Targets(deciders=(DECIDER, PRESET_DECIDER), preset_deciders=(PRESET_DECIDER,))


def body(surface: str, rng: random.Random, largest: bool = False,
         targets: Targets = DEFAULT_TARGETS, model: str | None = None) -> tuple[str, dict[str, Any]]:
    """One request of `surface` with varied lengths and row counts (every call a likely new ragged shape);
    `largest`: the most inputs of the longest texts the load ever sends; `model`: else one of the surface's targets."""
    model = model or rng.choice(targets.of(surface))

    def count(low: int, high: int) -> int:
        return high if largest else rng.randint(low, high)

    def some(low: int = 3, high: int = 120) -> str:
        return text(rng, high, high) if largest else text(rng, low, high)

    if surface == "embeddings":
        return "/v1/embeddings", {"model": model, "input": [some() for _ in range(count(1, 16))]}
    if surface == "classify":
        return "/v1/classify", {"model": model, "input": [some() for _ in range(count(1, 4))]}
    if surface == "rerank":
        return "/v1/rerank", {"model": model, "query": some(3, 20),
                              "documents": [some() for _ in range(count(2, 20))]}
    if model in targets.preset_deciders:  # one pair read by the encoder and the LM; a one-part preset beside it
        preset, parts = rng.choice((("relevance", ("request", "candidate")), ("grounded", ("context", "answer"))))
        return "/v1/decisions", {"model": model, "state": {part: some() for part in parts}, "questions": {
            "pair": {"type": "noul", "preset": preset}, "attack": {"type": "noul", "preset": "jailbreak"}}}
    return "/v1/decisions", {"model": model, "state": some(), "questions": {
        "relevant": {"type": "noul", "instructions": "Does the text ask for a refund?"},
        "kind": {"type": "choice", "instructions": "What is this text about?",
                 "choices": [{"key": "billing"}, {"key": "code"}, {"key": "other"}]}}}


@dataclass
class Load:
    latencies_ms: dict[str, list[float]] = field(default_factory=lambda: {s: [] for s in SURFACES})
    errors: dict[str, int] = field(default_factory=lambda: dict.fromkeys(SURFACES, 0))
    statuses: dict[str, int] = field(default_factory=dict)

    def summary(self) -> dict[str, Any]:
        out: dict[str, Any] = {}
        for s in SURFACES:
            lat = np.array(self.latencies_ms[s] or [0.0])
            out[s] = {"requests": len(self.latencies_ms[s]), "errors": self.errors[s],
                      **{f"p{q}_ms": round(float(np.percentile(lat, q)), 1) for q in (50, 90, 99)}}
        return out


async def load(url: str, surfaces: tuple[str, ...], callers: int, seconds: float, seed: int = 23,
               targets: Targets = DEFAULT_TARGETS) -> Load:
    """Closed loop: `callers` callers, each sends its next request when the previous one answered, until
    `seconds` have passed (bounded: it stops by itself). Each caller opens with the largest request of every
    surface, so buffers sized by the largest batch seen fill in the warm-up, not as a step in the measured part."""
    import aiohttp

    result = Load()
    deadline = time.monotonic() + seconds
    timeout = aiohttp.ClientTimeout(total=120)
    async with aiohttp.ClientSession(connector=aiohttp.TCPConnector(limit=callers), timeout=timeout) as session:

        async def caller(k: int) -> None:
            rng = random.Random(seed * 1000 + k)
            # the largest request of each surface to each of its models first
            opening = [(surface, model) for surface in surfaces for model in targets.of(surface)]
            while time.monotonic() < deadline:
                largest = bool(opening)
                surface, model = opening.pop() if opening else (rng.choice(surfaces), None)
                path, payload = body(surface, rng, largest, targets, model)
                started = time.perf_counter()
                try:
                    async with session.post(url + path, json=payload) as r:
                        await r.read()
                        status = r.status
                except (TimeoutError, aiohttp.ClientError):
                    status = 0
                result.latencies_ms[surface].append((time.perf_counter() - started) * 1000)
                result.statuses[str(status)] = result.statuses.get(str(status), 0) + 1
                if status != 200:
                    result.errors[surface] += 1

        await asyncio.gather(*(caller(k) for k in range(callers)))
    return result


# -- sampling ----------------------------------------------------------------------------------------------------------
def label(proc: Any) -> str:
    """A stable name for one process of the served tree across samples."""
    if proc.role == "model":
        return f"{proc.instance}"
    return proc.role if proc.role != "other" else f"{proc.instance}[{proc.pid}]"


ANON = "anon:"  # sample keys of anonymous resident memory: "anon:<process>"


def anon_rss(pid: int) -> int | None:
    """Anonymous resident bytes of `pid` (RssAnon: the heap and other private memory, what a leak grows). RSS also
    counts file-backed pages (the shared libraries, mapped weights), which the kernel drops and reads back as other
    processes need memory: on a shared host that moved every instance's RSS by up to 80 MiB at once."""
    try:
        for line in Path(f"/proc/{pid}/status").read_text().splitlines():
            if line.startswith("RssAnon:"):
                return int(line.split()[1]) * 1024
    except OSError:
        return None
    return None


def stop_process(proc: subprocess.Popen, grace_s: float) -> int:  # type: ignore[type-arg]
    """SIGTERM, then SIGKILL if it is still there after `grace_s`: every soak's own server goes this way."""
    if proc.poll() is None:
        proc.terminate()
        try:
            proc.wait(grace_s)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()
    return int(proc.returncode)


def tree_row(root: int) -> dict[str, float]:
    """RSS and anonymous RSS (MiB) of every process under `root` (gateway, tritonserver, model instances)."""
    from gateway.metrics import process_tree_memory

    row: dict[str, float] = {}
    for proc in process_tree_memory(root):
        row[label(proc)] = round(proc.rss_bytes / 2**20, 1)
        if (anon := anon_rss(proc.pid)) is not None:
            row[ANON + label(proc)] = round(anon / 2**20, 1)
    return row


def trim_in_place(root: int) -> dict[str, dict[str, float]]:
    """Anonymous RSS (MiB) of every process under `root` before and after glibc's malloc_trim(0) is called inside it
    (through gdb, which must be installed): what a process gives back is memory glibc held after it was freed, what
    stays is memory in use. It tells a leak from an allocator that keeps freed pages (docs/benchmarks.md)."""
    import shutil

    from gateway.metrics import process_tree_memory

    gdb = shutil.which("gdb")
    if gdb is None:
        raise SystemExit("--trim-at-end needs gdb (Debian package `gdb`)")
    out: dict[str, dict[str, float]] = {}
    for proc in process_tree_memory(root):
        before = anon_rss(proc.pid)
        subprocess.run([gdb, "-p", str(proc.pid), "-batch", "-ex", "call (int)malloc_trim(0)"],
                       capture_output=True, timeout=120, check=False)
        after = anon_rss(proc.pid)
        if before is not None and after is not None:
            out[label(proc)] = {"before_mib": round(before / 2**20, 2), "after_mib": round(after / 2**20, 2)}
    return out


async def sample_rows(read: Callable[[], dict[str, float]], every: float, until: float,
                      into: list[dict[str, Any]]) -> None:
    """One row of `read()` (name -> MiB) with its time since the start (`t`, s) every `every` seconds until the
    monotonic time `until` (the last row at or after it): the sampling loop of every soak (tools.soak_controlplane
    too)."""
    started = time.monotonic()
    while True:
        now = time.monotonic()
        into.append({"t": round(now - started, 1), **read()})
        if now >= until:
            return
        await asyncio.sleep(min(every, max(0.0, until - time.monotonic())))


async def sample(root: int, every: float, until: float, into: list[dict[str, Any]]) -> None:
    """RSS and anonymous RSS (MiB) of every process under `root` (gateway, tritonserver, model instances) every
    `every` seconds."""
    await sample_rows(lambda: tree_row(root), every, until, into)


def growth(samples: list[dict[str, Any]], warmup_s: float) -> dict[str, dict[str, float]]:
    """Per process: RSS at the end of warm-up and at the end (MiB), the least-squares slope after warm-up (MiB per
    minute) and the percentage growth per 10 minutes that slope means."""
    out: dict[str, dict[str, float]] = {}
    names = sorted({k for row in samples for k in row if k != "t"})
    for name in names:
        points = [(row["t"], row[name]) for row in samples if name in row and row["t"] >= warmup_s]
        if len(points) < 3:
            continue
        t, rss = np.array(points).T
        slope = float(np.polyfit(t / 60.0, rss, 1)[0])
        out[name] = {"after_warmup_mib": float(rss[0]), "end_mib": float(rss[-1]), "max_mib": float(rss.max()),
                     "mib_per_min": round(slope, 2), "pct_per_10min": round(100 * slope * 10 / float(rss[0]), 2),
                     **envelope(t, rss)}
    return out


def envelope(t: np.ndarray, rss: np.ndarray) -> dict[str, float]:
    """Growth per 10 minutes of the per-minute floor and peak (whole minutes after warm-up only). An engine that
    allocates a batch's activations and gives them back after each forward (PyTorch with malloc_trim) swings by
    ±70 MiB between samples, so a least-squares slope over a few minutes of samples measures when the samples fell,
    not a trend; a leak lifts the floor and the peak alike, a swinging allocator neither."""
    minute = np.floor((t - t[0]) / 60.0)
    whole = [m for m in np.unique(minute) if (t[minute == m].max() - t[minute == m].min()) >= 45.0]
    if len(whole) < 3:
        return {}
    floors = np.array([rss[minute == m].min() for m in whole])
    peaks = np.array([rss[minute == m].max() for m in whole])
    base = float(rss[0])
    return {"floor_pct_per_10min": round(100 * float(np.polyfit(whole, floors, 1)[0]) * 10 / base, 2),
            "peak_pct_per_10min": round(100 * float(np.polyfit(whole, peaks, 1)[0]) * 10 / base, 2)}


def plot(samples: list[dict[str, Any]], warmup_s: float, path: Path, title: str) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(10, 5))
    names = sorted({k for row in samples for k in row if k != "t" and not k.startswith(ANON)})
    for name in names:
        points = [(r["t"] / 60, r[name]) for r in samples if name in r]
        line, = ax.plot(*zip(*points, strict=True), label=name)
        anon = [(r["t"] / 60, r[ANON + name]) for r in samples if ANON + name in r]
        if anon:
            ax.plot(*zip(*anon, strict=True), color=line.get_color(), linestyle="--", linewidth=0.8)
    ax.axvline(warmup_s / 60, color="grey", linestyle=":", label="end of warm-up")
    ax.set_xlabel("minutes")
    ax.set_ylabel("RSS (MiB); dashed: anonymous RSS")
    ax.set_title(title)
    ax.legend(fontsize=7, loc="upper left")
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)


# -- a served stack ----------------------------------------------------------------------------------------------------
class Stack:
    """`sr-gateway serve` on a free loopback port, Triton as its child, until stopped (a context manager)."""

    def __init__(self, models: str, log: Path, env: dict[str, str] | None = None,
                 repository: Path | None = None) -> None:
        from tools.benchlib import free_port

        self.port = free_port()
        self.url = f"http://127.0.0.1:{self.port}"
        log.parent.mkdir(parents=True, exist_ok=True)
        args = [str(Path(sys.executable).parent / "sr-gateway"), "serve", "--host", "127.0.0.1", "--port",
                str(self.port), "--models", models]
        if repository is not None:
            args += ["--model-repository", str(repository)]
        self.log = log.open("w")
        self.proc = subprocess.Popen(args, stdout=self.log, stderr=subprocess.STDOUT, cwd=ROOT,
                                     env={**os.environ, **(env or {})})

    def wait_ready(self, timeout: float = 420) -> None:
        import httpx

        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            if self.proc.poll() is not None:
                raise RuntimeError(f"sr-gateway serve exited with {self.proc.returncode}; see {self.log.name}")
            try:
                health = httpx.get(self.url + "/health", timeout=2).json()
                if health.get("status") == "ready":
                    return
                if health.get("status") == "failed":
                    raise RuntimeError(f"the stack failed to start: {health}")
            except httpx.HTTPError:
                pass
            time.sleep(0.5)
        raise TimeoutError(f"sr-gateway serve not ready after {timeout} s; see {self.log.name}")

    def stop(self) -> int:
        code = stop_process(self.proc, 60)
        self.log.close()
        return code

    def __enter__(self) -> Stack:
        try:
            self.wait_ready()
        except BaseException:
            self.stop()
            raise
        return self

    def __exit__(self, *exc: object) -> None:
        self.stop()


async def soak(stack: Stack, surfaces: tuple[str, ...], callers: int, seconds: float,
               sample_s: float, targets: Targets = DEFAULT_TARGETS) -> tuple[Load, list[dict[str, Any]]]:
    samples: list[dict[str, Any]] = []
    sampler = asyncio.create_task(sample(stack.proc.pid, sample_s, time.monotonic() + seconds, samples))
    result = await load(stack.url, surfaces, callers, seconds, targets=targets)
    await sampler
    return result, samples


def forced_repository(models: str, forced: list[str], into: Path) -> Path:
    """A copy of the served models' directories with each `MODEL=ENGINE/PRECISION` of `forced` tuned to that
    engine and precision instead of the host's measured choice, so a soak can hold every engine the tuner may
    choose on some host to the same rule (the checked-out repository keeps its own tuning). The tune still runs
    the card's checks: a precision the card (or a card riding on it among `models`) does not allow, or one whose
    answers drift past the card's tolerance on this host, fails here, before any load."""
    import shutil

    from sr_build.tune import tune_repository

    repository = into / "repository"
    shutil.rmtree(repository, ignore_errors=True)
    repository.mkdir(parents=True)
    for name in models.split(","):
        shutil.copytree(ROOT / "model_repository" / name, repository / name,
                        ignore=shutil.ignore_patterns("__pycache__"))
    for spec in forced:
        model, _, choice = spec.partition("=")
        engine, _, precision = choice.partition("/")
        if not (model and engine and precision):
            raise SystemExit(f"--tune {spec!r}: expected MODEL=ENGINE/PRECISION")
        tune_repository(repository, only=[model], engine=engine, precision=precision, force=True)
    return repository


def run_serve(args: argparse.Namespace) -> dict[str, Any]:
    from tools.benchlib import machine

    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    env = {"SR_BACKEND_UNBOUNDED": "1"} if args.unbounded else {}
    seconds, warmup = args.minutes * 60, args.warmup_minutes * 60
    targets = Targets(*(tuple(n for n in names.split(",") if n)
                        for names in (args.embedder, args.classifier, args.decider, args.preset_decider)))
    repository = forced_repository(args.models, args.tune, out) if args.tune else None
    with Stack(args.models, out / "gateway.log", env, repository) as stack:
        started = time.time()
        result, samples = asyncio.run(soak(stack, tuple(args.surfaces.split(",")), args.callers, seconds,
                                           args.sample_s, targets))
        trimmed = trim_in_place(stack.proc.pid) if args.trim_at_end else None
    summary = result.summary()
    report = {"machine": machine(), "started": time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime(started)),
              "minutes": args.minutes, "warmup_minutes": args.warmup_minutes, "callers": args.callers,
              "models": args.models, "unbounded": args.unbounded,
              "forced": args.tune, "targets": vars(targets),
              "requests": sum(s["requests"] for s in summary.values()),
              "errors": sum(s["errors"] for s in summary.values()), "statuses": result.statuses,
              "throughput_rps": round(sum(s["requests"] for s in summary.values()) / seconds, 1),
              "surfaces": summary, "growth": growth(samples, warmup), "trimmed_at_end": trimmed, "samples": samples}
    (out / "soak.json").write_text(json.dumps(report, indent=1))
    plot(samples, warmup, out / "soak.png", f"RSS under a {args.minutes:g}-minute mixed soak, {args.callers} callers"
         + (" (unbounded: old settings)" if args.unbounded else ""))
    return report


# -- in-process --------------------------------------------------------------------------------------------------------
IDS = (1000, 19000)  # token ids within every served text model's vocabulary (pii-rampart's is the smallest: 19,730)


def random_rows(rng: np.random.Generator, low: int = 8, high: int = 128) -> list[Any]:
    """One ragged batch as Triton hands it to execute(): 1–32 rows of `low`–`high` tokens."""
    from sr_backend.ragged import Row

    return [Row(np.array([101, *rng.integers(*IDS, int(rng.integers(low, high + 1)) - 2), 102],
                         dtype=np.int64)) for _ in range(int(rng.integers(1, 33)))]


def _engine(args: argparse.Namespace) -> Any:
    from sr_backend.engines import load_engine

    onnx = ROOT / "model_repository" / args.model / "1" / "model.onnx"
    recipe = "nncf" if args.engine == "openvino" and args.precision == "int8" else "dynamic"
    return load_engine(args.engine, args.precision, onnx, args.threads, recipe=recipe)


def run_shapes(args: argparse.Namespace) -> dict[str, Any]:
    """RSS of this process over `--seconds` of random ragged batches through the RaggedRunner."""
    if args.unbounded:
        os.environ["SR_BACKEND_UNBOUNDED"] = "1"
    from gateway.metrics import process_tree_memory
    from sr_backend.ragged import RaggedRunner

    def rss() -> float:
        return round(process_tree_memory()[0].rss_bytes / 2**20, 1)

    runner = RaggedRunner(_engine(args))
    rng = np.random.default_rng(args.seed)
    runner.run(random_rows(rng))
    timeline, batches, started = [(0.0, rss())], 0, time.monotonic()
    while (elapsed := time.monotonic() - started) < args.seconds:
        runner.run(random_rows(rng))
        batches += 1
        if elapsed >= len(timeline) * args.sample_s:
            timeline.append((round(elapsed, 1), rss()))
    timeline.append((round(time.monotonic() - started, 1), rss()))
    return {"engine": args.engine, "precision": args.precision, "unbounded": args.unbounded,
            "seconds": args.seconds, "batches": batches, "rss_mib": timeline}


def run_ab(args: argparse.Namespace) -> dict[str, Any]:
    """Bucketed and unbucketed runners over one engine, alternating batch by batch on the same random batches."""
    from sr_backend.engines.shapes import COARSE_BUCKETS
    from sr_backend.ragged import DEFAULT_BUCKETS, Buckets, RaggedRunner

    engine = _engine(args)
    powers = Buckets(lengths=(8, 16, 32, 64, 128, 256, 512), rows=(1, 2, 4, 8, 16, 32, 64, 128))  # fewer still
    sides = {"bucketed": RaggedRunner(engine, buckets=DEFAULT_BUCKETS), "unbucketed": RaggedRunner(engine,
                                                                                                  buckets=None),
             "coarser": RaggedRunner(engine, buckets=COARSE_BUCKETS), "powers": RaggedRunner(engine, buckets=powers)}
    busy = dict.fromkeys(sides, 0.0)
    rows = dict.fromkeys(sides, 0)
    rng = np.random.default_rng(args.seed)
    started = time.monotonic()
    while time.monotonic() - started < args.seconds:
        batch = random_rows(rng)
        order = list(sides)
        random.Random(int(rng.integers(1 << 30))).shuffle(order)
        for name in order:
            t0 = time.perf_counter()
            sides[name].run(batch)
            busy[name] += time.perf_counter() - t0
            rows[name] += len(batch)
    rate = {k: rows[k] / busy[k] for k in sides}
    return {"engine": args.engine, "precision": args.precision, "seconds": args.seconds,
            "rows_per_s": {k: round(v, 1) for k, v in rate.items()},
            "bucketed_over_unbucketed": round(rate["bucketed"] / rate["unbucketed"], 3),
            "coarser_over_unbucketed": round(rate["coarser"] / rate["unbucketed"], 3),
            "powers_over_unbucketed": round(rate["powers"] / rate["unbucketed"], 3)}


class _MallInfo2(ctypes.Structure):
    _fields_ = [(name, ctypes.c_size_t) for name in ("arena", "ordblks", "smblks", "hblks", "hblkhd", "usmblks",
                                                     "fsmblks", "uordblks", "fordblks", "keepcost")]


def heap_in_use() -> float:
    """Bytes this process holds from glibc malloc (all arenas, mmapped blocks included), in MiB."""
    mallinfo2 = ctypes.CDLL(ctypes.util.find_library("c")).mallinfo2
    mallinfo2.restype = _MallInfo2
    info = mallinfo2()
    return round((info.uordblks + info.hblkhd) / 2**20, 1)


def distinct_shapes(count: int) -> list[tuple[int, int]]:
    """`count` distinct bucketed (rows, width) shapes, the cheapest first (every one a new entry in a per-shape
    cache)."""
    from sr_backend.engines.shapes import DEFAULT_BUCKETS

    shapes = sorted(((r, w) for r in DEFAULT_BUCKETS.rows for w in DEFAULT_BUCKETS.lengths),
                    key=lambda s: (s[0] * s[1], s))
    return shapes[:count]


def run_distinct(args: argparse.Namespace) -> dict[str, Any]:
    """Heap in use after loading, after the first few shapes, after every shape once, after every shape again."""
    if args.unbounded:
        os.environ["SR_BACKEND_UNBOUNDED"] = "1"
    engine = _engine(args)
    rng = np.random.default_rng(args.seed)

    def forward(rows: int, width: int) -> None:
        ids = rng.integers(*IDS, (rows, width), dtype=np.int64)
        feed = {"input_ids": ids, "attention_mask": np.ones_like(ids)}
        if "token_type_ids" in engine.inputs:
            feed["token_type_ids"] = np.zeros_like(ids)
        engine.forward(feed)

    shapes = distinct_shapes(args.shapes)
    heap = {"loaded": heap_in_use()}
    forward(*shapes[-1])  # the largest first: buffers sized by the largest shape seen are full before the count
    for rows, width in shapes[:args.first]:
        forward(rows, width)
    heap[f"first_{args.first}"] = heap_in_use()
    for rows, width in shapes[args.first:]:
        forward(rows, width)
    heap["all_once"] = heap_in_use()
    for rows, width in shapes:
        forward(rows, width)
    heap["all_twice"] = heap_in_use()
    new = len(shapes) - args.first
    return {"engine": args.engine, "precision": args.precision, "unbounded": args.unbounded, "shapes": len(shapes),
            "heap_in_use_mib": heap, "mib_per_new_shape": round((heap["all_once"] - heap[f"first_{args.first}"])
                                                                / max(1, new), 3)}


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    commands = parser.add_subparsers(dest="command", required=True)
    serve = commands.add_parser("serve", help="a served stack under a mixed varied load")
    serve.add_argument("--minutes", type=float, default=20.0)
    serve.add_argument("--warmup-minutes", type=float, default=2.0)
    serve.add_argument("--callers", type=int, default=16)
    serve.add_argument("--sample-s", type=float, default=5.0)
    serve.add_argument("--models", default=MODELS)
    serve.add_argument("--surfaces", default=",".join(SURFACES))
    serve.add_argument("--out", default=str(ROOT / ".cache" / "soak"))
    serve.add_argument("--unbounded", action="store_true", help="SR_BACKEND_UNBOUNDED=1: the old settings")
    serve.add_argument("--embedder", default=EMBEDDER, help="the models embeddings and rerank call (comma-separated)")
    serve.add_argument("--classifier", default=TAGGER, help="the models classify calls (comma-separated)")
    serve.add_argument("--decider", default=DECIDER, help="the models decisions calls (comma-separated)")
    serve.add_argument("--preset-decider", default="",
                       help="those of --decider asked their relevance/grounded presets, whose heads read the LM "
                            "(e.g. decision-multilingual; it must be in --models with its encoder and reader)")
    serve.add_argument("--tune", action="append", default=[], metavar="MODEL=ENGINE/PRECISION",
                       help="serve MODEL on this engine and precision instead of the tuner's choice (repeatable)")
    serve.add_argument("--trim-at-end", action="store_true",
                       help="after the load, call malloc_trim(0) in every process (gdb) and record what it gave back")
    helps = {"shapes": "RSS under random shapes", "ab": "throughput with vs without buckets",
             "distinct": "the heap a new input shape leaves behind"}
    for name, help_ in helps.items():
        sub = commands.add_parser(name, help="in-process: " + help_)
        sub.add_argument("--engine", default="openvino")
        sub.add_argument("--precision", default="bf16")
        sub.add_argument("--model", default=EMBEDDER)
        sub.add_argument("--threads", type=int, default=1)
        sub.add_argument("--seconds", type=float, default=60.0)
        sub.add_argument("--seed", type=int, default=23)
        sub.add_argument("--sample-s", type=float, default=5.0)
        sub.add_argument("--unbounded", action="store_true", help="SR_BACKEND_UNBOUNDED=1: the old settings")
        if name == "distinct":
            sub.add_argument("--shapes", type=int, default=48)
            sub.add_argument("--first", type=int, default=8, help="shapes seen before the count starts")
    args = parser.parse_args(argv)
    if args.command == "serve":
        report = run_serve(args)
        print(json.dumps({k: v for k, v in report.items() if k != "samples"}, indent=1))
        print(f"wrote {Path(args.out) / 'soak.json'} and soak.png")
    else:
        run = {"shapes": run_shapes, "ab": run_ab, "distinct": run_distinct}[args.command]
        print(json.dumps(run(args)))
    return 0


if __name__ == "__main__":
    sys.exit(main())
