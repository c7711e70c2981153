"""`abstain_probability`: answered exactly where a card declares an abstain option (`decisions.abstain`), never
otherwise. The card checks and the family's scoring rule need no model; the answers come from the real gateway and
Triton (decision-zeroshot declares it for choice, decision-multilingual declares none), checked against the
contract and against the same rule computed in process with ONNX Runtime."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import httpx
import numpy as np
import pytest

from gateway.cards import CardError, load_card
from gateway.decisions.answers import Outcome, assemble
from gateway.decisions.families import FamilyError, family_for
from gateway.decisions.families.zeroshot import ZeroShot
from gateway.decisions.questions import Question, validate
from gateway.heads import softmax
from gateway.runtime import ServedModel
from tools.fit_decisions import Embedder
from tools.reference_examples import routing_request

from .cards import REPO, edited_card, family_of
from .contract import check
from .precision import golden_tolerance

ZEROSHOT, PRESETS = "decision-zeroshot", "decision-multilingual"
CHOICE = {"type": "choice", "instructions": "Which domain does this request belong to?",
          "choices": [{"key": "code", "description": "Programming"}, {"key": "math", "description": "Mathematics"}]}
AWAY = {"type": "choice", "instructions": "Which domain does this request belong to?",
        "choices": [{"key": "cooking", "description": "Cooking and recipes"},
                    {"key": "garden", "description": "Gardening and plants"}]}
STATE = "Write a Python function that merges two sorted lists and explain its running time."


def _question(model: ServedModel, raw: dict[str, Any]) -> Question:
    assert model.card.decisions is not None
    q = validate("q", raw, model.card.decisions, model.id)
    assert isinstance(q, Question)
    return q


# -- the card ----------------------------------------------------------------------------------------------------
def test_a_card_declaring_abstain_for_a_type_it_does_not_answer_fails_to_load(tmp_path: Path) -> None:
    def edit(raw: dict[str, Any]) -> None:
        raw["decisions"]["question_types"] = ["choice", "score"]
        raw["decisions"]["abstain"] = {"types": ["choice", "noul"]}

    with pytest.raises(CardError, match=r"decisions.abstain lists \['noul'\]"):
        load_card(edited_card(tmp_path, ZEROSHOT, edit))


def test_an_abstain_declaration_naming_no_type_or_a_type_without_options_is_refused(tmp_path: Path) -> None:
    for types in ([], ["score"]):
        def edit(raw: dict[str, Any], types: list[str] = types) -> None:
            raw["decisions"]["abstain"] = {"types": types}

        with pytest.raises(CardError, match="abstain"):
            load_card(edited_card(tmp_path / str(len(types)), ZEROSHOT, edit))


def test_a_declared_abstain_option_the_family_does_not_score_fails_the_model_at_load(tmp_path: Path) -> None:
    def edit(raw: dict[str, Any]) -> None:
        del raw["decisions"]["parameters"]["abstain"]

    with pytest.raises(FamilyError, match=r"lists \['choice'\]; family zeroshot scores an abstain option for no"):
        family_of(edited_card(tmp_path, ZEROSHOT, edit))


def test_an_abstain_level_the_card_does_not_declare_fails_the_model_at_load(tmp_path: Path) -> None:
    def edit(raw: dict[str, Any]) -> None:
        del raw["decisions"]["abstain"]

    with pytest.raises(FamilyError, match="declares none"):
        family_of(edited_card(tmp_path, ZEROSHOT, edit))


def test_the_zero_shot_family_has_no_abstain_option_for_noul(tmp_path: Path) -> None:
    def edit(raw: dict[str, Any]) -> None:
        raw["decisions"]["abstain"]["types"] = ["choice", "noul"]

    with pytest.raises(FamilyError, match=r"lists \['noul'\]"):
        family_of(edited_card(tmp_path, ZEROSHOT, edit))


def test_a_presets_card_cannot_promise_abstain_for_a_type_its_trained_heads_answer(tmp_path: Path) -> None:
    if not (REPO / PRESETS / "1" / "preset-heads.json").is_file():
        pytest.fail("decision-multilingual's preset heads are not built (sr-gateway models build)")

    def edit(raw: dict[str, Any]) -> None:
        raw["decisions"]["abstain"] = {"types": ["choice"]}
        raw["decisions"]["parameters"]["abstain"] = {"cosine": 0.9}

    with pytest.raises(FamilyError, match=r"trained preset heads \['domain', 'language'\] have no abstain option"):
        family_of(edited_card(tmp_path, PRESETS, edit))


# -- the rule and the answer -------------------------------------------------------------------------------------
def test_abstain_is_one_more_option_at_the_cards_cosine_and_leaves_the_choice_probabilities_unchanged() -> None:
    model = ServedModel(load_card(REPO / ZEROSHOT / "card.yaml"))
    fam = family_for(model)
    assert isinstance(fam, ZeroShot)
    q = _question(model, CHOICE)
    level, temperature = fam.params.abstain.cosine, fam.params.temperature["choice"]
    cos = np.asarray([level + 0.1, level - 0.3])
    together = softmax(np.append(cos, level) / temperature)
    got = fam.abstain(q, cos)
    assert got is not None and abs(got - together[-1]) < 1e-12
    assert np.allclose(fam.probabilities(q, cos), together[:-1] / together[:-1].sum())
    assert fam.abstain(q, cos - 0.5) > 0.99 > 0.01 > fam.abstain(q, cos + 0.5)  # type: ignore[operator]
    assert fam.abstain(_question(model, {"type": "noul", "instructions": "Is it code?"}), cos[:1]) is None


def test_an_answer_carries_abstain_probability_only_when_the_family_gave_one() -> None:
    model = ServedModel(load_card(REPO / ZEROSHOT / "card.yaml"))
    q = _question(model, CHOICE)
    p = np.asarray([0.75, 0.25])
    with_it, _ = assemble(q, Outcome(p, abstain=0.1234567), {}, None)
    without, _ = assemble(q, Outcome(p), {}, None)
    assert with_it["q"]["abstain_probability"] == 0.123457 and "abstain_probability" not in without["q"]
    for answers in (with_it, without):
        check("/v1/decisions", "post", 200, {"model": model.id, "answers": answers,
                                             "usage": {"input_tokens": 1, "output_tokens": 0}})


# -- served ------------------------------------------------------------------------------------------------------
def post(client: httpx.Client, body: dict[str, Any]) -> dict[str, Any]:
    r = client.post("/v1/decisions", json=body)
    assert r.status_code == 200, r.text
    check("/v1/decisions", "post", r.status_code, r.json(), r.headers)
    return r.json()  # type: ignore[no-any-return]


def test_choice_answers_of_a_card_declaring_abstain_carry_it_and_other_types_never_do(http: httpx.Client) -> None:
    spec = routing_request(ZEROSHOT)
    r = post(http, {**spec, "questions": {**spec["questions"], "topics": {
        "type": "set", "instructions": "Which topics?", "labels": [{"key": "code", "description": "Programming"}]}}})
    answers = r["answers"]
    assert 0 <= answers["domain"]["abstain_probability"] <= 1
    assert [k for k, a in answers.items() if "abstain_probability" in a] == ["domain"]


def test_the_served_abstain_probability_is_the_cards_rule_over_the_served_encoders_cosines(
        http: httpx.Client) -> None:
    card = load_card(REPO / ZEROSHOT / "card.yaml")
    model = ServedModel(card)
    fam = family_for(model)
    assert isinstance(fam, ZeroShot)
    embed = Embedder(model)
    for raw in (CHOICE, AWAY):
        texts = fam.option_texts(_question(model, raw))
        embed([STATE, *texts])
        cos = np.asarray([embed.cos(STATE, t) for t in texts])
        want = float(softmax(np.append(cos, fam.params.abstain.cosine) / fam.params.temperature["choice"])[-1])
        got = post(http, {"model": ZEROSHOT, "state": STATE, "questions": {"q": raw}})["answers"]["q"]
        assert abs(got["abstain_probability"] - want) <= golden_tolerance(card), (raw["choices"], got, want)


def test_a_choice_whose_options_all_miss_the_state_abstains_more_than_one_with_a_fitting_option(
        http: httpx.Client) -> None:
    r = post(http, {"model": ZEROSHOT, "state": STATE, "questions": {"fits": CHOICE, "misses": AWAY}})["answers"]
    assert r["fits"]["choice"] == "code"
    assert r["fits"]["abstain_probability"] < 0.5 < r["misses"]["abstain_probability"], r


def test_a_card_that_declares_no_abstain_option_never_answers_abstain_probability(http: httpx.Client) -> None:
    domain = {"type": "choice", "preset": "domain", "instructions": "Which domain does this request belong to?"}
    r = post(http, {"model": PRESETS, "state": STATE, "questions": {"zero_shot": CHOICE, "trained": domain,
                                                                    "noul": {"type": "noul", "instructions": "Code?"}}})
    assert all("error" not in a and "abstain_probability" not in a for a in r["answers"].values()), r
