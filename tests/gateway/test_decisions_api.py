"""POST /v1/decisions through the real gateway and Triton: the zero-shot family (MiniLM + the PII tagger) in the
session gateway, the NLI adapter on a random-weight fixture in the fixtures' gateway. Every response is checked
against the contract."""

from __future__ import annotations

from typing import Any

import httpx
import numpy as np
import onnxruntime as ort
import pytest
from tokenizers import Tokenizer

from gateway.cards import load_card
from gateway.text import TextEncoder
from tools.reference_examples import check_all, routing_request

from .conftest import NLI, ROOT, Served
from .contract import check, timings
from .precision import golden_tolerance

MODEL = "decision-zeroshot"
# How far two runs of one question may differ when its rows are padded with other rows (numerics approximate):
# the card's golden tolerance at the precision this host serves, the rule readiness uses for its second run.
SAME = golden_tolerance(load_card(ROOT / "model_repository" / MODEL / "card.yaml"))
SPEC_STATE: str = routing_request(MODEL)["state"]  # the spec's first example (and the card's golden request)
SPEC_QUESTIONS: dict[str, Any] = routing_request(MODEL)["questions"]


def post(client: httpx.Client, body: Any, *, model: str | None = MODEL, status: int = 200) -> dict[str, Any]:
    if isinstance(body, dict) and model is not None and "model" not in body:
        body = {"model": model, **body}
    r = client.post("/v1/decisions", json=body)
    assert r.status_code == status, r.text
    check("/v1/decisions", "post", r.status_code, r.json(), r.headers)
    timings(r)
    return r.json()  # type: ignore[no-any-return]


def ask(client: httpx.Client, question: dict[str, Any], state: Any = "Is this ok?") -> dict[str, Any]:
    """The answer to one question named q."""
    return post(client, {"state": state, "questions": {"q": question, "ok": {"type": "noul", "instructions": "Ok?"}}}
                )["answers"]["q"]  # type: ignore[no-any-return]


# -- the spec's examples ----------------------------------------------------------------------------------------
def test_the_spec_examples_answer_as_documented_including_the_states_batch(gateway_url: str) -> None:
    checks = check_all(gateway_url, MODEL)
    failed = [c for c in checks if not c.ok]
    assert checks and not failed, failed


def test_choice_noul_and_score_answers_have_their_documented_fields_in_question_order(http: httpx.Client) -> None:
    r = post(http, {"state": SPEC_STATE, "questions": SPEC_QUESTIONS})
    assert list(r["answers"]) == ["domain", "reasoning", "difficulty"]
    domain, reasoning, difficulty = r["answers"].values()
    assert domain["choice"] == "code" and list(domain["probabilities"]) == ["code", "math", "other"]
    assert abs(sum(domain["probabilities"].values()) - 1) < 1e-5 and 0 <= domain["confidence"] <= 1
    assert 0 <= reasoning["noul"] <= 1 and set(reasoning) == {"type", "noul"}
    assert difficulty["legend"] == {"0": "Trivial", "1": "Moderate", "2": "Hard"}
    expected = sum(int(k) * p for k, p in difficulty["probabilities"].items())
    assert abs(difficulty["score"] - expected) < 1e-4
    assert r["usage"]["input_tokens"] > 0 and r["usage"]["output_tokens"] == 0
    assert "meta" not in r


def test_return_meta_adds_meta_and_leaves_the_answers_unchanged(http: httpx.Client) -> None:
    plain = post(http, {"state": SPEC_STATE, "questions": SPEC_QUESTIONS})
    meta = post(http, {"state": SPEC_STATE, "questions": SPEC_QUESTIONS, "options": {"return_meta": True}})
    assert meta["meta"]["model_id"] == MODEL and meta["meta"]["numerics"] == "approximate"
    for qid, answer in plain["answers"].items():
        for key, value in answer.items():
            if isinstance(value, float):
                assert abs(meta["answers"][qid][key] - value) <= SAME
            elif key != "probabilities":
                assert meta["answers"][qid][key] == value


def test_a_states_entry_answers_exactly_as_the_same_request_sent_alone(http: httpx.Client) -> None:
    alone = post(http, {"state": SPEC_STATE, "questions": SPEC_QUESTIONS})
    batch = post(http, {"states": {"a": {"state": SPEC_STATE, "questions": SPEC_QUESTIONS},
                                   "b": {"state": "Hello!", "questions": {"x": SPEC_QUESTIONS["reasoning"]}}}})
    assert "answers" not in batch and list(batch["states"]) == ["a", "b"]
    entry = batch["states"]["a"]
    assert entry["model"] == MODEL and entry["usage"] == alone["usage"]
    for qid, answer in alone["answers"].items():
        assert entry["answers"][qid].keys() == answer.keys()
        assert abs(entry["answers"][qid].get("noul", 0) - answer.get("noul", 0)) <= SAME
    assert batch["usage"]["input_tokens"] == sum(s["usage"]["input_tokens"] for s in batch["states"].values())


# -- validation: a bad question fails alone, in the reference's words ---------------------------------------------
VALID = [
    {"type": "choice", "instructions": "i", "choices": [{"key": "a"}, {"key": "b", "description": None}]},
    {"type": "choice", "instructions": "i", "choices": [{"key": f"k{i}"} for i in range(255)]},
    {"type": "choice", "instructions": {"ask": ["structured"]}, "criteria": {"a": "x", "b": None}},
    {"type": "noul", "instructions": "i"},
    {"type": "noul", "instructions": "i", "criteria": {"true": "yes"}},
    {"type": "noul", "instructions": "i", "criteria": {"false": "no", "true": "yes"}},
    {"type": "noul", "instructions": "i", "criteria": {"false": None, "true": None}},
    {"type": "noul", "instructions": "i", "choices": [{"key": "true", "description": "yes"}]},
    {"type": "score", "instructions": "i", "levels": ["a", "b"]},
    {"type": "score", "instructions": "i", "criteria": [str(i) for i in range(10)]},
    {"type": "set", "instructions": "i", "labels": [{"key": "only"}]},
    {"type": "set", "instructions": "i", "criteria": {f"l{i}": None for i in range(255)}, "threshold": 1},
    {"type": "span", "instructions": "i", "labels": [{"key": "EMAIL_ADDRESS"}], "threshold": 0},
    {"type": "noul", "instructions": "i", "require_full_input": True},
    {"type": "noul", "instructions": "i", "overflow": "truncate"},
]
INVALID = [
    ({"type": "choice", "instructions": "i", "choices": [{"key": "a"}]}, "choices must name 2 to 255 options"),
    ({"type": "choice", "instructions": "i", "criteria": {f"k{i}": None for i in range(256)}},
     "criteria must name 2 to 255 options"),
    ({"type": "choice", "instructions": "i", "choices": [{"key": "a"}, {"key": "a"}]}, "name 'a' twice"),
    ({"type": "choice", "instructions": "i", "criteria": {"a": None, " ": None}}, "keys must not be blank"),
    ({"type": "choice", "instructions": "i", "criteria": {"a": "", "b": None}}, "must not be blank"),
    ({"type": "choice", "instructions": "i", "criteria": {"a": None, "b": None}, "choices": [{"key": "a"}]},
     "use criteria or choices, not both"),
    ({"type": "choice", "instructions": "i", "levels": ["a", "b"]}, "choice questions do not take ['levels']"),
    ({"type": "score", "instructions": "i", "levels": ["a"]}, "levels must list 2 to 10 levels"),
    ({"type": "score", "instructions": "i", "levels": [str(i) for i in range(11)]}, "levels must list 2 to 10"),
    ({"type": "score", "instructions": "i", "levels": ["a", None]}, "level 1 must not be null"),
    ({"type": "noul", "instructions": "i", "criteria": {"maybe": "x"}}, "take only the keys false and true"),
    ({"type": "noul", "instructions": "i", "colour": "red"}, "noul questions do not take ['colour']"),
    ({"type": "noul", "instructions": " "}, "instructions must not be blank"),
    ({"type": "noul"}, "instructions are required"),
    ({"instructions": "i"}, "type must be one of"),
    ({"type": "set", "instructions": "i", "labels": []}, "labels must name 1 to 255 labels"),
    ({"type": "set", "instructions": "i", "criteria": {f"l{i}": None for i in range(256)}}, "1 to 255 labels"),
    ({"type": "set", "instructions": "i", "labels": [{"key": "a"}], "threshold": 1.5}, "threshold must be"),
    ({"type": "noul", "instructions": "i", "threshold": 0.5}, "noul questions do not take ['threshold']"),
    ({"type": "noul", "instructions": "i", "require_full_input": "true"}, "require_full_input must be true or false"),
    ({"type": "noul", "instructions": "i", "require_full_input": 1}, "require_full_input must be true or false"),
    ({"type": "noul", "instructions": "i", "require_full_input": True, "overflow": "truncate"},
     "cannot be used with overflow 'truncate'"),
    ({"type": "noul", "instructions": "i", "overflow": "reject"}, "overflow must be 'window' or 'truncate'"),
    ({"type": "span", "instructions": "i", "labels": [{"key": "COLOUR", "description": "a colour"}]},
     "label 'COLOUR' names no entity type"),
    ({"type": "noul", "preset": "nope"}, "has no preset 'nope'"),
    ({"type": "choice", "preset": "relevance"}, "preset 'relevance' is a noul question"),
    ({"type": "noul", "instructions": "i", "over": "request"}, "over names parts of an object state"),
]


@pytest.mark.parametrize("question", VALID, ids=lambda q: f"{q['type']}-{len(str(q))}")
def test_questions_at_every_edge_of_the_spec_ranges_are_answered(http: httpx.Client, question: dict[str, Any]
                                                                 ) -> None:
    r = post(http, {"state": "Reach me at jane@example.com, it is urgent.", "questions": {"q": question}})
    answers = r["answers"]
    assert all("error" not in a for a in answers.values()), answers
    if question["type"] == "set":
        assert len([k for k in answers if k.startswith("q.")]) == len(r["sets"]["q"]["probabilities"])
    if question.get("require_full_input"):
        assert answers["q"]["input_coverage"] == "complete"


@pytest.mark.parametrize(("question", "message"), INVALID, ids=[m[:40] for _, m in INVALID])
def test_a_question_past_an_edge_fails_in_place_naming_the_field_and_its_sibling_is_answered(
        http: httpx.Client, question: dict[str, Any], message: str) -> None:
    r = post(http, {"state": "Is this ok?", "questions": {"q": question,
                                                          "ok": {"type": "noul", "instructions": "Ok?"}}})
    bad = r["answers"]["q"]
    assert bad["error"] == "invalid_question" and message in bad["message"], bad
    assert set(bad) == {"type", "error", "message"}
    assert 0 <= r["answers"]["ok"]["noul"] <= 1


def test_a_set_label_whose_answer_id_is_another_questions_id_is_invalid(http: httpx.Client) -> None:
    r = post(http, {"state": "x", "questions": {
        "s": {"type": "set", "instructions": "i", "labels": [{"key": "a"}, {"key": "b"}]},
        "s.b": {"type": "noul", "instructions": "i"}}})
    assert r["answers"]["s"]["error"] == "invalid_question" and "s.b" in r["answers"]["s"]["message"]
    assert "noul" in r["answers"]["s.b"]


def test_a_request_with_no_valid_question_fails_naming_every_reason(http: httpx.Client) -> None:
    r = post(http, {"state": "x", "questions": {"bad": {"type": "noul", "instructions": "i", "colour": "red"},
                                                "worse": {"type": "maybe"}}}, status=400)
    assert r["error"]["code"] == "invalid_request"
    assert "bad: noul questions do not take ['colour']" in r["error"]["message"]
    assert "worse: type must be one of" in r["error"]["message"]


@pytest.mark.parametrize(("body", "message"), [
    ({"questions": {"q": {"type": "noul", "instructions": "i"}}}, "state is required"),
    ({"state": "x"}, "questions is required"),
    ({"state": 3, "questions": {"q": {"type": "noul", "instructions": "i"}}}, "state must be"),
    ({"state": "", "questions": {"q": {"type": "noul", "instructions": "i"}}}, "must not be an empty string"),
    ({"state": {}, "questions": {"q": {"type": "noul", "instructions": "i"}}}, "at least one part"),
    ({"state": "x", "questions": {}}, "at least one question"),
    ({"state": "x", "questions": {" ": {"type": "noul", "instructions": "i"}}}, "blank question id"),
    ({"state": "x", "questions": {"q": {"type": "noul", "instructions": "i"}}, "extra": 1}, "extra"),
    ({"state": "x", "questions": {"q": {"type": "noul", "instructions": "i"}}, "options": {"stream": True}},
     "stream"),
    ({"state": "x", "questions": {"q": {"type": "noul", "instructions": "i"}}, "options": {"deadline_ms": -1}},
     "deadline_ms"),
    ({"state": "x", "questions": {"q": {"type": "noul", "instructions": "i"}},
      "states": {"a": {"state": "x", "questions": {"q": {"type": "noul", "instructions": "i"}}}}}, "one form"),
    ({"states": {}}, "at least one state"),
    ({"states": []}, "states must be an object"),
    ({"states": {"a": {"state": "x"}}}, "states.a.questions is required"),
    ({"states": {"a": {"state": "x", "questions": {"q": {"type": "noul", "instructions": "i"}}, "model": MODEL}}},
     "does not take ['model']"),
    ({"states": {" ": {"state": "x", "questions": {"q": {"type": "noul", "instructions": "i"}}}}}, "blank"),
    ({"states": {"a": {"state": "", "questions": {"q": {"type": "noul", "instructions": "i"}}}}}, "empty string"),
    ({"state": {"a": "x"}, "roles": {"b": "user"}, "questions": {"q": {"type": "noul", "instructions": "i"}}},
     "roles names parts the state does not have"),
    ({"state": "x", "roles": {"a": "user"}, "questions": {"q": {"type": "noul", "instructions": "i"}}},
     "roles names parts of an object state"),
    ({"state": "x", "images": ["data:image/png;base64,AAAA"], "questions": {"q": {"type": "noul",
                                                                                "instructions": "i"}}},
     "images[0]"),
])
def test_a_malformed_request_fails_as_a_whole_with_400(http: httpx.Client, body: dict[str, Any], message: str
                                                        ) -> None:
    r = post(http, body, status=400)
    assert r["error"]["code"] == "invalid_request" and message in r["error"]["message"], r


def test_an_unknown_model_is_404_listing_the_served_models(http: httpx.Client) -> None:
    r = post(http, {"state": "x", "questions": {"q": {"type": "noul", "instructions": "i"}}}, model="nope",
             status=404)
    assert MODEL in r["error"]["message"]


def test_a_model_that_does_not_serve_decisions_is_422(http: httpx.Client) -> None:
    r = post(http, {"state": "x", "questions": {"q": {"type": "noul", "instructions": "i"}}},
             model="all-minilm-l6-v2", status=422)
    assert r["error"]["code"] == "unsupported_surface"


def test_a_rejected_states_entry_fails_its_questions_and_the_others_answer(http: httpx.Client) -> None:
    q = {"q": {"type": "noul", "instructions": "i"}}
    r = post(http, {"states": {"bad": {"state": "x", "images": ["data:image/png;base64,AAAA"], "questions": q},
                               "good": {"state": "y", "questions": q}}})
    assert r["states"]["bad"]["answers"]["q"]["error"] == "invalid_input"
    assert "images" in r["states"]["bad"]["answers"]["q"]["message"]
    assert "noul" in r["states"]["good"]["answers"]["q"]


# -- roles, parts and over ----------------------------------------------------------------------------------------
def test_roles_decide_how_parts_are_read_and_over_selects_them(http: httpx.Client) -> None:
    state = {"request": "How do I bake bread?", "candidate": "Mix flour, water and yeast, then bake."}
    q = {"type": "choice", "instructions": "Topic?", "criteria": {"cooking": "Baking and cooking",
                                                                   "finance": "Money and banks"}}
    with_keys = post(http, {"state": state, "questions": {"q": q}})["answers"]["q"]
    no_roles = post(http, {"state": state, "roles": None, "questions": {"q": q}})["answers"]["q"]
    assert with_keys["choice"] == no_roles["choice"] == "cooking"
    assert with_keys["probabilities"] != no_roles["probabilities"]  # "request:\n…" blocks vs bare values
    only = post(http, {"state": state, "questions": {"q": {**q, "over": "candidate"}}})["answers"]["q"]
    alone = post(http, {"state": state["candidate"], "questions": {"q": q}})["answers"]["q"]
    assert abs(only["probabilities"]["cooking"] - alone["probabilities"]["cooking"]) <= SAME
    bad = ask(http, {**q, "over": ["nope"]}, state)
    assert bad["error"] == "invalid_question" and "unknown part" in bad["message"]


def test_span_offsets_are_code_points_of_the_one_part_read(http: httpx.Client) -> None:
    state = {"request": "Ünïcödé 😀 text first", "answer": "Mail me: jane.doe@example.com 😀 thanks"}
    r = post(http, {"state": state, "questions": {
        "c": {"type": "span", "instructions": "Contacts?", "labels": [{"key": "EMAIL_ADDRESS"}]}}})
    [span] = r["spans"]["c"]
    assert state["answer"][span["start"]:span["end"]] == span["text"] == "jane.doe@example.com"
    assert r["answers"]["c"]["noul"] > 0.5 and r["thresholds"]["c"] == 0.5


def test_the_pii_preset_finds_names_and_email_addresses(http: httpx.Client) -> None:
    text = "My name is John Smith. Write to jane.doe@example.com."
    r = post(http, {"state": text, "questions": {"p": {"type": "span", "preset": "pii"}}})
    labels = {s["label"]: s["text"] for s in r["spans"]["p"]}
    assert labels.get("PERSON") == "John Smith" and labels.get("EMAIL_ADDRESS") == "jane.doe@example.com"


def test_a_label_is_matched_to_the_tagger_by_its_description_when_its_key_says_nothing(http: httpx.Client) -> None:
    r = post(http, {"state": "Write to jane.doe@example.com today.", "questions": {
        "c": {"type": "span", "instructions": "i", "criteria": {"contact": "An email address"}}}})
    assert [s["label"] for s in r["spans"]["c"]] == ["contact"]


# -- long inputs, deadlines, usage ----------------------------------------------------------------------------------
def test_a_part_over_the_scan_budget_fails_that_question_and_truncate_still_answers(http: httpx.Client) -> None:
    state = "word " * 6000
    r = post(http, {"state": state, "questions": {
        "window": {"type": "noul", "instructions": "Long?"},
        "cut": {"type": "noul", "instructions": "Long?", "overflow": "truncate"},
        "full": {"type": "noul", "instructions": "Long?", "require_full_input": True}}})
    assert r["answers"]["window"]["error"] == "scan_budget_exceeded"
    assert r["answers"]["full"]["error"] == "scan_budget_exceeded"
    assert 0 <= r["answers"]["cut"]["noul"] <= 1


def test_a_long_part_within_the_scan_budget_is_read_in_windows_and_each_option_takes_its_best_window(
        http: httpx.Client) -> None:
    filler = "The weather was mild and nothing happened. " * 60  # ≈ 540 tokens: three windows
    state = filler + "Write a Python function that sorts a list."
    q = {"type": "choice", "instructions": "Topic?", "criteria": {"code": "Programming", "cooking": "Recipes"}}
    read = post(http, {"state": state, "questions": {"q": q, "full": {**q, "require_full_input": True}}})
    assert read["answers"]["q"]["choice"] == "code"
    assert read["answers"]["full"]["input_coverage"] == "complete"
    small = post(http, {"state": state, "questions": {"q": q}, "options": {"max_tokens": 64}})
    assert small["answers"]["q"]["error"] == "scan_budget_exceeded"


def test_a_deadline_that_has_passed_fails_every_question(http: httpx.Client) -> None:
    r = post(http, {"state": "x", "questions": SPEC_QUESTIONS, "options": {"deadline_ms": 0.001}})
    assert {a["error"] for a in r["answers"].values()} == {"deadline_exceeded"}


def test_state_once_usage_counts_the_state_once_and_each_question_its_own_tokens(http: httpx.Client) -> None:
    one = post(http, {"state": SPEC_STATE, "questions": {"r": SPEC_QUESTIONS["reasoning"]}})["usage"]["input_tokens"]
    two = post(http, {"state": SPEC_STATE, "questions": {"r": SPEC_QUESTIONS["reasoning"],
                                                         "r2": SPEC_QUESTIONS["reasoning"]}})["usage"]["input_tokens"]
    tokenizer = Tokenizer.from_str(_tokenizer_json())
    tokenizer.no_padding()
    question = len(tokenizer.encode(SPEC_QUESTIONS["reasoning"]["instructions"]).ids)  # special tokens included
    assert two - one == question


def test_a_request_over_max_request_tokens_fails_as_a_whole(http: httpx.Client) -> None:
    r = post(http, {"state": "word " * 70000, "questions": {"q": {"type": "noul", "instructions": "i",
                                                                    "overflow": "truncate"}}}, status=400)
    assert "max_request_tokens 65536" in r["error"]["message"]


def test_server_timing_is_on_answers_and_on_errors(http: httpx.Client) -> None:
    r = http.post("/v1/decisions", json={"model": MODEL, "state": "x"})
    assert r.status_code == 400 and timings(r)["total"] > 0
    ok = http.post("/v1/decisions", json={"model": MODEL, "state": "x", "questions": {"q": SPEC_QUESTIONS["domain"]}})
    phases = timings(ok)
    assert phases["forward"] > 0 and phases["tokenize"] > 0


def test_models_lists_question_types_presets_limits_and_confidence_formulas(http: httpx.Client) -> None:
    r = http.get("/v1/models")
    check("/v1/models", "get", 200, r.json())
    card = next(c for c in r.json()["data"] if c["id"] == MODEL)
    assert card["question_types"] == ["choice", "noul", "score", "set", "span", "box", "track"]
    assert {"pii", "relevance"} <= set(card["decisions"]["presets"])
    assert card["decisions"]["confidence"]["choice"] == "1 - H/ln K"
    assert card["limits"]["max_scan_tokens"] == 4096 and card["limits"]["max_request_tokens"] == 65536
    assert card["golden"]["status"] == "matched"


def _tokenizer_json() -> str:
    from .conftest import ROOT

    return (ROOT / "model_repository" / "all-minilm-l6-v2" / "1" / "tokenizer.json").read_text()


# -- the NLI adapter on a random-weight classifier -------------------------------------------------------------------
@pytest.fixture(scope="module")
def nli(fixtures_served: Served) -> tuple[httpx.Client, TextEncoder, ort.InferenceSession]:
    version = fixtures_served.repo / NLI / "1"
    tokenizer = Tokenizer.from_file(str(version / "tokenizer.json"))
    session = ort.InferenceSession(str(version / "model.onnx"), providers=["CPUExecutionProvider"])
    return httpx.Client(base_url=fixtures_served.url, timeout=60), TextEncoder(tokenizer), session


def _entailment_logits(encoder: TextEncoder, session: ort.InferenceSession, premise: str, hypothesis: str
                       ) -> np.ndarray:
    enc = encoder.encode_pair(premise, hypothesis, max_tokens=256)
    ids = np.asarray([enc.ids], dtype=np.int64)
    feed = {"input_ids": ids, "attention_mask": np.ones_like(ids), "token_type_ids": np.asarray([enc.type_ids])}
    return np.asarray(session.run(None, feed)[0][0], dtype=np.float64)


def test_the_nli_adapter_answers_choice_noul_and_set_from_entailment_as_the_reference_defines(
        nli: tuple[httpx.Client, TextEncoder, ort.InferenceSession]) -> None:
    client, encoder, session = nli
    premise = "The cat sat on the mat."
    r = post(client, {"state": premise, "questions": {
        "c": {"type": "choice", "instructions": "This text is about {label}.",
              "criteria": {"animals": None, "finance": "money"}},
        "n": {"type": "noul", "instructions": "A cat is mentioned."},
        "s": {"type": "set", "instructions": "It mentions {label}.", "labels": [{"key": "cat"}, {"key": "dog"}]}}},
        model=NLI)
    def entail(h: str) -> np.ndarray:
        return _entailment_logits(encoder, session, premise, h)
    logits = [entail("This text is about animals."), entail("This text is about money.")]
    z = np.asarray([x[0] for x in logits])
    want = np.exp(z - z.max()) / np.exp(z - z.max()).sum()
    assert abs(r["answers"]["c"]["probabilities"]["animals"] - want[0]) < 1e-4
    n = entail("A cat is mentioned.")
    assert abs(r["answers"]["n"]["noul"] - np.exp(n[0]) / np.exp(n).sum()) < 1e-4
    s = entail("It mentions dog.")
    assert abs(r["answers"]["s.dog"]["noul"] - np.exp(s[0]) / np.exp(s).sum()) < 1e-4


@pytest.mark.parametrize(("question", "message"), [
    ({"type": "choice", "instructions": "no placeholder", "criteria": {"a": None, "b": None}}, "{label}"),
    ({"type": "noul", "instructions": "i", "criteria": {"false": "no"}}, "do not take a false description"),
    ({"type": "score", "instructions": "i", "levels": ["a", "b"]}, "does not answer score questions"),
    ({"type": "span", "instructions": "i", "labels": [{"key": "a"}]}, "does not answer span questions"),
])
def test_the_nli_adapter_refuses_what_it_cannot_answer(
        nli: tuple[httpx.Client, TextEncoder, ort.InferenceSession], question: dict[str, Any], message: str) -> None:
    r = post(nli[0], {"state": "x", "questions": {"q": question, "ok": {"type": "noul", "instructions": "i"}}},
             model=NLI)
    assert r["answers"]["q"]["error"] == "invalid_question" and message in r["answers"]["q"]["message"]


def test_an_nli_premise_over_the_models_limit_fails_with_max_length_exceeded(
        nli: tuple[httpx.Client, TextEncoder, ort.InferenceSession]) -> None:
    r = post(nli[0], {"state": "word " * 400, "questions": {"q": {"type": "noul", "instructions": "i"}}}, model=NLI)
    assert r["answers"]["q"]["error"] == "max_length_exceeded"
