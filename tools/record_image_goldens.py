"""Record the image models' golden checks (printed as YAML blocks for their cards), computed in process.

- efficientnet-lite0: two small generated pictures, decoded and preprocessed by the gateway's own code
  (gateway/images), run through the PyTorch reference module (sr_build/recipes/images.py), embedding prefixes;
  readiness then checks Triton's ONNX answer against PyTorch's.
- ppocr-v4: a rendered line of text read by sr_backend/ocr.py on ONNX Runtime; readiness checks Triton's answer.

    python -m tools.record_image_goldens [--repo model_repository]
"""

from __future__ import annotations

import argparse
import base64
import io
from pathlib import Path
from typing import Any

import numpy as np
import yaml
from PIL import Image, ImageDraw, ImageFont

PREFIX = 64  # EfficientNet-Lite's features pass ReLU6: many are exactly 0, so compare more of them


def png(img: Image.Image) -> bytes:
    out = io.BytesIO()
    img.save(out, format="PNG", optimize=True)
    return out.getvalue()


def pictures() -> list[bytes]:
    """Two smooth, deterministic pictures (small PNGs, so the card stays readable)."""
    y, x = np.mgrid[0:96, 0:128]
    first = np.stack([x * 2, y * 2, 255 - x - y // 2], axis=-1).clip(0, 255).astype(np.uint8)
    second = Image.new("RGB", (120, 80), (30, 90, 160))
    draw = ImageDraw.Draw(second)
    draw.ellipse((20, 10, 90, 70), fill=(230, 200, 40))
    draw.rectangle((70, 40, 115, 75), fill=(200, 30, 30))
    return [png(Image.fromarray(first)), png(second)]


def data_url(data: bytes) -> str:
    return "data:image/png;base64," + base64.b64encode(data).decode("ascii")


def efficientnet_golden(repo: Path) -> dict[str, Any]:
    import torch

    from gateway.cards import load_card
    from gateway.images.decode import decode_image
    from gateway.images.preprocess import PREPROCESS
    from sr_build.recipes.images import efficientnet_module
    from sr_build.sources import package_dir

    card = load_card(repo / "efficientnet-lite0" / "card.yaml")
    assert card.build is not None and card.image is not None and card.image_max_pixels is not None
    source = card.build["source"]
    module = efficientnet_module(package_dir(source["package"], source["dir"]) / card.build["weights"])
    images = pictures()
    batch = np.stack([PREPROCESS[card.image.preprocess](decode_image(d, card.image_max_pixels)) for d in images])
    with torch.no_grad():
        _, embedding = module(torch.from_numpy(batch))
    return {"surface": "embeddings", "tolerance": 0.001,
            "request": {"input": [{"type": "image_url", "image_url": {"url": data_url(d)}} for d in images]},
            "expected": {"prefix": PREFIX, "embeddings": [[round(float(v), 6) for v in row[:PREFIX]]
                                                          for row in embedding.numpy()]}}


def rendered_text() -> bytes:
    img = Image.new("RGB", (300, 48), "white")
    ImageDraw.Draw(img).text((12, 10), "SR GATEWAY 2026", fill="black", font=ImageFont.load_default(size=24))
    return png(img)


def ocr_golden(repo: Path) -> dict[str, Any]:
    from gateway.cards import load_card
    from gateway.images.decode import decode_image
    from sr_backend.image_runners import load_ocr

    card = load_card(repo / "ppocr-v4" / "card.yaml")
    assert card.image_max_pixels is not None
    version = repo / "ppocr-v4" / "1"
    pipeline = load_ocr("onnxruntime", "fp32", version / "model.onnx", version / "recognizer.onnx", 2)
    data = rendered_text()
    pixels = decode_image(data, card.image_max_pixels).pixels
    h, w = pixels.shape[:2]
    lines, _ = pipeline.read(pixels)
    return {"surface": "ocr", "tolerance": 0.02, "request": {"image_base64": base64.b64encode(data).decode("ascii")},
            "expected": {"lines": [{"text": ln.text, "box": {"top": round(ln.top / h, 6), "left": round(ln.left / w, 6),
                                                             "bottom": round(ln.bottom / h, 6),
                                                             "right": round(ln.right / w, 6)}} for ln in lines]}}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--repo", type=Path, default=Path("model_repository"))
    args = parser.parse_args()
    for name, golden in (("efficientnet-lite0", efficientnet_golden(args.repo)), ("ppocr-v4", ocr_golden(args.repo))):
        print(f"# {name}\n" + yaml.safe_dump({"golden": golden}, sort_keys=False, width=118, default_flow_style=None))


if __name__ == "__main__":
    main()
