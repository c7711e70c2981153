"""Videos without a model: containers checked (each malformed kind refused with its reason), frames sampled at the
right moments in one bounded pass, the moments a question reads, and how one frame's lines become a box.

The videos are made here, at test time, with PyAV; `video` and friends are shared with the API tests."""

from __future__ import annotations

import base64
import io
import struct
from collections.abc import Callable
from functools import cache
from typing import cast

import av
import numpy as np
import pytest
from av.audio.stream import AudioStream
from av.video.stream import VideoStream
from PIL import Image, ImageDraw, ImageFont

from gateway.images.ocr import Box, TextLine
from gateway.videos import container, moments
from gateway.videos.clips import ClipRejected, parse_clip
from gateway.videos.container import VideoRejected, probe, sample
from gateway.videos.tracking import WHOLE_FRAME, spot

FONT = "/usr/share/fonts/truetype/dejavu/DejaVuSans.ttf"


def solid(index: int, width: int, height: int) -> np.ndarray:
    """Frame `index` painted grey level 10·index, so a sampled frame tells which one it was."""
    return np.full((height, width, 3), min(255, 10 * index), dtype=np.uint8)


def video(frames: int, fps: int = 2, *, width: int = 32, height: int = 32, fmt: str = "mp4",
          codec: str = "libx264", paint: Callable[[int, int, int], np.ndarray] = solid,
          options: dict[str, str] | None = None) -> bytes:
    """A video of `frames` frames at `fps`, each painted by `paint(index, width, height)`."""
    buf = io.BytesIO()
    with av.open(buf, "w", format=fmt, options=options or {}) as out:
        stream = cast(VideoStream, out.add_stream(codec, rate=fps))
        stream.width, stream.height = width, height
        stream.pix_fmt = "yuvj420p" if codec == "mjpeg" else "yuv420p"
        if codec == "libx264":
            stream.options = {"qp": "0", "preset": "ultrafast"}  # lossless: a frame's grey level survives
        for i in range(frames):
            for packet in stream.encode(av.VideoFrame.from_ndarray(paint(i, width, height), format="rgb24")):
                out.mux(packet)
        for packet in stream.encode():
            out.mux(packet)
    return buf.getvalue()


def sign(x: int, *, width: int = 640, height: int = 360, text: str = "EXIT 42") -> np.ndarray:
    """A white frame with `text` drawn at (x, 150) in large black letters (OCR reads it)."""
    img = Image.new("RGB", (width, height), "white")
    if text:
        ImageDraw.Draw(img).text((x, 150), text, fill="black", font=ImageFont.truetype(FONT, 48))
    return np.asarray(img)


def audio_only() -> bytes:
    buf = io.BytesIO()
    with av.open(buf, "w", format="mp4") as out:
        stream = cast(AudioStream, out.add_stream("aac", rate=8000))
        frame = av.AudioFrame.from_ndarray(np.zeros((1, 1024), np.float32), format="fltp", layout="mono")
        frame.sample_rate = 8000
        for packet in [*stream.encode(frame), *stream.encode()]:
            out.mux(packet)
    return buf.getvalue()


def no_streams() -> bytes:
    """An MP4 whose movie box holds no track at all (ftyp + moov with only its header)."""
    ftyp = struct.pack(">I4s4sI4s", 20, b"ftyp", b"isom", 0x200, b"isom")
    matrix = struct.pack(">9I", 0x10000, 0, 0, 0, 0x10000, 0, 0, 0, 0x40000000)
    body = struct.pack(">5I", 0, 0, 0, 1000, 0) + struct.pack(">IH", 0x10000, 0x100) + b"\0" * 10 + matrix
    body += b"\0" * 24 + struct.pack(">I", 1)
    mvhd = struct.pack(">I4s", 8 + len(body), b"mvhd") + body
    return ftyp + struct.pack(">I4s", 8 + len(mvhd), b"moov") + mvhd


@cache
def huge() -> bytes:
    """One 4096×4096 frame (16.8 MP, over the 16 MP images may have), cheap as Motion JPEG of one grey."""
    return video(1, 1, width=4096, height=4096, fmt="avi", codec="mjpeg")


def data_url(data: bytes, kind: str = "mp4") -> str:
    return f"data:video/{kind};base64," + base64.b64encode(data).decode()


MALFORMED: dict[str, Callable[[], bytes]] = {
    "truncated mp4": lambda: (lambda d: d[: len(d) // 2])(video(20)),
    "truncated webm": lambda: (lambda d: d[: len(d) * 2 // 3])(video(40, fmt="webm", codec="libvpx-vp9")),
    "not a video": lambda: b"GIF89a this is not a video at all",
    "audio only": audio_only,
    "zero streams": no_streams,
    "huge dimensions": huge,
    "empty": lambda: b"",
}
REASONS = {"truncated mp4": "cannot be read", "truncated webm": "truncated", "not a video": "not an MP4",
           "audio only": "only audio", "zero streams": "no video stream", "huge dimensions": "pixels",
           "empty": "empty"}


@pytest.mark.parametrize("kind", sorted(MALFORMED))
def test_each_malformed_container_is_refused_with_its_reason(kind: str) -> None:
    with pytest.raises(VideoRejected, match=REASONS[kind]):
        probe(MALFORMED[kind]())


@pytest.mark.parametrize(("fmt", "codec"), [("mp4", "libx264"), ("webm", "libvpx-vp9"), ("avi", "mpeg4"),
                                            ("matroska", "libx264")])
def test_the_common_containers_are_probed_with_their_length(fmt: str, codec: str) -> None:
    found = probe(video(6, 2, fmt=fmt, codec=codec))
    assert (found.width, found.height) == (32, 32)
    assert found.seconds is not None and abs(found.seconds - 3.0) < 0.05


def test_a_container_that_does_not_give_its_length_probes_as_unknown() -> None:
    assert probe(video(4, 2, fmt="matroska", options={"live": "1"})).seconds is None


def test_a_video_over_the_byte_limit_is_refused_before_it_is_opened(monkeypatch: pytest.MonkeyPatch) -> None:
    data = video(2)
    monkeypatch.setattr(container, "MAX_VIDEO_BYTES", len(data) - 1)
    with pytest.raises(VideoRejected, match="bytes"):
        probe(data)


def test_the_frame_shown_at_each_moment_is_sampled() -> None:
    frames = sample(video(10, 2), [0.0, 0.4, 0.5, 2.0, 4.9])  # frame k starts at k/2 s
    levels = {t: round(float(img.pixels.mean()) / 10) for t, img in frames.items()}
    assert levels == {0.0: 0, 0.4: 0, 0.5: 1, 2.0: 4, 4.9: 9}


def test_moments_sharing_a_frame_share_one_picture() -> None:
    frames = sample(video(2, 1), [0.0, 0.25, 0.5])
    assert frames[0.0] is frames[0.25] is frames[0.5]


def test_sampled_frames_are_scaled_to_the_frame_budget_and_keep_the_size_as_sent(
        monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(container, "FRAME_PIXELS", 16 * 8)
    img = sample(video(1, 1, width=64, height=32), [0.0])[0.0]
    assert img.pixels.shape[0] * img.pixels.shape[1] <= 16 * 8 and (img.width, img.height) == (64, 32)


def test_decoding_stops_at_the_frame_cap(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(container, "MAX_DECODED_FRAMES", 3)
    data = video(10, 2)
    assert set(sample(data, [0.5])) == {0.5}  # reached within the cap: decoding stops after it
    with pytest.raises(VideoRejected, match="more than 3 frames"):
        sample(data, [4.0])


def test_a_moment_past_the_last_frame_of_a_stream_cut_short_is_refused() -> None:
    with pytest.raises(VideoRejected, match="truncated"):
        sample(video(4, 2), [10.0])


@pytest.mark.parametrize(("seconds", "rate", "expected"), [
    (3.0, 1, [0.0, 1.0, 2.0]),
    (3.0, 2, [0.0, 0.5, 1.0, 1.5, 2.0, 2.5]),
    (2.5, 1, [0.0, 1.0, 2.0]),
    (0.4, 1, [0.0]),
    (30.0, 2, [k / 2 for k in range(60)]),
])
def test_track_samples_rate_moments_a_second_while_a_frame_is_on_screen(seconds: float, rate: int,
                                                                         expected: list[float]) -> None:
    assert moments.track_times(seconds, rate) == expected


def test_the_longest_track_and_an_overview_fit_one_requests_frame_budget() -> None:
    assert len(moments.track_times(30.0, 2)) + moments.OVERVIEW_FRAMES == moments.MAX_REQUEST_FRAMES


@pytest.mark.parametrize(("seconds", "expected"), [(8.0, [1.0, 3.0, 5.0, 7.0]), (None, [0.0]),
                                                   (0.4, [0.05, 0.15, 0.25, 0.35])])
def test_other_questions_read_the_middles_of_four_equal_stretches(seconds: float | None,
                                                                  expected: list[float]) -> None:
    assert moments.overview_times(seconds) == expected


@pytest.mark.parametrize(("value", "message"), [
    ("https://example.org/v.mp4", "remote URLs"),
    ("data:image/png;base64,AAAA", "data:video"),
    ("data:video/mp4;base64,@@@", "base64"),
    (7, "data URL"),
])
def test_a_videos_entry_that_is_not_a_base64_video_data_url_is_refused(value: object, message: str) -> None:
    with pytest.raises(ClipRejected, match=message):
        parse_clip(value, "videos[0]")


def _line(text: str, left: float, score: float = 0.9) -> TextLine:
    return TextLine(text, Box(0.4, left, 0.5, left + 0.2), score)


def test_a_frame_without_text_is_the_whole_frame_with_no_confidence_and_not_visible() -> None:
    found = spot([], np.asarray([]), temperature=0.05, visible_bias=0.3, visible_temperature=0.05)
    assert (found.box, found.confidence, found.visible) == (WHOLE_FRAME, None, 0.0)


def test_the_line_most_like_the_instructions_is_the_target_and_its_match_makes_it_visible() -> None:
    lines = [_line("Welcome", 0.1), _line("EXIT 42", 0.6)]
    near = spot(lines, np.asarray([0.1, 0.8]), temperature=0.05, visible_bias=0.3, visible_temperature=0.05)
    far = spot(lines, np.asarray([0.1, 0.2]), temperature=0.05, visible_bias=0.3, visible_temperature=0.05)
    assert near.box["left"] == 0.6 and near.confidence is not None and near.confidence > 0.99
    assert near.visible > 0.89 and far.visible < 0.2
