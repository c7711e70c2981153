"""Top-level `assets`: images held by reference and substituted wherever the reference appears in a request.

`{"<ref>": {"type": "image", "data_base64": "..."}}`, or `{"type": "image", "part": "<name>"}` for a part of a
multipart body (see body.py). Substitution follows the spec: a string equal to a reference *is* that image; a longer
string is split at every occurrence into text and image segments; object keys are never replaced. Every asset must
be used; each use adds the image again (its tokens count where it stands). A reference is 1–1,024 UTF-8 bytes and
all references together at most 65,536.

How a surface uses this (decisions, embeddings, classify):

    assets = Assets.parse(body.get("assets"), call.parts)    # 400 on bad references or parts
    state = assets.substitute(body["state"])                  # str | ImageUse | Segments | list | dict
    assets.check_all_used()                                   # 400 names any unused asset
    images = await assets.decode(card.image_max_pixels)       # {ref: DecodedImage}, 400 names a rejected asset

Each `ImageUse` carries its `ordinal` (0-based, in walk order across every `substitute` call), so "[image k]"
numbering is stable. Decoding happens once per asset, however often it is used.
"""

from __future__ import annotations

import base64
import binascii
import re
from collections import Counter
from dataclasses import dataclass
from typing import Any

from .errors import ApiError
from .images.decode import DecodedImage, ImageRejected, decode_async

MAX_REF_BYTES = 1024
MAX_REFS_BYTES = 65_536


@dataclass(frozen=True)
class Asset:
    ref: str
    data: bytes
    part: str | None = None  # the multipart part it came from, if any


@dataclass(frozen=True)
class ImageUse:
    """One use of an asset where its reference stood."""

    asset: Asset
    ordinal: int

    @property
    def ref(self) -> str:
        return self.asset.ref


class Segments(list[str | ImageUse]):
    """A string that contained references, split into text and images in order (never an empty text segment).
    A subclass of list so consumers can tell it from a JSON array."""


def _invalid(message: str) -> ApiError:
    return ApiError("invalid_request", message)


def _b64(ref: str, value: Any) -> bytes:
    if not isinstance(value, str):
        raise _invalid(f"asset {ref!r}: data_base64 must be a string")
    try:
        return base64.b64decode(value, validate=True)
    except (binascii.Error, ValueError) as exc:
        raise _invalid(f"asset {ref!r}: data_base64 is not valid base64: {exc}") from exc


class Assets:
    def __init__(self, assets: dict[str, Asset] | None = None) -> None:
        self.assets: dict[str, Asset] = assets or {}
        self.uses: Counter[str] = Counter()
        self._ordinal = 0
        refs = sorted(self.assets, key=len, reverse=True)  # the longest reference wins where two overlap
        self._pattern = re.compile("|".join(re.escape(r) for r in refs)) if refs else None

    @classmethod
    def parse(cls, raw: Any, parts: dict[str, bytes] | None = None) -> Assets:
        """Validate `assets` against the spec's rules and the body's parts (None: not a multipart body)."""
        multipart = parts is not None
        parts = parts or {}
        if raw is None:
            if parts:
                raise _invalid(f"multipart part {next(iter(parts))!r} is not referenced by any asset "
                               "(the request has no assets)")
            return cls()
        if not isinstance(raw, dict):
            raise _invalid("assets must be an object of reference → {type, data_base64 | part}")
        total = 0
        out: dict[str, Asset] = {}
        claimed: dict[str, str] = {}
        for ref, spec in raw.items():
            size = len(ref.encode("utf-8"))
            if not 1 <= size <= MAX_REF_BYTES:
                raise _invalid(f"asset reference {ref[:64]!r} is {size} bytes; a reference is 1 to "
                               f"{MAX_REF_BYTES} bytes")
            total += size
            if not isinstance(spec, dict) or spec.get("type") != "image":
                raise _invalid(f"asset {ref!r} must be an object with type \"image\"")
            extra = set(spec) - {"type", "data_base64", "part"}
            if extra:
                raise _invalid(f"asset {ref!r} has unknown member{'s' if len(extra) > 1 else ''} "
                               f"{', '.join(sorted(extra))}")
            if ("data_base64" in spec) == ("part" in spec):
                raise _invalid(f"asset {ref!r} needs exactly one of data_base64 or part")
            if "part" in spec:
                name = spec["part"]
                if not isinstance(name, str):
                    raise _invalid(f"asset {ref!r}: part must be a string")
                if name not in parts:
                    raise _invalid(f"asset {ref!r} names part {name!r}, which the body does not have"
                                   + ("" if multipart else " (send a multipart/form-data body)"))
                if name in claimed:
                    raise _invalid(f"part {name!r} is referenced by both asset {claimed[name]!r} and {ref!r}")
                claimed[name] = ref
                out[ref] = Asset(ref, parts[name], name)
            else:
                out[ref] = Asset(ref, _b64(ref, spec["data_base64"]))
        if total > MAX_REFS_BYTES:
            raise _invalid(f"asset references total {total} bytes; at most {MAX_REFS_BYTES}")
        unreferenced = [p for p in parts if p not in claimed]
        if unreferenced:
            raise _invalid(f"multipart part {unreferenced[0]!r} is not referenced by any asset")
        return cls(out)

    def _use(self, ref: str) -> ImageUse:
        self.uses[ref] += 1
        use = ImageUse(self.assets[ref], self._ordinal)
        self._ordinal += 1
        return use

    def split(self, text: str) -> str | ImageUse | Segments:
        """A string with its references replaced: the image itself, the text unchanged, or segments."""
        if self._pattern is None:
            return text
        if text in self.assets:
            return self._use(text)
        out = Segments()
        at = 0
        for match in self._pattern.finditer(text):
            if match.start() > at:
                out.append(text[at : match.start()])
            out.append(self._use(match.group()))
            at = match.end()
        if not out:
            return text
        if at < len(text):
            out.append(text[at:])
        return out

    def substitute(self, value: Any) -> Any:
        """Any JSON value with every reference in its strings replaced; object keys are kept as they are."""
        if isinstance(value, str):
            return self.split(value)
        if isinstance(value, list):
            return [self.substitute(v) for v in value]
        if isinstance(value, dict):
            return {k: self.substitute(v) for k, v in value.items()}
        return value

    def check_all_used(self) -> None:
        unused = [ref for ref in self.assets if self.uses[ref] == 0]
        if unused:
            raise _invalid(f"asset {unused[0]!r} is never used" + (f" (nor {len(unused) - 1} more)"
                                                                    if len(unused) > 1 else ""))

    async def decode(self, max_pixels: int) -> dict[str, DecodedImage]:
        """Every used asset decoded once (in parallel on the bounded decode pool); a rejected image fails the
        request with a message naming the asset."""
        import asyncio

        refs = [r for r in self.assets if self.uses[r]]
        results = await asyncio.gather(*(decode_async(self.assets[r].data, max_pixels) for r in refs),
                                       return_exceptions=True)
        out: dict[str, DecodedImage] = {}
        for ref, result in zip(refs, results, strict=True):
            if isinstance(result, ImageRejected):
                raise _invalid(f"asset {ref!r}: {result}")
            if isinstance(result, BaseException):
                raise result
            out[ref] = result
        return out


def share_parts(bodies: dict[str, Any], parts: dict[str, bytes] | None,
                what: str) -> dict[str, dict[str, bytes] | None]:
    """A multipart body holding several requests (a bundle's tasks, a System One batch): each request gets the
    parts its own `assets` name, so it reads them exactly as if sent alone. The spec gives every part exactly one
    asset, so a part no request names, or one that two requests name, fails the body as a whole. A JSON body
    (`parts` None) gives every request None, so an asset naming a part still asks for a multipart body."""
    if parts is None:
        return dict.fromkeys(bodies)
    owner: dict[str, str] = {}
    out: dict[str, dict[str, bytes] | None] = {}
    for name, body in bodies.items():
        raw = body.get("assets") if isinstance(body, dict) else None
        mine: dict[str, bytes] = {}
        for spec in raw.values() if isinstance(raw, dict) else ():
            part = spec.get("part") if isinstance(spec, dict) else None
            if not isinstance(part, str) or part not in parts:
                continue  # the request's own validation names what is wrong with it
            if owner.get(part, name) != name:
                raise _invalid(f"multipart part {part!r} is referenced by {what} {owner[part]!r} and {name!r}; "
                               "each part belongs to exactly one asset")
            owner[part] = name
            mine[part] = parts[part]
        out[name] = mine
    unreferenced = [p for p in parts if p not in owner]
    if unreferenced:
        raise _invalid(f"multipart part {unreferenced[0]!r} is not referenced by any asset")
    return out


CHECK_PIXELS = 65_536  # assets are checked by decoding at this size (JPEG decodes scaled down: cheap)
_MIME = {"PNG": "image/png", "JPEG": "image/jpeg", "WEBP": "image/webp"}


async def inline_input_assets(body: Any, parts: dict[str, bytes] | None) -> Any:
    """For the surfaces whose `input` items are content parts (/v1/embeddings, /v1/classify): an item equal to an
    asset reference becomes that image as an image_url part, so assets and multipart bodies answer exactly as data
    URLs do. Every asset is decoded once here (small, off the loop), so a rejected image (format, limits, animation,
    truncation) fails the whole request naming its asset, as the spec asks of assets."""
    if not isinstance(body, dict) or ("assets" not in body and not parts):
        return body
    body = dict(body)
    assets = Assets.parse(body.pop("assets", None), parts)
    raw = body.get("input")
    items = [raw] if isinstance(raw, str) else raw if isinstance(raw, list) else []
    resolved: list[Any] = [assets.split(item) if isinstance(item, str) else item for item in items]
    for index, value in enumerate(resolved):
        if isinstance(value, Segments):
            ref = next(v.ref for v in value if isinstance(v, ImageUse))
            raise _invalid(f"input {index} mixes text with asset {ref!r}; an input item is one text or one image here")
    assets.check_all_used()
    formats = {ref: image.format for ref, image in (await assets.decode(CHECK_PIXELS)).items()}
    for index, value in enumerate(resolved):
        if isinstance(value, ImageUse):
            url = f"data:{_MIME[formats[value.ref]]};base64,{base64.b64encode(value.asset.data).decode('ascii')}"
            resolved[index] = {"type": "image_url", "image_url": {"url": url}}
    if isinstance(raw, list) or (isinstance(raw, str) and not isinstance(resolved[0], str)):
        body["input"] = resolved  # a lone reference is a one-item list: a bare `input` is only ever a string
    return body
