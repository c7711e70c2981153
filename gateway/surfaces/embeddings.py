"""POST /v1/embeddings — OpenAI-compatible embeddings (float or base64 little-endian float32).

Each input is its own Triton request, so Triton's dynamic batcher can put inputs of many HTTP requests into one
execute(); per-input failures (too long, deadline) are answered in place and never fail their siblings.
"""

from __future__ import annotations

import asyncio
import base64
import time
from dataclasses import dataclass
from typing import Any, Literal

import numpy as np
from aiohttp import web
from pydantic import Field, StrictBool, StrictInt, StrictStr

from ..errors import ApiError, ItemError
from ..runtime import DEVICE, ENGINE, Runtime, ServedModel
from ..triton import Result, TritonFailure
from .common import Call, Strict, parse, surface
from .tokens import Encoded, encode


class EmbeddingsOptions(Strict):
    overflow: Literal["reject", "truncate"] = "reject"
    max_tokens: StrictInt | None = Field(default=None, ge=1)
    deadline_ms: float | StrictInt | None = Field(default=None, gt=0)
    return_meta: StrictBool = False


class EmbeddingsRequest(Strict):
    model: StrictStr | None = None
    input: StrictStr | list[StrictStr] = Field(min_length=1)
    encoding_format: Literal["float", "base64"] = "float"
    dimensions: StrictInt | None = None
    layer: StrictInt | None = None
    input_type: StrictStr | None = None
    user: StrictStr | None = None
    options: EmbeddingsOptions = EmbeddingsOptions()


@dataclass
class Item:
    index: int
    encoded: Encoded | None = None
    vector: Result | None = None
    error: ItemError | None = None


def _check(req: EmbeddingsRequest, model: ServedModel) -> tuple[int, int, int]:
    """Request-level checks against the card: (budget, dimension, layer)."""
    spec = model.card.embedding
    assert spec is not None
    limits = model.card.limits
    texts = [req.input] if isinstance(req.input, str) else req.input
    if len(texts) > limits.max_inputs:
        raise ApiError("invalid_request", f"input has {len(texts)} items; model {model.id} takes at most "
                                          f"{limits.max_inputs} per request")
    dimension = req.dimensions if req.dimensions is not None else max(spec.dimensions)
    if dimension not in spec.dimensions:
        raise ApiError("invalid_request", f"dimensions must be one of {spec.dimensions} for model {model.id}")
    layer = req.layer if req.layer is not None else max(spec.layers)
    if layer not in spec.layers:
        raise ApiError("invalid_request", f"layer must be one of {spec.layers} for model {model.id}")
    if req.input_type is not None and req.input_type not in spec.input_types:
        raise ApiError("invalid_request", f"model {model.id} takes no input_type"
                       if not spec.input_types else f"input_type must be one of {spec.input_types}")
    budget = limits.max_input_tokens
    if req.options.max_tokens is not None:
        if req.options.max_tokens > budget:
            raise ApiError("invalid_request", f"options.max_tokens {req.options.max_tokens} exceeds model "
                                              f"{model.id}'s max_input_tokens {budget}")
        budget = req.options.max_tokens
    return budget, dimension, layer


async def _run(runtime: Runtime, model: ServedModel, item: Item, deadline_ns: int | None) -> None:
    assert runtime.triton is not None and item.encoded is not None
    timeout_us = None
    if deadline_ns is not None:
        left = deadline_ns - time.time_ns()
        if left <= 0:
            item.error = ItemError("deadline_exceeded", "the deadline passed before this input was run")
            return
        timeout_us = max(1, left // 1000)
    try:
        item.vector = await runtime.triton.infer(model.card.triton_name, model.output, item.encoded.ids,
                                                 timeout_us=timeout_us)
    except TritonFailure as exc:
        if exc.deadline:
            item.error = ItemError("deadline_exceeded", "the deadline passed while this input was queued")
        elif exc.unavailable:
            item.error = ItemError("unavailable", f"model {model.id} is unavailable: {exc}")
        else:
            item.error = ItemError("invalid_model_output", f"the model failed on this input: {exc}")


def _vector(values: np.ndarray, dimension: int, normalized: bool, fmt: str) -> Any:
    if dimension < values.shape[0]:  # Matryoshka: truncate, then re-normalise
        values = values[:dimension]
        if normalized:
            values = values / max(float(np.linalg.norm(values)), 1e-12)
    values = values.astype("<f4", copy=False)
    if not np.all(np.isfinite(values)):
        raise ApiError("internal_error", "the model produced a non-finite number")
    if fmt == "base64":
        return base64.b64encode(values.tobytes()).decode("ascii")
    return values  # serialised by orjson straight from the float32 array


def phase_times(vectors: list[Result], submitted_ns: int) -> tuple[float, float]:
    """(queue_ms, forward_ms) of one request from Triton-side timestamps.

    forward: the time covered by its inputs' executions, from the start of each execute() in Triton until the
    answer is back (readout included), overlapping executions counted once. queue: the rest of the time from the
    first submission until the last answer: waiting before the first forward and between forwards.
    """
    if not vectors:
        return 0.0, 0.0
    spans = sorted((max(v.execution.started_ns, submitted_ns), v.received_ns) for v in vectors)
    forward = 0
    start, end = spans[0]
    for s, e in spans[1:]:
        if s > end:
            forward += end - start
            start, end = s, e
        else:
            end = max(end, e)
    forward += end - start
    span = max(v.received_ns for v in vectors) - submitted_ns
    return max(0.0, (span - forward) / 1e6), forward / 1e6


async def embed(runtime: Runtime, model: ServedModel, req: EmbeddingsRequest, call: Call | None = None,
                ) -> dict[str, Any]:
    """The surface's work, shared by the HTTP handler and the readiness (golden) check."""
    started = time.perf_counter()
    budget, dimension, layer = _check(req, model)
    texts = [req.input] if isinstance(req.input, str) else req.input
    items = [Item(i) for i in range(len(texts))]
    assert model.tokenizer is not None
    for item, text in zip(items, texts, strict=True):
        try:
            item.encoded = encode(model.tokenizer, text, budget, req.options.overflow)
        except ItemError as exc:
            item.error = exc
    runnable = [it for it in items if it.error is None]
    if call is not None:
        started = call.timing.add("tokenize", started)
    deadline_ns = None
    if req.options.deadline_ms is not None:
        origin = call.timing.started if call is not None else started
        deadline_ns = time.time_ns() + int((req.options.deadline_ms / 1000 - (time.perf_counter() - origin)) * 1e9)
    submitted = time.time_ns()
    runtime.admit(model, len(runnable))
    try:
        await asyncio.gather(*(_run(runtime, model, it, deadline_ns) for it in runnable))
    finally:
        runtime.release(model, len(runnable))
    answered = [it.vector for it in runnable if it.vector is not None]
    queue_ms, forward_ms = phase_times(answered, submitted)
    mark = time.perf_counter()
    spec = model.card.embedding
    assert spec is not None
    data: list[dict[str, Any]] = []
    prompt_tokens = 0
    for it in items:
        entry: dict[str, Any] = {"object": "embedding", "index": it.index}
        if it.error is not None or it.vector is None or it.encoded is None:
            error = it.error or ItemError("invalid_model_output", "no answer")
            entry.update(error=error.code, message=error.message)
            runtime.metrics.inputs.labels(model.id, error.code).inc()
        else:
            entry["embedding"] = _vector(it.vector.values, dimension, spec.normalized, req.encoding_format)
            entry["input"] = it.encoded.usage()
            prompt_tokens += it.encoded.tokens
            runtime.metrics.inputs.labels(model.id, "ok").inc()
        data.append(entry)
    runtime.metrics.input_tokens.labels(model.id).inc(prompt_tokens)
    for e in {(v.execution.started_ns, v.execution.forward_ns): v.execution for v in answered}.values():
        runtime.metrics.batch_rows.labels(model.id).observe(e.rows)
        runtime.metrics.batch_tokens.labels(model.id).observe(e.tokens)
    response: dict[str, Any] = {"object": "list", "data": data, "model": model.id,
                                "usage": {"prompt_tokens": prompt_tokens, "total_tokens": prompt_tokens}}
    if req.options.return_meta:
        response["meta"] = {
            "model_id": model.id, "revision": model.card.revision, "model_sha256": model.card.model_sha256,
            "numerics": model.card.numerics, "engine": ENGINE, "accelerator": DEVICE, "device": DEVICE,
            "queue_ms": round(queue_ms, 3), "compute_ms": round(forward_ms, 3),
            "representation": {"model_sha256": model.card.model_sha256, "layer": layer, "dimension": dimension,
                               "normalized": spec.normalized, "modality": "text"},
        }
    if call is not None:
        call.timing.ms["queue"] += queue_ms
        call.timing.ms["forward"] += forward_ms
        call.timing.add("post", mark)
    return response


@surface("embeddings")
async def create_embeddings(call: Call) -> dict[str, Any]:
    mark = time.perf_counter()
    req = parse(EmbeddingsRequest, call.body)
    model = call.runtime.resolve(req.model, "embeddings")
    call.timing.add("tokenize", mark)
    return await embed(call.runtime, model, req, call)


def routes() -> list[web.RouteDef]:
    return [web.post("/v1/embeddings", create_embeddings)]
