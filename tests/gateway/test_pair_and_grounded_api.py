"""Classify over text pairs and grounded `{context, question, answer}` items, end to end on random-weight fixtures
(no such weights ship offline): a pair sequence head (the NLI fixture) and a grounded token head. Each answer must be
what ONNX Runtime in process computes on the same encoding, and token spans must index the judged text."""

from __future__ import annotations

from typing import Any

import httpx
import numpy as np
import onnxruntime as ort
import pytest
from tokenizers import Tokenizer

from gateway.heads import decode_spans, softmax
from gateway.text import TextEncoder

from .conftest import GROUNDED, NLI, Served
from .contract import check

CONTEXT = "The Eiffel Tower is in Paris. It was finished in 1889 and is 330 metres tall."
QUESTION = "When was the Eiffel Tower finished?"
ANSWER = "It was finished in 1889 by Gustave Eiffel's company, in Lyon."


def post(url: str, body: dict[str, Any]) -> dict[str, Any]:
    r = httpx.post(url + "/v1/classify", json=body, timeout=60)
    check("/v1/classify", "post", r.status_code, r.json(), r.headers)
    assert r.status_code == 200, r.text
    return r.json()  # type: ignore[no-any-return]


def reference(served: Served, model: str) -> tuple[TextEncoder, ort.InferenceSession]:
    version = served.repo / model / "1"
    return (TextEncoder(Tokenizer.from_file(str(version / "tokenizer.json"))),
            ort.InferenceSession(str(version / "model.onnx"), providers=["CPUExecutionProvider"]))


def run(session: ort.InferenceSession, ids: list[int], type_ids: list[int]) -> np.ndarray:
    feed = {"input_ids": np.asarray([ids], dtype=np.int64), "attention_mask": np.ones((1, len(ids)), dtype=np.int64),
            "token_type_ids": np.asarray([type_ids], dtype=np.int64)}
    return np.asarray(session.run(None, feed)[0][0], dtype=np.float64)


@pytest.fixture(scope="module")
def served(fixtures_served: Served) -> Served:
    return fixtures_served


def test_pairs_reach_a_pair_head_exactly_as_in_process(served: Served) -> None:
    encoder, session = reference(served, NLI)
    pairs = [("The cat sat on the mat.", "A cat is mentioned."), ("It rained all day.", "The weather was dry.")]
    r = post(served.url, {"model": NLI, "input": [{"text": a, "text_pair": b} for a, b in pairs]})
    for (a, b), result in zip(pairs, r["results"], strict=True):
        enc = encoder.encode_pair(a, b, max_tokens=256)
        want = softmax(run(session, enc.ids, enc.type_ids))
        got = [result["probabilities"][k] for k in ("entailment", "neutral", "contradiction")]
        assert np.max(np.abs(np.asarray(got) - want)) < 1e-5


def test_a_grounded_item_is_framed_context_sep_question_sep_answer_and_spans_index_the_answer(served: Served
                                                                                               ) -> None:
    encoder, session = reference(served, GROUNDED)
    item = {"context": CONTEXT, "question": QUESTION, "answer": ANSWER}
    r = post(served.url, {"model": GROUNDED, "input": [item], "options": {"threshold": 0.3,
                                                                           "return_tokens": True}})
    enc = encoder.encode_grounded(CONTEXT, QUESTION, ANSWER, max_tokens=256)
    tokenizer = Tokenizer.from_file(str(served.repo / GROUNDED / "1" / "tokenizer.json"))
    tokenizer.no_padding()  # MiniLM's tokenizer.json pads to 128 by itself
    cls, sep = tokenizer.token_to_id("[CLS]"), tokenizer.token_to_id("[SEP]")
    content = lambda text: tokenizer.encode(text, add_special_tokens=False).ids  # noqa: E731
    assert enc.ids == [cls, *content(CONTEXT), sep, *content(QUESTION), sep, *content(ANSWER), sep]
    logits = run(session, enc.ids, enc.type_ids)
    keep = [i for i, s in enumerate(enc.sequence_ids) if s == 1]
    probs = softmax(logits[keep])
    labels = ["O", "B-UNSUPPORTED", "I-UNSUPPORTED"]
    want = [s.as_dict(ANSWER) for s in decode_spans(probs, [enc.offsets[i] for i in keep], labels, 0.3)]
    result = r["results"][0]
    assert result["spans"] == want
    assert len(result["tokens"]) == len(keep)  # one row per answer token, none for context or question
    for span in result["spans"]:
        assert ANSWER[span["start"]:span["end"]] == span["text"]
    assert result["input"]["tokens"] == len(enc.ids)


def test_token_spans_on_a_pair_index_the_text_pair(served: Served) -> None:
    r = post(served.url, {"model": GROUNDED, "input": [{"text": CONTEXT, "text_pair": ANSWER}],
                          "options": {"threshold": 0.0, "return_tokens": True}})
    result = r["results"][0]
    assert result["spans"], "threshold 0 marks every token"
    assert all(ANSWER[s["start"]:s["end"]] == s["text"] for s in result["spans"])
    assert max(t["end"] for t in result["tokens"]) <= len(ANSWER)


def test_a_grounded_item_over_budget_clips_the_context_under_truncate_and_fails_under_reject(served: Served) -> None:
    long = {"context": "background words " * 400, "question": QUESTION, "answer": ANSWER}
    r = post(served.url, {"model": GROUNDED, "input": [long], "options": {"overflow": "truncate"}})
    usage = r["results"][0]["input"]
    assert usage["truncated"] and usage["processed_tokens"] == 256 and "spans" in r["results"][0]
    r = post(served.url, {"model": GROUNDED, "input": [long]})
    assert r["results"][0]["error"] == "max_length_exceeded"
    huge_answer = {"context": "c", "question": QUESTION, "answer": "word " * 400}
    r = post(served.url, {"model": GROUNDED, "input": [huge_answer], "options": {"overflow": "truncate"}})
    assert r["results"][0]["error"] == "max_length_exceeded"  # the judged answer is never cut


def test_a_grounded_item_on_a_head_that_does_not_read_them_is_400(served: Served) -> None:
    r = httpx.post(served.url + "/v1/classify", json={"model": NLI, "input": [
        {"context": "c", "question": "q", "answer": "a"}]})
    assert r.status_code == 400 and "grounded" in r.json()["error"]["message"]
