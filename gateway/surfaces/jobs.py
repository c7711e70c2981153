"""Jobs — prepared model inputs — run through Triton: admission, deadlines, per-input failures, phase times, metrics.

Every surface turns its request into `Job`s (one model input each) and calls `run_jobs`; what comes back is a
`Result` or an `ItemError` per job, so one failing input never fails its siblings.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from contextvars import ContextVar
from dataclasses import dataclass

from ..errors import ApiError, ItemError, too_long
from ..runtime import Runtime, ServedModel
from ..text import Encoded, InputTooLong
from ..timing import Timing, charge_model
from ..triton import Result, TritonFailure

# Most Triton calls one HTTP request keeps in flight. The gRPC channel carries a bounded number of concurrent
# streams; without this bound a request with thousands of inputs would take them all and every other request
# would wait behind it. Triton still sees enough at once to fill its batches (max_batch_size 128 per model).
PER_REQUEST_IN_FLIGHT = 64


@dataclass
class Job:
    ids: list[int]
    type_ids: list[int] | None = None
    layer: int | None = None  # embedders: a declared earlier layer (None: the model's default, its last)
    result: Result | None = None
    error: ItemError | None = None
    out_of_memory: bool = False  # its forward ran out of device memory (the request fails: 413 alone, 429 shared)


def encode_each(texts: list[str], encode: Callable[[str], Encoded], *, noun: str = "input",
                pairs: bool = False) -> tuple[list[Job], list[Encoded | None]]:
    """One job per text; an empty or over-budget text becomes that job's item error, never the request's."""
    jobs: list[Job] = []
    encoded: list[Encoded | None] = []
    for text in texts:
        if not text:
            jobs.append(Job([], error=ItemError("invalid_input", f"the {noun} is an empty string")))
            encoded.append(None)
            continue
        try:
            enc = encode(text)
        except InputTooLong as exc:
            jobs.append(Job([], error=too_long(exc)))
            encoded.append(None)
            continue
        jobs.append(Job(enc.ids, enc.type_ids if pairs else None))
        encoded.append(enc)
    return jobs, encoded


def deadline_ns(deadline_ms: float | None, timing: Timing | None) -> int | None:
    """Unix-ns deadline measured from the request's arrival (the handler start)."""
    if deadline_ms is None:
        return None
    elapsed = time.perf_counter() - timing.started if timing is not None else 0.0
    # any finite number above 0 is a valid deadline_ms; past a year it is as good as none (and int(inf) fails)
    return time.time_ns() + int((min(deadline_ms, 365 * 86_400_000.0) / 1000 - elapsed) * 1e9)


async def _run(runtime: Runtime, model: ServedModel, job: Job, deadline: int | None) -> None:
    assert runtime.triton is not None
    timeout_us = None
    if deadline is not None:
        left = deadline - time.time_ns()
        if left <= 0:
            job.error = ItemError("deadline_exceeded", "the deadline passed before this input was run")
            return
        timeout_us = max(1, left // 1000)
    try:
        job.result = await runtime.triton.infer(model.card.triton_name, model.output, job.ids, job.type_ids,
                                                timeout_us=timeout_us, layer=job.layer)
    except TritonFailure as exc:
        job.out_of_memory = exc.out_of_memory
        if exc.deadline:
            job.error = ItemError("deadline_exceeded", "the deadline passed while this input was queued")
        elif exc.unavailable:
            job.error = ItemError("unavailable", f"model {model.id} is unavailable: {exc}")
        else:
            job.error = ItemError("invalid_model_output", f"the model failed on this input: {exc}")


def default_layer(runtime: Runtime, triton_name: str) -> int | None:
    """The default layer of a Triton model that pools several (its own card declares them), else None. Inputs
    that want the default send it as LAYER too: Triton batches only requests with the same inputs, so without it
    default-layer inputs (embeddings, rerank, zero-shot heads, decisions) would never share a forward with
    earlier-layer ones (measured: none did in 300 mixed requests)."""
    for served in runtime.models.values():
        spec, card = served.card.embedding, served.card
        if spec is not None and len(spec.layers) > 1 and card.triton_model is None and card.triton_name == triton_name:
            return spec.layers[-1]
    return None


def phase_times(results: list[Result], submitted_ns: int) -> tuple[float, float]:
    """(queue_ms, forward_ms) of one request from Triton-side timestamps.

    forward: the time covered by its inputs' executions, from the start of each execute() in Triton until the
    answer is back (readout included), overlapping executions counted once. queue: the rest of the time from the
    first submission until the last answer: waiting before the first forward and between forwards.
    """
    if not results:
        return 0.0, 0.0
    spans = sorted((max(r.execution.started_ns, submitted_ns), r.received_ns) for r in results)
    forward = 0
    start, end = spans[0]
    for s, e in spans[1:]:
        if s > end:
            forward += end - start
            start, end = s, e
        else:
            end = max(end, e)
    forward += end - start
    span = max(r.received_ns for r in results) - submitted_ns
    return max(0.0, (span - forward) / 1e6), forward / 1e6


# A job group (one bundle): identical inputs for one Triton model with one deadline, from any of its tasks, are run
# once and answered to every task that sent them.
_GROUP: ContextVar[dict[tuple[object, ...], asyncio.Future[tuple[Result | None, ItemError | None]]] | None] = \
    ContextVar("job_group", default=None)


@contextmanager
def job_group() -> Iterator[None]:
    """Inside this block (and the tasks it starts), identical model inputs are run once."""
    token = _GROUP.set({})
    try:
        yield
    finally:
        _GROUP.reset(token)


async def run_jobs(runtime: Runtime, model: ServedModel, jobs: list[Job], *, deadline_ms: float | None = None,
                  timing: Timing | None = None) -> tuple[float, float]:
    """Run every job without an error yet; returns (queue_ms, forward_ms), also added to `timing`."""
    candidates = [j for j in jobs if j.error is None]
    default = default_layer(runtime, model.card.triton_name)
    for job in candidates:
        if job.layer is None:
            job.layer = default
    deadline = deadline_ns(deadline_ms, timing)
    submitted = time.time_ns()
    group = _GROUP.get()
    runnable: list[Job] = []
    waiting: list[tuple[Job, asyncio.Future[tuple[Result | None, ItemError | None]]]] = []
    owned: dict[int, asyncio.Future[tuple[Result | None, ItemError | None]]] = {}
    for job in candidates:
        if group is None:
            runnable.append(job)
            continue
        key = (model.card.triton_name, tuple(job.ids), tuple(job.type_ids or ()), job.layer, deadline_ms)
        future = group.get(key)
        if future is None:
            group[key] = owned[id(job)] = asyncio.get_running_loop().create_future()
            runnable.append(job)
        else:
            waiting.append((job, future))
    alone = not runtime.inflight.get(model.card.triton_name)  # nothing else in flight on this model
    try:
        runtime.admit(model, len(runnable))
    except ApiError as exc:  # a job group is admitted all or nothing: tasks waiting on these inputs fail alike
        for shared_key, future in list((group or {}).items()):
            if group is not None and future in owned.values():
                del group[shared_key]
                future.set_exception(exc)
                future.exception()  # retrieved here, so an unawaited one raises no warning
        raise
    window = asyncio.Semaphore(PER_REQUEST_IN_FLIGHT)

    async def run(job: Job) -> None:
        async with window:
            await _run(runtime, model, job, deadline)

    try:
        if len(runnable) == 1:
            # Most requests carry one input. Awaiting it here saves a task and gather's wake-up: each is one more
            # event-loop pass before the handler resumes, and under load one pass serves every ready request
            # (measured: own time p50 at C=32 2.5 ms through gather, 0.29-0.38 ms direct; docs/benchmarks.md).
            await _run(runtime, model, runnable[0], deadline)
        elif runnable:
            await asyncio.gather(*(run(j) for j in runnable))
    finally:
        runtime.release(model, len(runnable))
        for job in runnable:
            future = owned.get(id(job))
            if future is not None and not future.done():
                future.set_result((job.result, job.error or (None if job.result is not None else ItemError(
                    "unavailable", "the input was not run"))))
    for job, future in waiting:
        job.result, job.error = await asyncio.shield(future)
    if any(j.out_of_memory for j in runnable):
        # Spec: a forward out of memory is the request's own fault when it ran alone (413: send less), and a
        # shared forward's when others were in it (429: try again).
        if alone:
            raise ApiError("request_too_large", f"model {model.id} ran out of memory on this request's inputs; "
                                                "send fewer or shorter inputs")
        raise ApiError("overloaded", f"model {model.id} ran out of memory in a forward shared with other requests")
    answered = [j.result for j in runnable + [job for job, _ in waiting] if j.result is not None]
    queue_ms, forward_ms = phase_times(answered, submitted)
    ran = [j.result for j in runnable if j.result is not None]  # what this call itself sent (metrics count it once)
    for e in {(r.execution.started_ns, r.execution.forward_ns): r.execution for r in ran}.values():
        runtime.metrics.child(runtime.metrics.batch_rows, model.id).observe(e.rows)
        runtime.metrics.child(runtime.metrics.batch_tokens, model.id).observe(e.tokens)
    runtime.metrics.child(runtime.metrics.input_tokens, model.id).inc(sum(len(j.ids) for j in runnable))
    charge_model(timing, queue_ms, forward_ms)
    return queue_ms, forward_ms
