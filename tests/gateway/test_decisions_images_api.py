"""Images in decisions through the real stack: assets (base64 and multipart) read as their OCR text lines in front
of the state, images in instructions by placement, box questions on a rendered receipt, and the errors of each
rule (`question_images_unsupported`, `box_needs_image`, `box_target_ambiguous`, `box_unsupported`, models without
the image modality)."""

from __future__ import annotations

import base64
import io
import json
from functools import cache
from typing import Any

import httpx
import pytest
from PIL import Image, ImageDraw, ImageFont

from .contract import check

MODEL = "decision-zeroshot"
LINES = ["CORNER BAKERY", "Date: 2026-11-28", "Bread 4.50", "Coffee 3.20", "TOTAL 7.70", "Thank you"]
TOTAL_LINE = 4  # row of "TOTAL 7.70"
WIDTH, HEIGHT, TOP, STEP = 600, 800, 60, 110


def _font(size: int) -> ImageFont.FreeTypeFont | ImageFont.ImageFont:
    for path in ("/usr/share/fonts/truetype/dejavu/DejaVuSans.ttf",
                 "/usr/share/fonts/truetype/liberation/LiberationSans-Regular.ttf"):
        try:
            return ImageFont.truetype(path, size)
        except OSError:
            continue
    return ImageFont.load_default(size)


@cache
def receipt_png() -> bytes:
    """A receipt rendered with pillow: one text line every STEP pixels from TOP."""
    img = Image.new("RGB", (WIDTH, HEIGHT), "white")
    draw = ImageDraw.Draw(img)
    for i, text in enumerate(LINES):
        draw.text((60, TOP + i * STEP), text, fill="black", font=_font(32))
    buf = io.BytesIO()
    img.save(buf, "PNG")
    return buf.getvalue()


@cache
def blank_png(width: int = 64, height: int = 64) -> bytes:
    buf = io.BytesIO()
    Image.new("RGB", (width, height), "white").save(buf, "PNG")
    return buf.getvalue()


def asset(data: bytes) -> dict[str, str]:
    return {"type": "image", "data_base64": base64.b64encode(data).decode()}


def post(client: httpx.Client, body: dict[str, Any], status: int = 200) -> dict[str, Any]:
    r = client.post("/v1/decisions", json={"model": MODEL, **body})
    assert r.status_code == status, r.text
    check("/v1/decisions", "post", r.status_code, r.json(), r.headers)
    return r.json()  # type: ignore[no-any-return]


RECEIPT_QUESTIONS: dict[str, Any] = {
    "complete": {"type": "noul", "instructions": "Does <receipt> show a total, a date and a merchant?"},
    "kind": {"type": "choice", "instructions": "What is this document?",
             "choices": [{"key": "receipt", "description": "A shop receipt with prices"},
                         {"key": "letter", "description": "A personal letter"},
                         {"key": "code", "description": "Source code"}]},
    "total": {"type": "box", "instructions": "the total amount"},
}


def receipt_body() -> dict[str, Any]:
    return {"state": {"receipt": "<receipt>", "note": "Uploaded by the customer."},
            "assets": {"<receipt>": asset(receipt_png())}, "questions": RECEIPT_QUESTIONS}


def test_a_receipt_is_read_through_its_text_and_its_total_is_located(http: httpx.Client) -> None:
    r = post(http, receipt_body())
    answers = r["answers"]
    assert answers["kind"]["choice"] == "receipt"
    box = answers["total"]["box"]
    expected_top = (TOP + TOTAL_LINE * STEP) / HEIGHT
    assert abs(box["top"] - expected_top) < 0.03 and box["bottom"] < expected_top + STEP / HEIGHT
    assert 0 < box["left"] < box["right"] <= 1 and 0 <= answers["total"]["confidence"] <= 1
    assert 0 <= answers["complete"]["noul"] <= 1


def test_multipart_and_base64_bodies_give_identical_answers(http: httpx.Client) -> None:
    body = receipt_body()
    by_base64 = post(http, body)
    request = {**body, "model": MODEL, "assets": {"<receipt>": {"type": "image", "part": "scan"}}}
    files: dict[str, Any] = {"request": (None, json.dumps(request), "application/json"),
             "scan": ("receipt.png", receipt_png(), "image/png")}
    r = http.post("/v1/decisions", files=files)
    assert r.status_code == 200, r.text
    assert r.json() == by_base64


def test_the_state_text_refers_to_each_image_as_image_k_and_its_text_is_read(http: httpx.Client) -> None:
    q = {"type": "choice", "instructions": "What is this about?",
         "choices": [{"key": "bakery", "description": "A bakery and bread"},
                     {"key": "cars", "description": "Cars and engines"}]}
    with_image = post(http, {"state": "<r>", "assets": {"<r>": asset(receipt_png())}, "questions": {"q": q}})
    blank = post(http, {"state": "<r>", "assets": {"<r>": asset(blank_png())}, "questions": {"q": q}})
    assert with_image["answers"]["q"]["choice"] == "bakery"
    assert with_image["answers"]["q"]["probabilities"] != blank["answers"]["q"]["probabilities"]
    assert with_image["usage"]["input_tokens"] > blank["usage"]["input_tokens"]  # the receipt's lines were read


def test_the_images_list_reads_data_urls_in_front_of_the_state(http: httpx.Client) -> None:
    url = "data:image/png;base64," + base64.b64encode(receipt_png()).decode()
    r = post(http, {"state": "What is the total of this purchase?", "images": [url],
                    "questions": {"total": {"type": "box", "instructions": "the total amount"}}})
    assert abs(r["answers"]["total"]["box"]["top"] - (TOP + TOTAL_LINE * STEP) / HEIGHT) < 0.03
    remote = post(http, {"state": "x", "images": ["https://example.org/a.png"],
                         "questions": {"q": {"type": "noul", "instructions": "i"}}}, status=400)
    assert "data URL" in remote["error"]["message"]


@pytest.mark.parametrize(("body", "code"), [
    ({"state": "no image here", "questions": {"b": {"type": "box", "instructions": "the total"}}},
     "box_needs_image"),
    ({"state": "<a> and <b>", "assets": {"<a>": asset(receipt_png()), "<b>": asset(blank_png())},
      "questions": {"b": {"type": "box", "instructions": "the total"}}}, "box_target_ambiguous"),
    ({"state": "<a>", "assets": {"<a>": asset(receipt_png())},
      "questions": {"b": {"type": "box", "instructions": "the total", "at": 3}}}, "box_needs_image"),  # no video
    ({"state": "<a>", "assets": {"<a>": asset(receipt_png())},
      "questions": {"b": {"type": "track", "instructions": "the total"}}}, "box_needs_image"),
    ({"state": "the receipt", "assets": {"<a>": asset(receipt_png())},
      "questions": {"b": {"type": "choice", "instructions": "Which?",
                          "choices": [{"key": "x", "description": "like <a>"}, {"key": "y"}]}}},
     "question_images_unsupported"),
])
def test_each_image_rule_fails_its_question_alone(http: httpx.Client, body: dict[str, Any], code: str) -> None:
    body["questions"]["ok"] = {"type": "noul", "instructions": "Is this a receipt?"}
    r = post(http, body)
    assert r["answers"]["b"]["error"] == code, r["answers"]["b"]
    assert "noul" in r["answers"]["ok"]


def test_an_instruction_image_belongs_to_its_question_only(http: httpx.Client) -> None:
    q = {"type": "box", "instructions": "the total amount in <r>"}
    r = post(http, {"state": "Here is my purchase.", "assets": {"<r>": asset(receipt_png())}, "questions": {
        "total": q, "plain": {"type": "noul", "instructions": "Is this about a purchase?"}}})
    assert abs(r["answers"]["total"]["box"]["top"] - (TOP + TOTAL_LINE * STEP) / HEIGHT) < 0.03
    alone = post(http, {"state": "Here is my purchase.",
                        "questions": {"plain": {"type": "noul", "instructions": "Is this about a purchase?"}}})
    assert abs(r["answers"]["plain"]["noul"] - alone["answers"]["plain"]["noul"]) < 1e-4  # not moved into the state


@pytest.mark.parametrize(("body", "message"), [
    ({"state": "<a>", "assets": {"<a>": {"type": "image", "data_base64": base64.b64encode(b"not an image").decode()}},
      "questions": {"q": {"type": "noul", "instructions": "i"}}}, "<a>"),
    ({"state": "plain", "assets": {"<a>": asset(receipt_png())},
      "questions": {"q": {"type": "noul", "instructions": "i"}}}, "never used"),
    ({"state": "x", "videos": ["data:video/mp4;base64,AAAA"],
      "questions": {"q": {"type": "noul", "instructions": "i"}}}, "videos[0]: the bytes are not"),
])
def test_a_rejected_image_or_video_fails_the_request_naming_it(http: httpx.Client, body: dict[str, Any],
                                                              message: str) -> None:
    r = post(http, body, status=400)
    assert message in r["error"]["message"]


def test_in_a_states_batch_a_rejected_image_fails_only_its_entry(http: httpx.Client) -> None:
    q = {"q": {"type": "noul", "instructions": "Is this a receipt?"}}
    r = post(http, {"assets": {"<bad>": {"type": "image", "data_base64": base64.b64encode(b"GIF89a").decode()},
                               "<good>": asset(receipt_png())},
                    "states": {"bad": {"state": "<bad>", "questions": q}, "good": {"state": "<good>", "questions": q}}})
    assert r["states"]["bad"]["answers"]["q"]["error"] == "invalid_input"
    assert "<bad>" in r["states"]["bad"]["answers"]["q"]["message"]
    assert "noul" in r["states"]["good"]["answers"]["q"]


def test_systemone_reads_images_placed_before_the_text_of_an_array_state_in_front_of_it(gateway_url: str) -> None:
    q = {"kind": {"type": "choice", "instructions": "What is this document?",
                  "choices": [{"key": "receipt", "description": "A shop receipt with prices"},
                              {"key": "letter", "description": "A personal letter"}]}}
    body = {"model": MODEL, "state": ["<r>", "Here is my receipt."], "assets": {"<r>": asset(receipt_png())},
            "questions": q}
    r = httpx.post(gateway_url + "/v1/systemone", json=body, timeout=60)
    assert r.status_code == 200, r.text
    url = "data:image/png;base64," + base64.b64encode(receipt_png()).decode()
    same = httpx.post(gateway_url + "/v1/decisions", json={"model": MODEL, "state": "Here is my receipt.",
                                                            "images": [url], "questions": q}, timeout=60).json()
    assert r.json()["answers"] == same["answers"]  # the image read in front of the text, not as a JSON array


def test_a_text_only_decisions_model_fails_a_question_holding_an_image_alone(fixtures_served: Any) -> None:
    from .conftest import NLI

    body = {"model": NLI, "state": "A cat sat on the mat.", "assets": {"<a>": asset(blank_png())},
            "questions": {"q": {"type": "noul", "instructions": "Is <a> a cat?"},
                          "ok": {"type": "noul", "instructions": "A cat is mentioned."}}}
    r = httpx.post(fixtures_served.url + "/v1/decisions", json=body, timeout=60)
    assert r.status_code == 200 and r.json()["answers"]["q"]["error"] == "question_images_unsupported"
    assert "noul" in r.json()["answers"]["ok"]
    in_state = httpx.post(fixtures_served.url + "/v1/decisions", json={**body, "state": "<a>", "questions": {
        "ok": body["questions"]["ok"]}}, timeout=60)
    assert in_state.status_code == 400 and "does not read images" in in_state.json()["error"]["message"]
