"""Pictures for the image tests: real photos a package ships (scikit-image's sample data), a rendered receipt, and
files built to sit exactly at (or one step past) each of the gateway's image limits."""

from __future__ import annotations

import base64
import io
import zlib
from pathlib import Path
from typing import Any

from PIL import Image, ImageDraw, ImageFont

RECEIPT_LINES = ["CORNER BAKERY", "12 Market Street", "2026-11-30 09:41", "Sourdough loaf 4.50",
                 "Croissant x2 3.20", "TOTAL 7.70"]


def photo(name: str) -> bytes:
    """A sample photo shipped inside the scikit-image wheel (no download)."""
    import skimage

    return (Path(skimage.__file__).parent / "data" / name).read_bytes()


def encode(img: Image.Image, fmt: str = "PNG", **kwargs: Any) -> bytes:
    out = io.BytesIO()
    img.save(out, format=fmt, **kwargs)
    return out.getvalue()


def data_url(data: bytes, mime: str = "image/png") -> str:
    return f"data:{mime};base64,{base64.b64encode(data).decode('ascii')}"


def image_part(data: bytes, mime: str = "image/png") -> dict[str, Any]:
    return {"type": "image_url", "image_url": {"url": data_url(data, mime)}}


def receipt() -> tuple[bytes, list[tuple[int, int, int, int]], tuple[int, int]]:
    """A pillow-drawn receipt: PNG bytes, each line's (top, left, bottom, right) ink box, and (height, width)."""
    font = ImageFont.load_default(size=28)
    img = Image.new("RGB", (520, 60 + 48 * len(RECEIPT_LINES)), "white")
    draw = ImageDraw.Draw(img)
    boxes = []
    for i, text in enumerate(RECEIPT_LINES):
        xy = (30, 30 + 48 * i)
        draw.text(xy, text, fill="black", font=font)
        left, top, right, bottom = draw.textbbox(xy, text, font=font)
        boxes.append((top, left, bottom, right))
    return encode(img), boxes, (img.height, img.width)


def blank_png(width: int, height: int) -> bytes:
    """A white PNG of any size, written directly (a 16 MP white picture compresses to a few kB)."""
    def chunk(kind: bytes, body: bytes) -> bytes:
        return len(body).to_bytes(4, "big") + kind + body + zlib.crc32(kind + body).to_bytes(4, "big")

    row = b"\x00" + b"\xff" * (3 * width)
    compressor = zlib.compressobj(9)
    pixels = b"".join(compressor.compress(row) for _ in range(height)) + compressor.flush()
    header = width.to_bytes(4, "big") + height.to_bytes(4, "big") + bytes([8, 2, 0, 0, 0])
    return b"\x89PNG\r\n\x1a\n" + chunk(b"IHDR", header) + chunk(b"IDAT", pixels) + chunk(b"IEND", b"")


def padded_png(size: int) -> bytes:
    """A valid small PNG followed by padding up to exactly `size` bytes (decoders stop at IEND)."""
    base = encode(Image.new("RGB", (64, 64), (200, 120, 40)))
    return base + b"\x00" * (size - len(base))


def animated(fmt: str) -> bytes:
    frames = [Image.new("RGB", (32, 32), c) for c in ((255, 0, 0), (0, 0, 255))]
    return encode(frames[0], fmt, save_all=True, append_images=frames[1:], duration=100, loop=0)
