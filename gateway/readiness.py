"""Warm-up: zero-shot label vectors, then the golden check — a model is ready only after it reproduces its
card's recorded answer, twice.

This catches a wrong export, a wrong tokenizer or a broken runtime before traffic does (tolerance from the card,
1e-3 on CPU).
"""

from __future__ import annotations

from typing import Any

import numpy as np

from .decisions import golden as decisions_golden
from .errors import ApiError
from .execution.jobs import Job, run_jobs
from .images.golden import check_ocr_golden
from .runtime import Runtime, ServedModel
from .surfaces.classify import ClassifyRequest, classify
from .surfaces.embeddings import EmbeddingsRequest, embed


class GoldenMismatch(Exception):
    pass


async def prepare_heads(runtime: Runtime, model: ServedModel) -> None:
    """Zero-shot heads: embed each label description once with the model itself (normalised vectors); decisions
    models: their family is built and the models it reads through are ready."""
    if model.card.decisions is not None:
        await decisions_golden.prepare(runtime, model)
    for head in model.card.heads or []:
        if head.zero_shot is None:
            continue
        encoder = model.text_encoder()  # only zero-shot heads read text here (image models have no tokenizer)
        texts = [head.zero_shot.descriptions[label] for label in head.labels]
        jobs = [Job(encoder.encode(t, max_tokens=model.card.limits.max_input_tokens, overflow="truncate").ids)
                for t in texts]
        await run_jobs(runtime, model, jobs)
        failed = [j.error for j in jobs if j.result is None]
        if failed:
            raise GoldenMismatch(f"head {head.name}: a label description failed: {failed[0]}")
        vectors = np.stack([j.result.values for j in jobs if j.result is not None])
        model.label_vectors[head.name] = vectors / np.linalg.norm(vectors, axis=1, keepdims=True)


async def _answer(runtime: Runtime, model: ServedModel, surface: str, request: dict[str, Any]) -> dict[str, Any]:
    body = {**request, "model": model.id}
    if surface == "embeddings":
        return await embed(runtime, model, EmbeddingsRequest.model_validate(body))
    if surface == "classify":
        return await classify(runtime, model, ClassifyRequest.model_validate(body))
    raise ApiError("internal_error", f"no golden check for surface {surface}")


def _rows(answer: dict[str, Any], surface: str, expected: dict[str, Any]) -> list[np.ndarray]:
    """The compared numbers of each answered input (embedding prefix, or probabilities in label order)."""
    items = answer["data"] if surface == "embeddings" else answer["results"]
    rows = []
    for i, item in enumerate(items):
        if "error" in item:
            raise GoldenMismatch(f"input {i} failed: {item.get('error')}: {item.get('message')}")
        if surface == "embeddings":
            rows.append(np.asarray(item["embedding"][: int(expected.get("prefix", 8))], dtype=np.float64))
        elif "spans" in item:
            rows.append(np.asarray([p for s in item["spans"] for p in (s["start"], s["end"])], dtype=np.float64))
        else:
            values = item.get("probabilities") or item.get("scores") or {}
            rows.append(np.asarray([values[label] for label in answer["labels"]], dtype=np.float64))
    return rows


def _compare(answer: dict[str, Any], surface: str, expected: dict[str, Any], tolerance: float) -> int:
    """Returns the number of inputs checked; raises GoldenMismatch on the first difference."""
    key = next(k for k in ("embeddings", "probabilities", "scores", "spans") if k in expected)
    want = expected[key]
    got = _rows(answer, surface, expected)
    if len(got) != len(want):
        raise GoldenMismatch(f"expected {len(want)} answers, got {len(got)}")
    for i, (row, ref) in enumerate(zip(got, want, strict=True)):
        if key == "spans":
            ref_row = np.asarray([p for s in ref for p in (s["start"], s["end"])], dtype=np.float64)
            if row.shape != ref_row.shape or np.any(row != ref_row):
                raise GoldenMismatch(f"input {i}: spans {row.tolist()} != {ref_row.tolist()}")
            continue
        ref_row = np.asarray(ref[: len(row)], dtype=np.float64)
        diff = float(np.max(np.abs(row - ref_row))) if row.shape == ref_row.shape else float("inf")
        if diff > tolerance:
            raise GoldenMismatch(f"input {i}: max abs diff {diff:.2e} > tolerance {tolerance:g}")
    if "prompt_tokens" in expected and answer["usage"]["prompt_tokens"] != expected["prompt_tokens"]:
        raise GoldenMismatch(f"prompt_tokens {answer['usage']['prompt_tokens']} != {expected['prompt_tokens']}")
    return len(want)


async def check_golden(runtime: Runtime, model: ServedModel) -> None:
    golden = model.card.golden
    if golden is not None and golden.surface == "ocr":  # image → text lines (gateway/images/golden.py)
        model.golden = await check_ocr_golden(runtime, model, golden)
        return
    if golden is None:
        model.golden = {"status": "unverified", "checked": 0, "matched": 0, "reference": "cpu"}
        return
    if golden.surface == "decisions":
        runs = [await decisions_golden.answer(runtime, model, golden.request) for _ in range(2)]
        try:
            checked = decisions_golden.compare(runs[0], golden.expected, golden.tolerance)
            decisions_golden.compare(runs[1], {"answers": runs[0]["answers"]},
                                     0.0 if model.card.numerics == "exact" else golden.tolerance)
        except decisions_golden.GoldenMismatch as exc:
            raise GoldenMismatch(str(exc)) from exc
        model.golden = {"status": "matched", "checked": checked, "matched": checked, "reference": "cpu"}
        return
    first = await _answer(runtime, model, golden.surface, golden.request)
    second = await _answer(runtime, model, golden.surface, golden.request)
    checked = _compare(first, golden.surface, golden.expected, golden.tolerance)
    # an embedder's earlier layers each reproduce their own PyTorch answer (`expected.layers: {layer: rows}`)
    for layer, rows in (golden.expected.get("layers") or {}).items() if golden.surface == "embeddings" else ():
        answer = await _answer(runtime, model, golden.surface, {**golden.request, "layer": int(layer)})
        try:
            checked += _compare(answer, golden.surface, {**golden.expected, "embeddings": rows}, golden.tolerance)
        except GoldenMismatch as exc:
            raise GoldenMismatch(f"layer {layer}: {exc}") from exc
    # exact models must repeat bit for bit; approximate ones (rows padded together in one forward) within tolerance
    repeat = 0.0 if model.card.numerics == "exact" else golden.tolerance
    for a, b in zip(_rows(first, golden.surface, golden.expected), _rows(second, golden.surface, golden.expected),
                    strict=True):
        if a.shape != b.shape or float(np.max(np.abs(a - b), initial=0.0)) > repeat:
            raise GoldenMismatch("two runs of the golden request gave different answers")
    model.golden = {"status": "matched", "checked": checked, "matched": checked, "reference": "cpu"}
