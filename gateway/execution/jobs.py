"""Jobs — prepared model inputs — run through Triton: admission, deadlines, per-input failures, phase times, metrics.

Every caller turns its request into `Job`s (one model input each: token ids, or named tensors such as a picture's
pixels) and calls `run_jobs`; what comes back is a `Result` or an `ItemError` per job, so one failing input never
fails its siblings, and a forward out of memory fails the request the same way whatever the input was.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Awaitable, Callable, Hashable, Iterator
from contextlib import contextmanager
from contextvars import ContextVar
from dataclasses import dataclass, field

import numpy as np

from ..errors import ApiError, ItemError, too_long
from ..runtime import Runtime, ServedModel
from ..text import Encoded, InputTooLong
from ..timing import Timing, charge_model
from ..triton import Result, TritonFailure
from .deadlines import deadline_ns, timeout_us
from .failures import failure_error
from .phases import phase_times

# Most Triton calls one HTTP request keeps in flight. The gRPC channel carries a bounded number of concurrent
# streams; without this bound a request with thousands of inputs would take them all and every other request
# would wait behind it. Triton still sees enough at once to fill its batches (max_batch_size 128 per model).
PER_REQUEST_IN_FLIGHT = 64


@dataclass
class Tensors:
    """Named input tensors of one job (a picture), built only when the job runs, so a request's pictures are never
    all preprocessed at once."""

    output: str  # the Triton output to read
    build: Callable[[], Awaitable[dict[str, np.ndarray]]]
    identity: Callable[[], Hashable] | None = None  # what makes two jobs one input (job groups); None: never shared
    noun: str = "image"  # what the input is called in its item errors


@dataclass
class Job:
    ids: list[int] = field(default_factory=list)
    type_ids: list[int] | None = None
    layer: int | None = None  # embedders: a declared earlier layer (None: the model's default, its last)
    tensors: Tensors | None = None  # named tensors instead of token ids
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


async def _run(runtime: Runtime, model: ServedModel, job: Job, deadline: int | None) -> None:
    assert runtime.inference is not None
    noun = job.tensors.noun if job.tensors is not None else "input"
    timeout = timeout_us(deadline)
    if timeout == 0:
        job.error = ItemError("deadline_exceeded", f"the deadline passed before this {noun} was run")
        return
    try:
        if job.tensors is not None:
            inputs = await job.tensors.build()
            job.result = await runtime.inference.infer_tensors(model.card.triton_name, inputs, job.tensors.output,
                                                               timeout_us=timeout)
        else:
            job.result = await runtime.inference.infer(model.card.triton_name, model.output, job.ids, job.type_ids,
                                                       timeout_us=timeout, layer=job.layer)
    except TritonFailure as exc:
        job.out_of_memory = exc.out_of_memory
        job.error = failure_error(exc, model.id, noun)


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


# A job group (one bundle): identical inputs for one Triton model with one deadline, from any of its tasks, are run
# once and answered to every task that sent them.
_Shared = asyncio.Future[tuple[Result | None, ItemError | None]]
_GROUP: ContextVar[dict[tuple[object, ...], _Shared] | None] = ContextVar("job_group", default=None)


@contextmanager
def job_group() -> Iterator[None]:
    """Inside this block (and the tasks it starts), identical model inputs are run once."""
    token = _GROUP.set({})
    try:
        yield
    finally:
        _GROUP.reset(token)


def _group_key(model: ServedModel, job: Job, deadline_ms: float | None) -> tuple[object, ...] | None:
    """What makes two jobs of a group one input; None for a job that is never shared."""
    if job.tensors is not None:
        if job.tensors.identity is None:
            return None
        return (model.card.triton_name, job.tensors.output, job.tensors.identity(), deadline_ms)
    return (model.card.triton_name, tuple(job.ids), tuple(job.type_ids or ()), job.layer, deadline_ms)


async def run_jobs(runtime: Runtime, model: ServedModel, jobs: list[Job], *, deadline_ms: float | None = None,
                   timing: Timing | None = None) -> tuple[float, float]:
    """Run every job without an error yet; returns (queue_ms, forward_ms), also added to `timing`."""
    candidates = [j for j in jobs if j.error is None]
    default = default_layer(runtime, model.card.triton_name)
    for job in candidates:
        if job.layer is None and job.tensors is None:
            job.layer = default
    deadline = deadline_ns(deadline_ms, timing)
    submitted = time.time_ns()
    group = _GROUP.get()
    runnable: list[Job] = []
    waiting: list[tuple[Job, _Shared]] = []
    owned: dict[int, _Shared] = {}
    for job in candidates:
        key = _group_key(model, job, deadline_ms) if group is not None else None
        if group is None or key is None:
            runnable.append(job)
            continue
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
                                                "send fewer or smaller inputs")
        raise ApiError("overloaded", f"model {model.id} ran out of memory in a forward shared with other requests")
    answered = [j.result for j in runnable + [job for job, _ in waiting] if j.result is not None]
    queue_ms, forward_ms = phase_times(answered, submitted)
    ran = [j for j in runnable if j.result is not None]  # what this call itself sent (metrics count it once)
    executions = {(j.result.execution.started_ns, j.result.execution.forward_ns): (j.result.execution, j.tensors)
                  for j in ran if j.result is not None}
    for e, tensors in executions.values():
        runtime.metrics.child(runtime.metrics.batch_rows, model.id).observe(e.rows)
        if tensors is None:  # a picture's forward has rows, not tokens
            runtime.metrics.child(runtime.metrics.batch_tokens, model.id).observe(e.tokens)
    runtime.metrics.child(runtime.metrics.input_tokens, model.id).inc(sum(len(j.ids) for j in runnable))
    charge_model(timing, queue_ms, forward_ms)
    return queue_ms, forward_ms
