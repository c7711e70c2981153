"""Fit the zero-shot decision family's templates, temperatures and biases on the labelled set's fit split, and
record the card's golden answers — both in process with ONNX Runtime, through the family's own code.

    .venv/bin/python -m tools.fit_decisions [--card decision-multilingual] [--items FILE ...] [--out FILE]

Prints (and writes to --out) the fitted `decisions.parameters` values and the golden block; the card is edited by
hand from them, so every change to its numbers is a reviewed diff. Span questions are not fitted (the tagger's own
probabilities are used). Only `fit` items are read (items.jsonl, items_zh.jsonl and items_heldout2.jsonl by
default; the split is by question, so no held-out question is seen). Parameters are per question type: each type
picks its template, temperature and bias (noul: also the pair term; set: also whether its labels' cosines are
centred on their mean, `centred`) by the accuracy of the SERVED rule on its fit items — choice the arg-max, noul
P(true) ≥ 0.5, score the expected level Σ p_i·i rounded half up, set the exact selection — ties broken by the lower
negative log-likelihood. The card's encoder (`triton_model`) and its `prefix` (E5: "query: ") are used.
The abstain option's cosine (`parameters.abstain`, for cards declaring `decisions.abstain`) is fitted last, on the
choice rule chosen (fit_abstain).
"""

from __future__ import annotations

import argparse
import itertools
import json
import math
from collections.abc import Iterable
from pathlib import Path
from typing import Any

import numpy as np

from gateway.cards import load_card
from gateway.decisions.families import FAMILIES
from gateway.decisions.families.presets import Presets, PresetsParams
from gateway.decisions.families.zeroshot import ZeroShot, ZeroShotParams
from gateway.decisions.questions import Invalid, Question, validate
from gateway.decisions.state import parse_state
from gateway.heads import softmax
from gateway.runtime import ServedModel
from sr_backend.engines.ort_engine import make_session
from sr_backend.ragged import RaggedRunner
from sr_common.cards import AbstainSpec
from tools.reference_examples import routing_request

ROOT = Path(__file__).resolve().parents[1]
CARD = ROOT / "model_repository" / "decision-zeroshot" / "card.yaml"
# every file with fit items: v1's and v2's held-out ad-hoc items were scored, then moved to `fit` (2026-12-07)
ITEMS = [ROOT / "tools" / "decisions_eval" / name for name in ("items.jsonl", "items_zh.jsonl", "items_heldout2.jsonl")]
# E5's cosines sit in a compressed range (unrelated texts 0.7-0.8), hence the small temperatures and high biases
TEMPERATURES = [0.005, 0.0075, 0.01, 0.015, 0.02, 0.03, 0.04, 0.05, 0.07, 0.1, 0.15, 0.2]
BIASES = [round(b, 3) for b in np.linspace(0.0, 0.95, 39)]
# a centred set label's cosine less the question's mean: E5's spread between labels is a few hundredths
CENTRED_BIASES = [round(b, 4) for b in np.linspace(-0.05, 0.05, 41)]
PAIR_WEIGHTS = [0.0, 0.5, 1.0, 2.0, 4.0, 8.0]
TEMPLATES = {
    "choice": ["{key}: {description}", "{description}", "{instructions} {key}: {description}"],
    "score": ["{instructions} {description}", "{description}", "{instructions} Level {key}: {description}"],
    "set": ["{key}: {description}", "{description}", "{instructions} {key}: {description}"],
}
GOLDEN: dict[str, Any] = {k: v for k, v in routing_request("").items() if k != "model"}  # the spec's example


class Embedder:
    """The card's encoder in process: the same ONNX file and tokenizer Triton serves, one text at a time."""

    def __init__(self, model: ServedModel) -> None:
        self.encoder = model.text_encoder()
        card = model.card
        onnx = card.directory.parent / card.triton_name / str(card.version) / "model.onnx"
        self.runner = RaggedRunner(make_session(str(onnx), threads=2))
        self.cache: dict[str, np.ndarray] = {}

    def __call__(self, texts: Iterable[str], window: int = 256) -> None:
        todo = [t for t in dict.fromkeys(texts) if t not in self.cache]
        for start in range(0, len(todo), 64):
            chunk = todo[start:start + 64]
            rows = [np.asarray(self.encoder.encode(t, max_tokens=window, overflow="truncate").ids) for t in chunk]
            vectors, _ = self.runner.run_pooled(rows)
            for text, vector in zip(chunk, vectors, strict=True):
                self.cache[text] = np.asarray(vector, dtype=np.float64)

    def cos(self, a: str, b: str) -> float:
        return float(self.cache[a] @ self.cache[b])


def _family(params: dict[str, Any]) -> tuple[ServedModel, ZeroShot]:
    card = load_card(CARD)
    spec = card.decisions
    assert spec is not None
    # candidate parameters with or without an abstain option: the card declares exactly what they score
    abstain = (spec.abstain or AbstainSpec(types=["choice"])) if params.get("abstain") else None
    card = card.model_copy(update={"decisions": spec.model_copy(update={"parameters": params, "abstain": abstain})})
    model = ServedModel(card)
    return model, (_Prefixed if spec.family == Presets.name else FAMILIES[spec.family])(model)  # type: ignore[return-value]


class _Prefixed(ZeroShot):
    """The presets family's zero-shot part (its `prefix` before every text), without needing the built heads."""

    params_type = PresetsParams

    def option_texts(self, q: Question) -> list[str]:
        return [self.params.prefix + t for t in super().option_texts(q)]


def _prefix(fam: ZeroShot) -> str:
    return str(getattr(fam.params, "prefix", ""))


def _items(paths: list[Path], model: ServedModel) -> list[tuple[dict[str, Any], Question, Any]]:
    spec = model.card.decisions
    assert spec is not None
    out = []
    for path in paths:
        if not path.is_file():
            continue
        for line in path.read_text(encoding="utf-8").splitlines():
            if not line.strip():
                continue
            item = json.loads(line)
            if item["split"] != "fit" or item["question"]["type"] not in ("choice", "noul", "score", "set"):
                continue  # held-out items are never read here
            q = validate(item["id"], item["question"], spec, model.id)
            if isinstance(q, Invalid):
                raise SystemExit(f"item {item['id']}: {q.message}")
            out.append((item, q, parse_state(item["state"]).view(q.over)))
    return out


def _nll(p: np.ndarray, want: Any, q: Question) -> tuple[float, bool]:
    """Negative log-likelihood of the expected answer and whether the answer is right."""
    eps = 1e-9
    if q.type == "choice":
        index = q.keys.index(want)
        return -math.log(max(float(p[index]), eps)), int(np.argmax(p)) == index
    if q.type == "score":  # the served rule: the expected level, rounded half up
        index = int(want)
        served = math.floor(float(np.arange(len(p)) @ p) + 0.5)
        return -math.log(max(float(p[index]), eps)), served == index
    if q.type == "noul":
        return -math.log(max(float(p[1] if want else p[0]), eps)), (p[1] >= 0.5) == bool(want)
    chosen = set(want)  # selected as served: every label whose probability reaches the threshold
    loss = -sum(math.log(max(float(v if k in chosen else 1 - v), eps)) for k, v in zip(q.keys, p, strict=True))
    return loss, {k for k, v in zip(q.keys, p, strict=True) if v >= 0.5} == chosen


def fit(paths: list[Path]) -> dict[str, Any]:
    base = _family(load_card(CARD).decisions.parameters)[1].params  # type: ignore[union-attr]
    model, fam = _family(base.model_dump())
    embed = Embedder(model)
    prefix = _prefix(fam)
    data = _items(paths, model)
    fitting = data
    texts = {prefix + v.text for _, _, v in data} | {prefix + p for _, _, v in data for p in v.parts[:2]}
    for qtype, templates in TEMPLATES.items():
        for template in templates:
            f = _family({**base.model_dump(), "templates": {**base.templates, qtype: template}})[1]
            texts |= {t for _, q, _ in data if q.type == qtype for t in f.option_texts(q)}
    texts |= {t for _, q, _ in data if q.type == "noul" for t in fam.option_texts(q)}
    embed(texts)
    chosen: dict[str, Any] = {"templates": dict(base.templates), "temperature": {}, "bias": {}, "pair": {},
                              "centred": []}
    report: dict[str, Any] = {}

    features: dict[tuple[str, str], list[tuple[Any, Question, np.ndarray, float | None, Any]]] = {}

    def score(params: ZeroShotParams, qtype: str) -> tuple[float, float]:
        fam.params = params  # the family's own scoring rule, with the candidate parameters
        key = (qtype, params.templates.get(qtype, ""))
        if key not in features:
            features[key] = [(item["expected"], q, np.asarray([embed.cos(prefix + view.text, t)
                                                               for t in fam.option_texts(q)]),
                              embed.cos(*(prefix + p for p in view.parts[:2])) if len(view.parts) >= 2 else None,
                              view) for item, q, view in fitting if q.type == qtype]
        loss, right = 0.0, 0
        rows = features[key]
        for expected, q, cos, pair, view in rows:
            n, ok = _nll(fam.probabilities(q, cos, pair if fam._paired(q, view) else None), expected, q)
            loss, right = loss + n, right + ok
        return loss / max(len(rows), 1), right / max(len(rows), 1)

    for qtype in ("choice", "score", "set", "noul"):
        best: tuple[float, float, ZeroShotParams] | None = None
        templates = TEMPLATES.get(qtype, [base.templates.get(qtype, "")])
        biases = BIASES if qtype in ("noul", "set") else [0.0]
        pairs = list(itertools.product(PAIR_WEIGHTS, BIASES[::3])) if qtype == "noul" else [(0.0, 0.0)]
        grid = [(False, *row) for row in itertools.product(templates, TEMPERATURES, biases, pairs)]
        if qtype == "set":
            grid += [(True, *row) for row in itertools.product(templates, TEMPERATURES, CENTRED_BIASES, pairs)]
        for centred, template, temperature, bias, (weight, pair_bias) in grid:
            params = base.model_copy(update={
                "centred": [qtype] if centred else [t for t in base.centred if t != qtype],
                "templates": {**base.templates, qtype: template} if qtype in TEMPLATES else base.templates,
                "temperature": {**base.temperature, qtype: temperature},
                "bias": {**base.bias, qtype: bias},
                "pair": base.pair.model_copy(update={"weight": weight, "bias": pair_bias}) if qtype == "noul"
                else base.pair})
            loss, accuracy = score(params, qtype)
            if best is None or (-accuracy, loss) < (-best[1], best[0]):
                best = (loss, accuracy, params)
        assert best is not None
        loss, accuracy, params = best
        chosen["templates"][qtype] = params.templates[qtype] if qtype in TEMPLATES else base.templates[qtype]
        chosen["temperature"][qtype] = params.temperature[qtype]
        if qtype in ("noul", "set"):
            chosen["bias"][qtype] = params.bias[qtype]
        if qtype == "noul":
            chosen["pair"] = params.pair.model_dump()
        if qtype in params.centred:
            chosen["centred"].append(qtype)
        report[qtype] = {"fit_items": sum(1 for x in fitting if x[1].type == qtype), "fit_accuracy": accuracy,
                         "fit_nll": round(loss, 4)}
    fitted = {**base.model_dump(), **{k: v for k, v in chosen.items() if v or k == "centred"}}
    fam.params = fam.params_type.model_validate(fitted)
    if base.abstain is not None:  # only a card that declares an abstain option scores one
        abstain, report["abstain"] = fit_abstain(fam, embed, prefix, fitting)
        if abstain is not None:
            fitted["abstain"] = abstain
    return {"parameters": fitted, "report": report, "golden": golden(fitted, embed)}


def fit_abstain(fam: ZeroShot, embed: Embedder, prefix: str, data: list[tuple[dict[str, Any], Question, Any]]
                ) -> tuple[dict[str, float] | None, dict[str, Any]]:
    """The abstain option's cosine (`parameters.abstain`, for cards declaring `decisions.abstain`), fitted by leaving
    the right answer out: every choice item of three or more options is read twice, as labelled (it should not
    abstain) and without its right option (it should: none of the rest fits). The level whose served rule,
    abstain_probability ≥ 0.5, is right most often wins (ties: the lower NLL). Choice temperature as fitted."""
    rows: list[tuple[np.ndarray, bool]] = []
    for item, q, view in data:
        if q.type != "choice" or len(q.options) < 3:
            continue
        cos = np.asarray([embed.cos(prefix + view.text, t) for t in fam.option_texts(q)])
        right = q.keys.index(item["expected"])
        rows += [(cos, False), (np.delete(cos, right), True)]
    if not rows:
        return None, {"fit_items": 0}
    temperature = fam.params.temperature["choice"]
    best: tuple[float, int, float] | None = None
    for level in np.round(np.linspace(-0.2, 1.0, 241), 3):
        loss, right = 0.0, 0
        for cos, should in rows:
            p = float(softmax(np.append(cos, level) / temperature)[-1])
            loss -= math.log(max(p if should else 1.0 - p, 1e-9))
            right += (p >= 0.5) == should
        if best is None or (-right, loss) < (-best[1], best[0]):
            best = (loss, right, float(level))
    assert best is not None
    loss, right, level = best
    return {"cosine": level}, {"fit_items": len(rows) // 2, "fit_rows": len(rows),
                               "fit_accuracy": round(right / len(rows), 4), "fit_nll": round(loss / len(rows), 4)}


def golden(params: dict[str, Any], embed: Embedder) -> dict[str, Any]:
    """The card's golden answers for the reference's readiness request, computed in process."""
    model, fam = _family(params)
    spec = model.card.decisions
    assert spec is not None
    view = parse_state(GOLDEN["state"]).view(None)
    state = _prefix(fam) + view.text
    answers: dict[str, Any] = {}
    for qid, raw in GOLDEN["questions"].items():
        q = validate(qid, raw, spec, model.id)
        assert isinstance(q, Question)
        texts = fam.option_texts(q)
        embed([state, *texts])
        p = fam.probabilities(q, np.asarray([embed.cos(state, t) for t in texts]))
        if q.type == "choice":
            answers[qid] = {"choice": q.keys[int(np.argmax(p))],
                            "probabilities": {k: round(float(v), 6) for k, v in zip(q.keys, p, strict=True)}}
        elif q.type == "noul":
            answers[qid] = {"noul": round(float(p[1]), 6)}
        else:
            answers[qid] = {"score": round(float(np.arange(len(p)) @ p), 6),
                            "probabilities": {k: round(float(v), 6) for k, v in zip(q.keys, p, strict=True)}}
    return {"surface": "decisions", "tolerance": 0.001, "request": GOLDEN, "expected": {"answers": answers}}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--card", default="decision-zeroshot", help="the decisions card to fit (its encoder)")
    parser.add_argument("--items", type=Path, nargs="+", default=ITEMS)
    parser.add_argument("--out", type=Path, default=None)
    args = parser.parse_args()
    global CARD
    CARD = ROOT / "model_repository" / args.card / "card.yaml"
    result = fit(args.items)
    text = json.dumps(result, indent=2)
    print(text)
    if args.out is not None:
        args.out.write_text(text + "\n")


if __name__ == "__main__":
    main()
