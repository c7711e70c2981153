"""The OCR model's golden check: a recorded picture (base64 PNG in the card) must be read as the recorded lines
(exact text, boxes within the card's tolerance as fractions of the picture), twice, through the real Triton path."""

from __future__ import annotations

import base64
from typing import Any

from ..cards import Golden
from ..errors import ItemError
from ..runtime import Runtime, ServedModel
from .decode import decode_async
from .ocr import TextLine, read_text


class OcrGoldenMismatch(Exception):
    pass


def _compare(got: list[TextLine], want: list[dict[str, Any]], tolerance: float) -> None:
    if [g.text for g in got] != [w["text"] for w in want]:
        raise OcrGoldenMismatch(f"read {[g.text for g in got]}, expected {[w['text'] for w in want]}")
    for g, w in zip(got, want, strict=True):
        worst = max(abs(getattr(g.box, side) - float(w["box"][side])) for side in ("top", "left", "bottom", "right"))
        if worst > tolerance:
            raise OcrGoldenMismatch(f"line {g.text!r}: box {g.box} differs from {w['box']} by {worst:.3f}")


async def check_ocr_golden(runtime: Runtime, model: ServedModel, golden: Golden) -> dict[str, Any]:
    assert model.card.image_max_pixels is not None
    image = await decode_async(base64.b64decode(golden.request["image_base64"]), model.card.image_max_pixels)
    want = golden.expected["lines"]
    try:
        first = await read_text(runtime, model, image)
        second = await read_text(runtime, model, image)
    except ItemError as exc:
        raise OcrGoldenMismatch(f"the golden picture failed: {exc.code}: {exc.message}") from exc
    _compare(first, want, golden.tolerance)
    if first != second:
        raise OcrGoldenMismatch("two runs of the golden picture gave different answers")
    return {"status": "matched", "checked": len(want), "matched": len(want), "reference": "cpu"}
