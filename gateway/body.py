"""Reading request bodies: byte limits, one layer of Content-Encoding, strict JSON.

The size limit applies to the body as sent and again as decoded, and decoding stops one byte past the limit, so
a decompression bomb costs at most `max_bytes` of memory and ends in 413, never in an OOM.
"""

from __future__ import annotations

import json
import re
import zlib
from dataclasses import dataclass
from typing import Any

import zstandard
from aiohttp import web

from .errors import ApiError

ZSTD_MAX_WINDOW = 8 * 1024 * 1024
_ENCODINGS = {"gzip", "x-gzip", "zstd"}
_ESCAPED_SURROGATE = re.compile(rb"\\[uU][dD][89a-fA-F]")
_SURROGATE = re.compile("[\ud800-\udfff]")


def too_large(limit: int, decoded: bool = False) -> ApiError:
    what = "the decoded request body" if decoded else "the request body"
    return ApiError("request_too_large", f"{what} exceeds {limit} bytes")


async def read_limited(request: web.Request, limit: int) -> bytes:
    """The raw body, refusing early by Content-Length and again while streaming (chunked bodies)."""
    if request.content_length is not None and request.content_length > limit:
        raise too_large(limit)
    chunks: list[bytes] = []
    size = 0
    async for chunk in request.content.iter_chunked(1 << 16):
        size += len(chunk)
        if size > limit:
            raise too_large(limit)
        chunks.append(chunk)
    return b"".join(chunks)


def content_encoding(header: str | None) -> str | None:
    """The single supported coding named by the header, or None for an identity body."""
    if header is None or not header.strip():
        return None
    codings = [c.strip().lower() for c in header.split(",") if c.strip()]
    codings = [c for c in codings if c != "identity"]
    if not codings:
        return None
    if len(codings) > 1:
        raise ApiError("unsupported_media_type",
                       f"stacked Content-Encoding {header!r} is not supported: use one of gzip, x-gzip, zstd")
    if codings[0] not in _ENCODINGS:
        raise ApiError("unsupported_media_type",
                       f"Content-Encoding {codings[0]!r} is not supported: use gzip, x-gzip or zstd")
    return codings[0]


def _gunzip(data: bytes, limit: int) -> bytes:
    out = bytearray()
    while data:
        d = zlib.decompressobj(16 + zlib.MAX_WBITS)
        try:
            out += d.decompress(data, limit + 1 - len(out))
            if len(out) > limit:
                raise too_large(limit, decoded=True)
            if not d.eof:
                if d.unconsumed_tail:  # output budget exhausted with input left over
                    raise too_large(limit, decoded=True)
                raise ApiError("invalid_request", "the gzip body is truncated")
        except zlib.error as exc:
            raise ApiError("invalid_request", f"the gzip body is corrupt: {exc}") from exc
        data = d.unused_data  # concatenated members are one stream (RFC 1952)
    return bytes(out)


def _window_too_large() -> ApiError:
    return ApiError("unsupported_media_type", f"zstd frames must use a window of at most {ZSTD_MAX_WINDOW} bytes")


def _unzstd(data: bytes, limit: int) -> bytes:
    try:
        if zstandard.get_frame_parameters(data).window_size > ZSTD_MAX_WINDOW:
            raise _window_too_large()
    except zstandard.ZstdError as exc:
        raise ApiError("invalid_request", f"the zstd body is corrupt: {exc}") from exc
    dctx = zstandard.ZstdDecompressor(max_window_size=ZSTD_MAX_WINDOW)
    try:
        with dctx.stream_reader(data, read_across_frames=True) as reader:
            out = reader.read(limit + 1)
    except zstandard.ZstdError as exc:
        if "too much memory" in str(exc) or "window" in str(exc).lower():  # a later frame's window
            raise _window_too_large() from exc
        raise ApiError("invalid_request", f"the zstd body is corrupt: {exc}") from exc
    if len(out) > limit:
        raise too_large(limit, decoded=True)
    return out


def decode(data: bytes, coding: str | None, limit: int) -> bytes:
    if coding is None:
        return data
    if coding in ("gzip", "x-gzip"):
        return _gunzip(data, limit)
    return _unzstd(data, limit)


def _reject_constant(name: str) -> Any:
    raise ValueError(f"{name} is not valid JSON")


def _has_surrogate(value: Any) -> bool:
    if isinstance(value, str):
        return _SURROGATE.search(value) is not None
    if isinstance(value, dict):
        return any(_has_surrogate(k) or _has_surrogate(v) for k, v in value.items())
    if isinstance(value, list):
        return any(_has_surrogate(v) for v in value)
    return False


def parse_json(data: bytes) -> Any:
    """Strict UTF-8 JSON: no NaN/Infinity, no unpaired surrogates (escaped or raw)."""
    try:
        text = data.decode("utf-8")
    except UnicodeDecodeError as exc:
        bad = data[exc.start : exc.start + 2]
        surrogate = len(bad) == 2 and bad[0] == 0xED and bad[1] >= 0xA0  # UTF-8 form of U+D800..U+DFFF
        message = "the request contains an unpaired surrogate" if surrogate else f"the request body is not UTF-8: {exc}"
        raise ApiError("invalid_request", message) from exc
    try:
        value = json.loads(text, parse_constant=_reject_constant)
    except ValueError as exc:
        raise ApiError("invalid_request", f"the request body is not JSON: {exc}") from exc
    if _ESCAPED_SURROGATE.search(data) and _has_surrogate(value):
        raise ApiError("invalid_request", "the request contains an unpaired surrogate")
    return value


_DISPOSITION_NAME = re.compile(r'(?:^|;)\s*name\s*=\s*(?:"((?:[^"\\]|\\.)*)"|([^;\s]+))', re.IGNORECASE)


def _part_name(headers: bytes) -> str:
    for line in headers.split(b"\r\n"):
        key, _, value = line.partition(b":")
        if key.strip().lower() == b"content-disposition":
            text = value.decode("utf-8", "replace").strip()
            if not text.lower().startswith("form-data"):
                break
            match = _DISPOSITION_NAME.search(text[len("form-data"):])
            if match:
                name = match.group(1) if match.group(1) is not None else match.group(2)
                return name.replace('\\"', '"')
    raise ApiError("invalid_request", "a multipart part has no Content-Disposition: form-data; name=...")


def split_multipart(data: bytes, boundary: str) -> list[tuple[str, bytes]]:
    """(name, bytes) of every part of a multipart/form-data body, in order (RFC 7578); strict about framing."""
    delimiter = b"--" + boundary.encode("latin-1")
    start = data.find(delimiter)
    if start < 0 or (start > 0 and data[start - 2 : start] != b"\r\n"):
        raise ApiError("invalid_request", "the multipart body has no opening boundary")
    parts: list[tuple[str, bytes]] = []
    at = start + len(delimiter)
    while True:
        if data[at : at + 2] == b"--":
            return parts  # closing delimiter; the epilogue is ignored
        if data[at : at + 2] != b"\r\n":
            raise ApiError("invalid_request", "the multipart body has a malformed boundary line")
        end = data.find(b"\r\n" + delimiter, at + 2)
        if end < 0:
            raise ApiError("invalid_request", "the multipart body is truncated (no closing boundary)")
        head_end = data.find(b"\r\n\r\n", at)
        if head_end < 0 or head_end > end:
            if data[at + 2 : at + 4] == b"\r\n":  # a part with no headers at all
                raise ApiError("invalid_request", "a multipart part has no Content-Disposition: form-data; name=...")
            raise ApiError("invalid_request", "a multipart part's headers are not terminated")
        parts.append((_part_name(data[at + 2 : head_end]), data[head_end + 4 : end]))
        at = end + 2 + len(delimiter)


@dataclass
class Body:
    """A request body: the JSON request, and the image parts of a multipart body (None for a JSON body)."""

    json: Any
    parts: dict[str, bytes] | None = None


def parse_multipart(data: bytes, boundary: str | None) -> Body:
    """The first part `request` is the JSON request; every other part is one image's bytes, named uniquely."""
    if not boundary:
        raise ApiError("invalid_request", "multipart/form-data needs a boundary parameter")
    parts = split_multipart(data, boundary)
    if not parts or parts[0][0] != "request":
        raise ApiError("invalid_request", "the first part of a multipart body must be `request` (the JSON request)")
    images: dict[str, bytes] = {}
    for name, payload in parts[1:]:
        if name == "request" or name in images:
            raise ApiError("invalid_request", f"multipart part {name!r} appears more than once")
        images[name] = payload
    return Body(parse_json(parts[0][1]), images)


async def read_body(request: web.Request, limit: int) -> Body:
    """JSON, compressed JSON or multipart/form-data; `limit` covers the whole body as sent and as decoded."""
    coding = content_encoding(request.headers.get("Content-Encoding"))
    ctype = request.content_type
    if ctype.startswith("multipart/") and ctype != "multipart/form-data":
        raise ApiError("unsupported_media_type", f"{ctype} is not supported: send multipart/form-data")
    raw = decode(await read_limited(request, limit), coding, limit)
    if ctype == "multipart/form-data":
        return parse_multipart(raw, _boundary(request.headers.get("Content-Type", "")))
    return Body(parse_json(raw))


def _boundary(content_type: str) -> str | None:
    """The boundary parameter, quoted or not (the email module implements RFC 2045 parameter parsing)."""
    from email.message import Message

    message = Message()
    message["content-type"] = content_type
    value = message.get_param("boundary")
    return value if isinstance(value, str) else None


async def read_json(request: web.Request, limit: int) -> Any:
    """The JSON request of any accepted body (multipart image parts are dropped; see `read_body`)."""
    return (await read_body(request, limit)).json
