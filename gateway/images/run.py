"""Running pictures through an image model in Triton: decode → preprocess → one Triton request per picture.

Admission, deadlines, per-picture failures and phase times work as for text inputs (surfaces/jobs.py): the
dynamic batcher puts pictures of many HTTP requests into one execute(), and one bad picture fails only its item.
"""

from __future__ import annotations

import asyncio
import time
from dataclasses import dataclass

import numpy as np

from ..errors import ItemError
from ..runtime import Runtime, ServedModel
from ..surfaces.jobs import PER_REQUEST_IN_FLIGHT, deadline_ns, phase_times
from ..timing import Timing, charge_model
from ..triton import Result, TritonFailure
from .decode import DecodedImage, ImageRejected, decode_async
from .preprocess import PREPROCESS

# The Triton input each preprocessing feeds (see model_repository/*/config.pbtxt of the image models).
INPUT_TENSOR = {"efficientnet-lite": "PIXELS", "ppocr": "IMAGE"}


@dataclass
class ImageJob:
    """One picture: its bytes in, its decoded form and model answer (or an item error) out."""

    data: bytes | None = None
    image: DecodedImage | None = None
    result: Result | None = None
    error: ItemError | None = None


def image_spec(model: ServedModel) -> tuple[str, int]:
    card = model.card
    if card.image is None or card.image_max_pixels is None:
        raise ItemError("invalid_input", f"model {model.id} has no image modality")
    return card.image.preprocess, card.image_max_pixels


async def decode_jobs(model: ServedModel, jobs: list[ImageJob]) -> None:
    """Decode every job that has bytes (bounded pool, in parallel); a rejected picture becomes its item error."""
    _, max_pixels = image_spec(model)

    async def one(job: ImageJob) -> None:
        assert job.data is not None
        try:
            job.image = await decode_async(job.data, max_pixels)
        except ImageRejected as exc:
            job.error = ItemError("invalid_input", f"the image is rejected: {exc}")

    await asyncio.gather(*(one(j) for j in jobs if j.error is None and j.data is not None and j.image is None))


async def _run(runtime: Runtime, model: ServedModel, job: ImageJob, output: str, deadline: int | None) -> None:
    assert runtime.triton is not None and job.image is not None
    preprocess, _ = image_spec(model)
    timeout_us = None
    if deadline is not None:
        left = deadline - time.time_ns()
        if left <= 0:
            job.error = ItemError("deadline_exceeded", "the deadline passed before this image was run")
            return
        timeout_us = max(1, left // 1000)
    pixels = await asyncio.to_thread(PREPROCESS[preprocess], job.image) if job.image.pixels.size > 1 << 20 \
        else PREPROCESS[preprocess](job.image)
    try:
        job.result = await runtime.triton.infer_tensors(
            model.card.triton_name, {INPUT_TENSOR[preprocess]: np.ascontiguousarray(pixels[None])}, output,
            timeout_us=timeout_us)
    except TritonFailure as exc:
        if exc.deadline:
            job.error = ItemError("deadline_exceeded", "the deadline passed while this image was queued")
        elif exc.unavailable:
            job.error = ItemError("unavailable", f"model {model.id} is unavailable: {exc}")
        else:
            job.error = ItemError("invalid_model_output", f"the model failed on this image: {exc}")


async def forward_images(runtime: Runtime, model: ServedModel, jobs: list[ImageJob], output: str, *,
                         deadline_ms: float | None = None, timing: Timing | None = None) -> tuple[float, float]:
    """Run every decoded job; returns (queue_ms, forward_ms), also added to `timing`."""
    runnable = [j for j in jobs if j.error is None and j.image is not None]
    deadline = deadline_ns(deadline_ms, timing)
    submitted = time.time_ns()
    runtime.admit(model, len(runnable))
    window = asyncio.Semaphore(PER_REQUEST_IN_FLIGHT)

    async def run(job: ImageJob) -> None:
        async with window:
            await _run(runtime, model, job, output, deadline)

    try:
        await asyncio.gather(*(run(j) for j in runnable))
    finally:
        runtime.release(model, len(runnable))
    answered = [j.result for j in runnable if j.result is not None]
    queue_ms, forward_ms = phase_times(answered, submitted)
    for e in {(r.execution.started_ns, r.execution.forward_ns): r.execution for r in answered}.values():
        runtime.metrics.child(runtime.metrics.batch_rows, model.id).observe(e.rows)
    charge_model(timing, queue_ms, forward_ms)
    return queue_ms, forward_ms
