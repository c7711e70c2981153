"""Running pictures through an image model in Triton: decode → preprocess → one Triton request per picture.

Only what is particular to pictures lives here (decoding, preprocessing, the input tensor's name); admission,
deadlines, the failure → error mapping, job groups and phase times are the execution core's
(`gateway/execution/jobs.py`), so a picture fails exactly as a text does, and a bundle runs a picture once.
"""

from __future__ import annotations

import asyncio
import hashlib
from dataclasses import dataclass

import numpy as np

from ..errors import ItemError
from ..execution.jobs import Job, Tensors, run_jobs
from ..runtime import Runtime, ServedModel
from ..timing import Timing
from ..triton import Result
from .decode import DecodedImage, ImageRejected, decode_async
from .preprocess import PREPROCESS

# The Triton input each preprocessing feeds (see model_repository/*/config.pbtxt of the image models).
INPUT_TENSOR = {"efficientnet-lite": "PIXELS", "ppocr": "IMAGE"}

# Pictures larger than this many pixel values are preprocessed on a worker thread, off the event loop.
INLINE_PIXELS = 1 << 20


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


def _tensors(preprocess: str, job: ImageJob, output: str) -> Tensors:
    """The core's view of a decoded picture: its input tensor, built when it runs, and (with its bytes) an
    identity, so a bundle that sends the same picture twice to one model runs it once."""
    image = job.image
    assert image is not None

    async def build() -> dict[str, np.ndarray]:
        pixels = await asyncio.to_thread(PREPROCESS[preprocess], image) if image.pixels.size > INLINE_PIXELS \
            else PREPROCESS[preprocess](image)
        return {INPUT_TENSOR[preprocess]: np.ascontiguousarray(pixels[None])}

    data = job.data
    identity = (lambda: (preprocess, hashlib.blake2b(data).digest())) if data is not None else None
    return Tensors(output, build, identity)


async def forward_images(runtime: Runtime, model: ServedModel, jobs: list[ImageJob], output: str, *,
                         deadline_ms: float | None = None, timing: Timing | None = None) -> tuple[float, float]:
    """Run every decoded job through the execution core; returns (queue_ms, forward_ms), also added to `timing`.
    A forward out of memory raises the request's ApiError (413 alone, 429 shared), as for texts."""
    runnable = [j for j in jobs if j.error is None and j.image is not None]
    preprocess = image_spec(model)[0] if runnable else ""
    core = [Job(tensors=_tensors(preprocess, job, output)) for job in runnable]
    try:
        return await run_jobs(runtime, model, core, deadline_ms=deadline_ms, timing=timing)
    finally:
        for job, ran in zip(runnable, core, strict=True):
            job.result, job.error = ran.result, ran.error
