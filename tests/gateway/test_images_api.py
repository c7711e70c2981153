"""Images through the real stack (shared Triton and gateway): EfficientNet-Lite0 classify and embeddings on photos
a package ships, content parts, assets and multipart bodies, and OCR of a rendered receipt through Triton."""

from __future__ import annotations

import base64
from typing import Any

import httpx
import numpy as np
import pytest

from .conftest import MODEL
from .contract import check
from .image_samples import RECEIPT_LINES, image_part, photo, receipt

IMAGE_MODEL = "efficientnet-lite0"
OCR_MODEL = "ppocr-v4"


def post(http: httpx.Client, path: str, body: dict[str, Any]) -> httpx.Response:
    r = http.post(path, json=body)
    check(path, "post", r.status_code, r.json(), r.headers)
    return r


def top5(result: dict[str, Any]) -> list[str]:
    return [k for k, _ in sorted(result["probabilities"].items(), key=lambda kv: -kv[1])[:5]]


def multipart(request: dict[str, Any], parts: list[tuple[str, bytes]], boundary: str = "sr-boundary-7f3a") -> bytes:
    import json

    chunks = [f'--{boundary}\r\nContent-Disposition: form-data; name="request"\r\n'
              f"Content-Type: application/json\r\n\r\n".encode() + json.dumps(request).encode()]
    for name, data in parts:
        chunks.append(f'--{boundary}\r\nContent-Disposition: form-data; name="{name}"; filename="x.bin"\r\n'
                      f"Content-Type: application/octet-stream\r\n\r\n".encode() + data)
    return b"\r\n".join(chunks) + f"\r\n--{boundary}--\r\n".encode()


def post_multipart(http: httpx.Client, path: str, body: bytes, boundary: str = "sr-boundary-7f3a") -> httpx.Response:
    r = http.post(path, content=body, headers={"Content-Type": f"multipart/form-data; boundary={boundary}"})
    check(path, "post", r.status_code, r.json(), r.headers)
    return r


@pytest.mark.parametrize("name, sensible", [
    ("chelsea.png", {"tabby", "tiger cat", "Egyptian cat"}),
    ("coffee.png", {"espresso", "cup", "coffee mug"}),
    ("motorcycle_left.png", {"moped", "motor scooter"}),
    ("rocket.jpg", {"missile", "projectile", "space shuttle"}),
])
def test_sample_photos_are_classified_with_a_sensible_label_in_the_top_five(http: httpx.Client, name: str,
                                                                           sensible: set[str]) -> None:
    mime = "image/jpeg" if name.endswith(".jpg") else "image/png"
    r = post(http, "/v1/classify", {"model": IMAGE_MODEL, "input": [image_part(photo(name), mime)]})
    assert r.status_code == 200, r.text
    result = r.json()["results"][0]
    assert sensible & set(top5(result)), f"{name}: top-5 {top5(result)}"
    assert result["label"] == top5(result)[0]
    assert abs(sum(result["probabilities"].values()) - 1) < 1e-3


def test_a_cat_photo_is_never_read_as_an_espresso(http: httpx.Client) -> None:
    r = post(http, "/v1/classify", {"model": IMAGE_MODEL, "input": [image_part(photo("chelsea.png")),
                                                                    image_part(photo("coffee.png"))]})
    cat, coffee = r.json()["results"]
    assert cat["probabilities"]["espresso"] < 0.01 < coffee["probabilities"]["espresso"]


def test_image_embeddings_are_unit_vectors_of_the_image_space_and_similar_photos_are_closer(
        http: httpx.Client) -> None:
    photos = [photo("chelsea.png"), photo("coffee.png"), photo("chelsea.png")]
    r = post(http, "/v1/embeddings", {"model": IMAGE_MODEL, "input": [image_part(p) for p in photos],
                                      "options": {"return_meta": True}})
    body = r.json()
    assert r.status_code == 200 and body["meta"]["representation"]["modality"] == "image"
    vectors = np.array([d["embedding"] for d in body["data"]])
    assert vectors.shape == (3, 1280)
    assert np.allclose(np.linalg.norm(vectors, axis=1), 1, atol=1e-5)
    assert float(vectors[0] @ vectors[2]) > 0.999 > float(vectors[0] @ vectors[1])
    assert body["usage"]["prompt_tokens"] == 3


def test_a_data_url_an_asset_and_a_multipart_part_give_identical_answers(http: httpx.Client) -> None:
    data = photo("coffee.png")
    inline = post(http, "/v1/classify", {"model": IMAGE_MODEL, "input": [image_part(data)]}).json()
    asset = post(http, "/v1/classify", {"model": IMAGE_MODEL, "input": ["<cup>"], "assets": {
        "<cup>": {"type": "image", "data_base64": base64.b64encode(data).decode()}}}).json()
    parts = post_multipart(http, "/v1/classify", multipart(
        {"model": IMAGE_MODEL, "input": ["<cup>"], "assets": {"<cup>": {"type": "image", "part": "cup"}}},
        [("cup", data)])).json()
    assert inline["results"] == asset["results"] == parts["results"]
    vectors = [post(http, "/v1/embeddings", {"model": IMAGE_MODEL, "input": "<cup>", "assets": {
        "<cup>": {"type": "image", "data_base64": base64.b64encode(data).decode()}}}).json()["data"][0]["embedding"],
               post_multipart(http, "/v1/embeddings", multipart(
                   {"model": IMAGE_MODEL, "input": ["<cup>"], "assets": {"<cup>": {"type": "image", "part": "p"}}},
                   [("p", data)])).json()["data"][0]["embedding"]]
    assert vectors[0] == vectors[1]


def test_each_use_of_an_asset_is_one_more_image(http: httpx.Client) -> None:
    data = base64.b64encode(photo("coffee.png")).decode()
    r = post(http, "/v1/embeddings", {"model": IMAGE_MODEL, "input": ["A", "A", "A"],
                                      "assets": {"A": {"type": "image", "data_base64": data}}})
    body = r.json()
    assert len(body["data"]) == 3 and body["usage"]["prompt_tokens"] == 3
    assert body["data"][0]["embedding"] == body["data"][2]["embedding"]


def test_items_of_a_modality_the_model_does_not_read_fail_in_place_naming_it(http: httpx.Client) -> None:
    picture = image_part(photo("coffee.png"))
    audio = {"type": "input_audio", "input_audio": {"data": "UklGRg==", "format": "wav"}}
    on_image = post(http, "/v1/embeddings", {"model": IMAGE_MODEL, "input": [picture, "a text", audio]}).json()
    assert "embedding" in on_image["data"][0]
    assert on_image["data"][1]["error"] == "invalid_input" and "no text modality" in on_image["data"][1]["message"]
    assert on_image["data"][2]["error"] == "invalid_input" and "audio" in on_image["data"][2]["message"]
    on_text = post(http, "/v1/embeddings", {"model": MODEL, "input": ["a text", picture,
                                                                    {"type": "text", "text": "a text"}]}).json()
    assert on_text["data"][1]["error"] == "invalid_input" and "no image modality" in on_text["data"][1]["message"]
    assert on_text["data"][0]["embedding"] == on_text["data"][2]["embedding"]
    classify = post(http, "/v1/classify", {"model": IMAGE_MODEL, "input": ["a text", picture]}).json()
    assert classify["results"][0]["error"] == "invalid_input" and "label" in classify["results"][1]


@pytest.mark.parametrize("url, words", [
    ("https://example.invalid/cat.png", "remote image URLs are not fetched"),
    ("data:text/plain;base64,aGVsbG8=", "not an image type"),
    ("data:image/png;base64,@@@", "not valid base64"),
    ("data:image/png,rawbytes", "base64 data URL"),
])
def test_a_remote_or_malformed_image_url_fails_its_item_with_a_clear_message(http: httpx.Client, url: str,
                                                                             words: str) -> None:
    r = post(http, "/v1/embeddings", {"model": IMAGE_MODEL, "input": [
        {"type": "image_url", "image_url": {"url": url}}, image_part(photo("coffee.png"))]})
    first, second = r.json()["data"]
    assert first["error"] == "invalid_input" and words in first["message"] and "embedding" in second


def test_image_models_declare_their_modalities_and_pass_their_golden_checks(http: httpx.Client) -> None:
    r = http.get("/v1/models")
    check("/v1/models", "get", 200, r.json())
    cards = {m["id"]: m for m in r.json()["data"]}
    for name in (IMAGE_MODEL, OCR_MODEL):
        card = cards[name]
        assert card["modalities"] == ["image"] and card["image_placements"] == ["state"]
        assert card["image_max_pixels"] >= 65_536 and card["golden"]["status"] == "matched", card["golden"]
    assert cards[MODEL]["modalities"] == ["text"] and "image_max_pixels" not in cards[MODEL]


async def test_ocr_through_triton_reads_a_rendered_receipt_with_boxes_where_the_text_was_drawn(
        triton_url: str, gateway_url: str) -> None:
    from pathlib import Path

    from gateway.cards import load_card
    from gateway.images.decode import decode_image
    from gateway.images.ocr import read_text
    from gateway.metrics import Metrics
    from gateway.runtime import Runtime
    from gateway.settings import Settings
    from gateway.triton import Triton

    card = load_card(Path(__file__).resolve().parents[2] / "model_repository" / OCR_MODEL / "card.yaml")
    runtime = Runtime(Settings(), [card], Metrics(), Triton(triton_url))
    try:
        data, boxes, (height, width) = receipt()
        assert card.image_max_pixels is not None
        lines = await read_text(runtime, runtime.models[OCR_MODEL], decode_image(data, card.image_max_pixels))
    finally:
        assert runtime.inference is not None
        await runtime.inference.close()
    squash = [t.replace(" ", "") for t in RECEIPT_LINES]  # PP-OCR may drop the gap between words
    assert [line.text.replace(" ", "") for line in lines] == squash
    slack = 3  # pixels: the detector's box may start a little inside the anti-aliased ink
    for line, (top, left, bottom, right) in zip(lines, boxes, strict=True):
        assert 0.9 <= line.score <= 1
        got = line.box  # fractions; the drawn ink box must lie inside it, and the centres agree within 1.5 %
        assert got.top * height <= top + slack and got.bottom * height >= bottom - slack, (line, top, bottom)
        assert got.left * width <= left + slack and got.right * width >= right - slack, (line, left, right)
        assert abs((got.top + got.bottom) / 2 - (top + bottom) / 2 / height) < 0.015, line
        assert abs((got.left + got.right) / 2 - (left + right) / 2 / width) < 0.015, line
    total = next(line for line in lines if line.text.startswith("TOTAL"))
    assert total.box.top > max(line.box.top for line in lines if line is not total)  # the last line, at the bottom


def test_a_bundle_task_reads_its_image_assets_like_its_endpoint(http: httpx.Client) -> None:
    data = photo("coffee.png")
    task = {"model": IMAGE_MODEL, "input": ["<cup>"], "assets": {
        "<cup>": {"type": "image", "data_base64": base64.b64encode(data).decode()}}}
    alone = post(http, "/v1/classify", task).json()
    r = http.post("/v1/bundle", json={"tasks": [{"id": "cup", "classify": task}]})
    assert r.status_code == 200 and r.json()["results"][0]["status"] == 200
    assert r.json()["results"][0]["classify"]["results"] == alone["results"]
