"""OpenAI-style content parts (`input` items of /v1/embeddings and /v1/classify): text, image_url, input_audio.

Images come only as base64 data URLs (`data:image/<type>;base64,...`); the declared type is not trusted (the format
is read from the bytes). Remote URLs are never fetched. A part a model cannot read (an image on a text-only model,
audio anywhere here) fails that item with invalid_input naming the modality; its siblings are answered.
"""

from __future__ import annotations

import base64
import binascii
import re
from typing import Literal

from pydantic import StrictStr

from ..cards import Card
from ..errors import ItemError
from ..execution.requests import Strict


class ImageUrl(Strict):
    url: StrictStr
    detail: Literal["auto", "low", "high"] | None = None


class InputAudio(Strict):
    data: StrictStr
    format: StrictStr = "wav"


class TextPart(Strict):
    type: Literal["text"]
    text: StrictStr


class ImagePart(Strict):
    type: Literal["image_url"]
    image_url: ImageUrl


class AudioPart(Strict):
    type: Literal["input_audio"]
    input_audio: InputAudio


ContentPart = TextPart | ImagePart | AudioPart
_DATA_URL = re.compile(r"data:([^;,]*)((?:;[^;,]*)*?);base64,(.*)", re.DOTALL)


def modality(value: object) -> str:
    """The modality of one input item: text (a string or text part), image or audio."""
    if isinstance(value, ImagePart):
        return "image"
    if isinstance(value, AudioPart):
        return "audio"
    return "text"


def refusal(card: Card, value: object) -> ItemError | None:
    """The item error for an item of a modality the model does not read (None if it reads it)."""
    kind = modality(value)
    if kind in card.modalities and kind != "audio":  # no surface here reads audio yet
        return None
    reads = " and ".join(m for m in card.modalities if m != "audio") or "nothing"
    return ItemError("invalid_input", f"model {card.id} has no {kind} modality (it reads {reads}); "
                                      f"this item is {'an' if kind in ('image', 'audio') else 'a'} {kind} input")


def image_bytes(part: ImagePart) -> bytes:
    """The bytes of a data URL image part; ItemError for remote URLs and malformed data."""
    url = part.image_url.url
    if url.lower().startswith(("http://", "https://", "ftp://", "file:")):
        raise ItemError("invalid_input", "remote image URLs are not fetched: send the image inline as a "
                                         "data:image/png|jpeg|webp;base64,... URL")
    match = _DATA_URL.fullmatch(url)
    if match is None:
        raise ItemError("invalid_input", "image_url.url must be a base64 data URL: data:image/<type>;base64,...")
    if not match.group(1).lower().startswith("image/"):
        raise ItemError("invalid_input", f"the data URL's type {match.group(1)!r} is not an image type")
    try:
        return base64.b64decode(match.group(3), validate=True)
    except (binascii.Error, ValueError) as exc:
        raise ItemError("invalid_input", f"the data URL is not valid base64: {exc}") from exc


def text_of(value: object) -> str | None:
    """The text of a string or text part; None for media parts."""
    if isinstance(value, str):
        return value
    if isinstance(value, TextPart):
        return value.text
    return None
