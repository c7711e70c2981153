"""The image models' forwards on any engine of sr_backend/engines, without Triton: the Python backend
(image_model.py) serves them and the tuner (sr_build/tune.py) measures and checks the same objects.

- `Classifier`: uint8 pixels [B, 224, 224, 3] → every graph output by name (logits, embedding), one forward.
- `OcrPipeline` (ocr.py): both PP-OCR graphs (detector, recogniser) on the same engine and precision.
"""

from __future__ import annotations

from pathlib import Path

import numpy as np

from .engines import Engine, load_engine
from .ocr import Line, OcrPipeline, read_characters

CLASSIFIER_INPUT = "pixels"


class Classifier:
    def __init__(self, engine: Engine) -> None:
        self.engine = engine

    def run(self, pixels: np.ndarray) -> dict[str, np.ndarray]:
        return self.engine.forward_all({CLASSIFIER_INPUT: pixels})


class OcrReader:
    """Pictures one at a time, as the Triton model reads them: `run(pictures)` is each picture's text lines."""

    def __init__(self, pipeline: OcrPipeline) -> None:
        self.pipeline = pipeline

    def run(self, pictures: list[np.ndarray]) -> list[list[Line]]:
        return [self.pipeline.read(p)[0] for p in pictures]


def load_classifier(engine: str, precision: str, onnx: Path, threads: int = 0, recipe: str = "dynamic"
                    ) -> Classifier:
    return Classifier(load_engine(engine, precision, onnx, threads, recipe=recipe))


def load_ocr(engine: str, precision: str, detector: Path, recogniser: Path, threads: int = 0,
             recipe: str = "dynamic") -> OcrPipeline:
    """The OCR pipeline with both graphs on `engine` at `precision` (int8 reads each graph's quantised sibling)."""
    return OcrPipeline(load_engine(engine, precision, detector, threads, recipe=recipe),
                       load_engine(engine, precision, recogniser, threads, recipe=recipe),
                       read_characters(recogniser))
