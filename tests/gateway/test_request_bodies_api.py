"""Cross-cutting body handling on a POST surface: limits, Content-Encoding, JSON strictness, Server-Timing."""

from __future__ import annotations

import gzip
import json
import zlib

import httpx
import pytest
import zstandard

from .conftest import MODEL
from .contract import PHASES, check, timings

LIMIT = 8_388_608  # the default --max-request-bytes


def raw(http: httpx.Client, content: bytes, **headers: str) -> httpx.Response:
    r = http.post("/v1/embeddings", content=content, headers={"Content-Type": "application/json", **headers})
    check("/v1/embeddings", "post", r.status_code, r.json(), r.headers)
    return r


def padded(size: int) -> bytes:
    """A valid request of exactly `size` bytes (padding goes into the ignored `user` member)."""
    base = b'{"model":"all-minilm-l6-v2","input":"x","user":""}'
    body = base[:-2] + b"u" * (size - len(base)) + b'"}'
    assert len(body) == size
    return body


def test_a_body_of_exactly_the_limit_is_accepted_and_one_byte_more_is_413(http: httpx.Client) -> None:
    assert raw(http, padded(LIMIT)).status_code == 200
    r = raw(http, padded(LIMIT + 1))
    assert r.status_code == 413 and r.json()["error"]["code"] == "request_too_large"


@pytest.mark.parametrize("coding, compress", [
    ("gzip", gzip.compress), ("x-gzip", gzip.compress), ("zstd", lambda b: zstandard.ZstdCompressor().compress(b)),
])
def test_compressed_bodies_are_decoded_and_the_limit_applies_to_the_decoded_size(http: httpx.Client, coding: str,
                                                                                  compress) -> None:  # type: ignore[no-untyped-def]
    body = json.dumps({"model": MODEL, "input": ["compressed request"]}).encode()
    ok = raw(http, compress(body), **{"Content-Encoding": coding})
    assert ok.status_code == 200 and len(ok.json()["data"]) == 1
    assert raw(http, compress(padded(LIMIT)), **{"Content-Encoding": coding}).status_code == 200
    over = raw(http, compress(padded(LIMIT + 1)), **{"Content-Encoding": coding})
    assert over.status_code == 413 and "decoded" in over.json()["error"]["message"]


def test_a_gzip_bomb_is_413_without_inflating_it(http: httpx.Client) -> None:
    bomb = zlib.compressobj(9, zlib.DEFLATED, 31)
    data = bomb.compress(b"[" + b" " * (1 << 28)) + bomb.flush()  # 256 MiB of JSON whitespace in ~256 KiB
    assert len(data) < LIMIT // 16
    r = raw(http, data, **{"Content-Encoding": "gzip"})
    assert r.status_code == 413


def zstd_frame(window_log: int, body: bytes) -> bytes:
    params = zstandard.ZstdCompressionParameters(window_log=window_log)
    stream = zstandard.ZstdCompressor(compression_params=params).compressobj()  # size unknown: window kept
    frame = stream.compress(body) + stream.flush()
    assert zstandard.get_frame_parameters(frame).window_size == 1 << window_log
    return frame


def test_a_zstd_window_of_exactly_8_mib_is_accepted_and_16_mib_is_415(http: httpx.Client) -> None:
    assert raw(http, zstd_frame(23, padded(1000)), **{"Content-Encoding": "zstd"}).status_code == 200
    r = raw(http, zstd_frame(24, padded(1000)), **{"Content-Encoding": "zstd"})
    assert r.status_code == 415


@pytest.mark.parametrize("header", ["br", "deflate", "gzip, gzip", "gzip, zstd", "compress"])
def test_other_or_stacked_encodings_are_415(http: httpx.Client, header: str) -> None:
    r = raw(http, gzip.compress(b'{"model":"all-minilm-l6-v2","input":"x"}'), **{"Content-Encoding": header})
    assert r.status_code == 415 and r.json()["error"]["code"] == "unsupported_media_type"


def test_a_corrupt_gzip_body_is_400(http: httpx.Client) -> None:
    assert raw(http, b"\x1f\x8b\x08\x00garbage", **{"Content-Encoding": "gzip"}).status_code == 400


@pytest.mark.parametrize("content, fragment", [
    (b"{", "not JSON"),
    (b'{"input": NaN}', "not JSON"),
    (b'{"input": "\\ud800"}', "unpaired surrogate"),
    (b'{"input": "a\xed\xa0\x80b"}', "unpaired surrogate"),
    (b'{"input": "\xff"}', "not UTF-8"),
    (b"[1, 2]", "JSON object"),
])
def test_malformed_json_is_400(http: httpx.Client, content: bytes, fragment: str) -> None:
    r = raw(http, content)
    assert r.status_code == 400 and fragment in r.json()["error"]["message"]


def test_an_escaped_surrogate_pair_is_accepted(http: httpx.Client) -> None:
    assert raw(http, b'{"model": "all-minilm-l6-v2", "input": "smile \\ud83d\\ude00"}').status_code == 200


def test_server_timing_has_seven_phases_and_phases_fit_in_total(http: httpx.Client) -> None:
    r = raw(http, json.dumps({"model": MODEL, "input": ["timing check", "another one"]}).encode())
    t = timings(r)
    assert t["forward"] > 0 and t["tokenize"] > 0
    assert sum(t[p] for p in PHASES[:-1]) <= t["total"] + 0.01


def test_errors_carry_server_timing_with_no_forward(http: httpx.Client) -> None:
    for body in (b"{", b'{"model": "nope", "input": "x"}', padded(LIMIT + 1)):
        t = timings(raw(http, body))
        assert t["forward"] == 0.0


def test_non_surface_endpoints_carry_no_server_timing(http: httpx.Client) -> None:
    for path in ("/health", "/health/live", "/v1/models", "/metrics"):
        assert "Server-Timing" not in http.get(path).headers


def test_unknown_paths_and_methods_answer_in_the_error_format(http: httpx.Client) -> None:
    r = http.get("/v1/nothing")
    assert r.status_code == 404
    assert r.json() == {"error": {"code": "invalid_request", "message": "no route /v1/nothing"}}
    r = http.get("/v1/embeddings")
    assert r.status_code == 405 and r.json()["error"]["code"] == "invalid_request"
