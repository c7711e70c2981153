"""Reading text in an image through the OCR model in Triton (PP-OCRv4, model_repository/ppocr-v4).

The API the decisions code uses:

    lines = await read_text(runtime, model, image)   # image: a DecodedImage (see gateway/assets.py: Assets.decode)
    for line in lines: line.text, line.box.top, line.box.left, line.box.bottom, line.box.right, line.score

Boxes are fractions of the image's height and width, top-left origin. Fractions do not depend on the scale, so they
hold for the image as sent even when it was read scaled down to the card's `image_max_pixels`.
"""

from __future__ import annotations

import json
from dataclasses import dataclass

from ..errors import ItemError, no_answer
from ..runtime import Runtime, ServedModel
from ..timing import Timing
from .decode import DecodedImage
from .run import ImageJob, forward_images

OUTPUT = "LINES"


@dataclass(frozen=True)
class Box:
    top: float
    left: float
    bottom: float
    right: float

    def as_dict(self) -> dict[str, float]:
        return {"top": self.top, "left": self.left, "bottom": self.bottom, "right": self.right}


@dataclass(frozen=True)
class TextLine:
    text: str
    box: Box
    score: float


def lines_from_json(raw: bytes, height: int, width: int) -> list[TextLine]:
    """The OCR model's LINES answer (pixel boxes of the picture it read) as fractions of that picture."""
    out = []
    for line in json.loads(raw.decode("utf-8")):
        box = Box(round(line["top"] / height, 6), round(line["left"] / width, 6),
                  round(line["bottom"] / height, 6), round(line["right"] / width, 6))
        out.append(TextLine(str(line["text"]), box, float(line["score"])))
    return out


async def read_many(runtime: Runtime, model: ServedModel, images: list[DecodedImage], *,
                    deadline_ms: float | None = None, timing: Timing | None = None,
                    ) -> list[list[TextLine] | ItemError]:
    """Text lines of each image (pictures of one call run concurrently); a failed image is its ItemError."""
    jobs = [ImageJob(image=img) for img in images]
    await forward_images(runtime, model, jobs, OUTPUT, deadline_ms=deadline_ms, timing=timing)
    out: list[list[TextLine] | ItemError] = []
    for job in jobs:
        if job.result is None or job.image is None:
            out.append(no_answer(job.error))
            continue
        h, w = job.image.pixels.shape[:2]
        out.append(lines_from_json(bytes(job.result.values.reshape(-1)[0]), h, w))
    return out


async def read_text(runtime: Runtime, model: ServedModel, image: DecodedImage, *,
                    deadline_ms: float | None = None, timing: Timing | None = None) -> list[TextLine]:
    """Text lines of one image, top to bottom; raises ItemError when the model fails on it."""
    answer = (await read_many(runtime, model, [image], deadline_ms=deadline_ms, timing=timing))[0]
    if isinstance(answer, ItemError):
        raise answer
    return answer
