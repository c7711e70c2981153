"""Readouts of classification heads: pure functions from model outputs to answers.

sequence → softmax over labels; scores → independent sigmoids; token → per-token softmax, then BIO decoding into
spans with Unicode code-point offsets (end exclusive). Window reductions live here too, so the classify surface
only moves data around.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from .errors import ItemError


def softmax(x: np.ndarray) -> np.ndarray:
    z = x - np.max(x, axis=-1, keepdims=True)
    e = np.exp(z)
    return np.asarray(e / np.sum(e, axis=-1, keepdims=True))


def sigmoid(x: np.ndarray | float) -> np.ndarray:
    """1 / (1 + e^-x) without overflow for large |x| (a cross-encoder logit can be ±1000)."""
    x = np.asarray(x)
    e = np.exp(-np.abs(x))
    return np.asarray(np.where(x >= 0, 1.0 / (1.0 + e), e / (1.0 + e)))


def ensure_finite(values: np.ndarray | float) -> None:
    """A NaN or infinity from the model fails that input alone (spec: the item's `invalid_model_output`), never
    the request: every surface and question type checks its readout through here."""
    if not np.all(np.isfinite(values)):
        raise ItemError("invalid_model_output", "the model produced a non-finite number")


def zero_shot(vector: np.ndarray, labels: np.ndarray, temperature: float) -> np.ndarray:
    """softmax(cosine / T) between one normalised input vector and normalised label vectors [labels, dim]."""
    return softmax((labels @ vector) / temperature)


@dataclass(frozen=True)
class Span:
    label: str
    start: int
    end: int
    probability: float

    def as_dict(self, text: str) -> dict[str, object]:
        return {"label": self.label, "start": self.start, "end": self.end, "text": text[self.start : self.end],
                "probability": round(self.probability, 6)}


def entity_types(labels: list[str]) -> list[str]:
    """Entity types of a BIO label set, in first-seen order (O excluded)."""
    seen: dict[str, None] = {}
    for label in labels:
        if label != "O":
            seen.setdefault(label.split("-", 1)[-1], None)
    return list(seen)


def decode_spans(probabilities: np.ndarray, offsets: list[tuple[int, int]], labels: list[str],
                 threshold: float) -> list[Span]:
    """BIO decoding over content tokens ([tokens, labels] probabilities, code-point offsets per token).

    A token is part of an entity when 1 - P(O) reaches `threshold`; its type is the one with the highest
    P(B-type) + P(I-type). Consecutive tokens of one type form one span unless a token starts a new word and its
    B- tag outweighs its I- tag (sub-word pieces of one word always join). The span's probability is the mean of
    its tokens' type probabilities. Deciding "entity or not" before "which type" keeps a token whose type is a
    near-tie (e.g. given name vs surname) inside the span instead of dropping it.
    """
    types = entity_types(labels)
    begin = np.zeros((len(labels), len(types)))
    inside = np.zeros((len(labels), len(types)))
    outside = labels.index("O") if "O" in labels else None
    for i, label in enumerate(labels):
        if label == "O":
            continue
        prefix, _, kind = label.partition("-")
        (begin if prefix == "B" else inside)[i, types.index(kind or prefix)] = 1.0
    p_begin = probabilities @ begin
    p_type = p_begin + probabilities @ inside
    p_out = probabilities[:, outside] if outside is not None else np.zeros(len(probabilities))
    spans: list[Span] = []
    current: tuple[int, int, int, list[float]] | None = None  # type index, start, end, probabilities
    for t, (start, end) in enumerate(offsets):
        k = int(np.argmax(p_type[t])) if types else -1
        p = float(p_type[t, k]) if types else 0.0
        if not types or 1.0 - p_out[t] < threshold or p <= p_out[t] or start == end:
            if current is not None:
                spans.append(_span(types, current))
                current = None
            continue
        same_word = current is not None and start == current[2]
        new_entity = p_begin[t, k] > p - p_begin[t, k] and not same_word
        if current is not None and current[0] == k and not new_entity:
            current = (k, current[1], end, [*current[3], p])
            continue
        if current is not None:
            spans.append(_span(types, current))
        current = (k, start, end, [p])
    if current is not None:
        spans.append(_span(types, current))
    return spans


def _span(types: list[str], current: tuple[int, int, int, list[float]]) -> Span:
    k, start, end, ps = current
    return Span(types[k], start, end, float(np.mean(ps)))


def best_context_windows(windows: list[tuple[int, int]], tokens: int) -> list[int]:
    """For each content token, the window that gives it most context on its shorter side (earlier on ties)."""
    owner = [-1] * tokens
    best = [-1] * tokens
    for w, (start, end) in enumerate(windows):
        for t in range(start, end):
            context = min(t - start, end - 1 - t)
            if context > best[t]:
                best[t], owner[t] = context, w
    return owner
