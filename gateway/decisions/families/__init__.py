"""Decision families by the name a card gives in `decisions.family`. A new family is a module here plus one entry."""

from __future__ import annotations

from ...runtime import ServedModel
from .base import Ask, Context, Family, FamilyError, Phases
from .nli import Nli
from .presets import Presets
from .zeroshot import ZeroShot

FAMILIES: dict[str, type[Family]] = {ZeroShot.name: ZeroShot, Nli.name: Nli, Presets.name: Presets}


def family_for(model: ServedModel) -> Family:
    spec = model.card.decisions
    assert spec is not None
    kind = FAMILIES.get(spec.family)
    if kind is None:
        raise FamilyError(f"unknown decision family {spec.family!r}; known: {sorted(FAMILIES)}")
    return kind(model)


def family(model: ServedModel) -> Family:
    """The model's family, built once (a card error surfaces at load, through the golden check)."""
    if model.family is None:
        model.family = family_for(model)
    return model.family  # type: ignore[no-any-return]


__all__ = ["FAMILIES", "Ask", "Context", "Family", "FamilyError", "Phases", "family", "family_for"]
