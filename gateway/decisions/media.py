"""Images in decisions: assets substituted into an entry's state and questions, numbered, placed and decoded.

Every image use is read as one more image: the entry's `images` first, then each use in the state (in reading
order), all in front of the state, whose text refers to each as `[image k]`. An image in a question's instructions
or options belongs to that question only (numbered after the entry's images) and is allowed only where the card's
`image_placements` lists that place; elsewhere the question fails with `question_images_unsupported` (it is never
moved into the state: that would change every other question's answer). A model without the image modality
refuses images; an image the decoder rejects fails the entry (or the request) naming its asset.
"""

from __future__ import annotations

import base64
import binascii
import hashlib
import re
from dataclasses import dataclass, field
from typing import Any

from ..assets import Asset, Assets, ImageUse, Segments
from ..errors import ApiError
from ..images.decode import DecodedImage, ImageRejected, decode_async
from ..runtime import ServedModel

DATA_URL = re.compile(r"^data:image/(png|jpeg|jpg|webp);base64,(.*)$", re.DOTALL)
QUESTION_PLACES = {"instructions": "instructions"}  # every other member of a question holds its options: criteria


@dataclass
class Picture:
    """One image use an entry or a question reads."""

    asset: Asset
    number: int  # k in "[image k]"
    decoded: DecodedImage | None = None

    @property
    def key(self) -> str:
        return hashlib.sha256(self.asset.data).hexdigest()


@dataclass
class EntryMedia:
    state: Any  # the state with every image replaced by "[image k]"
    questions: dict[str, Any]
    images: list[Picture] = field(default_factory=list)  # read in front of the state, in order
    question_images: dict[str, list[Picture]] = field(default_factory=dict)
    question_places: dict[str, set[str]] = field(default_factory=dict)  # where each question holds images
    videos: list[Any] = field(default_factory=list)


def _data_url(index: int, value: Any, where: str) -> Asset:
    if not isinstance(value, str):
        raise ApiError("invalid_request", f"{where}[{index}] must be a data URL or an asset reference")
    match = DATA_URL.match(value)
    if match is None:
        raise ApiError("invalid_request", f"{where}[{index}] must be a base64 data URL (data:image/png|jpeg|webp;"
                                          "base64,...) or an asset reference; remote URLs are not fetched")
    try:
        data = base64.b64decode(match.group(2), validate=True)
    except (binascii.Error, ValueError) as exc:
        raise ApiError("invalid_request", f"{where}[{index}] is not valid base64: {exc}") from exc
    return Asset(f"{where}[{index}]", data)


class Numbering:
    """Replaces image uses by "[image k]" and records the pictures, in reading order."""

    def __init__(self, start: int = 1) -> None:
        self.next = start
        self.pictures: list[Picture] = []

    def add(self, asset: Asset) -> str:
        self.pictures.append(Picture(asset, self.next))
        self.next += 1
        return f"[image {self.pictures[-1].number}]"

    def text(self, value: Any) -> Any:
        if isinstance(value, ImageUse):
            return self.add(value.asset)
        if isinstance(value, Segments):
            return "".join(self.add(p.asset) if isinstance(p, ImageUse) else p for p in value)
        if isinstance(value, list):
            return [self.text(v) for v in value]
        if isinstance(value, dict):
            return {k: self.text(v) for k, v in value.items()}
        return value


def _uses(value: Any) -> bool:
    if isinstance(value, ImageUse | Segments):
        return True
    if isinstance(value, list):
        return any(_uses(v) for v in value)
    if isinstance(value, dict):
        return any(_uses(v) for v in value.values())
    return False


def leading_images(state: Any) -> tuple[list[ImageUse], Any]:
    """System One's array state: images (then videos) whose placeholders stand before exactly one other element
    are read in front of that element, which is then the state."""
    if not isinstance(state, list) or isinstance(state, Segments) or len(state) < 2:
        return [], state
    images = [v for v in state[:-1] if isinstance(v, ImageUse)]
    if len(images) != len(state) - 1 or isinstance(state[-1], ImageUse):
        return [], state
    return images, state[-1]


def substitute(assets: Assets, state: Any, questions: Any, images: Any, where: str, *,
               leading: bool = False) -> EntryMedia:
    """One entry's state and questions with their images numbered ("[image k]") and collected."""
    numbering = Numbering()
    listed = images if images is not None else []
    if not isinstance(listed, list):
        raise ApiError("invalid_request", f"{where}images must be a list")
    used = assets.substitute(listed)
    for index, item in enumerate(used):
        if isinstance(item, ImageUse):
            numbering.add(item.asset)
        else:
            numbering.add(_data_url(index, item, f"{where}images"))
    raw_state = assets.substitute(state)
    if leading:
        ahead, raw_state = leading_images(raw_state)
        for use in ahead:
            numbering.add(use.asset)
    text_state = numbering.text(raw_state)
    media = EntryMedia(text_state, {}, list(numbering.pictures))
    if not isinstance(questions, dict):
        media.questions = questions  # the engine answers a malformed `questions` with its own 400
        return media
    for qid, raw in questions.items():
        sub = assets.substitute(raw)
        local = Numbering(numbering.next)
        if isinstance(sub, dict):
            places = {QUESTION_PLACES.get(k, "criteria") for k, v in sub.items() if _uses(v)}
            media.questions[qid] = local.text(sub)
        else:
            places = set()
            media.questions[qid] = sub
        if local.pictures:
            media.question_images[qid] = local.pictures
            media.question_places[qid] = places
    return media


async def decode(model: ServedModel, pictures: list[Picture]) -> dict[str, str]:
    """Decode every picture once per distinct upload at the card's size; returns {key: rejection message}."""
    max_pixels = model.card.image_max_pixels or 1_638_400
    done: dict[str, DecodedImage | str] = {}
    for picture in pictures:
        if picture.key not in done:
            try:
                done[picture.key] = await decode_async(picture.asset.data, max_pixels)
            except ImageRejected as exc:
                done[picture.key] = f"asset {picture.asset.ref!r}: {exc}"
        found = done[picture.key]
        if isinstance(found, DecodedImage):
            picture.decoded = found
    return {k: v for k, v in done.items() if isinstance(v, str)}
