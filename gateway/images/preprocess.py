"""Per-model image preprocessing, all in one place: what each image model sees of a decoded picture.

Every model first gets `decode.decode_image`'s output (RGB, EXIF-oriented, at most the card's `image_max_pixels`).
Then, by the card's `image.preprocess`:

- `efficientnet-lite` (EfficientNet-Lite0, ImageNet-1k): bicubic resize so the short side is 256 (= 224 / 0.875,
  the reference crop fraction), centre crop 224×224, sent to Triton as uint8 HWC. The graph itself normalises
  with the TF-Lite reference constants `(x - 127) / 128` (see `sr_build/recipes/images.py`), so only bytes cross
  gRPC and the in-process baseline and the server cannot disagree on the constants.
- `ppocr` (PP-OCRv4 detector + recogniser): the decoded pixels as they are. The Triton model (sr_backend/ocr.py)
  resizes for the detector (short side up to 736, multiples of 32, `(x/255 - 0.5) / 0.5`, BGR) and crops each
  detected line from the full-resolution pixels for the recogniser (height 48), because recognition needs the
  detail the detector's scale throws away.
"""

from __future__ import annotations

from collections.abc import Callable

import numpy as np
from PIL import Image

from .decode import DecodedImage

EFFICIENTNET_SIZE = 224
EFFICIENTNET_RESIZE = 256


def efficientnet_lite(image: DecodedImage) -> np.ndarray:
    """uint8 [224, 224, 3]: short side to 256 (bicubic), centre crop 224."""
    img = Image.fromarray(image.pixels)
    w, h = img.size
    scale = EFFICIENTNET_RESIZE / min(w, h)
    img = img.resize((max(EFFICIENTNET_SIZE, round(w * scale)), max(EFFICIENTNET_SIZE, round(h * scale))),
                     Image.Resampling.BICUBIC)
    w, h = img.size
    left, top = (w - EFFICIENTNET_SIZE) // 2, (h - EFFICIENTNET_SIZE) // 2
    img = img.crop((left, top, left + EFFICIENTNET_SIZE, top + EFFICIENTNET_SIZE))
    return np.ascontiguousarray(np.asarray(img, dtype=np.uint8))


def ppocr(image: DecodedImage) -> np.ndarray:
    """uint8 [H, W, 3] as decoded; the OCR model resizes for its detector itself (see the module docstring)."""
    return image.pixels


PREPROCESS: dict[str, Callable[[DecodedImage], np.ndarray]] = {
    "efficientnet-lite": efficientnet_lite,
    "ppocr": ppocr,
}
