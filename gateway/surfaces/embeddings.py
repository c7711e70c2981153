"""POST /v1/embeddings — OpenAI-compatible embeddings (float or base64 little-endian float32).

`input` items are strings or content parts (text, image_url as a base64 data URL, input_audio): an image model
embeds pictures (gateway/images/surfaces.py), a text model texts; an item of a modality the model does not read
fails in place with invalid_input naming the modality.

Each input is its own Triton request, so Triton's dynamic batcher can put inputs of many HTTP requests into one
execute(); per-input failures (too long, deadline) are answered in place and never fail their siblings.

`input_type` (one of the card's `embedding.input_types`, else its `default_input_type`) puts the card's prefix for
that type before each text (E5: "query: " / "passage: "); the tokens read include it.

`layer` picks one of the card's `embedding.layers` (default: the last). The model pools every declared layer in one
forward, so a request for an earlier layer costs the same forward and may share a batch with any other; `dimensions`
is one the card declares (Matryoshka truncation only where the card declares smaller sizes).
"""

from __future__ import annotations

import base64
import time
from typing import Any, Literal

import numpy as np
from aiohttp import web
from pydantic import Field, StrictInt, StrictStr

from ..errors import ApiError, ItemError, no_answer
from ..execution.jobs import Job, encode_each, run_jobs
from ..execution.limits import check_inputs, token_budget
from ..execution.meta import input_usage, response_meta
from ..execution.offload import off_loop_if_large
from ..execution.requests import Strict, TextOptions
from ..heads import ensure_finite
from ..images.content import ContentPart, refusal, text_of
from ..images.surfaces import embed_images, reads_images_only
from ..runtime import Runtime, ServedModel
from ..timing import charge
from .common import Call, surface_route


class EmbeddingsRequest(Strict):
    model: StrictStr | None = None
    input: StrictStr | list[StrictStr | ContentPart] = Field(min_length=1)
    encoding_format: Literal["float", "base64"] = "float"
    dimensions: StrictInt | None = None
    layer: StrictInt | None = None
    input_type: StrictStr | None = None
    user: StrictStr | None = None
    options: TextOptions = TextOptions()


def _check(req: EmbeddingsRequest, model: ServedModel) -> tuple[int, int, int]:
    """Request-level checks against the card: (budget, dimension, layer)."""
    spec = model.card.embedding
    assert spec is not None
    check_inputs(model, 1 if isinstance(req.input, str) else len(req.input))
    dimension = req.dimensions if req.dimensions is not None else max(spec.dimensions)
    if dimension not in spec.dimensions:
        raise ApiError("invalid_request", f"dimensions must be one of {spec.dimensions} for model {model.id}")
    layer = req.layer if req.layer is not None else spec.layers[-1]
    if layer not in spec.layers:
        raise ApiError("invalid_request", f"layer must be one of {spec.layers} for model {model.id}")
    if req.input_type is not None and req.input_type not in spec.input_types:
        raise ApiError("invalid_request", f"model {model.id} takes no input_type"
                       if not spec.input_types else f"input_type must be one of {spec.input_types}")
    return token_budget(model, req.options.max_tokens), dimension, layer


def _vector(values: np.ndarray, dimension: int, normalized: bool, fmt: str) -> Any:
    if dimension < values.shape[0]:  # Matryoshka: truncate, then re-normalise
        values = values[:dimension]
        if normalized:
            values = values / max(float(np.linalg.norm(values)), 1e-12)
    values = values.astype("<f4", copy=False)
    ensure_finite(values)
    if fmt == "base64":
        return base64.b64encode(values.tobytes()).decode("ascii")
    return values  # serialised by orjson straight from the float32 array


async def embed(runtime: Runtime, model: ServedModel, req: EmbeddingsRequest, call: Call | None = None,
                ) -> dict[str, Any]:
    """The surface's work, shared by the HTTP handler and the readiness (golden) check."""
    timing = call.timing if call is not None else None
    started = time.perf_counter()
    budget, dimension, layer = _check(req, model)
    values: list[Any] = [req.input] if isinstance(req.input, str) else list(req.input)
    if reads_images_only(model):
        return await embed_images(runtime, model, values, dimension=dimension, layer=layer,
                                  encoding_format=req.encoding_format, return_meta=req.options.return_meta,
                                  deadline_ms=req.options.deadline_ms, timing=timing, vector=_vector)
    spec = model.card.embedding
    assert spec is not None
    texts = [spec.prefixed(text_of(v) or "", req.input_type) for v in values]  # E5's "query: " etc. (card)
    encoder = model.text_encoder()
    jobs, encoded = await off_loop_if_large(
        sum(map(len, texts)), encode_each, texts,
        lambda text: encoder.encode(text, max_tokens=budget, overflow=req.options.overflow))
    for i, value in enumerate(values):
        refused = refusal(model.card, value)
        if refused is not None:  # an image or audio part on a text model fails only its own item
            jobs[i], encoded[i] = Job([], error=refused), None
        elif len(spec.layers) > 1:  # only a model that pools several layers takes LAYER
            jobs[i].layer = layer
    charge(timing, "tokenize", started)
    queue_ms, forward_ms = await run_jobs(runtime, model, jobs, deadline_ms=req.options.deadline_ms, timing=timing)
    mark = time.perf_counter()
    data: list[dict[str, Any]] = []
    prompt_tokens = 0
    for index, (job, item) in enumerate(zip(jobs, encoded, strict=True)):
        entry: dict[str, Any] = {"object": "embedding", "index": index}
        try:
            if job.result is None or item is None:
                raise no_answer(job.error)
            entry["embedding"] = _vector(job.result.values, dimension, spec.normalized, req.encoding_format)
        except ItemError as error:  # fails this input only
            entry.update(error=error.code, message=error.message)
            runtime.metrics.count_input(model.id, error.code)
        else:
            entry["input"] = input_usage(item)
            prompt_tokens += item.tokens
            runtime.metrics.count_input(model.id, "ok")
        data.append(entry)
    response: dict[str, Any] = {"object": "list", "data": data, "model": model.id,
                                "usage": {"prompt_tokens": prompt_tokens, "total_tokens": prompt_tokens}}
    if req.options.return_meta:
        response["meta"] = {
            **response_meta(model, queue_ms, forward_ms),
            "representation": {"model_sha256": model.card.model_sha256, "layer": layer, "dimension": dimension,
                               "normalized": spec.normalized, "modality": "text"},
        }
    charge(timing, "post", mark)
    return response


def routes() -> list[web.RouteDef]:
    return [surface_route("/v1/embeddings", "embeddings", EmbeddingsRequest, embed)]
