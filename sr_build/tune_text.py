"""Tuning a text model (served by the ragged runner, sr_backend.triton_model): every engine × precision × int8
recipe the card allows, checked against ONNX Runtime fp32 on the verification rows at every layer a request can
ask for, timed at the card's typical shapes (one request: latency; a dynamic batch: throughput), then the
instances × threads layouts of the winner.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import numpy as np

from sr_common.cards import Card, PrecisionSpec

from .tune_measure import (
    Candidate,
    cpu_layouts,
    current_timing,
    isolated,
    load_engines,
    measure_layout,
    report,
    set_timing,
    softmax,
    time_forward,
)
from .tune_samples import calibration_feeds, verification_rows

# the card's typical shapes: one request alone (latency) and a dynamic batch of them (throughput)
LATENCY_SHAPE = (1, 128)
THROUGHPUT_SHAPE = (16, 128)


def check(card: Card, spec: PrecisionSpec, reference: list[np.ndarray], outputs: list[np.ndarray]
          ) -> tuple[bool, dict[str, float], str]:
    """Does a precision's answer pass the card's check against the fp32 reference? Embeddings: every row's cosine;
    classifiers: the same argmax (per token for token heads, so the same spans) and the largest probability
    difference."""
    metrics: dict[str, float] = {}
    if card.embedding is not None:
        cos = [float(np.dot(a, b) / (np.linalg.norm(a) * np.linalg.norm(b)))
               for a, b in zip(reference, outputs, strict=True)]
        metrics["min_cosine"] = min(cos)
        if spec.min_cosine is None:
            return False, metrics, "the card states no min_cosine for this precision"
        if metrics["min_cosine"] < spec.min_cosine:
            return False, metrics, f"min cosine {metrics['min_cosine']:.6f} < {spec.min_cosine}"
        return True, metrics, ""
    ref = [softmax(r.astype(np.float64)) for r in reference]
    out = [softmax(o.astype(np.float64)) for o in outputs]
    metrics["max_prob_diff"] = max(float(np.max(np.abs(a - b))) for a, b in zip(ref, out, strict=True))
    metrics["argmax_mismatches"] = float(sum(int(np.sum(a.argmax(-1) != b.argmax(-1)))
                                             for a, b in zip(ref, out, strict=True)))
    if spec.max_prob_diff is None:
        return False, metrics, "the card states no max_prob_diff for this precision"
    if spec.same_argmax and metrics["argmax_mismatches"]:
        return False, metrics, f"{metrics['argmax_mismatches']:.0f} argmax mismatches"
    if metrics["max_prob_diff"] > spec.max_prob_diff:
        return False, metrics, f"max probability difference {metrics['max_prob_diff']:.4f} > {spec.max_prob_diff}"
    return True, metrics, ""


def rows_of(vocab_rows: list[np.ndarray], shape: tuple[int, int], limit: int) -> list[np.ndarray]:
    rows, width = shape
    ids = np.concatenate(vocab_rows)
    width = min(width, limit)
    return [np.resize(np.roll(ids, i), width).astype(np.int64) for i in range(rows)]


def text_runner(engine: str, precision: str, onnx: Path, threads: int, recipe: str = "dynamic") -> Any:
    from sr_backend.ragged import RaggedRunner

    return RaggedRunner(load_engines().load_engine(engine, precision, onnx, threads, recipe=recipe or "dynamic"),
                        max_batch_tokens=8192)


def every_layer(card: Card, rows: list[np.ndarray]) -> list[Any]:
    """The verification rows once per layer an embedder's graph pools (its declared early exits), so a precision
    must pass its check at every layer a request can ask for, not only the default."""
    from sr_backend.ragged import Row

    count = len(card.embedding.layers) if card.embedding is not None else 1
    return list(rows) if count < 2 else [Row(r, layer=k) for k in range(count) for r in rows]


def fp32_reference(onnx: Path, rows: list[Any]) -> list[np.ndarray]:
    return list(text_runner("onnxruntime", "fp32", onnx, 0).run(rows)[0])


def measure_candidate(engine: str, precision: str, onnx: Path, rows: list[Any],
                       latency_rows: list[np.ndarray], batch_rows: list[np.ndarray], timing: tuple[float, int],
                       recipe: str = "dynamic") -> tuple[list[np.ndarray], float, float]:
    """The candidate's answers on the verification rows, then seconds per forward at both shapes."""
    set_timing(timing)
    runner = text_runner(engine, precision, onnx, 0, recipe)
    outputs = runner.run(rows)[0]
    return outputs, time_forward(runner, latency_rows), time_forward(runner, batch_rows)


def measure_text(card: Card, engine: str | None, precision: str | None, cores: int, say: Any
                 ) -> tuple[Candidate, list[Candidate], list[dict[str, Any]]]:
    """Every engine x precision x int8 recipe the card allows (or the one asked for), checked against ONNX Runtime
    fp32 and timed at both shapes; the best, every candidate with its reason, and the best one's layouts."""
    engines = load_engines()
    onnx = card.version_dir / "model.onnx"
    rows = verification_rows(card)
    layered = every_layer(card, rows)  # a faster precision is checked at every layer a request can ask for
    reference = isolated(fp32_reference, onnx, layered)
    precisions = [precision] if precision else ["fp32", *card.precisions]
    wanted = [engine] if engine else list(card.engines)
    limit = card.limits.max_input_tokens
    latency_rows = rows_of(rows, LATENCY_SHAPE, limit)
    batch_rows = rows_of(rows, THROUGHPUT_SHAPE, limit)
    candidates: list[Candidate] = []
    # int8 comes in recipes: ONNX Runtime's dynamic and static, OpenVINO's NNCF; each is a candidate with the card's
    # int8 check
    recipes = {("onnxruntime", "int8"): engines.INT8_RECIPES, ("openvino", "int8"): engines.OPENVINO_INT8_RECIPES}
    variants = [(name, prec, recipe) for name in wanted for prec in precisions
                for recipe in recipes.get((name, prec), ("",))]
    feeds: list[dict[str, np.ndarray]] = []  # calibration rows, read once for the recipes that need them
    for name, prec, recipe in variants:
        cand = Candidate(name, prec, recipe)
        candidates.append(cand)
        if (name, prec) not in engines.SUPPORTED:
            cand.status, cand.reason = "unavailable", f"{name} has no {prec} path"
            continue
        try:
            if recipe in ("static", "nncf") and not feeds:
                feeds = calibration_feeds(card, onnx)
            if name == "onnxruntime" and prec == "int8":
                from sr_backend.engines.ort_engine import ensure_int8

                ensure_int8(onnx, engines.int8_path(onnx, recipe), recipe, feeds if recipe == "static" else None)
            elif name == "openvino" and prec == "int8":
                from sr_backend.engines.openvino_engine import ensure_int8_nncf

                ensure_int8_nncf(onnx, engines.int8_path(onnx, recipe), feeds)
            outputs, latency, seconds = isolated(measure_candidate, name, prec, onnx, layered, latency_rows,
                                                 batch_rows, current_timing(), recipe or "dynamic")
        except Exception as exc:  # an engine this host or install cannot run is a reason, not a failure
            cand.status, cand.reason = "unavailable", f"{type(exc).__name__}: {exc}"
            continue
        if prec != "fp32":
            ok, cand.check, why = check(card, card.precisions[prec], reference, outputs)  # type: ignore[index]
            if not ok:
                cand.status, cand.reason = "rejected", why
                continue
        else:
            ok, cand.check, _ = check(card, PrecisionSpec(min_cosine=0.99999, max_prob_diff=1e-4), reference,
                                      outputs)
            if not ok:
                cand.status, cand.reason = "rejected", f"does not reproduce the fp32 reference: {cand.check}"
                continue
        cand.latency_ms = round(latency * 1000, 2)
        cand.rows_per_s = round(len(batch_rows) / seconds, 1)
        cand.status = "measured"
    shape = (f"rows/s at {THROUGHPUT_SHAPE[0]}x{THROUGHPUT_SHAPE[1]}, {{}} ms at "
             f"{LATENCY_SHAPE[0]}x{LATENCY_SHAPE[1]}")
    best = report(card, candidates, lambda c: f"{c.rows_per_s} " + shape.format(c.latency_ms), say)
    layouts = [isolated(measure_layout, text_runner, best.engine, best.precision, onnx, n, t, latency_rows,
                        batch_rows, current_timing(), best.recipe or "dynamic")
               for n, t in cpu_layouts(cores, card.max_instances)]
    return best, candidates, layouts


