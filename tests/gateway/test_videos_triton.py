"""Videos read through the real stack: a clip made here with PyAV (an "EXIT 42" sign sliding right across a
platform, then an empty screen), its frames sampled and read by the served PP-OCRv4 in tritonserver, the target
chosen through the served MiniLM: `box` at a moment and `track` at 1 and 2 samples a second; other questions
read the text of the video's overview frames in front of the state.

Its own gateway on the session's tritonserver serves decision-zeroshot and the models it reads through, and
nothing else, so the test waits for (and depends on) only those."""

from __future__ import annotations

from collections.abc import Iterator
from functools import cache
from typing import Any

import httpx
import numpy as np
import pytest
from PIL import Image, ImageDraw, ImageFont

from .conftest import serve_gateway
from .contract import check
from .test_videos_units import FONT, data_url, video

MODEL = "decision-zeroshot"
SERVED = [MODEL, "all-minilm-l6-v2", "pii-rampart", "ppocr-v4"]  # the family, its embedder, tagger and OCR
WIDTH, HEIGHT, FPS, FRAMES, SHOWN = 640, 360, 2, 8, 6  # 4 s; the sign is on screen for the first 3 s
SIGN_TOP, STEP, FIRST_LEFT = 200, 80, 40  # frame k draws the sign at x = FIRST_LEFT + STEP·k
QUESTION = "the EXIT 42 sign"


def platform(index: int, width: int, height: int) -> np.ndarray:
    img = Image.new("RGB", (width, height), "white")
    if index < SHOWN:
        draw = ImageDraw.Draw(img)
        draw.text((40, 40), "Platform 3", fill="black", font=ImageFont.truetype(FONT, 40))
        draw.text((FIRST_LEFT + STEP * index, SIGN_TOP), "EXIT 42", fill="black", font=ImageFont.truetype(FONT, 48))
    return np.asarray(img)


@pytest.fixture(scope="module")
def http(triton_url: str) -> Iterator[httpx.Client]:
    for url in serve_gateway(triton_url, "gateway-videos.log", "--models", ",".join(SERVED), timeout=300):
        with httpx.Client(base_url=url, timeout=120) as client:
            yield client


@cache
def clip() -> str:
    return data_url(video(FRAMES, FPS, width=WIDTH, height=HEIGHT, paint=platform))


def ask(http: httpx.Client, questions: dict[str, Any]) -> dict[str, Any]:
    r = http.post("/v1/decisions", json={"model": MODEL, "state": "A camera on the platform.", "videos": [clip()],
                                         "questions": questions})
    assert r.status_code == 200, r.text
    check("/v1/decisions", "post", r.status_code, r.json(), r.headers)
    return r.json()["answers"]  # type: ignore[no-any-return]


def sign_left(time_s: float) -> float:
    return (FIRST_LEFT + STEP * int(time_s * FPS)) / WIDTH


def test_box_at_a_moment_locates_the_sign_in_the_frame_shown_then(http: httpx.Client) -> None:
    answers = ask(http, {"early": {"type": "box", "instructions": QUESTION, "at": 0.5},
                         "late": {"type": "box", "instructions": QUESTION, "at": 2.0}})
    for qid, at in (("early", 0.5), ("late", 2.0)):
        found = answers[qid]
        assert found["type"] == "box" and found["time"] == at, found
        assert abs(found["box"]["left"] - sign_left(at)) < 0.04, (found, sign_left(at))
        assert abs(found["box"]["top"] - SIGN_TOP / HEIGHT) < 0.06 and found["box"]["bottom"] < 0.8
        assert found["confidence"] is not None and found["confidence"] > 0.5  # EXIT 42, not Platform 3


def test_track_follows_the_sign_while_it_is_on_screen_and_reports_it_gone_after(http: httpx.Client) -> None:
    answers = ask(http, {"t": {"type": "track", "instructions": QUESTION},
                         "platform": {"type": "track", "instructions": "the platform number"}})
    track = answers["t"]["track"]
    assert [m["time"] for m in track] == [0.0, 1.0, 2.0, 3.0]
    lefts = [m["box"]["left"] for m in track[:3]]
    assert lefts == sorted(lefts) and all(abs(left - sign_left(t)) < 0.04 for left, t in zip(lefts, (0, 1, 2),
                                                                                               strict=True))
    assert all(m["visible"] > 0.5 for m in track[:3]), track
    gone = track[3]
    assert gone["visible"] == 0.0 and gone["confidence"] is None
    assert gone["box"] == {"top": 0.0, "left": 0.0, "bottom": 1.0, "right": 1.0}
    platform = answers["platform"]["track"][:3]  # the same frames, another target: the line that stays put
    assert all(abs(m["box"]["top"] - 40 / HEIGHT) < 0.06 and abs(m["box"]["left"] - 40 / WIDTH) < 0.04
               for m in platform), platform


def test_track_at_rate_two_samples_every_half_second(http: httpx.Client) -> None:
    track = ask(http, {"t": {"type": "track", "instructions": QUESTION, "rate": 2}})["t"]["track"]
    assert [m["time"] for m in track] == [k / 2 for k in range(FRAMES)]
    on_screen = track[:SHOWN]
    assert all(abs(m["box"]["left"] - sign_left(m["time"])) < 0.04 for m in on_screen), on_screen
    assert [m["visible"] for m in track[SHOWN:]] == [0.0, 0.0]


def test_other_questions_read_the_videos_text_in_front_of_the_state(http: httpx.Client) -> None:
    q = {"type": "choice", "instructions": "What is this about?",
         "choices": [{"key": "station", "description": "A train station platform and its exit"},
                     {"key": "bakery", "description": "A bakery and bread"}]}
    body = {"model": MODEL, "state": "What does the camera show?", "questions": {"q": q}}
    seen = http.post("/v1/decisions", json={**body, "videos": [clip()]}).json()
    blind = http.post("/v1/decisions", json=body).json()
    assert seen["answers"]["q"]["choice"] == "station", seen
    assert seen["answers"]["q"]["probabilities"] != blind["answers"]["q"]["probabilities"]
    assert seen["usage"]["input_tokens"] > blind["usage"]["input_tokens"]  # "EXIT 42", "Platform 3" were read


def test_batch_entries_sharing_a_video_each_read_their_own_moments(http: httpx.Client) -> None:
    entry = {"state": "A camera on the platform.", "videos": [clip()]}
    r = http.post("/v1/decisions", json={"model": MODEL, "states": {
        "tracked": {**entry, "questions": {"t": {"type": "track", "instructions": QUESTION}}},
        "moment": {**entry, "questions": {"b": {"type": "box", "instructions": QUESTION, "at": 2.5}}}}})
    assert r.status_code == 200, r.text
    states = r.json()["states"]
    assert [m["time"] for m in states["tracked"]["answers"]["t"]["track"]] == [0.0, 1.0, 2.0, 3.0]
    assert abs(states["moment"]["answers"]["b"]["box"]["left"] - sign_left(2.5)) < 0.04
