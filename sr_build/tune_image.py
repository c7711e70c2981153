"""Tuning an image model (sr_backend/image_model.py): the classifier (efficientnet-lite) and the OCR pipeline
(ppocr), by the text models' procedure on pictures: every engine × precision the card allows, checked against
ONNX Runtime fp32 on the verification pictures (sr_build.tune_samples), timed at one picture and a batch, then the
layouts of the winner.
"""

from __future__ import annotations

from functools import partial
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

IMAGE_BATCH = 16  # the classifier's throughput shape: a dynamic batch of 16 pictures (224x224); latency: one
# ONNX Runtime's dynamic int8 of a conv net: the convolutions and the classifier's Gemm, not only MatMuls
IMAGE_INT8_OPS = ("Conv", "Gemm", "MatMul")


def image_kind(card: Card) -> str:
    return "ocr" if card.image is not None and card.image.preprocess == "ppocr" else "classifier"


def image_graphs(card: Card) -> list[Path]:
    """The graphs a precision must exist for: the classifier's one, the OCR detector's and recogniser's."""
    onnx = card.version_dir / "model.onnx"
    return [onnx, onnx.with_name("recognizer.onnx")] if image_kind(card) == "ocr" else [onnx]


def pictures_digest(pictures: list[np.ndarray]) -> str:
    import hashlib

    digest = hashlib.sha256()
    for p in pictures:
        digest.update(str(p.shape).encode() + np.ascontiguousarray(p).tobytes())
    return digest.hexdigest()[:16]


def image_runner(kind: str, engine: str, precision: str, onnx: Path, threads: int, recipe: str = "dynamic") -> Any:
    from sr_backend.image_runners import OcrReader, load_classifier, load_ocr

    if kind == "ocr":
        return OcrReader(load_ocr(engine, precision, onnx, onnx.with_name("recognizer.onnx"), threads,
                                  recipe or "dynamic"))
    return load_classifier(engine, precision, onnx, threads, recipe or "dynamic")


def image_inputs(kind: str, pictures: list[np.ndarray]) -> Any:
    return pictures if kind == "ocr" else np.stack(pictures)


def image_reference(kind: str, onnx: Path, pictures: list[np.ndarray]) -> Any:
    return image_runner(kind, "onnxruntime", "fp32", onnx, 0).run(image_inputs(kind, pictures))


def measure_image_candidate(kind: str, engine: str, precision: str, onnx: Path, pictures: list[np.ndarray],
                             latency_in: Any, batch_in: Any, timing: tuple[float, int], recipe: str = "dynamic"
                             ) -> tuple[Any, float, float]:
    """The candidate's answers on the verification pictures, then seconds per forward at both shapes."""
    set_timing(timing)
    runner = image_runner(kind, engine, precision, onnx, 0, recipe)
    answers = runner.run(image_inputs(kind, pictures))
    return answers, time_forward(runner, latency_in), time_forward(runner, batch_in)


def cosines(a: np.ndarray, b: np.ndarray) -> np.ndarray:
    return np.asarray(np.sum(a * b, axis=-1) / (np.linalg.norm(a, axis=-1) * np.linalg.norm(b, axis=-1)))


def check_image(card: Card, spec: PrecisionSpec, reference: Any, outputs: Any,
                sizes: list[tuple[int, int]] | None = None) -> tuple[bool, dict[str, float], str]:
    """Does a precision's answer on the verification pictures pass the card's check against the fp32 reference?
    Classifier: the same top-1 on every picture, the largest probability difference, every embedding's cosine, and
    the golden pictures' embeddings within the served golden check's tolerance of the recorded PyTorch answer.
    OCR: the same text on every picture (`same_argmax`: CTC's greedy argmax decoding), boxes within the golden
    tolerance (fractions of the picture), and line scores within max_prob_diff where the card states one."""
    assert card.golden is not None
    tolerance = spec.golden_tolerance or card.golden.tolerance
    metrics: dict[str, float] = {}
    if image_kind(card) == "ocr":
        sizes = sizes or [(1, 1)] * len(reference)  # (height, width) of each verification picture
        texts = [[ln.text for ln in lines] for lines in outputs]
        metrics["text_mismatches"] = float(sum(a != b for a, b in
                                               zip([[ln.text for ln in r] for r in reference], texts, strict=True)))
        pairs = [(r, o, h, w) for rs, os_, (h, w) in zip(reference, outputs, sizes, strict=True)
                 if len(rs) == len(os_) for r, o in zip(rs, os_, strict=True)]
        metrics["max_score_diff"] = max((abs(r.score - o.score) for r, o, _, _ in pairs), default=0.0)
        metrics["max_box_diff"] = max((max(abs(r.top - o.top) / h, abs(r.bottom - o.bottom) / h,
                                           abs(r.left - o.left) / w, abs(r.right - o.right) / w)
                                       for r, o, h, w in pairs), default=0.0)
        if spec.same_argmax and metrics["text_mismatches"]:
            return False, metrics, f"{metrics['text_mismatches']:.0f} picture(s) read as different text: {texts}"
        if metrics["max_box_diff"] > tolerance:
            return False, metrics, f"boxes moved by {metrics['max_box_diff']:.4f} of the picture > {tolerance}"
        if spec.max_prob_diff is not None and metrics["max_score_diff"] > spec.max_prob_diff:
            return False, metrics, f"line score difference {metrics['max_score_diff']:.4f} > {spec.max_prob_diff}"
        return True, metrics, ""
    ref = softmax(reference["logits"].astype(np.float64))
    out = softmax(outputs["logits"].astype(np.float64))
    metrics["argmax_mismatches"] = float(np.sum(ref.argmax(-1) != out.argmax(-1)))
    metrics["max_prob_diff"] = float(np.max(np.abs(ref - out)))
    metrics["min_cosine"] = float(cosines(reference["embedding"], outputs["embedding"]).min())
    want = (card.golden.expected.get("embeddings") or []) if card.golden.surface == "embeddings" else []
    if want:
        prefix = int(card.golden.expected.get("prefix", len(want[0])))
        got = outputs["embedding"][: len(want), :prefix]
        metrics["golden_max_diff"] = float(np.max(np.abs(got - np.array(want, dtype=np.float64))))
    if spec.min_cosine is None or spec.max_prob_diff is None:
        return False, metrics, "the card states no min_cosine and max_prob_diff for this precision"
    if spec.same_argmax and metrics["argmax_mismatches"]:
        return False, metrics, f"{metrics['argmax_mismatches']:.0f} top-1 mismatches"
    if metrics["max_prob_diff"] > spec.max_prob_diff:
        return False, metrics, f"max probability difference {metrics['max_prob_diff']:.4f} > {spec.max_prob_diff}"
    if metrics["min_cosine"] < spec.min_cosine:
        return False, metrics, f"min embedding cosine {metrics['min_cosine']:.6f} < {spec.min_cosine}"
    if metrics.get("golden_max_diff", 0.0) > tolerance:
        return False, metrics, (f"golden embeddings differ from the recorded answer by "
                                f"{metrics['golden_max_diff']:.4f} > {tolerance}")
    return True, metrics, ""


def image_layouts(kind: str, cores: int) -> list[tuple[int, int]]:
    """The classifier: the text models' layouts. OCR: the author's one instance with every core first (a picture
    takes ~1 s of CPU: two busy OCR instances take the cores from the gateway and the text models), then those."""
    return ([(1, cores)] if kind == "ocr" and cores > 1 else []) + cpu_layouts(cores)


def measure_image(card: Card, pictures: list[np.ndarray], engine: str | None, precision: str | None, cores: int,
                  say: Any) -> tuple[Candidate, list[Candidate], list[dict[str, Any]]]:
    """The text models' procedure on an image model: every engine x precision the card allows, checked against
    ONNX Runtime fp32 on the verification pictures, timed at one picture and a batch (classifier: IMAGE_BATCH
    pictures; OCR: one golden picture, read whole), then the layouts of the winner."""
    from sr_backend.engines.ort_engine import ensure_int8

    engines = load_engines()
    kind = image_kind(card)
    onnx = card.version_dir / "model.onnx"
    reference = isolated(image_reference, kind, onnx, pictures)
    if kind == "ocr":
        latency_in: Any = pictures[:1]
        batch_in: Any = pictures[:1]
    else:
        latency_in = np.stack(pictures[:1])
        batch_in = np.stack([pictures[i % len(pictures)] for i in range(IMAGE_BATCH)])
    precisions = [precision] if precision else ["fp32", *card.precisions]
    wanted = [engine] if engine else list(card.engines)
    candidates: list[Candidate] = []
    for name in wanted:
        for prec in precisions:
            cand = Candidate(name, prec, ("nncf" if name == "openvino" else "dynamic") if prec == "int8" else "")
            candidates.append(cand)
            if (name, prec) not in engines.SUPPORTED:
                cand.status, cand.reason = "unavailable", f"{name} has no {prec} path"
                continue
            if (name, prec) == ("openvino", "int8"):  # NNCF is calibrated on request texts; none for pictures
                cand.status, cand.reason = "unavailable", "openvino int8 (NNCF) has no picture calibration set"
                continue
            if name == "torch":
                cand.status, cand.reason = "unavailable", "the torch engine serves text graphs only"
                continue
            try:
                if prec == "int8":
                    for graph in image_graphs(card):
                        ensure_int8(graph, engines.int8_path(graph), "dynamic", op_types=IMAGE_INT8_OPS)
                outputs, latency, seconds = isolated(measure_image_candidate, kind, name, prec, onnx, pictures,
                                                      latency_in, batch_in, current_timing(), "dynamic")
            except Exception as exc:  # an engine this host or install cannot run is a reason, not a failure
                cand.status, cand.reason = "unavailable", f"{type(exc).__name__}: {exc}"
                continue
            exact = PrecisionSpec(min_cosine=0.99999, max_prob_diff=1e-4)
            spec = card.precisions[prec] if prec != "fp32" else exact  # type: ignore[index]
            sizes = [(p.shape[0], p.shape[1]) for p in pictures]
            ok, cand.check, why = check_image(card, spec, reference, outputs, sizes)
            cand.latency_ms = round(latency * 1000, 2)
            cand.rows_per_s = round(len(batch_in) / seconds, 1)
            if not ok:
                cand.status = "rejected"
                cand.reason = why if prec != "fp32" else f"does not reproduce the fp32 reference: {why}"
                continue
            cand.status = "measured"
    shape = "1 picture" if kind == "ocr" else f"batch {IMAGE_BATCH} of 224x224"
    best = report(card, candidates,
                   lambda c: f"{c.rows_per_s} pictures/s at {shape}, {c.latency_ms} ms for one picture", say)
    layouts = [isolated(measure_layout, partial(image_runner, kind), best.engine, best.precision, onnx, n, t,
                        latency_in, batch_in, current_timing(), best.recipe or "dynamic")
               for n, t in image_layouts(kind, cores)]
    return best, candidates, layouts
