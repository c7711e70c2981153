"""From one sampled frame's OCR text lines to where the question's target is: the line whose text is most like
the instructions (scaled cosine of their sentence embeddings, as image `box` questions do), how sure that choice is
among the frame's lines, and how likely the target is on screen at all.

- confidence: softmax(cos / T) of the chosen line among the frame's lines (null when the frame has no text: there
  is nothing to choose between, and the box is the whole frame);
- visible: the chosen line's OCR score × sigmoid((cos − b) / T_visible): a frame whose best line reads clearly and
  says what the instructions describe shows the target; a frame without text, or whose text says something else,
  does not.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from ..heads import sigmoid, softmax
from ..images.ocr import TextLine

WHOLE_FRAME = {"top": 0.0, "left": 0.0, "bottom": 1.0, "right": 1.0}
DIGITS = 6


@dataclass(frozen=True)
class Spot:
    box: dict[str, float]
    confidence: float | None
    visible: float


def spot(lines: list[TextLine], cosines: np.ndarray, *, temperature: float, visible_bias: float,
         visible_temperature: float) -> Spot:
    """Where the target is in one frame, given each line's cosine with the instructions."""
    if not lines:
        return Spot(dict(WHOLE_FRAME), None, 0.0)
    p = softmax(np.asarray(cosines, dtype=np.float64) / temperature)
    best = int(np.argmax(p))
    presence = float(sigmoid(np.asarray([(cosines[best] - visible_bias) / visible_temperature]))[0])
    visible = float(np.clip(lines[best].score, 0.0, 1.0)) * presence
    return Spot(lines[best].box.as_dict(), round(float(p[best]), DIGITS), round(visible, DIGITS))
