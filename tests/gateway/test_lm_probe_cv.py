"""tools/lm_probe_cv.py's logic, offline: the prompts, their yes/no labels, the recast preset lines and the rules.

The LM's states are not read here (the tool's run is recorded in docs/benchmarks.md); what is checked is that each
question becomes the prompts and labels the docstring says, and that the served rules decide over P(yes).
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import numpy as np
import pytest

from gateway.decisions.questions import Question, validate
from sr_common.cards import load_card
from tools import lm_probe_cv as probe

CARD = load_card(Path(probe.CARD))


def asked(raw: dict[str, Any]) -> Question:
    assert CARD.decisions is not None
    q = validate("q", raw, CARD.decisions, CARD.id)
    assert isinstance(q, Question), q
    return q


SET = {"type": "set", "instructions": "Which problems are reported?",
       "labels": [{"key": "billing", "description": "A charge problem"}, {"key": "shipping", "description": "Delivery"},
                  {"key": "account", "description": "Login"}]}


def test_a_set_item_reads_one_prompt_per_label_labelled_yes_exactly_for_the_expected_labels() -> None:
    item = {"id": "x", "state": "Charged twice and the parcel is late.", "question": SET,
            "expected": ["billing", "shipping"]}
    prompts, labels = probe.prompts_of(item, asked(SET))
    assert labels == [1, 1, 0]
    assert [p.count("Is this right: billing: A charge problem?") for p in prompts] == [1, 0, 0]
    assert all(p.startswith("<|im_start|>system\n") and p.endswith("<|im_start|>assistant\n") for p in prompts)
    assert all("- account: Login" in p for p in prompts)  # every prompt lists every option


def test_a_noul_item_reads_one_prompt_that_carries_its_criteria() -> None:
    raw = {"type": "noul", "instructions": "Is it a refund request?",
           "criteria": {"false": "Anything else", "true": "Asks for money back"}}
    prompts, labels = probe.prompts_of({"id": "x", "state": "我要退款", "question": raw, "expected": False},
                                       asked(raw))
    assert labels == [0]
    assert "Question: Is it a refund request?\n(yes: Asks for money back; no: Anything else)" in prompts[0]


def test_an_object_state_is_read_as_the_gateway_renders_the_parts_the_question_names() -> None:
    raw = {"type": "noul", "instructions": "Does the answer hold?", "over": ["answer"]}
    state = {"context": "Opens at 9.", "answer": "It opens at ten."}
    prompts, _ = probe.prompts_of({"id": "x", "state": state, "question": raw, "expected": False}, asked(raw))
    assert "Text: answer:\nIt opens at ten.\n" in prompts[0] and "Opens at 9." not in prompts[0]  # role: block


def test_the_rules_are_the_served_ones_over_each_options_probability_of_yes() -> None:
    noul = asked({"type": "noul", "instructions": "Urgent?"})
    assert probe.decide(noul, np.asarray([0.51])) is True and probe.decide(noul, np.asarray([0.5])) is False
    choice = asked({"type": "choice", "instructions": "Which?", "choices": [{"key": "a"}, {"key": "b"}]})
    assert probe.decide(choice, np.asarray([0.2, 0.3])) == 1  # arg-max, even when no option is above 0.5
    assert probe.decide(asked(SET), np.asarray([0.9, 0.2, 0.6])) == {0, 2}
    score = asked({"type": "score", "instructions": "How hard?", "levels": ["easy", "medium", "hard"]})
    assert probe.decide(score, np.asarray([0.1, 0.1, 0.8])) == 2  # expected level 1.7, rounded
    assert probe.decide(score, np.asarray([0.5, 0.0, 0.5])) == 1  # 1.0: the middle, as the served rule says


@pytest.fixture(scope="module")
def recast() -> list[dict[str, Any]]:
    assert CARD.decisions is not None
    return probe.preset_items(CARD.decisions)


def test_preset_train_lines_are_recast_in_the_cards_words_and_a_choice_keeps_its_answer_and_one_other(
        recast: list[dict[str, Any]]) -> None:
    by_preset: dict[str, list[dict[str, Any]]] = {}
    for item in recast:
        by_preset.setdefault(item["question_id"], []).append(item)
    assert set(by_preset) == {f"preset-{p}" for p in probe.NOUL_PRESETS + probe.CHOICE_PRESETS}
    assert all(len(v) == probe.PRESET_LINES for v in by_preset.values())
    for item in by_preset["preset-domain"] + by_preset["preset-language"]:
        keys = [c["key"] for c in item["question"]["choices"]]
        assert len(keys) == 2 and item["expected"] in keys, item["id"]
    assert CARD.decisions is not None
    assert by_preset["preset-jailbreak"][0]["question"]["instructions"] == \
        CARD.decisions.presets["jailbreak"]["instructions"]
    assert all(i["split"] == "train" for i in recast)
