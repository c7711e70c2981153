"""Every image and asset limit at its edge, through the real stack: the last accepted value answers, one step past
it is a clear 400 naming the asset (or a failed item for a content part), and the server stays ready."""

from __future__ import annotations

import base64
import json
from collections.abc import Iterator
from typing import Any

import httpx
import pytest
from PIL import Image

from .conftest import READY_S, free_port, start, stop, wait_for
from .contract import check
from .image_samples import animated, blank_png, encode, image_part, padded_png, photo
from .test_images_api import IMAGE_MODEL, multipart, post_multipart

MIB = 1024 * 1024


def b64(data: bytes) -> str:
    return base64.b64encode(data).decode("ascii")


def small() -> bytes:
    return encode(Image.new("RGB", (32, 32), (10, 200, 90)))


def embed_assets(http: httpx.Client, assets: dict[str, bytes], inputs: list[str] | None = None) -> httpx.Response:
    body = {"model": IMAGE_MODEL, "input": inputs if inputs is not None else list(assets),
            "assets": {ref: {"type": "image", "data_base64": b64(data)} for ref, data in assets.items()}}
    r = http.post("/v1/embeddings", json=body)
    check("/v1/embeddings", "post", r.status_code, r.json(), r.headers)
    return r


def assert_ready(http: httpx.Client) -> None:
    assert http.get("/health").json()["status"] == "ready"


def rejected(r: httpx.Response, *words: str) -> str:
    assert r.status_code == 400, r.text
    error = r.json()["error"]
    assert error["code"] == "invalid_request"
    for word in words:
        assert word in error["message"], error["message"]
    return str(error["message"])


def test_a_reference_of_1024_bytes_is_accepted_and_1025_is_refused(http: httpx.Client) -> None:
    ref = "é" * 512  # 1,024 UTF-8 bytes in 512 characters: the limit is on bytes
    assert embed_assets(http, {ref: small()}).status_code == 200
    rejected(embed_assets(http, {ref + "x": small()}), "1025 bytes", "1 to 1024")
    rejected(embed_assets(http, {"": small()}), "0 bytes")


def test_references_of_65536_bytes_in_all_are_accepted_and_one_byte_more_is_refused(http: httpx.Client) -> None:
    refs = {f"{i:04d}".ljust(1024, "r"): small() for i in range(64)}  # 64 × 1,024 = 65,536, and 64 = max_inputs
    r = embed_assets(http, refs)
    assert r.status_code == 200 and all("embedding" in d for d in r.json()["data"])
    rejected(embed_assets(http, {**refs, "z": small()}), "65537 bytes", "65536")


def test_every_asset_must_be_used_and_text_may_not_be_mixed_into_an_image_item(http: httpx.Client) -> None:
    rejected(embed_assets(http, {"A": small(), "B": small()}, ["A"]), "'B'", "never used")
    rejected(embed_assets(http, {"A": small()}, ["look at A please"]), "mixes text", "'A'")
    keys = embed_assets(http, {"A": small()}, [{"A": "keys are never replaced"}])  # type: ignore[list-item]
    rejected(keys, "'A'", "never used")


@pytest.mark.parametrize("name, data, words", [
    ("zero-size", b"", ["empty"]),
    ("truncated PNG", photo("coffee.png")[:20_000], ["truncated or corrupt"]),
    ("truncated JPEG header", photo("rocket.jpg")[:40], ["JPEG"]),
    ("animated GIF", animated("GIF"), ["GIF images are not supported"]),
    ("animated WebP", animated("WEBP"), ["animated WEBP"]),
    ("polyglot: a GIF behind a PNG signature", b"\x89PNG\r\n\x1a\n" + animated("GIF"), ["PNG header"]),
    ("polyglot: HTML", b"<html><img src=x></html>" + photo("coffee.png"), ["not a PNG, JPEG or WebP"]),
    ("16,000,001 pixels", blank_png(24961, 641), ["16000001 pixels"]),  # 641 × 24,961: a prime-ish edge
    ("aspect 201", blank_png(2010, 10), ["aspect ratio 2010x10"]),
])
def test_a_rejected_asset_fails_the_request_naming_it_and_the_server_stays_ready(
        http: httpx.Client, name: str, data: bytes, words: list[str]) -> None:
    rejected(embed_assets(http, {"<img>": data}), "asset '<img>'", *words)
    r = http.post("/v1/embeddings", json={"model": IMAGE_MODEL, "input": [image_part(data), image_part(small())]})
    bad, good = r.json()["data"]
    assert bad["error"] == "invalid_input" and all(w in bad["message"] for w in words) and "embedding" in good
    assert_ready(http)


@pytest.mark.parametrize("width, height", [(4000, 4000), (2000, 10), (10, 2000)])
def test_pictures_at_16_megapixels_or_aspect_200_are_read(http: httpx.Client, width: int, height: int) -> None:
    r = embed_assets(http, {"edge": blank_png(width, height)})
    assert r.status_code == 200 and "embedding" in r.json()["data"][0], r.text


@pytest.mark.parametrize("body, words", [
    (lambda: multipart({"model": IMAGE_MODEL, "input": ["A"], "assets": {"A": {"type": "image", "part": "a"}}},
                       [("a", small()), ("stray", small())]), ["'stray'", "not referenced"]),
    (lambda: multipart({"model": IMAGE_MODEL, "input": ["A"], "assets": {"A": {"type": "image", "part": "a"}}},
                       [("a", small()), ("a", small())]), ["'a'", "more than once"]),
    (lambda: multipart({"model": IMAGE_MODEL, "input": ["A"], "assets": {"A": {"type": "image", "part": "b"}}},
                       [("a", small())]), ["names part 'b'"]),
    (lambda: multipart({"model": IMAGE_MODEL, "input": ["A", "B"], "assets": {
        "A": {"type": "image", "part": "a"}, "B": {"type": "image", "part": "a"}}}, [("a", small())]),
     ["part 'a' is referenced by both"]),
    (lambda: multipart({"model": IMAGE_MODEL, "input": ["x"]}, [("a", small())]), ["'a' is not referenced"]),
    (lambda: multipart({"model": IMAGE_MODEL, "input": ["x"]}, [])[:-30], ["truncated"]),
    (lambda: b'--sr-boundary-7f3a\r\nContent-Disposition: form-data; name="img"\r\n\r\nxx\r\n--sr-boundary-7f3a--',
     ["first part", "`request`"]),
])
def test_bad_multipart_bodies_are_400_with_the_reason(http: httpx.Client, body: Any, words: list[str]) -> None:
    rejected(post_multipart(http, "/v1/embeddings", body()), *words)


def test_a_multipart_body_on_a_surface_that_reads_no_images_is_refused(http: httpx.Client) -> None:
    body = multipart({"query": "q", "documents": ["d"]}, [("a", small())])
    r = http.post("/v1/rerank", content=body,
                  headers={"Content-Type": "multipart/form-data; boundary=sr-boundary-7f3a"})
    assert r.status_code == 400 and "reads no images" in r.json()["error"]["message"]


def test_a_multipart_body_counts_against_max_request_bytes_as_a_whole(http: httpx.Client) -> None:
    body = multipart({"model": IMAGE_MODEL, "input": ["A"], "assets": {"A": {"type": "image", "part": "a"}}},
                     [("a", padded_png(9 * MIB))])  # the default --max-request-bytes is 8 MiB
    r = post_multipart(http, "/v1/embeddings", body)
    assert r.status_code == 413 and r.json()["error"]["code"] == "request_too_large"


@pytest.fixture(scope="module")
def roomy(triton_url: str) -> Iterator[httpx.Client]:
    """A gateway on the shared Triton serving only the image model, admitting bodies above 16 MiB."""
    port = free_port()
    proc = start(["serve", "--triton-url", triton_url, "--port", str(port), "--models", IMAGE_MODEL,
                  "--max-request-bytes", str(20 * MIB)], "gateway-images.log")
    url = f"http://127.0.0.1:{port}"
    try:
        wait_for(lambda: httpx.get(url + "/health", timeout=2).json()["status"] in ("ready", "failed"), READY_S,
                 "gateway (images)", proc)
        with httpx.Client(base_url=url, timeout=120) as client:
            assert_ready(client)
            yield client
    finally:
        code = stop(proc)
    assert code == 0, "the images gateway did not exit cleanly"


def test_an_image_of_16_mib_is_read_and_one_byte_more_is_refused(roomy: httpx.Client) -> None:
    def send(data: bytes) -> httpx.Response:
        return post_multipart(roomy, "/v1/embeddings", multipart(
            {"model": IMAGE_MODEL, "input": ["A"], "assets": {"A": {"type": "image", "part": "a"}}}, [("a", data)]))

    r = send(padded_png(16 * MIB))
    assert r.status_code == 200 and "embedding" in r.json()["data"][0], r.text
    rejected(send(padded_png(16 * MIB + 1)), "asset 'A'", f"{16 * MIB + 1} bytes", "16 MiB")
    assert_ready(roomy)
    assert json.loads(roomy.get("/v1/models").content)["models"] == [IMAGE_MODEL]


def test_a_compressed_multipart_body_is_read_like_a_plain_one_and_other_multipart_types_are_415(
        http: httpx.Client) -> None:
    import gzip

    body = multipart({"model": IMAGE_MODEL, "input": ["A"], "assets": {"A": {"type": "image", "part": "a"}}},
                     [("a", photo("coffee.png"))])
    plain = post_multipart(http, "/v1/classify", body).json()
    r = http.post("/v1/classify", content=gzip.compress(body), headers={
        "Content-Type": "multipart/form-data; boundary=sr-boundary-7f3a", "Content-Encoding": "gzip"})
    assert r.status_code == 200 and r.json()["results"] == plain["results"]
    mixed = http.post("/v1/classify", content=body,
                      headers={"Content-Type": "multipart/mixed; boundary=sr-boundary-7f3a"})
    assert mixed.status_code == 415 and mixed.json()["error"]["code"] == "unsupported_media_type"
