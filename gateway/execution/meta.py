"""What a response says about how it was answered: `meta` (model, numerics, model time) and per-input usage."""

from __future__ import annotations

from typing import Any

from ..runtime import ServedModel, served_dtype, served_engine
from ..text import Encoded


def response_meta(model: ServedModel, queue_ms: float, forward_ms: float) -> dict[str, Any]:
    """`meta` of a response (with options.return_meta): what answered, on what, and how long the model took."""
    card = model.card
    return {"model_id": model.id, "revision": card.revision, "model_sha256": card.model_sha256,
            "dtype": served_dtype(model), "numerics": card.numerics, "engine": served_engine(model),
            "accelerator": model.accelerator,
            "device": model.device,
            "queue_ms": round(queue_ms, 3), "compute_ms": round(forward_ms, 3)}


def input_usage(encoded: Encoded) -> dict[str, Any]:
    """Per-input usage: tokens counted (a lower bound when read only in part), tokens run, and truncation."""
    out: dict[str, Any] = {"tokens": encoded.tokens, "processed_tokens": len(encoded.ids),
                           "truncated": encoded.truncated}
    if encoded.tokens_lower_bound:
        out["tokens_lower_bound"] = True
    return out
