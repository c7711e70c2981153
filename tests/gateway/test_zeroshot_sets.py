"""The zero-shot family's set rule: with `centred: [set]` a label is scored by its cosine relative to the mean of
the question's labels, so a text whose cosines to every label sit higher or lower (E5 moves them together) selects
the same labels; without it the card's absolute bias decides. No model is needed: the rule is a function of the
cosines, checked on the shipped cards' own parameters."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import numpy as np
import pytest

from gateway.decisions.families import FamilyError
from gateway.decisions.questions import Question, validate
from gateway.heads import sigmoid

from .cards import edited_card, family_of

SET = {"type": "set", "instructions": "Which problems does the customer report?",
       "labels": [{"key": "billing", "description": "A payment or charge problem"},
                  {"key": "shipping", "description": "A delivery problem"},
                  {"key": "account", "description": "A login or account problem"}]}


def _family(tmp_path: Path, edit: Any) -> Any:
    """decision-zeroshot with its `decisions.parameters` edited."""
    return family_of(edited_card(tmp_path, "decision-zeroshot", lambda raw: edit(raw["decisions"]["parameters"])))


def _set(family: Any) -> Question:
    q = validate("q", SET, family.spec, family.model.id)
    assert isinstance(q, Question)
    return q


def _centred(params: dict[str, Any], bias: float = 0.005, temperature: float = 0.01) -> None:
    params["centred"] = ["set"]
    params["bias"]["set"], params["temperature"]["set"] = bias, temperature


def test_a_centred_set_selects_the_same_labels_when_every_cosine_moves_together(tmp_path: Path) -> None:
    family = _family(tmp_path, _centred)
    q = _set(family)
    cos = np.asarray([0.84, 0.83, 0.79])
    for shift in (-0.06, 0.0, 0.05):
        p = family.probabilities(q, cos + shift)
        assert np.allclose(p, sigmoid((cos - cos.mean() - 0.005) / 0.01))
        assert [k for k, v in zip(q.keys, p, strict=True) if v >= 0.5] == ["billing", "shipping"]


def test_an_absolute_set_follows_the_common_shift_of_its_cosines(tmp_path: Path) -> None:
    def absolute(params: dict[str, Any]) -> None:
        params.pop("centred", None)
        params["bias"]["set"], params["temperature"]["set"] = 0.82, 0.01

    family = _family(tmp_path, absolute)
    q = _set(family)
    cos = np.asarray([0.84, 0.83, 0.79])
    assert family.params.centred == []
    selected = {shift: [k for k, v in zip(q.keys, family.probabilities(q, cos + shift), strict=True) if v >= 0.5]
                for shift in (-0.06, 0.0, 0.05)}
    assert selected == {-0.06: [], 0.0: ["billing", "shipping"], 0.05: ["billing", "shipping", "account"]}


def test_centring_a_type_other_than_set_fails_the_model_at_load(tmp_path: Path) -> None:
    def choice(params: dict[str, Any]) -> None:
        params["centred"] = ["choice"]

    with pytest.raises(FamilyError, match="centred"):
        _family(tmp_path, choice)
