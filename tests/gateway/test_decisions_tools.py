"""The decisions evaluation set and the client tools (eval_decisions, reference_examples), offline.

The tools are run against the served stack elsewhere; here their logic meets canned answers shaped like the spec's
examples, over httpx's in-process transport where the HTTP plumbing matters.
"""

from __future__ import annotations

import copy
import json
from collections import Counter
from typing import Any

import httpx
import pytest

from tools import eval_decisions as ev
from tools import reference_examples as ref

MODEL = "decision-zeroshot"


# ---------------------------------------------------------------- the evaluation set


@pytest.fixture(scope="module")
def items() -> list[ev.Item]:
    return ev.load_items()


def test_the_evaluation_set_covers_every_type_in_both_question_forms_and_both_state_forms(items: list[ev.Item]) -> None:
    assert len(items) >= 260
    per_type = Counter(ev.question_type(i) for i in items)
    assert all(per_type[t] >= 40 for t in ("choice", "noul", "score", "set")) and per_type["span"] >= 30, per_type
    for kind in ev.TYPES:
        of_type = [i for i in items if ev.question_type(i) == kind]
        assert any("criteria" in i["question"] for i in of_type), kind
        assert any("criteria" not in i["question"] for i in of_type), kind
        assert any(isinstance(i["state"], dict) for i in of_type), kind
        assert any(isinstance(i["state"], str) for i in of_type), kind


def test_about_forty_percent_of_each_type_was_split_into_fit_and_only_seen_held_out_items_moved_there(
        items: list[ev.Item]) -> None:
    for kind in ev.TYPES:
        of_type = [i for i in items if ev.question_type(i) == kind]
        share = sum(i["split"] == "fit" and "moved_from" not in i for i in of_type) / len(of_type)
        assert 0.35 <= share <= 0.45, (kind, share)
    moved = [i for i in ev.load_all() if "moved_from" in i]
    assert moved and {(i["split"], i["moved_from"]) for i in moved} == {("fit", "heldout"), ("fit", "heldout2")}
    assert not [i["id"] for i in ev.load_all() if i["split"] in ("heldout", "heldout2")
                and ev.question_type(i) in ("choice", "noul", "score", "set")]


def test_no_two_items_ask_the_same_question_about_the_same_state(items: list[ev.Item]) -> None:
    keys = Counter(json.dumps([i["state"], i["question"]], sort_keys=True) for i in items)
    assert [k for k, n in keys.items() if n > 1] == []


def test_both_noul_answers_and_empty_sets_and_spans_are_expected_somewhere(items: list[ev.Item]) -> None:
    nouls = Counter(i["expected"] for i in items if ev.question_type(i) == "noul")
    assert min(nouls.values()) >= 0.4 * sum(nouls.values())
    assert any(i["expected"] == [] for i in items if ev.question_type(i) == "set")
    assert any(i["expected"] == [] for i in items if ev.question_type(i) == "span")


def test_an_item_whose_expected_answer_is_not_an_option_is_refused() -> None:
    item = {"id": "x", "split": "fit", "state": "hi", "expected": "maybe",
            "question": {"type": "choice", "instructions": "?", "criteria": {"yes": "Yes", "no": "No"}}}
    with pytest.raises(ValueError, match="'maybe' is not one of"):
        ev.validate_item(item)
    span = {"id": "s", "split": "fit", "state": {"a": "mail me", "b": "x@example.com"}, "expected":
            [{"label": "EMAIL_ADDRESS", "text": "x@example.com"}],
            "question": {"type": "span", "instructions": "?", "over": "a", "labels": [{"key": "EMAIL_ADDRESS"}]}}
    with pytest.raises(ValueError, match="not in the part it reads"):
        ev.validate_item(span)


# ---------------------------------------------------------------- requests and scoring


def test_items_are_sent_as_batches_of_at_most_16_states_with_one_question_each(items: list[ev.Item]) -> None:
    sent = list(ev.batches(items[:40], MODEL))
    assert [len(body["states"]) for body, _ in sent] == [16, 16, 8]
    body, chunk = sent[0]
    assert body["model"] == MODEL and set(body) == {"model", "states"}
    assert list(body["states"]) == [i["id"] for i in chunk]
    first = body["states"][chunk[0]["id"]]
    assert first == {"state": chunk[0]["state"], "questions": {"q": chunk[0]["question"]}}


def _choice(key: str, keys: list[str], split: str = "heldout", name: str | None = None) -> ev.Item:
    return {"id": name or f"c-{key}-{len(keys)}-{split}", "split": split, "state": "s", "expected": key,
            "question": {"type": "choice", "instructions": "?", "choices": [{"key": k} for k in keys]}}


def _entry(answers: dict[str, Any], **extra: Any) -> ev.Entry:
    return {"model": MODEL, "answers": answers, "usage": {"input_tokens": 3, "output_tokens": 0}, **extra}


def test_choice_accuracy_counts_the_answered_key_beside_first_option_and_fit_majority() -> None:
    fit = [_choice("b", ["a", "b"], "fit", "f1"), _choice("b", ["a", "b", "c"], "fit", "f2"),
           _choice("a", ["a", "b"], "fit", "f3")]
    held = [_choice("b", ["a", "b"], name="h1"), _choice("c", ["a", "c"], name="h2"), _choice("a", ["a", "c"],
                                                                                              name="h3")]
    answers = {"h1": _entry({"q": {"type": "choice", "choice": "b"}}),
               "h2": _entry({"q": {"type": "choice", "choice": "a"}}),
               "h3": _entry({"q": {"type": "choice", "error": "invalid_question", "message": "bad"}})}
    report = ev.evaluate(answers, held, fit_items=fit + held)
    assert report.value("choice", "accuracy") == pytest.approx(1 / 3)
    assert report.value("choice", "accuracy", "first option") == pytest.approx(1 / 3)
    # the fit split's majority key is b; where b is not an option the baseline falls back to the first option
    assert report.value("choice", "accuracy", "majority") == pytest.approx(2 / 3)
    assert report.types["choice"].errors == 1


def test_noul_is_right_when_its_probability_is_on_the_expected_side_of_one_half() -> None:
    def noul(name: str, expected: bool, split: str = "heldout") -> ev.Item:
        return {"id": name, "split": split, "state": "s", "expected": expected,
                "question": {"type": "noul", "instructions": "?"}}

    held = [noul("t", True), noul("f", False), noul("edge", True)]
    answers = {"t": _entry({"q": {"type": "noul", "noul": 0.7}}), "f": _entry({"q": {"type": "noul", "noul": 0.8}}),
               "edge": _entry({"q": {"type": "noul", "noul": 0.5}})}
    report = ev.evaluate(answers, held, fit_items=[noul("a", False, "fit"), noul("b", False, "fit"), *held])
    assert report.value("noul", "accuracy") == pytest.approx(2 / 3)
    assert report.value("noul", "accuracy", "majority") == pytest.approx(1 / 3)


def test_score_rounds_the_expected_level_and_reports_mean_absolute_error_against_the_middle_level() -> None:
    def score(name: str, expected: int, levels: int) -> ev.Item:
        return {"id": name, "split": "heldout", "state": "s", "expected": expected,
                "question": {"type": "score", "instructions": "?", "levels": [f"l{i}" for i in range(levels)]}}

    held = [score("a", 0, 3), score("b", 2, 3), score("c", 3, 4)]
    answers = {"a": _entry({"q": {"type": "score", "score": 0.4}}), "b": _entry({"q": {"type": "score", "score": 1.4}}),
               "c": _entry({"q": {"type": "score", "error": "deadline_exceeded", "message": "late"}})}
    report = ev.evaluate(answers, held)
    assert report.value("score", "accuracy") == pytest.approx(1 / 3)
    # a failed score counts as the farthest level: |0 - 3| for c
    assert report.value("score", "mean abs error") == pytest.approx((0.4 + 0.6 + 3) / 3)
    # middle levels 1, 1, 1 (of 3, 3, 4 levels)
    assert report.value("score", "accuracy", "middle level") == 0.0
    assert report.value("score", "mean abs error", "middle level") == pytest.approx((1 + 1 + 2) / 3)


def test_set_scores_exact_sets_and_each_label_beside_empty_and_majority_baselines() -> None:
    def item(name: str, expected: list[str], split: str = "heldout") -> ev.Item:
        return {"id": name, "split": split, "state": "s", "expected": expected,
                "question": {"type": "set", "instructions": "?", "criteria": {"x": "X", "y": "Y", "z": "Z"}}}

    fit = [item("f1", ["x"], "fit"), item("f2", ["x", "y"], "fit"), item("f3", ["x"], "fit")]
    held = [item("h1", ["x", "y"]), item("h2", [])]

    def sets(selected: list[str]) -> dict[str, Any]:
        return {"q": {"selected": selected, "probabilities": {}}}

    answers = {"h1": _entry({"q.x": {"type": "noul", "noul": 0.9}}, sets=sets(["x", "y"])),
               "h2": _entry({"q.x": {"type": "noul", "noul": 0.9}}, sets=sets(["z"]))}
    report = ev.evaluate(answers, held, fit_items=fit + held)
    assert report.value("set", "exact set") == 0.5
    assert report.value("set", "per-label accuracy") == pytest.approx(5 / 6)
    assert report.value("set", "exact set", "empty set") == 0.5
    assert report.value("set", "per-label accuracy", "empty set") == pytest.approx(4 / 6)
    # majority per label from fit: x on, y and z off → {x}
    assert report.value("set", "exact set", "majority per label") == 0.0
    assert report.value("set", "per-label accuracy", "majority per label") == pytest.approx(4 / 6)


def test_a_failed_set_label_fails_the_whole_set_question() -> None:
    item = {"id": "s", "split": "heldout", "state": "s", "expected": [],
            "question": {"type": "set", "instructions": "?", "labels": [{"key": "x"}]}}
    answers = {"s": _entry({"q.x": {"type": "noul", "error": "invalid_question", "message": "collides"}})}
    report = ev.evaluate(answers, [item])
    assert report.value("set", "exact set") == 0.0 and report.types["set"].errors == 1


def test_a_span_counts_only_with_its_exact_text_and_offsets_and_extra_spans_cost_precision() -> None:
    text = "Call Ann Lee on 555 0100 or ann@example.com"
    item = {"id": "p", "split": "heldout", "state": text,
            "expected": [{"label": "PHONE_NUMBER", "text": "555 0100"}, {"label": "EMAIL_ADDRESS",
                                                                        "text": "ann@example.com"}],
            "question": {"type": "span", "instructions": "?", "labels": [{"key": "PHONE_NUMBER"},
                                                                          {"key": "EMAIL_ADDRESS"}]}}
    phone = text.index("555 0100")
    found = [{"label": "PHONE_NUMBER", "start": phone - 3, "end": phone + 8, "text": "on 555 0100"},  # contains it
             {"label": "EMAIL_ADDRESS", "start": 28, "end": 31, "text": "ann"},  # inside it
             {"label": "EMAIL_ADDRESS", "start": 0, "end": 15, "text": "ann@example.com"}]  # right text, wrong place
    report = ev.evaluate({"p": _entry({"q": {"type": "noul", "noul": 0.9}}, spans={"q": found})}, [item])
    assert report.value("span", "recall") == 0.0 and report.value("span", "precision") == 0.0
    exact = [{"label": "PHONE_NUMBER", "start": phone, "end": phone + 8, "text": "555 0100"},
             {"label": "EMAIL_ADDRESS", "start": 28, "end": 43, "text": "ann@example.com"}]
    report = ev.evaluate({"p": _entry({"q": {"type": "noul", "noul": 0.9}}, spans={"q": exact})}, [item])
    assert report.value("span", "recall") == 1.0 and report.value("span", "item exact") == 1.0
    assert report.value("span", "recall", "empty set") == 0.0


def test_span_recall_and_precision_are_also_counted_per_label_and_tabled_per_family() -> None:
    text = "联系王建国：13812345678，或 wang@example.cn"
    phone, mail = text.index("13812345678"), text.index("wang@example.cn")
    item = {"id": "z", "split": "heldout4", "lang": "zh", "state": text,
            "expected": [{"label": "PERSON", "text": "王建国", "start": 2, "end": 5},
                         {"label": "PHONE_NUMBER", "text": "13812345678", "start": phone, "end": phone + 11},
                         {"label": "EMAIL_ADDRESS", "text": "wang@example.cn", "start": mail, "end": mail + 15}],
            "question": {"type": "span", "instructions": "?", "labels": [
                {"key": "PERSON"}, {"key": "PHONE_NUMBER"}, {"key": "EMAIL_ADDRESS"}]}}
    found = [{"label": "PERSON", "start": 2, "end": 5, "text": "王建国"},
             {"label": "PHONE_NUMBER", "start": phone, "end": phone + 11, "text": "13812345678"},
             {"label": "PERSON", "start": 0, "end": 2, "text": "联系"}]  # no e-mail found, one extra name
    report = ev.evaluate({"z": _entry({"q": {"type": "noul", "noul": 0.9}}, spans={"q": found})}, [item])
    assert report.value("span", "recall PERSON") == 1.0 and report.value("span", "precision PERSON") == 0.5
    assert report.value("span", "recall PHONE_NUMBER") == 1.0 and report.value("span", "precision PHONE_NUMBER") == 1.0
    assert report.value("span", "recall EMAIL_ADDRESS") == 0.0
    assert "precision EMAIL_ADDRESS" not in report.types["span"].metrics  # nothing found: no precision to count
    table = ev.span_labels([ev.Row("ad-hoc items", "span", "zh", {"A": report})], ["A", "B"])
    person = next(line for line in table.splitlines() if "| PERSON |" in line)
    assert "1.00 [" in person and "(n 1)" in person and "0.50 [" in person and "(n 2)" in person and "—" in person
    assert ev.span_labels([ev.Row("ad-hoc items", "noul", "zh", {"A": report})], ["A"]) == ""


def test_address_pieces_are_not_joined_into_the_expected_address() -> None:
    text = "Ship to 1180 Maple Avenue, Springfield, IL 62704 today."
    item = {"id": "a", "split": "heldout", "state": text, "expected": [
        {"label": "ADDRESS", "text": "1180 Maple Avenue, Springfield, IL 62704"}],
            "question": {"type": "span", "instructions": "?", "labels": [{"key": "ADDRESS"}]}}

    def at(piece: str) -> dict[str, Any]:
        start = text.index(piece)
        return {"label": "ADDRESS", "start": start, "end": start + len(piece), "text": piece, "probability": 0.9}

    pieces = [at("1180 Maple Avenue"), at("Springfield"), at("IL 62704")]
    report = ev.evaluate({"a": _entry({"q": {"type": "noul", "noul": 0.9}}, spans={"q": pieces})}, [item])
    assert report.value("span", "recall") == 0.0 and report.value("span", "item exact") == 0.0
    whole = [at("1180 Maple Avenue, Springfield, IL 62704")]
    report = ev.evaluate({"a": _entry({"q": {"type": "noul", "noul": 0.9}}, spans={"q": whole})}, [item])
    assert report.value("span", "item exact") == 1.0


def test_a_span_question_expecting_nothing_is_right_only_when_nothing_is_found() -> None:
    def item(name: str) -> ev.Item:
        return {"id": name, "split": "heldout", "state": "no personal data here", "expected": [],
                "question": {"type": "span", "instructions": "?", "labels": [{"key": "PERSON"}]}}

    quiet = _entry({"q": {"type": "noul", "noul": 0.1}}, spans={"q": []})
    noisy = _entry({"q": {"type": "noul", "noul": 0.9}},
                   spans={"q": [{"label": "PERSON", "start": 0, "end": 2, "text": "no", "probability": 0.9}]})
    report = ev.evaluate({"a": quiet, "b": noisy}, [item("a"), item("b")])
    assert report.value("span", "item exact") == 0.5
    assert report.value("span", "item exact", "empty set") == 1.0
    assert report.value("span", "precision") == 0.0


def test_perfect_answers_score_one_on_every_type_of_the_real_set(items: list[ev.Item]) -> None:
    answers = {i["id"]: _perfect(i) for i in items}
    report = ev.evaluate(answers, items)
    for kind, metric in [("choice", "accuracy"), ("noul", "accuracy"), ("score", "accuracy"), ("set", "exact set"),
                         ("set", "per-label accuracy"), ("span", "item exact"), ("span", "recall")]:
        assert report.value(kind, metric) == 1.0, (kind, metric)
    assert report.value("score", "mean abs error") == pytest.approx(0.2)  # every score 0.2 off
    first = report.value("choice", "accuracy", "first option")
    assert first is not None and first < 1.0
    table = ev.markdown(report, "title")
    assert table.startswith("title\n\n| type | metric | n | model |")
    assert "| span | recall |" in table and "(empty set)" in table and "| set | per-label accuracy |" in table


def _perfect(item: ev.Item) -> ev.Entry:
    kind, expected = ev.question_type(item), item["expected"]
    if kind == "choice":
        return _entry({"q": {"type": "choice", "choice": expected}})
    if kind == "noul":
        return _entry({"q": {"type": "noul", "noul": 0.9 if expected else 0.1}})
    if kind == "score":
        return _entry({"q": {"type": "score", "score": expected + 0.2}})
    if kind == "set":
        return _entry({f"q.{k}": {"type": "noul", "noul": 0.5} for k in ev.options(item["question"])},
                      sets={"q": {"selected": list(expected), "probabilities": {}}})
    source = ev.span_source(item)
    spans = [{"label": s["label"], "start": source.index(s["text"]), "end": source.index(s["text"]) + len(s["text"]),
              "text": s["text"], "probability": 1.0} for s in expected]
    return _entry({"q": {"type": "noul", "noul": 1.0}}, spans={"q": spans})


def test_collect_maps_each_batch_entry_back_to_its_item_and_a_failed_batch_to_errors(items: list[ev.Item]) -> None:
    chosen = items[:20]
    seen: list[dict[str, Any]] = []

    def handler(request: httpx.Request) -> httpx.Response:
        body = json.loads(request.content)
        seen.append(body)
        if len(seen) == 2:
            return httpx.Response(503, json={"error": {"code": "not_ready", "message": "loading"}})
        states = {name: _perfect(next(i for i in chosen if i["id"] == name)) for name in body["states"]}
        return httpx.Response(200, json={"model": MODEL, "states": states, "usage": {"input_tokens": 1,
                                                                                      "output_tokens": 0}})

    with httpx.Client(base_url="http://gateway", transport=httpx.MockTransport(handler)) as client:
        responses = ev.collect("http://gateway", MODEL, chosen, client=client)
    assert [len(b["states"]) for b in seen] == [16, 4]
    assert list(responses) == [i["id"] for i in chosen]
    report = ev.evaluate(responses, chosen)
    failed = sum(t.errors for t in report.types.values())
    assert failed == 4
    assert "HTTP 503" in responses[chosen[-1]["id"]]["answers"]["q"]["message"]


# ---------------------------------------------------------------- reference examples


def _spec_replies() -> dict[str, ref.Reply]:
    """The spec's example answers (its rounded numbers), with the usage every response carries."""
    timing = {"server-timing": "parse;dur=0.1, total;dur=3.2"}
    usage = {"input_tokens": 20, "output_tokens": 0}
    routing = {"model": MODEL, "answers": {
        "domain": {"type": "choice", "choice": "code", "confidence": 0.99,
                   "probabilities": {"code": 1.0, "math": 0.0, "other": 0.0}, "abstain_probability": 0.01},
        "reasoning": {"type": "noul", "noul": 0.34},
        "difficulty": {"type": "score", "score": 1.3, "confidence": 0.28,
                       "legend": {"0": "Trivial", "1": "Moderate", "2": "Hard"},
                       "probabilities": {"0": 0.13, "1": 0.43, "2": 0.43}}}, "usage": usage}
    support = {"model": MODEL, "answers": {
        "problems.billing": {"type": "noul", "noul": 0.95}, "problems.shipping": {"type": "noul", "noul": 0.7},
        "problems.account": {"type": "noul", "noul": 0.03}, "contacts": {"type": "noul", "noul": 1.0}},
        "spans": {"contacts": [{"label": "EMAIL_ADDRESS", "start": 71, "end": 91, "text": "jane.doe@example.com",
                                "probability": 1.0}]},
        "sets": {"problems": {"selected": ["billing", "shipping"],
                              "probabilities": {"billing": 0.95, "shipping": 0.7, "account": 0.03}}},
        "thresholds": {"problems": 0.3, "contacts": 0.65}, "usage": usage}

    def doc(p: float, tokens: int) -> dict[str, Any]:
        return {"model": MODEL, "answers": {"relevance": {"type": "noul", "noul": p}},
                "usage": {"input_tokens": tokens, "output_tokens": 0}}

    relevance = {"model": MODEL, "states": {"doc_1": doc(0.81, 30), "doc_2": doc(0.12, 28)},
                 "usage": {"input_tokens": 58, "output_tokens": 0}}
    labels = ["biology", "math", "other"]
    bundle = {"results": [
        {"id": "domain", "status": 200, "classify": {
            "model": "domain-zeroshot", "head": "domain", "kind": "sequence", "labels": labels,
            "results": [{"index": 0, "label": "math", "probabilities": {"biology": 0.1, "math": 0.8, "other": 0.1}}],
            "usage": usage}},
        {"id": "kind", "status": 200, "decisions": {"model": MODEL, "answers": {"math": {"type": "noul",
                                                                                          "noul": 0.8}},
                                                    "usage": usage}}]}
    return {name: ref.Reply(200, body, timing) for name, body in
            [("routing", routing), ("support", support), ("relevance", relevance), ("bundle", bundle)]}


def _failed(checks: list[ref.Check]) -> list[str]:
    return [c.name for c in checks if not c.ok]


def test_the_spec_answers_pass_every_reference_check() -> None:
    checks = ref.check_replies(_spec_replies(), MODEL)
    assert _failed(checks) == []
    names = {c.name for c in checks}
    for semantic in ("routing: domain answers code", "support: contacts finds jane.doe@example.com at 71–91",
                     "support: problems selects billing and shipping but not account",
                     "relevance: doc_1 is more relevant than doc_2"):
        assert semantic in names


@pytest.mark.parametrize(("mutate", "failing"), [
    (lambda r: r["routing"].body["answers"]["domain"].update(choice="math"),
     ["routing: domain choice is the most probable option and confidence in [0, 1]",
      "routing: domain answers code"]),
    (lambda r: r["routing"].body["answers"].update(reasoning=r["routing"].body["answers"].pop("reasoning")),
     ["routing: answers in question order"]),
    (lambda r: r["routing"].body["answers"]["difficulty"].update(score=1.6),
     ["routing: difficulty score is the expected level over probabilities keyed by level"]),
    (lambda r: r["routing"].body["answers"]["difficulty"].update(legend={"0": "Trivial"}),
     ["routing: difficulty legend names the levels by index"]),
    (lambda r: r["support"].body["spans"]["contacts"][0].update(start=70, end=90),
     ["support: spans carry the label, code-point offsets with text equal to the slice, probability"]),
    (lambda r: r["support"].body["spans"]["contacts"][0].update(start=72, end=92, text="ane.doe@example.com."),
     ["support: contacts finds jane.doe@example.com at 71–91"]),
    (lambda r: r["support"].body["sets"]["problems"].update(selected=["billing"]),
     ["support: sets.problems selects the labels at its threshold; probabilities are the nouls"]),
    (lambda r: (r["support"].body["answers"]["problems.account"].update(noul=0.5),
                r["support"].body["sets"]["problems"].update(selected=["billing", "shipping", "account"]),
                r["support"].body["sets"]["problems"]["probabilities"].update(account=0.5)),
     ["support: problems selects billing and shipping but not account"]),
    (lambda r: r["support"].body.pop("thresholds"),
     ["support: thresholds for the set and the span question",
      "support: sets.problems selects the labels at its threshold; probabilities are the nouls",
      "support: spans carry the label, code-point offsets with text equal to the slice, probability"]),
    (lambda r: r["relevance"].body["states"]["doc_2"]["answers"]["relevance"].update(noul=0.9),
     ["relevance: doc_1 is more relevant than doc_2"]),
    (lambda r: r["relevance"].body.update(answers={}), ["relevance: a batch response has no top-level answers"]),
    (lambda r: r["relevance"].body["usage"].update(input_tokens=30), ["relevance: usage sums the entries"]),
    (lambda r: r["bundle"].body["results"].reverse(), ["bundle: results in task order"]),
    (lambda r: r["bundle"].body["results"][1].update(status=504),
     ["bundle: every task answered 200"]),
    (lambda r: r.update(routing=ref.Reply(200, r["routing"].body, {})), ["routing: Server-Timing has total"]),
    (lambda r: r["support"].body.update(usage={"input_tokens": 0, "output_tokens": 0}), ["support: usage"]),
])
def test_each_broken_answer_fails_exactly_its_checks(mutate: Any, failing: list[str]) -> None:
    replies = copy.deepcopy(_spec_replies())
    mutate(replies)
    assert _failed(ref.check_replies(replies, MODEL)) == failing


def test_a_request_that_failed_fails_its_checks_without_crashing_the_others() -> None:
    replies: dict[str, ref.Reply | None] = dict(_spec_replies())
    replies["support"] = ref.Reply(400, {"error": {"code": "invalid_request", "message": "no question is valid"}}, {})
    replies["relevance"] = None
    replies["routing"] = ref.Reply(200, {"model": MODEL, "answers": {"domain": 3, "reasoning": None,
                                                                     "difficulty": []}}, {"server-timing": "total"})
    failed = _failed(ref.check_replies(replies, MODEL))
    assert "support: answered 200 with JSON" in failed and "relevance: answered 200 with JSON" in failed
    assert "routing: domain is a choice answer without error" in failed
    assert not any(name.startswith("bundle") for name in failed)


def test_check_all_sends_the_spec_requests_with_the_served_model_name_and_main_exits_by_outcome(
        capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch) -> None:
    canned = _spec_replies()
    sent: list[tuple[str, dict[str, Any]]] = []

    def handler(request: httpx.Request) -> httpx.Response:
        body = json.loads(request.content)
        sent.append((request.url.path, body))
        name = {0: "routing", 1: "support", 2: "relevance", 3: "bundle"}[len(sent) - 1]
        return httpx.Response(200, json=canned[name].body, headers=dict(canned[name].headers))

    client = httpx.Client(base_url="http://gateway", transport=httpx.MockTransport(handler))
    checks = ref.check_all("http://gateway", MODEL, client=client)
    assert _failed(checks) == []
    assert [path for path, _ in sent] == ["/v1/decisions"] * 3 + ["/v1/bundle"]
    assert all(body["model"] == MODEL for _, body in sent[:3])
    assert sent[0][1]["questions"]["domain"]["choices"][2] == {"key": "other"}
    assert sent[1][1]["state"][71:91] == "jane.doe@example.com"
    assert list(sent[2][1]["states"]) == ["doc_1", "doc_2"] and "state" not in sent[2][1]
    tasks = sent[3][1]["tasks"]
    assert tasks[0]["classify"]["model"] == "domain-zeroshot" and tasks[1]["decisions"]["model"] == MODEL

    canned["routing"].body["answers"]["domain"]["choice"] = "other"
    sent.clear()
    original = ref.check_all
    monkeypatch.setattr(ref, "check_all", lambda url, model, domain_model: original(url, model, domain_model,
                                                                                    client=client))
    assert ref.main(["--url", "http://gateway"]) == 1
    out = capsys.readouterr().out
    assert "FAIL routing: domain answers code: choice='other'" in out and "PASS support: usage" in out
