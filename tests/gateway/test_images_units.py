"""The image building blocks in process: asset substitution, multipart framing, decoding and preprocessing."""

from __future__ import annotations

import base64

import numpy as np
import pytest
from PIL import Image

from gateway.assets import Assets, ImageUse, Segments
from gateway.body import parse_multipart, split_multipart
from gateway.errors import ApiError
from gateway.images.decode import ImageRejected, decode_image
from gateway.images.preprocess import efficientnet_lite

from .image_samples import encode


def assets(*refs: str) -> Assets:
    data = base64.b64encode(encode(Image.new("RGB", (8, 8)))).decode()
    return Assets.parse({ref: {"type": "image", "data_base64": data} for ref in refs})


def test_a_string_equal_to_a_reference_is_that_image_and_longer_strings_split_at_every_use() -> None:
    a = assets("<r>", "<s>")
    state = a.substitute({"<r>": "<r>", "text": "see <r> and <s> then <r>.", "list": ["plain", "<s>"]})
    assert set(state) == {"<r>", "text", "list"}  # keys are never replaced
    assert isinstance(state["<r>"], ImageUse) and state["<r>"].ref == "<r>"
    segments = state["text"]
    assert isinstance(segments, Segments)
    assert [s if isinstance(s, str) else s.ref for s in segments] == ["see ", "<r>", " and ", "<s>", " then ", "<r>",
                                                                      "."]
    assert state["list"][0] == "plain" and state["list"][1].ref == "<s>"
    assert a.uses == {"<r>": 3, "<s>": 2}
    ordinals = [state["<r>"].ordinal, *(s.ordinal for s in segments if isinstance(s, ImageUse)),
                state["list"][1].ordinal]
    assert ordinals == sorted(ordinals) == list(range(5))  # "[image k]" numbering follows the walk
    a.check_all_used()


def test_the_longest_reference_wins_where_two_overlap_and_an_unused_asset_is_named() -> None:
    a = assets("img", "img2")
    out = a.split("img2img")
    assert [s.ref for s in out if isinstance(s, ImageUse)] == ["img2", "img"]
    b = assets("used", "idle")
    b.substitute(["used"])
    with pytest.raises(ApiError, match="'idle' is never used"):
        b.check_all_used()


@pytest.mark.parametrize("raw, words", [
    ({"r": {"type": "video", "data_base64": ""}}, "type \"image\""),
    ({"r": {"type": "image"}}, "exactly one of"),
    ({"r": {"type": "image", "data_base64": "!!"}}, "not valid base64"),
    ({"r": {"type": "image", "data_base64": "", "extra": 1}}, "unknown member"),
    ([], "must be an object"),
])
def test_malformed_assets_are_invalid_requests_naming_the_asset(raw: object, words: str) -> None:
    with pytest.raises(ApiError, match=words):
        Assets.parse(raw)


def test_multipart_framing_is_strict_and_part_names_are_read_quoted_or_not() -> None:
    body = (b'preamble\r\n--b\r\nContent-Disposition: form-data; name="request"\r\n\r\n{"a": 1}\r\n'
            b'--b\r\nContent-Disposition: form-data; name=img; filename="x.png"\r\n\r\n\x00\r\n--\r\n--b--\r\nepilogue')
    assert split_multipart(body, "b") == [("request", b'{"a": 1}'), ("img", b"\x00\r\n--")]
    parsed = parse_multipart(body, "b")
    assert parsed.json == {"a": 1} and parsed.parts == {"img": b"\x00\r\n--"}
    for broken in (body.replace(b"--b--", b"--c--"), b'--b\r\nX-Other: 1\r\n\r\n{}\r\n--b--', b"no boundary"):
        with pytest.raises(ApiError):
            split_multipart(broken, "b")


def test_exif_orientation_is_applied_and_pictures_are_scaled_to_the_models_pixels() -> None:
    img = Image.new("RGB", (400, 100), (255, 0, 0))
    img.paste((0, 0, 255), (0, 0, 100, 100))  # blue on the left
    exif = Image.Exif()
    exif[0x0112] = 6  # rotate 90° clockwise when shown
    shown = decode_image(encode(img, "JPEG", exif=exif.tobytes(), quality=95), 10_000)
    assert (shown.width, shown.height) == (100, 400)  # as sent, oriented
    assert shown.pixels.shape[0] * shown.pixels.shape[1] <= 10_000 and shown.pixels.shape[0] > shown.pixels.shape[1]
    top = shown.pixels[: shown.pixels.shape[0] // 8].mean(axis=(0, 1))
    assert top[2] > 200 and top[0] < 60  # the blue end is now on top
    transparent = decode_image(encode(Image.new("RGBA", (10, 10), (0, 0, 0, 0))), 10_000)
    assert transparent.pixels.min() == 255  # transparency reads as white paper


def test_efficientnet_preprocessing_is_a_centre_crop_of_224_after_a_short_side_of_256() -> None:
    img = Image.new("RGB", (512, 256), (0, 0, 0))
    img.paste((255, 255, 255), (128, 0, 384, 256))  # a white centre band exactly the crop's width at scale 1
    pixels = efficientnet_lite(decode_image(encode(img), 1_000_000))
    assert pixels.shape == (224, 224, 3) and pixels.dtype == np.uint8
    assert pixels[:, 16:208].min() >= 250  # the crop sees the band (with room for the bicubic edge)


def test_the_pixel_count_is_checked_from_the_header_before_any_decoding() -> None:
    huge = encode(Image.new("1", (5000, 5000)))  # 25 MP, a few kB as a 1-bit PNG
    with pytest.raises(ImageRejected, match="25000000 pixels"):
        decode_image(huge, 1_000_000)
