"""From a family's probabilities to the API's answer objects; the confidence formulas live here, by name.

A family produces, per question, probabilities over the question's options (choice, score: they sum to 1; noul:
[P(false), P(true)]; set: one independent probability per label; span: found spans plus the probability that the
part holds any of the labels). The card names the confidence formula per type, and `/v1/models` shows it. Where
the card declares an abstain option (`decisions.abstain`), its questions also carry the option's probability.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from ..heads import ensure_finite
from .questions import Question

DIGITS = 6
FORMULAS = {
    "entropy": "1 - H/ln K",  # 1 − normalised entropy of the answer's distribution
    "margin": "p1 - p2",  # top-two margin
    "variance": "1 - Var/((K^2-1)/12)",  # score: spread around the expected level relative to uniform
}


@dataclass
class Outcome:
    """What a family answered for one question (before rounding and assembly)."""

    probabilities: np.ndarray
    spans: list[dict[str, Any]] = field(default_factory=list)
    box: dict[str, float] | None = None  # box questions: fractions of the image, top-left origin
    time: float | None = None  # box with `at`: the moment of the video located in (seconds)
    track: list[dict[str, Any]] | None = None  # track: {time, box, confidence, visible} per sampled moment
    abstain: float | None = None  # the abstain option's probability: set only where the card declares one


def confidence(p: np.ndarray, formula: str) -> float:
    k = len(p)
    if formula == "margin":
        top = np.sort(p)[::-1]
        return float(top[0] - top[1]) if k > 1 else 1.0
    if formula == "variance":
        levels = np.arange(k)
        mean = float(levels @ p)
        var = float(((levels - mean) ** 2) @ p)
        return float(np.clip(1.0 - var / ((k * k - 1) / 12.0), 0.0, 1.0))
    nz = p[p > 0]
    entropy = float(-(nz * np.log(nz)).sum())
    return float(np.clip(1.0 - entropy / math.log(k), 0.0, 1.0)) if k > 1 else 1.0


def _round(x: float) -> float:
    return round(float(x), DIGITS)


def assemble(q: Question, outcome: Outcome, formulas: dict[str, str], threshold: float | None
             ) -> tuple[dict[str, dict[str, Any]], dict[str, Any]]:
    """(answers by answer id, extras: {"sets"|"spans": ...}) for one answered question."""
    p = np.asarray(outcome.probabilities, dtype=np.float64)
    if q.type == "track":  # its moments were rounded where they were located (gateway/videos/tracking.py)
        assert outcome.track is not None
        return {q.id: {"type": "track", "track": outcome.track}}, {}
    if q.type == "box":  # confidence may be null (nothing to choose between), never another non-finite value
        assert outcome.box is not None
        conf = None if np.isnan(p[0]) else _round(p[0])
        moment = {} if outcome.time is None else {"time": _round(outcome.time)}
        return {q.id: {"type": "box", "box": outcome.box, "confidence": conf, **moment}}, {}
    ensure_finite(p)
    coverage = {"input_coverage": "complete"} if q.require_full_input else {}
    abstain: dict[str, float] = {}
    if outcome.abstain is not None:
        ensure_finite(outcome.abstain)
        abstain["abstain_probability"] = _round(outcome.abstain)
    if q.type == "choice":
        best = int(np.argmax(p))  # first option wins ties
        return {q.id: {"type": "choice", "choice": q.keys[best], "confidence": _round(
            confidence(p, formulas.get("choice", "entropy"))),
            "probabilities": {k: _round(v) for k, v in zip(q.keys, p, strict=True)}, **abstain, **coverage}}, {}
    if q.type == "noul":
        return {q.id: {"type": "noul", "noul": _round(p[1]), **abstain, **coverage}}, {}
    if q.type == "score":
        levels = np.arange(len(p))
        return {q.id: {"type": "score", "score": _round(float(levels @ p)),
                       "confidence": _round(confidence(p, formulas.get("score", "entropy"))),
                       "legend": {o.key: o.description for o in q.options},
                       "probabilities": {o.key: _round(v) for o, v in zip(q.options, p, strict=True)},
                       **coverage}}, {}
    assert threshold is not None
    if q.type == "set":
        answers = {f"{q.id}.{k}": {"type": "noul", "noul": _round(v), **coverage}
                   for k, v in zip(q.keys, p, strict=True)}
        selected = [k for k, v in zip(q.keys, p, strict=True) if v >= threshold]  # labels that reach it (spec)
        return answers, {"sets": {"selected": selected, "probabilities": {k: _round(v) for k, v in
                                                                           zip(q.keys, p, strict=True)},
                                  **coverage}}
    # span: the noul is the probability that the part read holds any of the labels
    return {q.id: {"type": "noul", "noul": _round(p[0]), **coverage}}, {"spans": outcome.spans}
