"""PP-OCRv4 text reading (rapidocr-onnxruntime's detector + recogniser ONNX files) without OpenCV.

Detector (DB): short side up to 736 (long side at most 2,000), both sides multiples of 32, `(x/255 - 0.5)/0.5` on
BGR; the probability map is thresholded at 0.3, dilated by one pixel, split into connected components; a component
scoring ≥ 0.5 (mean probability) becomes an axis-aligned box, grown by DB's unclip distance (area × 1.6 /
perimeter). Recogniser: each box cropped from the full-resolution pixels, height 48, batched by width, CTC greedy
decoding over the character list stored in the ONNX file's metadata. Lines are returned top to bottom, left to right.
This module has no Triton dependency: the in-process baseline and the Triton model run the same code.
"""

from __future__ import annotations

import time
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import onnxruntime as ort
from PIL import Image
from scipy import ndimage

from sr_backend.engines import Engine

DET_SIDE = 736
DET_MAX_SIDE = 2000
DET_THRESHOLD = 0.3
BOX_THRESHOLD = 0.5
UNCLIP_RATIO = 1.6
REC_HEIGHT = 48
REC_BATCH = 6
MIN_TEXT_SCORE = 0.5


@dataclass(frozen=True)
class Line:
    text: str
    top: int  # pixels of the image as given, top-left origin; bottom/right exclusive
    left: int
    bottom: int
    right: int
    score: float


def _det_input(pixels: np.ndarray) -> tuple[np.ndarray, float, float]:
    h, w = pixels.shape[:2]
    ratio = DET_SIDE / min(h, w) if min(h, w) < DET_SIDE else 1.0
    if max(h, w) * ratio > DET_MAX_SIDE:
        ratio = DET_MAX_SIDE / max(h, w)
    rh, rw = max(32, round(h * ratio / 32) * 32), max(32, round(w * ratio / 32) * 32)
    img = np.asarray(Image.fromarray(pixels).resize((rw, rh), Image.Resampling.BILINEAR), dtype=np.float32)
    x = (img[:, :, ::-1] / 255.0 - 0.5) / 0.5
    return np.ascontiguousarray(x.transpose(2, 0, 1)[None]), rh / h, rw / w


def boxes_from_map(prob: np.ndarray, sy: float, sx: float, height: int, width: int) -> list[tuple[int, int, int, int]]:
    """Axis-aligned text boxes (top, left, bottom, right) in source pixels from a DB probability map."""
    binary = ndimage.binary_dilation(prob > DET_THRESHOLD, structure=np.ones((2, 2), bool))
    labels, _ = ndimage.label(binary)
    out = []
    for index, found in enumerate(ndimage.find_objects(labels), start=1):
        if found is None:
            continue
        ys, xs = found
        bh, bw = ys.stop - ys.start, xs.stop - xs.start
        if min(bh, bw) < 3:
            continue
        if float(prob[ys, xs][labels[ys, xs] == index].mean()) < BOX_THRESHOLD:
            continue
        grow = bh * bw * UNCLIP_RATIO / (2 * (bh + bw))
        top, left = max(0.0, ys.start - grow), max(0.0, xs.start - grow)
        bottom, right = min(prob.shape[0], ys.stop + grow), min(prob.shape[1], xs.stop + grow)
        box = (int(top / sy), int(left / sx), min(height, int(np.ceil(bottom / sy))),
               min(width, int(np.ceil(right / sx))))
        if box[2] - box[0] >= 2 and box[3] - box[1] >= 2:
            out.append(box)
    out.sort(key=lambda b: ((b[0] + b[2]) // 2 // max(1, (b[2] - b[0]) // 2), b[1]))
    return out


def read_characters(recogniser: Path) -> list[str]:
    """The recogniser's character list, stored in its ONNX file's metadata (read without optimising the graph)."""
    options = ort.SessionOptions()
    options.graph_optimization_level = ort.GraphOptimizationLevel.ORT_DISABLE_ALL
    session = ort.InferenceSession(str(recogniser), sess_options=options, providers=["CPUExecutionProvider"])
    return str(session.get_modelmeta().custom_metadata_map["character"]).splitlines()


class OcrPipeline:
    """Both graphs on any engine of sr_backend/engines (the tuner's choice; image_runners.load_ocr builds one), with
    the recogniser's character list (read_characters)."""

    def __init__(self, detector: Engine, recogniser: Engine, characters: list[str]) -> None:
        self.detector = detector
        self.recogniser = recogniser
        self.characters = ["", *characters, " "]  # index 0 is CTC's blank; PP-OCR appends the space

    def detect(self, pixels: np.ndarray) -> list[tuple[int, int, int, int]]:
        x, sy, sx = _det_input(pixels)
        prob = self.detector.forward({"x": x})[0, 0]
        return boxes_from_map(prob, sy, sx, pixels.shape[0], pixels.shape[1])

    def _rec_batch(self, crops: list[np.ndarray]) -> list[tuple[str, float]]:
        ratios = [c.shape[1] / c.shape[0] for c in crops]
        width = max(REC_HEIGHT, int(np.ceil(REC_HEIGHT * max(ratios))))
        batch = np.zeros((len(crops), 3, REC_HEIGHT, width), dtype=np.float32)
        for i, crop in enumerate(crops):
            w = min(width, max(1, int(np.ceil(REC_HEIGHT * ratios[i]))))
            img = np.asarray(Image.fromarray(crop).resize((w, REC_HEIGHT), Image.Resampling.BILINEAR),
                             dtype=np.float32)
            batch[i, :, :, :w] = ((img[:, :, ::-1] / 255.0 - 0.5) / 0.5).transpose(2, 0, 1)
        probs = self.recogniser.forward({"x": batch})
        out = []
        for row in probs:
            ids, scores = row.argmax(axis=1), row.max(axis=1)
            keep = np.ones(len(ids), dtype=bool)
            keep[1:] = ids[1:] != ids[:-1]
            keep &= ids != 0
            text = "".join(self.characters[i] for i in ids[keep] if i < len(self.characters))
            out.append((text, float(scores[keep].mean()) if keep.any() else 0.0))
        return out

    def recognise(self, pixels: np.ndarray, boxes: list[tuple[int, int, int, int]]) -> list[tuple[str, float]]:
        crops = [pixels[top:bottom, left:right] for top, left, bottom, right in boxes]
        order = sorted(range(len(crops)), key=lambda i: crops[i].shape[1] / crops[i].shape[0])
        results: list[tuple[str, float]] = [("", 0.0)] * len(crops)
        for start in range(0, len(order), REC_BATCH):
            chunk = order[start : start + REC_BATCH]
            for i, answer in zip(chunk, self._rec_batch([crops[i] for i in chunk]), strict=True):
                results[i] = answer
        return results

    def read(self, pixels: np.ndarray) -> tuple[list[Line], int]:
        """Text lines of one RGB uint8 image, and the time its two graphs and the steps between took (ns)."""
        started = time.perf_counter_ns()
        boxes = self.detect(pixels)
        texts = self.recognise(pixels, boxes) if boxes else []
        lines = [Line(text.strip(), *box, score) for box, (text, score) in zip(boxes, texts, strict=True)
                 if text.strip() and score >= MIN_TEXT_SCORE]
        return lines, time.perf_counter_ns() - started
