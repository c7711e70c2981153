"""`sr-gateway models tune`: pick each model's engine, precision and instances × threads on this host, by measurement.

A precision beyond fp32 is a candidate only when the card allows it, and is accepted only when its outputs on the
verification texts pass the card's check against the fp32 ONNX Runtime reference. Among the passing candidates
the one with the smallest worst-case loss against the best latency (one request) and the best throughput (a
batch) at the card's typical shape wins, ONNX Runtime fp32 keeping its place within a 5% margin; the instance
layout (instances × threads over this host's cores) is chosen by the same rule. The choice is written into a
generated Triton config, `<model>/configs/tuned.pbtxt` (the tracked config.pbtxt with the parameters `engine`,
`precision`, `intra_op_threads` and `instance_group.count` set; git-ignored; see sr_common/tuned_config.py),
which tritonserver loads through `--model-config-name`, and cached in `<version>/.cache/tune.json`, keyed by the
host's CPU model and ISA flags, the graph's sha256, the engine versions and the card's allowances, so `make test`
reruns nothing on the same host; with a model store (sr_build/store.py), a fresh checkout on that host takes the
record, with the quantised copies of the int8 pairs it accepted, from there.

This module decides and records; the measuring is by model kind (tune_text, tune_image) on what tune_samples
provides, with the timing and choosing rules of tune_measure.
"""

from __future__ import annotations

import hashlib
import json
import sys
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

import numpy as np

from sr_backend.engines.torch_engine import program_path
from sr_common.cards import Card, discover
from sr_common.config_text import ConfigError, parse
from sr_common.tuned_config import write_generated

from . import tune_image, tune_text
from .sources import sha256_file
from .store import ModelStore
from .tune_measure import Candidate, TuneError, choose_layout, label, load_engines
from .tune_samples import calibration_texts, verification_pictures

__all__ = ["Choice", "TuneError", "read_config_choice", "tunable", "tune_model", "tune_repository", "with_riders"]

TUNE_FORMAT = 9  # 6: OpenVINO fp32/bf16 exact; 7: OpenVINO threads unpinned; 8: OpenVINO int8 (NNCF); 9: torch


@dataclass
class Choice:
    model: str
    engine: str
    precision: str
    instances: int
    threads: int
    host: dict[str, Any]
    candidates: list[dict[str, Any]]
    layouts: list[dict[str, Any]]
    source: str  # "measured" | "override" | "cached"
    int8_recipe: str = "dynamic"  # int8 only: the quantisation recipe that won (ort_engine.RECIPES)


def _versions() -> dict[str, str]:
    from importlib.metadata import PackageNotFoundError, version

    out = {}
    for dist in ("onnxruntime", "openvino", "nncf", "torch"):
        try:
            out[dist] = version(dist)
        except PackageNotFoundError:
            out[dist] = "missing"
    return out


def _key(card: Card, onnx: Path, host: Any, engine: str | None, precision: str | None) -> dict[str, Any]:
    from sr_backend.engines.ort_engine import RECIPES

    calibration = hashlib.sha256(json.dumps(calibration_texts(card), ensure_ascii=False).encode()).hexdigest()
    return {"format": TUNE_FORMAT, "host": host.key, "int8": RECIPES, "calibration": calibration,
            "onnx_sha256": sha256_file(onnx),
            "pt2_sha256": sha256_file(program) if (program := program_path(onnx)).is_file() else None,
            "versions": _versions(),
            "engines": list(card.engines), "override": [engine, precision],
            "precisions": {k: v.model_dump() for k, v in card.precisions.items()},
            **({"max_instances": card.max_instances} if card.max_instances is not None else {})}


def tune_model(card: Card, *, engine: str | None = None, precision: str | None = None, force: bool = False,
               log: Any = None, store: ModelStore | None = None) -> Choice:
    """Measure (or read from the cache) this model's engine choice on this host and write it into its config."""
    from sr_backend.engines.host import detect

    say = log or (lambda msg: print(msg, file=sys.stderr))
    host = detect()
    onnx = card.version_dir / "model.onnx"
    config = card.directory / "config.pbtxt"
    if not onnx.is_file() or not config.is_file():
        raise TuneError(f"{card.id}: {onnx} or {config} is missing: run `sr-gateway models build` first")
    if engine is not None and engine not in card.engines:
        raise TuneError(f"{card.id}: engine {engine!r} is not one the card allows ({card.engines})")
    if precision is not None and precision != "fp32" and precision not in card.precisions:
        raise TuneError(f"{card.id}: precision {precision!r} is not allowed by its card "
                        f"(allowed: fp32{''.join(', ' + p for p in card.precisions)})")
    key = _key(card, onnx, host, engine, precision)
    pictures: list[np.ndarray] = []
    if card.image is not None:
        pictures = verification_pictures(card)
        key["image"] = {"kind": tune_image.image_kind(card), "int8_ops": list(tune_image.IMAGE_INT8_OPS),
                        "pictures": tune_image.pictures_digest(pictures), "batch": tune_image.IMAGE_BATCH}
    cache = card.version_dir / ".cache" / "tune.json"

    def cached() -> Choice | None:
        if force or not cache.is_file():
            return None
        recorded = json.loads(cache.read_text())
        return Choice(**{**recorded["choice"], "source": "cached"}) if recorded.get("key") == key else None

    stored = {"model": card.id, **key}  # the store's key: the choice names its model
    if (choice := cached()) is None and not force and store is not None and store.fetch("tune", stored,
                                                                                         card.version_dir):
        choice = cached()
    if choice is not None:
        write_config(card.directory, choice)
        say(f"{card.id}: {label(choice.engine, choice.precision, choice.int8_recipe)}, {choice.instances} "
            f"instance(s) x {choice.threads} thread(s) (cached for this host: {cache})")
    else:
        if card.image is not None:
            measured = tune_image.measure_image(card, pictures, engine, precision, host.cores, say)
        else:
            measured = tune_text.measure_text(card, engine, precision, host.cores, say)
        choice = _finish(card, *measured, host, key, cache, engine, precision, say)
    if store is not None:
        store.publish("tune", stored, card.version_dir, [*_int8_files(onnx, choice), ".cache/tune.json"],
                      replace=choice.source != "cached")
    return choice


def _int8_files(onnx: Path, choice: Choice) -> list[str]:
    """The quantised copies (and their recipe stamps) of every int8 candidate that passed its check: the engine
    never makes one at load, and any accepted pair may be served (`test_accepted_precisions` serves them all)."""
    from sr_backend.engines import int8_path

    recipes = sorted({c["recipe"] or "dynamic" for c in choice.candidates
                      if c["precision"] == "int8" and c["status"] == "measured"}
                     | ({choice.int8_recipe} if choice.precision == "int8" else set()))
    names = []
    for recipe in recipes:
        path = int8_path(onnx, recipe)
        names += [path.name, *([path.with_suffix(".bin").name] if path.suffix == ".xml" else []), path.name + ".recipe"]
    return names


def _finish(card: Card, best: Candidate, candidates: list[Candidate], layouts: list[dict[str, Any]], host: Any,
            key: dict[str, Any], cache: Path, engine: str | None, precision: str | None, say: Any) -> Choice:
    """The layout chosen among the measured ones, the choice recorded in the cache and the generated config."""
    layout = choose_layout(layouts)
    choice = Choice(card.id, best.engine, best.precision, layout["instances"], layout["threads"],
                    {"model": host.model, "cores": host.cores, "flags": list(host.flags), "key": host.key},
                    [asdict(c) for c in candidates], layouts, "override" if (engine or precision) else "measured",
                    best.recipe or "dynamic")
    say(f"{card.id}: chose {label(choice.engine, choice.precision, best.recipe)}, {choice.instances} instance(s) x "
        f"{choice.threads} thread(s) on {host.model} ({host.cores} cores, {' '.join(host.flags)}); layouts {layouts}")
    cache.parent.mkdir(exist_ok=True)
    cache.write_text(json.dumps({"key": key, "choice": asdict(choice)}, indent=2))
    write_config(card.directory, choice)
    return choice


def write_config(model_dir: Path, choice: Choice) -> Path:
    """This host's choice as a generated config (configs/<name>.pbtxt, git-ignored) beside the tracked
    config.pbtxt, which keeps the author's defaults; tritonserver loads it through --model-config-name."""
    host = choice.host
    note = (f"{choice.source} on {host.get('model', '?')} ({host.get('cores', '?')} cores, "
            f"{' '.join(host.get('flags', [])) or 'no listed ISA flags'})")
    try:
        return write_generated(model_dir, {"engine": choice.engine, "precision": choice.precision,
                                           "threads": str(choice.threads), "instances": str(choice.instances),
                                           "int8_recipe": choice.int8_recipe}, note)
    except ConfigError as exc:
        raise TuneError(f"{model_dir / 'config.pbtxt'}: {exc}") from exc


def read_config_choice(model_dir: Path) -> dict[str, str]:
    """The engine parameters of the config Triton will load for this model (generated, else config.pbtxt)."""
    return load_engines().served_choice(model_dir)


def tunable(card: Card) -> bool:
    """CPU models with a graph of their own served by the shared backends: text models by the ragged runner
    (sr_backend.triton_model), image models (a card `image` section) by sr_backend.image_model."""
    backend = "sr_backend.image_model" if card.image is not None else "sr_backend.triton_model"
    return (card.triton_model in (None, card.directory.name)
            and ("text" in card.modalities or card.image is not None)
            and (card.version_dir / "model.onnx").is_file() and (card.directory / "config.pbtxt").is_file()
            and backend in _model_py(card)
            and _on_cpu(card.directory / "config.pbtxt"))  # a GPU variant is gpu.py's


def _on_cpu(config: Path) -> bool:
    """The config's instance groups are CPU ones (a malformed config is a TuneError naming it, not skipped)."""
    try:
        groups = parse(config.read_text()).instance_group
    except ConfigError as exc:
        raise TuneError(f"{config}: {exc}") from exc
    return any(g.kind == g.KIND_CPU for g in groups)


def _model_py(card: Card) -> str:
    path = card.version_dir / "model.py"
    return path.read_text() if path.is_file() else ""


def tune_repository(repo: Path, *, only: list[str] | None = None, engine: str | None = None,
                    precision: str | None = None, force: bool = False,
                    store: ModelStore | None = None) -> list[Choice]:
    choices = []
    every = discover(repo, None)
    for card in discover(repo, only):
        if tunable(card):
            card = with_riders(card, [c for c in every if c.triton_name == card.directory.name and c.id != card.id])
            choices.append(tune_model(card, engine=engine, precision=precision, force=force, store=store))
    return choices


def with_riders(card: Card, riders: list[Card]) -> Card:
    """The card as tuned: cards that run on this model's Triton graph (`triton_model:`, e.g. the zero-shot
    families on the embedder) are served at whatever precision it is tuned to, so only the precisions every one
    of them allows are candidates; each rider's readiness golden, at its own tolerance for that precision, is the
    check of its answers when it is served."""
    allowed = {p: spec for p, spec in card.precisions.items() if all(p in r.precisions for r in riders)}
    return card if allowed == card.precisions else card.model_copy(update={"precisions": allowed})
