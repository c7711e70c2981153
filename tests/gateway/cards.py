"""Shipped cards with one edit, for tests of what a card's YAML may and may not say."""

from __future__ import annotations

import shutil
from collections.abc import Callable
from pathlib import Path
from typing import Any

import yaml

from gateway.cards import load_card
from gateway.decisions.families import family_for
from gateway.runtime import ServedModel

from .conftest import ROOT

REPO = ROOT / "model_repository"


def edited_card(tmp_path: Path, name: str, edit: Callable[[dict[str, Any]], None]) -> Path:
    """A copy of the shipped card `name` (its files, and its built preset heads where it has them, but no model
    weights or tuned configs) whose YAML `edit` changes in place."""
    raw = yaml.safe_load((REPO / name / "card.yaml").read_text())
    edit(raw)
    folder = tmp_path / name
    shutil.copytree(REPO / name, folder, ignore=shutil.ignore_patterns("1", "configs"))
    heads = REPO / name / "1" / "preset-heads.json"
    if heads.is_file():
        (folder / "1").mkdir()
        shutil.copy(heads, folder / "1" / heads.name)
    (folder / "card.yaml").write_text(yaml.safe_dump(raw, allow_unicode=True))
    return folder / "card.yaml"


def family_of(path: Path) -> Any:
    """The decisions family the card at `path` is served by (no Triton: the family is built, not called)."""
    return family_for(ServedModel(load_card(path)))
