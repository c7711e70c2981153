"""What a test may expect of a served model's numbers, on whatever host it runs.

A host's tuner picks each model's engine and precision (an AMX host serves MiniLM in OpenVINO bf16, an AVX2 host in
fp32), so a test that compares a model's outputs with a reference takes its tolerance from what is served: the
precision the Triton config names and the card's check for that precision — the rule readiness and `models tune`
already use (`gateway.runtime.served_precision`). No test reads a constant that holds on one kind of host only.

`accepted_choices` lists every engine/precision pair the tuner measured and accepted here, so the precision-sensitive
tests can also run against the paths another kind of host would serve (test_accepted_precisions.py).
"""

from __future__ import annotations

import json
from pathlib import Path

from gateway.cards import Card, discover
from gateway.runtime import served_precision
from sr_backend.engines import served_choice
from sr_common.tuned_config import DEFAULTS, write_generated

FP32 = {**DEFAULTS}


def golden_tolerance(card: Card, choice: dict[str, str] | None = None) -> float:
    """The card's golden tolerance at the precision of `choice` (default: the config Triton serves)."""
    served, _ = served_precision(card, choice)
    assert served.golden is not None, f"{card.id} has no golden answer"
    return served.golden.tolerance


def served(card: Card) -> dict[str, str]:
    """engine, precision, threads, instances and int8 recipe of the config Triton loads for this card's model."""
    return served_choice(card.directory.parent / card.triton_name)


def accepted_choices(card: Card) -> list[dict[str, str]]:
    """Every engine/precision (and int8 recipe) the host's tuner measured and accepted for this model, read from its
    tune record (`1/.cache/tune.json`); a model that was not tuned has only what its config names."""
    record = card.version_dir / ".cache" / "tune.json"
    if not record.is_file():
        return [served(card)]
    candidates = json.loads(record.read_text())["choice"]["candidates"]
    return [{**DEFAULTS, "engine": c["engine"], "precision": c["precision"], "threads": "0", "instances": "1",
             "int8_recipe": c.get("recipe") or DEFAULTS["int8_recipe"]}
            for c in candidates if c["status"] == "measured"]


def same_path(a: dict[str, str], b: dict[str, str]) -> bool:
    """Whether two choices run the same numbers (threads and instance counts do not change them)."""
    keys = ("engine", "precision") + (("int8_recipe",) if a["precision"] == "int8" else ())
    return all(a[k] == b[k] for k in keys)


def label(choice: dict[str, str]) -> str:
    recipe = f"/{choice['int8_recipe']}" if choice["precision"] == "int8" else ""
    return f"{choice['engine']}/{choice['precision']}{recipe}"


def repository_at(target: Path, repo: Path, choices: dict[str, dict[str, str]]) -> list[str]:
    """A model repository at `target` serving each Triton model named in `choices` with its choice instead of this
    host's pick, with every card that rides on it (`triton_model:`) and the models those read through (a decision
    family's tagger), which keep their own choice. Directories are linked entry by entry, never copied or changed;
    each choice is written as the generated config Triton loads. Returns the ids of the cards that run on the models
    in `choices`."""
    from gateway.decisions.families import family_for
    from gateway.runtime import ServedModel

    every = {c.id: c for c in discover(repo, None)}
    riders = [c for c in every.values() if c.triton_name in choices]
    needed = {c.directory.name for c in riders}
    for card in riders:
        if card.decisions is not None:
            needed |= {every[name].directory.name for name in family_for(ServedModel(card, {})).components()}
    for name in sorted(needed):
        (target / name).mkdir(parents=True)
        for entry in (repo / name).iterdir():
            if not (name in choices and entry.name == "configs"):
                (target / name / entry.name).symlink_to(entry, target_is_directory=entry.is_dir())
    for model, choice in choices.items():
        write_generated(target / model, choice, f"test_accepted_precisions: {label(choice)}")
    return [c.id for c in riders]
