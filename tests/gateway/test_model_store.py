"""The model store (sr_build/store.py): a fresh checkout takes a build, a tune record or preset heads from an
identical earlier step on this machine, never a file that is not what that step made, and the store stays within
its cap. Tiny files and a fake recipe; the real steps' use of it is the build's (`sr-gateway models build`)."""

from __future__ import annotations

import json
import os
from pathlib import Path
from typing import Any

import pytest
import yaml

from gateway import cli
from sr_build import build, recipes
from sr_build.onnx_export import ExportReport
from sr_build.store import ModelStore, key_digest

KEY = {"recipe": "x", "files": {"a": "0" * 64}}


@pytest.fixture
def store(tmp_path: Path) -> ModelStore:
    return ModelStore(tmp_path / "store", 1 << 20)


def _checkout(tmp_path: Path, name: str, files: dict[str, bytes]) -> Path:
    folder = tmp_path / name
    for rel, data in files.items():
        (folder / rel).parent.mkdir(parents=True, exist_ok=True)
        (folder / rel).write_bytes(data)
    return folder


def test_a_published_entry_is_restored_into_a_fresh_checkout_byte_for_byte_with_its_mtimes(
        store: ModelStore, tmp_path: Path) -> None:
    first = _checkout(tmp_path, "one", {"model.onnx": b"graph", ".cache/tune.json": b"{}"})
    os.utime(first / "model.onnx", ns=(1_000_000_000, 1_000_000_000))  # int8 stamps record their source's mtime
    assert store.publish("build", KEY, first, ["model.onnx", ".cache/tune.json"])
    fresh = tmp_path / "two"
    assert store.fetch("build", KEY, fresh)
    assert (fresh / "model.onnx").read_bytes() == b"graph" and (fresh / ".cache/tune.json").read_bytes() == b"{}"
    assert (fresh / "model.onnx").stat().st_mtime_ns == 1_000_000_000
    assert sorted(p.name for p in fresh.rglob("*") if p.is_file()) == ["model.onnx", "tune.json"]  # no partials


def test_another_key_or_another_step_is_a_miss_and_writes_nothing(store: ModelStore, tmp_path: Path) -> None:
    first = _checkout(tmp_path, "one", {"model.onnx": b"graph"})
    store.publish("build", KEY, first, ["model.onnx"])
    fresh = tmp_path / "two"
    assert not store.fetch("build", {**KEY, "recipe": "y"}, fresh)
    assert not store.fetch("tune", KEY, fresh)
    assert not fresh.exists()


def test_a_step_that_ran_again_replaces_its_entry_and_a_current_one_leaves_it(
        store: ModelStore, tmp_path: Path) -> None:
    """A forced measurement on the same host has the same key as the one it supersedes: the store takes it."""
    store.publish("tune", KEY, _checkout(tmp_path, "one", {"tune.json": b"torch"}), ["tune.json"])
    store.publish("tune", KEY, _checkout(tmp_path, "two", {"tune.json": b"openvino"}), ["tune.json"])
    assert store.fetch("tune", KEY, tmp_path / "a") and (tmp_path / "a" / "tune.json").read_bytes() == b"torch"
    store.publish("tune", KEY, tmp_path / "two", ["tune.json"], replace=True)
    assert store.fetch("tune", KEY, tmp_path / "b") and (tmp_path / "b" / "tune.json").read_bytes() == b"openvino"
    assert len(store.entries()) == 1 and not list(store.root.glob(".tmp-*"))


def test_an_entry_whose_file_no_longer_matches_its_digest_is_dropped_not_restored(
        store: ModelStore, tmp_path: Path) -> None:
    first = _checkout(tmp_path, "one", {"model.onnx": b"graph", "build.json": b"{}"})
    store.publish("build", KEY, first, ["model.onnx", "build.json"])
    entry = store.root / "build" / key_digest("build", KEY)
    (entry / "files" / "model.onnx").write_bytes(b"grAph")  # same size, other bytes
    fresh = tmp_path / "two"
    assert not store.fetch("build", KEY, fresh)
    assert not entry.exists() and not fresh.exists()


def test_an_entry_recorded_for_another_key_under_this_name_is_not_restored(
        store: ModelStore, tmp_path: Path) -> None:
    first = _checkout(tmp_path, "one", {"model.onnx": b"graph"})
    store.publish("build", KEY, first, ["model.onnx"])
    entry = store.root / "build" / key_digest("build", KEY)
    manifest = json.loads((entry / "manifest.json").read_text())
    (entry / "manifest.json").write_text(json.dumps({**manifest, "key": {"recipe": "other"}}))
    assert not store.fetch("build", KEY, tmp_path / "two")


def test_a_half_written_entry_is_never_seen_and_a_dead_one_is_swept(store: ModelStore, tmp_path: Path) -> None:
    dead = store.root / ".tmp-1-2"
    (dead / "files").mkdir(parents=True)
    (dead / "manifest.json").write_text("{}")
    assert store.entries() == [] and not store.fetch("build", KEY, tmp_path / "two")
    os.utime(dead, (0, 0))
    store.evict()
    assert not dead.exists()


def test_the_least_recently_used_entries_go_first_once_the_store_is_over_its_cap(tmp_path: Path) -> None:
    store = ModelStore(tmp_path / "store", 250)
    keys = [{"n": i} for i in range(3)]
    for i, key in enumerate(keys):
        store.publish("build", key, _checkout(tmp_path, f"c{i}", {"f": bytes(100)}), ["f"])
        os.utime(store.root / "build" / key_digest("build", key), (1000 + i, 1000 + i))
    # the third publish put 300 bytes in a 250-byte store: the oldest went
    assert {p.name for _, _, p in store.entries()} == {key_digest("build", k) for k in keys[1:]}
    assert store.fetch("build", keys[1], tmp_path / "again")  # now the most recently used
    store.publish("build", {"n": 3}, _checkout(tmp_path, "c3", {"f": bytes(100)}), ["f"])
    assert {p.name for _, _, p in store.entries()} == {key_digest("build", k) for k in (keys[1], {"n": 3})}


def test_an_entry_larger_than_the_cap_is_not_kept(tmp_path: Path) -> None:
    store = ModelStore(tmp_path / "store", 10)
    assert not store.publish("build", KEY, _checkout(tmp_path, "one", {"f": bytes(11)}), ["f"])
    assert store.entries() == []


@pytest.mark.parametrize("value", ["off", "", "none"])
def test_the_store_is_off_when_the_setting_says_so(value: str) -> None:
    assert ModelStore.from_setting(value) is None


def test_the_default_store_lives_in_the_per_user_cache(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path))
    store = ModelStore.from_setting(None, 2)
    assert store is not None and store.root == tmp_path / "sr-gateway" / "models" and store.max_bytes == 2 << 30


@pytest.mark.parametrize("value", ["abc", "0", "-1", "inf", "nan"])
def test_a_cap_that_is_not_a_positive_number_is_a_usage_error_naming_the_flag_and_serve_is_unaffected(
        value: str, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]) -> None:
    monkeypatch.setenv("SR_GATEWAY_MODEL_STORE_MAX_GIB", value)
    with pytest.raises(SystemExit) as exited:
        cli.build_parser().parse_args(["models", "build"])
    assert exited.value.code == 2 and "--store-max-gib" in capsys.readouterr().err
    assert cli.build_parser().parse_args(["serve"]).command == "serve"


def test_the_env_twins_set_the_store_and_its_cap(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    monkeypatch.setenv("SR_GATEWAY_MODEL_STORE", str(tmp_path))
    monkeypatch.setenv("SR_GATEWAY_MODEL_STORE_MAX_GIB", "0.5")
    for command in ("build", "tune"):
        args = cli.build_parser().parse_args(["models", command])
        assert (args.store, args.store_max_gib) == (str(tmp_path), 0.5)


def test_a_fresh_checkout_takes_an_identical_build_from_the_store_without_running_its_recipe(
        store: ModelStore, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """build.json records what the recipe wrote; the store holds exactly those files and the stamp. A checkout
    with a stale build.json (another key) is rebuilt from the store too; --force runs the recipe."""
    runs: list[Path] = []

    def recipe(src: Path, out: Path, spec: dict[str, Any]) -> ExportReport:
        runs.append(out)
        (out / "model.onnx").write_bytes(b"graph")
        (out / "tokenizer.json").write_text("{}")
        return ExportReport(max_abs_diff=0.0, checked_rows=1, opset=18)

    monkeypatch.setitem(recipes.RECIPES, "store-test", recipe)
    package = Path(yaml.__file__).parent  # an installed package as the "weights"
    card = {"id": "stored-model", "build": {"recipe": "store-test", "source": {"package": "yaml"},
                                            "files": {"__init__.py": _sha(package / "__init__.py")}}}

    def checkout(name: str) -> Path:
        model = tmp_path / name / "stored-model"
        (model / "1").mkdir(parents=True)
        (model / "card.yaml").write_text(yaml.safe_dump(card))
        (model / "1" / "model.py").write_text("# tracked, not the recipe's\n")
        return model

    first = checkout("one")
    result = build.build_model(first, store=store)
    assert result is not None and result.action == "built" and len(runs) == 1
    assert json.loads((first / "1" / "build.json").read_text())["outputs"] == ["model.onnx", "tokenizer.json"]

    second = checkout("two")
    result = build.build_model(second, store=store)
    assert result is not None and result.action == "stored" and len(runs) == 1
    for name in ("model.onnx", "tokenizer.json", "build.json"):
        assert (second / "1" / name).read_bytes() == (first / "1" / name).read_bytes()
    assert build.build_model(second, store=store).action == "cached"  # type: ignore[union-attr]

    third = checkout("three")
    (third / "1" / "build.json").write_text(json.dumps({"key": {"stale": True}, "onnx_sha256": "x"}))
    assert build.build_model(third, store=store).action == "stored"  # type: ignore[union-attr]
    assert build.build_model(third, store=store, force=True).action == "built"  # type: ignore[union-attr]
    assert len(runs) == 2
    assert build.build_model(checkout("four")).action == "built"  # type: ignore[union-attr]  # no store


def _sha(path: Path) -> str:
    import hashlib

    return hashlib.sha256(path.read_bytes()).hexdigest()


def test_nothing_is_published_from_a_build_json_that_does_not_list_its_outputs(
        store: ModelStore, tmp_path: Path) -> None:
    """A checkout built before build.json listed the recipe's files: which of its files are outputs is unknown."""
    build._publish(store, KEY, tmp_path, {"key": KEY, "onnx_sha256": "x"})
    assert store.entries() == []
