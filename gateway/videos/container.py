"""Video containers through PyAV (FFmpeg's demuxers and decoders), safely: the one place that opens a video.

Hostile uploads are expected, so:
- the container's format is read from its signature (MP4/QuickTime, WebM/Matroska, AVI) and FFmpeg is told to use
  only that demuxer: no probing into playlist or concat formats that would open other files or URLs;
- the video stream's codec must be a common one, its frame size within the image limits;
- the length is read from the container; its packets are then walked (demuxed, not decoded) to check that the
  stream really reaches that length, so a truncated upload is refused before any question reads it;
- frames are decoded one at a time and only the sampled ones are kept, scaled to `FRAME_PIXELS`; decoding stops
  after the last wanted time or `MAX_DECODED_FRAMES`, whichever comes first.
Everything runs on a bounded thread pool, off the event loop.
"""

from __future__ import annotations

import asyncio
import io
import math
import os
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from fractions import Fraction
from typing import Any

import av
import numpy as np

from ..images.decode import MAX_ASPECT, MAX_SOURCE_PIXELS, DecodedImage

MAX_VIDEO_BYTES = 64 * 1024 * 1024
MAX_PACKETS = 100_000  # packets walked to check the length (a minute at 120 fps is 7,200)
MAX_DECODED_FRAMES = 18_000  # frames decoded to sample one video (two and a half minutes at 120 fps)
FRAME_PIXELS = 921_600  # a sampled frame is read at most at this size (1280×720), scaled with its aspect kept
CODECS = frozenset({"h264", "hevc", "vp8", "vp9", "av1", "mpeg4", "mpeg2video", "mjpeg"})
FORMATS = {"mov": "MP4/QuickTime", "matroska": "WebM/Matroska", "avi": "AVI"}
# A stream may end this short of the length its container declares (rounding, a last frame's duration).
LENGTH_SLACK_SECONDS = 0.5

_POOL = ThreadPoolExecutor(max_workers=max(1, os.cpu_count() or 1), thread_name_prefix="video-decode")


class VideoRejected(ValueError):
    """The bytes are not a video this gateway reads; the message says why (callers add which entry)."""


@dataclass(frozen=True)
class Probe:
    """What the container says about its first video stream."""

    format: str  # the demuxer used: mov | matroska | avi
    codec: str
    width: int
    height: int
    seconds: float | None  # None: the container does not say how long it is


def sniff(data: bytes) -> str:
    """The demuxer named by the file's own signature."""
    if len(data) >= 12 and data[4:8] == b"ftyp":
        return "mov"
    if data.startswith(b"\x1a\x45\xdf\xa3"):
        return "matroska"
    if len(data) >= 12 and data[:4] == b"RIFF" and data[8:12] == b"AVI ":
        return "avi"
    raise VideoRejected("the bytes are not an MP4/QuickTime, WebM/Matroska or AVI video")


def _open(data: bytes) -> tuple[Any, str]:
    if not data:
        raise VideoRejected("the video is empty (0 bytes)")
    if len(data) > MAX_VIDEO_BYTES:
        raise VideoRejected(f"the video has {len(data)} bytes; at most {MAX_VIDEO_BYTES} (64 MiB) are accepted")
    fmt = sniff(data)
    try:
        return av.open(io.BytesIO(data), mode="r", format=fmt, metadata_errors="ignore"), fmt
    except (av.FFmpegError, ValueError, OSError) as exc:
        raise VideoRejected(f"the {FORMATS[fmt]} container cannot be read: {_reason(exc)}") from exc


def _reason(exc: BaseException) -> str:
    return getattr(exc, "strerror", None) or str(exc) or type(exc).__name__


def _stream(container: Any, fmt: str) -> Any:
    if not container.streams.video:
        if container.streams.audio:
            raise VideoRejected(f"the {FORMATS[fmt]} file holds only audio, no video stream")
        raise VideoRejected(f"the {FORMATS[fmt]} file holds no video stream")
    stream = container.streams.video[0]
    codec = stream.codec_context.name
    if codec not in CODECS:
        raise VideoRejected(f"the video stream is {codec}; read are {', '.join(sorted(CODECS))}")
    width, height = stream.codec_context.width, stream.codec_context.height
    if width < 1 or height < 1:
        raise VideoRejected(f"the video stream has no frame size ({width}x{height})")
    if width * height > MAX_SOURCE_PIXELS:
        raise VideoRejected(f"the video's frames have {width}x{height} = {width * height} pixels; at most "
                            f"{MAX_SOURCE_PIXELS} are accepted")
    if max(width, height) / min(width, height) > MAX_ASPECT:
        raise VideoRejected(f"the video's aspect ratio {width}x{height} exceeds {MAX_ASPECT:g}")
    return stream


def _seconds(container: Any, stream: Any) -> float | None:
    if container.duration is not None and container.duration > 0:
        return float(Fraction(container.duration, av.time_base))
    if stream.duration is not None and stream.duration > 0 and stream.time_base is not None:
        return float(stream.duration * stream.time_base)
    return None


def probe(data: bytes) -> Probe:
    """Every check short of decoding the frames (blocking; see `probe_async`). Raises VideoRejected."""
    container, fmt = _open(data)
    with container:
        stream = _stream(container, fmt)
        seconds = _seconds(container, stream)
        end, packets = 0.0, 0
        try:
            for packet in container.demux(stream):
                stamp = packet.pts if packet.pts is not None else packet.dts
                if stamp is None or packet.size == 0:
                    continue
                packets += 1
                if packets > MAX_PACKETS:
                    raise VideoRejected(f"the video holds more than {MAX_PACKETS} packets")
                end = max(end, float((stamp + (packet.duration or 0)) * packet.time_base))
        except (av.FFmpegError, ValueError, OSError) as exc:
            raise VideoRejected(f"the {FORMATS[fmt]} video is truncated or corrupt: {_reason(exc)}") from exc
        if packets == 0:
            raise VideoRejected(f"the {FORMATS[fmt]} video holds no frames")
        if seconds is not None and end < seconds - LENGTH_SLACK_SECONDS:
            raise VideoRejected(f"the {FORMATS[fmt]} video is truncated: its frames end at {end:.2f} s of the "
                                f"{seconds:.2f} s its container declares")
        probed = Probe(fmt, stream.codec_context.name, stream.codec_context.width, stream.codec_context.height,
                       seconds)
    return probed


def _size(width: int, height: int, max_pixels: int) -> tuple[int, int]:
    if width * height <= max_pixels:
        return width, height
    scale = math.sqrt(max_pixels / (width * height))
    return max(2, math.floor(width * scale) // 2 * 2), max(2, math.floor(height * scale) // 2 * 2)


def _picture(frame: Any, width: int, height: int, nbytes: int) -> DecodedImage:
    w, h = _size(frame.width, frame.height, FRAME_PIXELS)
    pixels = frame.reformat(width=w, height=h, format="rgb24").to_ndarray()
    return DecodedImage(np.ascontiguousarray(pixels, dtype=np.uint8), width, height, "VIDEO", nbytes)


def sample(data: bytes, times: list[float]) -> dict[float, DecodedImage]:
    """The frame shown at each time (the last one that starts at or before it), decoded in one streamed pass
    that keeps only the frame before the current one (blocking; see `sample_async`). Raises VideoRejected."""
    wanted = sorted(set(times))
    out: dict[float, DecodedImage] = {}
    if not wanted:
        return out
    container, fmt = _open(data)
    with container:
        stream = _stream(container, fmt)
        width, height = stream.codec_context.width, stream.codec_context.height
        shown: list[Any] = [None, None]  # the frame on screen and, once converted, its picture (shared by times)
        decoded = index = 0

        def take(frame: Any) -> None:
            nonlocal index
            if shown[0] is not frame:
                shown[0], shown[1] = frame, _picture(frame, width, height, len(data))
            out[wanted[index]] = shown[1]
            index += 1

        previous: Any = None
        try:
            for frame in container.decode(stream):
                decoded += 1
                if decoded > MAX_DECODED_FRAMES:
                    raise VideoRejected(f"the video needs more than {MAX_DECODED_FRAMES} frames decoded to reach "
                                        f"{wanted[index]:g} s")
                if frame.time is None:
                    continue
                while index < len(wanted) and frame.time > wanted[index]:
                    take(previous if previous is not None else frame)  # before the first frame: the first frame
                previous = frame
                if index == len(wanted):
                    break
        except (av.FFmpegError, ValueError, OSError) as exc:
            raise VideoRejected(f"the {FORMATS[fmt]} video is truncated or corrupt: {_reason(exc)}") from exc
        if index < len(wanted):
            if previous is None:
                raise VideoRejected(f"the {FORMATS[fmt]} video holds no frame that decodes")
            last = float(previous.time or 0.0) + _frame_seconds(stream)
            if wanted[index] > last + LENGTH_SLACK_SECONDS:
                raise VideoRejected(f"the {FORMATS[fmt]} video is truncated: its frames end at {last:.2f} s, "
                                    f"before {wanted[index]:g} s")
            while index < len(wanted):  # the last frame stays on screen until the end
                take(previous)
    return out


def _frame_seconds(stream: Any) -> float:
    rate = stream.average_rate or stream.guessed_rate
    return float(1 / rate) if rate else 0.0


async def probe_async(data: bytes) -> Probe:
    return await asyncio.get_running_loop().run_in_executor(_POOL, probe, data)


async def sample_async(data: bytes, times: list[float]) -> dict[float, DecodedImage]:
    return await asyncio.get_running_loop().run_in_executor(_POOL, sample, data, times)
