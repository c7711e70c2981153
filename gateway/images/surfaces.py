"""The image paths of /v1/embeddings and /v1/classify: one picture per input item (an image_url content part).

Items a model cannot read fail in place with invalid_input naming the modality (a text item on an image-only model,
an audio part anywhere); a rejected picture (format, size, animation, truncation) fails its item with the reason.
"""

from __future__ import annotations

import time
from typing import Any

import numpy as np

from ..cards import HeadSpec
from ..errors import ApiError, ItemError, no_answer
from ..execution.limits import check_inputs
from ..execution.meta import response_meta
from ..heads import ensure_finite, softmax
from ..runtime import Runtime, ServedModel
from ..timing import Timing, charge
from .content import ImagePart, image_bytes, refusal
from .run import ImageJob, decode_jobs, forward_images


def reads_images_only(model: ServedModel) -> bool:
    return "image" in model.card.modalities and "text" not in model.card.modalities


def _jobs(model: ServedModel, values: list[Any]) -> list[ImageJob]:
    jobs = []
    for value in values:
        error = refusal(model.card, value)
        if error is not None:
            jobs.append(ImageJob(error=error))
            continue
        assert isinstance(value, ImagePart)
        try:
            jobs.append(ImageJob(data=image_bytes(value)))
        except ItemError as exc:
            jobs.append(ImageJob(error=exc))
    return jobs


def _usage(model: ServedModel) -> dict[str, Any]:
    tokens = model.card.image.tokens if model.card.image is not None else 1
    return {"tokens": tokens, "processed_tokens": tokens, "truncated": False}


async def _prepare(runtime: Runtime, model: ServedModel, values: list[Any], output: str,
                   deadline_ms: float | None, timing: Timing | None) -> tuple[list[ImageJob], float, float]:
    started = time.perf_counter()
    check_inputs(model, len(values))
    jobs = _jobs(model, values)
    await decode_jobs(model, jobs)
    charge(timing, "tokenize", started)  # decoding pictures is this surface's input preparation
    queue_ms, forward_ms = await forward_images(runtime, model, jobs, output, deadline_ms=deadline_ms, timing=timing)
    return jobs, queue_ms, forward_ms


async def embed_images(runtime: Runtime, model: ServedModel, values: list[Any], *, dimension: int, layer: int,
                       encoding_format: str, return_meta: bool, deadline_ms: float | None,
                       timing: Timing | None, vector: Any) -> dict[str, Any]:
    """Embeddings of pictures: the model's pooled, L2-normalised features (`meta.representation.modality` image)."""
    jobs, queue_ms, forward_ms = await _prepare(runtime, model, values, "EMBEDDING", deadline_ms, timing)
    mark = time.perf_counter()
    spec = model.card.embedding
    assert spec is not None
    data: list[dict[str, Any]] = []
    prompt_tokens = 0
    for index, job in enumerate(jobs):
        entry: dict[str, Any] = {"object": "embedding", "index": index}
        try:
            if job.result is None:
                raise no_answer(job.error)
            entry["embedding"] = vector(job.result.values, dimension, spec.normalized, encoding_format)
        except ItemError as error:
            entry.update(error=error.code, message=error.message)
            runtime.metrics.count_input(model.id, error.code)
        else:
            entry["input"] = _usage(model)
            prompt_tokens += entry["input"]["tokens"]
            runtime.metrics.count_input(model.id, "ok")
        data.append(entry)
    response: dict[str, Any] = {"object": "list", "data": data, "model": model.id,
                                "usage": {"prompt_tokens": prompt_tokens, "total_tokens": prompt_tokens}}
    if return_meta:
        response["meta"] = {
            **response_meta(model, queue_ms, forward_ms),
            "representation": {"model_sha256": model.card.model_sha256, "layer": layer, "dimension": dimension,
                               "normalized": spec.normalized, "modality": "image"},
        }
    charge(timing, "post", mark)
    return response


async def classify_images(runtime: Runtime, model: ServedModel, head: HeadSpec, values: list[Any], *,
                          return_meta: bool, deadline_ms: float | None, timing: Timing | None) -> dict[str, Any]:
    """A sequence head over pictures: softmax probabilities of every label and the top label."""
    if head.kind != "sequence":
        raise ApiError("invalid_request", f"head {head.name} of model {model.id} is not a sequence head")
    jobs, queue_ms, forward_ms = await _prepare(runtime, model, values, "LOGITS", deadline_ms, timing)
    mark = time.perf_counter()
    results: list[dict[str, Any]] = []
    input_tokens = 0
    for index, job in enumerate(jobs):
        try:
            if job.result is None:
                raise no_answer(job.error)
            probs = softmax(job.result.values)
            ensure_finite(probs)
        except ItemError as error:
            results.append({"index": index, "error": error.code, "message": error.message})
            runtime.metrics.count_input(model.id, error.code)
            continue
        usage = _usage(model)
        input_tokens += usage["processed_tokens"]
        results.append({"index": index, "probabilities": {lab: round(float(p), 6)
                                                          for lab, p in zip(head.labels, probs, strict=True)},
                        "label": head.labels[int(np.argmax(probs))], "input": usage})
        runtime.metrics.count_input(model.id, "ok")
    response: dict[str, Any] = {"model": model.id, "head": head.name, "kind": head.kind, "labels": head.labels,
                                "results": results, "usage": {"input_tokens": input_tokens, "output_tokens": 0}}
    if return_meta:
        response["meta"] = {**response_meta(model, queue_ms, forward_ms), "head": head.name}
    charge(timing, "post", mark)
    return response
