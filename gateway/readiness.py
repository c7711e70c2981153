"""Golden check: a model is ready only after it reproduces its card's recorded answer, twice.

This catches a wrong export, a wrong tokenizer or a broken runtime before traffic does (tolerance from the card,
1e-3 on CPU).
"""

from __future__ import annotations

from typing import Any

import numpy as np

from .runtime import Runtime, ServedModel
from .surfaces.embeddings import EmbeddingsRequest, embed


class GoldenMismatch(Exception):
    pass


async def _answer(runtime: Runtime, model: ServedModel, request: dict[str, Any]) -> dict[str, Any]:
    return await embed(runtime, model, EmbeddingsRequest.model_validate({**request, "model": model.id}))


def _compare(answer: dict[str, Any], expected: dict[str, Any], tolerance: float) -> int:
    """Returns the number of vectors checked; raises GoldenMismatch on the first difference."""
    prefix = int(expected.get("prefix", 8))
    want = expected["embeddings"]
    got = answer["data"]
    if len(got) != len(want):
        raise GoldenMismatch(f"expected {len(want)} embeddings, got {len(got)}")
    for i, (item, ref) in enumerate(zip(got, want, strict=True)):
        if "embedding" not in item:
            raise GoldenMismatch(f"input {i} failed: {item.get('error')}: {item.get('message')}")
        diff = float(np.max(np.abs(np.asarray(item["embedding"][:prefix]) - np.asarray(ref[:prefix]))))
        if diff > tolerance:
            raise GoldenMismatch(f"input {i}: max abs diff {diff:.2e} > tolerance {tolerance:g}")
    if "prompt_tokens" in expected and answer["usage"]["prompt_tokens"] != expected["prompt_tokens"]:
        raise GoldenMismatch(f"prompt_tokens {answer['usage']['prompt_tokens']} != {expected['prompt_tokens']}")
    return len(want)


async def check_golden(runtime: Runtime, model: ServedModel) -> None:
    golden = model.card.golden
    if golden is None:
        model.golden = {"status": "unverified", "checked": 0, "matched": 0, "reference": "cpu"}
        return
    first = await _answer(runtime, model, golden.request)
    second = await _answer(runtime, model, golden.request)
    checked = _compare(first, golden.expected, golden.tolerance)
    # exact models must repeat bit for bit; approximate ones (rows padded together in one forward) within tolerance
    repeat = 0.0 if model.card.numerics == "exact" else golden.tolerance
    for a, b in zip(first["data"], second["data"], strict=True):
        if float(np.max(np.abs(np.asarray(a["embedding"]) - np.asarray(b["embedding"])))) > repeat:
            raise GoldenMismatch("two runs of the golden request gave different answers")
    model.golden = {"status": "matched", "checked": checked, "matched": checked, "reference": "cpu"}
