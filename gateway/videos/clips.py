"""A request's videos: each `videos` entry is a base64 data URL (`data:video/<any>;base64,...`); the container's
format is read from the bytes, never from the declared type, and remote URLs are never fetched."""

from __future__ import annotations

import base64
import binascii
import hashlib
import re
from dataclasses import dataclass
from typing import Any

DATA_URL = re.compile(r"^data:video/[A-Za-z0-9.+-]+;base64,(.*)$", re.DOTALL)


class ClipRejected(ValueError):
    """A `videos` entry that is not a video this gateway reads; the message names the entry and says why."""


@dataclass(frozen=True)
class Clip:
    ref: str  # where it stood: "videos[0]" or "states.<name>.videos[0]"
    data: bytes


def raw_key(value: Any) -> str:
    """A digest of the entry as sent: what a cached answer about this video depends on (known before decoding)."""
    return hashlib.sha256(repr(value).encode("utf-8", "surrogatepass")).hexdigest()


def parse_clip(value: Any, ref: str) -> Clip:
    if not isinstance(value, str):
        raise ClipRejected(f"{ref} must be a data URL (data:video/...;base64,...)")
    match = DATA_URL.match(value)
    if match is None:
        raise ClipRejected(f"{ref} must be a base64 data URL (data:video/<type>;base64,...); remote URLs are not "
                           "fetched")
    try:
        data = base64.b64decode(match.group(1), validate=True)
    except (binascii.Error, ValueError) as exc:
        raise ClipRejected(f"{ref} is not valid base64: {exc}") from exc
    return Clip(ref, data)
