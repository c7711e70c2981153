"""POST /v1/classify — heads over texts and text pairs: label probabilities, independent scores or token spans.

Inputs longer than their budget are rejected, truncated or read in windows (`options.overflow`, default the head's
policy). Windows are reduced per label by max (sequence/scores) or, for token heads, by taking every token from the
window that gives it most context, then decoding spans once over the whole input.
"""

from __future__ import annotations

import time
from typing import Any

import numpy as np
from aiohttp import web
from pydantic import Field, StrictBool, StrictInt, StrictStr

from ..cards import HeadSpec
from ..errors import ApiError, ItemError, no_answer
from ..execution.items import Grounded, Item, Overflow, Pair, prepare_item, token_probabilities
from ..execution.jobs import run_jobs
from ..execution.limits import check_inputs, token_budget
from ..execution.meta import response_meta
from ..execution.offload import off_loop_if_large
from ..execution.requests import MIN_DEADLINE_MS, Strict
from ..heads import decode_spans, ensure_finite, sigmoid, softmax, zero_shot
from ..images.content import ContentPart, refusal, text_of
from ..images.surfaces import classify_images, reads_images_only
from ..runtime import Runtime, ServedModel
from ..text import TextEncoder
from ..timing import charge
from .common import Call, surface_route


class WindowOptions(Strict):
    tokens: StrictInt = Field(ge=2)
    overlap: StrictInt = Field(ge=0)


class ClassifyOptions(Strict):
    overflow: Overflow | None = None
    max_tokens: StrictInt | None = Field(default=None, ge=1)
    window: WindowOptions | None = None
    threshold: float | None = Field(default=None, ge=0, le=1)
    return_tokens: StrictBool = False
    deadline_ms: float | StrictInt | None = Field(default=None, ge=MIN_DEADLINE_MS)
    return_meta: StrictBool = False


class ClassifyRequest(Strict):
    model: StrictStr | None = None
    input: StrictStr | list[StrictStr] | list[Pair] | list[Grounded] | list[StrictStr | ContentPart] = Field(
        min_length=1)
    head: StrictStr | None = None
    options: ClassifyOptions = ClassifyOptions()


def _head(model: ServedModel, name: str | None) -> HeadSpec:
    heads = model.card.heads or []
    if name is None:
        return heads[0]
    for head in heads:
        if head.name == name:
            return head
    raise ApiError("invalid_request", f"model {model.id} has no head {name!r}; heads: {[h.name for h in heads]}")


def _kind_of(value: Any) -> str:
    return "pair" if isinstance(value, Pair) else "grounded" if isinstance(value, Grounded) else "text"


def _plan(req: ClassifyRequest, model: ServedModel, head: HeadSpec) -> tuple[Overflow, int, int, int]:
    """Request-level checks: (overflow, budget, window tokens, window overlap)."""
    limits = model.card.limits
    inputs = [req.input] if isinstance(req.input, str) else list(req.input)
    check_inputs(model, len(inputs))
    kinds = {_kind_of(v) for v in inputs}
    for kind in kinds:
        if kind not in head.inputs:
            raise ApiError("invalid_request", f"head {head.name} takes {head.inputs} inputs, not {kind}")
    overflow: Overflow = req.options.overflow or head.overflow
    if overflow == "window":
        if kinds != {"text"}:
            raise ApiError("invalid_request", "overflow window reads single texts only")
        budget = token_budget(model, req.options.max_tokens, limits.max_scan_tokens or limits.max_input_tokens,
                              "max_scan_tokens" if limits.max_scan_tokens else "max_input_tokens")
    else:
        budget = token_budget(model, req.options.max_tokens)
    window = req.options.window or head.window
    tokens = window.tokens if window is not None else limits.max_input_tokens
    overlap = window.overlap if window is not None else 0
    if overflow == "window":
        if tokens > limits.max_input_tokens:
            raise ApiError("invalid_request", f"options.window.tokens {tokens} exceeds model {model.id}'s "
                                              f"max_input_tokens {limits.max_input_tokens}")
        width = tokens - sum(len(x) for x in model.text_encoder().envelope)
        if width < 1 or overlap >= width:
            raise ApiError("invalid_request", f"a window of {tokens} tokens holds {max(width, 0)} content tokens; "
                                              f"overlap must be below that (got {overlap})")
    elif req.options.window is not None:
        raise ApiError("invalid_request", "options.window needs overflow window")
    return overflow, budget, tokens, overlap


def _prepare_all(encoder: TextEncoder, values: list[Any], overflow: Overflow, budget: int, tokens: int,
                 overlap: int) -> list[Item]:
    return [prepare_item(encoder, v, overflow, budget, tokens, overlap) for v in values]


def _sequence_scores(model: ServedModel, head: HeadSpec, values: np.ndarray) -> np.ndarray:
    if head.zero_shot is not None:
        return zero_shot(values, model.label_vectors[head.name], head.zero_shot.temperature)
    if head.preset is not None:  # a trained preset's head over the embedding (decisions' `presets` family)
        from ..decisions.families.presets import classify_scores

        return classify_scores(model, head.preset, values)
    return softmax(values) if head.kind == "sequence" else sigmoid(values)


def _answer(model: ServedModel, head: HeadSpec, item: Item, threshold: float, return_tokens: bool,
            ) -> dict[str, Any]:
    try:
        return _read(model, head, item, threshold, return_tokens)
    except ItemError as error:  # fails this input only
        return {"error": error.code, "message": error.message}


def _read(model: ServedModel, head: HeadSpec, item: Item, threshold: float, return_tokens: bool) -> dict[str, Any]:
    failed = next((j.error for j in item.jobs if j.error is not None), None)
    if item.error is not None or failed is not None or any(j.result is None for j in item.jobs):
        raise no_answer(item.error or failed)
    out: dict[str, Any] = {}
    results = [j.result.values for j in item.jobs if j.result is not None]
    if head.kind == "token":
        probs, offsets = token_probabilities(item, results)
        ensure_finite(probs)
        out["spans"] = [s.as_dict(item.text) for s in decode_spans(probs, offsets, head.labels, threshold)]
        if return_tokens:
            out["tokens"] = [{"start": s, "end": e, "probabilities": {lab: round(float(p), 6)
                                                                        for lab, p in zip(head.labels, row,
                                                                                          strict=True)}}
                             for (s, e), row in zip(offsets, probs, strict=True)]
    else:
        per_window = [_sequence_scores(model, head, v) for v in results]
        reduced = np.max(np.stack(per_window), axis=0)
        ensure_finite(reduced)
        key = "probabilities" if head.kind == "sequence" else "scores"
        out[key] = {label: round(float(p), 6) for label, p in zip(head.labels, reduced, strict=True)}
        if head.kind == "sequence":
            out["label"] = head.labels[int(np.argmax(reduced))]
        elif head.default_threshold is not None:
            out["selected"] = [lab for lab, p in zip(head.labels, reduced, strict=True) if p >= threshold]
        if len(per_window) > 1:
            out["windows"] = [{"start": s, "end": e, key: {lab: round(float(p), 6)
                                                           for lab, p in zip(head.labels, w, strict=True)}}
                              for (s, e), w in zip(item.spans, per_window, strict=True)]
    out["input"] = item.usage
    return out


async def classify(runtime: Runtime, model: ServedModel, req: ClassifyRequest, call: Call | None = None,
                   ) -> dict[str, Any]:
    """The surface's work, shared by the HTTP handler and the readiness (golden) check."""
    timing = call.timing if call is not None else None
    started = time.perf_counter()
    head = _head(model, req.head)
    values: list[Any] = [req.input] if isinstance(req.input, str) else list(req.input)
    if reads_images_only(model):  # pictures as image_url content parts (gateway/images/surfaces.py)
        return await classify_images(runtime, model, head, values, return_meta=req.options.return_meta,
                                     deadline_ms=req.options.deadline_ms, timing=timing)
    overflow, budget, tokens, overlap = _plan(req, model, head)
    encoder = model.text_encoder()
    values = [text if (text := text_of(v)) is not None else v for v in values]  # text parts read as their text
    refused = {i: error for i, v in enumerate(values) if (error := refusal(model.card, v)) is not None}
    values = ["" if i in refused else v for i, v in enumerate(values)]
    chars = sum(len(v) if isinstance(v, str) else sum(len(str(x)) for x in v.model_dump().values()) for v in values)
    items = await off_loop_if_large(chars, _prepare_all, encoder, values, overflow, budget, tokens, overlap)
    for i, error in refused.items():  # an image or audio part on a text model fails only its own item
        items[i] = Item(error=error)
    charge(timing, "tokenize", started)
    jobs = [j for it in items for j in it.jobs]
    queue_ms, forward_ms = await run_jobs(runtime, model, jobs, deadline_ms=req.options.deadline_ms, timing=timing)
    mark = time.perf_counter()
    threshold = req.options.threshold if req.options.threshold is not None else (head.default_threshold or 0.5)
    results = []
    input_tokens = 0
    for index, item in enumerate(items):
        answer = _answer(model, head, item, threshold, req.options.return_tokens)
        runtime.metrics.count_input(model.id, answer.get("error", "ok"))
        if "input" in answer:
            input_tokens += answer["input"]["tokens"]  # tokens read, like every surface (spec: usage)
        results.append({"index": index, **answer})
    response: dict[str, Any] = {"model": model.id, "head": head.name, "kind": head.kind, "labels": head.labels,
                                "results": results, "usage": {"input_tokens": input_tokens, "output_tokens": 0}}
    if req.options.return_meta:
        response["meta"] = {**response_meta(model, queue_ms, forward_ms), "head": head.name}
    charge(timing, "post", mark)
    return response


def routes() -> list[web.RouteDef]:
    return [surface_route("/v1/classify", "classify", ClassifyRequest, classify)]
