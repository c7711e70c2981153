"""Turning uploaded bytes into pixels, safely: the one place that decodes images.

The format is read from the bytes (PNG, JPEG or WebP; a declared content type is never trusted), the size is checked
from the header before any pixel is decoded (a decompression bomb costs nothing), animated images are refused,
EXIF orientation is applied and the picture is scaled down to the model's `image_max_pixels`. Decoding runs on a
bounded thread pool, so a burst of uploads neither stalls the event loop nor decodes more images at once than
there are cores (each decoded image can be up to 16 MP × 3 bytes).
"""

from __future__ import annotations

import asyncio
import io
import math
import os
import warnings
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass

import numpy as np
from PIL import Image, ImageFile, ImageOps

MAX_IMAGE_BYTES = 16 * 1024 * 1024
MAX_SOURCE_PIXELS = 16_000_000
MAX_ASPECT = 200.0
FORMATS = ("PNG", "JPEG", "WEBP")

ImageFile.LOAD_TRUNCATED_IMAGES = False
# Our own header check (MAX_SOURCE_PIXELS) runs before decoding; Pillow's bomb guard stays on as a second line.
Image.MAX_IMAGE_PIXELS = MAX_SOURCE_PIXELS

_POOL = ThreadPoolExecutor(max_workers=max(1, os.cpu_count() or 1), thread_name_prefix="image-decode")


class ImageRejected(ValueError):
    """The bytes are not an image this gateway reads; the message says why (callers add which asset)."""


@dataclass(frozen=True)
class DecodedImage:
    """RGB pixels as read by a model, and the size of the image as sent (after EXIF orientation)."""

    pixels: np.ndarray  # uint8 [H, W, 3]
    width: int  # as sent, oriented
    height: int
    format: str  # "PNG" | "JPEG" | "WEBP"
    nbytes: int  # size of the upload


def sniff(data: bytes) -> str:
    """The format named by the file's own signature."""
    if data.startswith(b"\x89PNG\r\n\x1a\n"):
        return "PNG"
    if data.startswith(b"\xff\xd8\xff"):
        return "JPEG"
    if len(data) >= 12 and data[:4] == b"RIFF" and data[8:12] == b"WEBP":
        return "WEBP"
    if data[:6] in (b"GIF87a", b"GIF89a"):
        raise ImageRejected("GIF images are not supported: send PNG, JPEG or WebP")
    raise ImageRejected("the bytes are not a PNG, JPEG or WebP image")


def _target_size(width: int, height: int, max_pixels: int) -> tuple[int, int]:
    if width * height <= max_pixels:
        return width, height
    scale = math.sqrt(max_pixels / (width * height))
    return max(1, math.floor(width * scale)), max(1, math.floor(height * scale))


def open_checked(data: bytes) -> tuple[ImageFile.ImageFile, str]:
    """The image opened (header only, no pixel decoded) and its format, after every check the header allows:
    size, format from the signature, pixels, aspect ratio, animation. Raises ImageRejected with the reason."""
    if not data:
        raise ImageRejected("the image is empty (0 bytes)")
    if len(data) > MAX_IMAGE_BYTES:
        raise ImageRejected(f"the image has {len(data)} bytes; at most {MAX_IMAGE_BYTES} (16 MiB) are accepted")
    fmt = sniff(data)
    with warnings.catch_warnings():
        warnings.simplefilter("error", Image.DecompressionBombWarning)
        try:
            img = Image.open(io.BytesIO(data), formats=[fmt])
        except (OSError, ValueError, SyntaxError, Image.DecompressionBombError,
                Image.DecompressionBombWarning) as exc:
            raise ImageRejected(f"the {fmt} header cannot be read: {exc}") from exc
    width, height = img.size
    if width < 1 or height < 1:
        raise ImageRejected(f"the image has no pixels ({width}x{height})")
    if width * height > MAX_SOURCE_PIXELS:
        raise ImageRejected(f"the image has {width}x{height} = {width * height} pixels; at most "
                            f"{MAX_SOURCE_PIXELS} are accepted")
    if max(width, height) / min(width, height) > MAX_ASPECT:
        raise ImageRejected(f"the image's aspect ratio {width}x{height} exceeds {MAX_ASPECT:g}")
    if getattr(img, "is_animated", False) or getattr(img, "n_frames", 1) > 1:
        raise ImageRejected(f"animated {fmt} images are not supported")
    return img, fmt


def decode_image(data: bytes, max_pixels: int) -> DecodedImage:
    """Validate and decode one image (blocking; see `decode_async`). Raises ImageRejected with the reason."""
    img, fmt = open_checked(data)
    width, height = img.size
    with warnings.catch_warnings():
        warnings.simplefilter("error", Image.DecompressionBombWarning)
        try:
            orientation = img.getexif().get(0x0112, 1)  # a PNG's EXIF may sit after its pixels: this can load
            swapped = orientation in (5, 6, 7, 8)
            sent_w, sent_h = (height, width) if swapped else (width, height)
            target_w, target_h = _target_size(sent_w, sent_h, max_pixels)
            if fmt == "JPEG":  # let libjpeg decode at 1/2, 1/4 or 1/8 scale when that still covers the target
                img.draft("RGB", (target_h, target_w) if swapped else (target_w, target_h))
            img.load()
        except (OSError, ValueError, SyntaxError, Image.DecompressionBombError,
                Image.DecompressionBombWarning) as exc:
            raise ImageRejected(f"the {fmt} image is truncated or corrupt: {exc}") from exc
    rgb: Image.Image = ImageOps.exif_transpose(img) or img
    if rgb.mode in ("RGBA", "LA", "PA") or (rgb.mode == "P" and "transparency" in rgb.info):
        rgba = rgb.convert("RGBA")  # transparent pixels read as on white paper, not as black
        rgb = Image.alpha_composite(Image.new("RGBA", rgba.size, (255, 255, 255, 255)), rgba)
    rgb = rgb.convert("RGB")
    if rgb.size != (target_w, target_h):
        rgb = rgb.resize((target_w, target_h), Image.Resampling.BICUBIC, reducing_gap=3.0)
    return DecodedImage(np.asarray(rgb, dtype=np.uint8), sent_w, sent_h, fmt, len(data))


async def decode_async(data: bytes, max_pixels: int) -> DecodedImage:
    """`decode_image` on the bounded decode pool, off the event loop."""
    return await asyncio.get_running_loop().run_in_executor(_POOL, decode_image, data, max_pixels)
