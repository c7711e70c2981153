"""POST /v1/rerank through real gateways and real Triton.

Bi-encoder: MiniLM in the shared session gateway (scores from the cosine of its embeddings). Cross-encoder: a
tiny random-weight BERT built by tools/make_cross_encoder_fixture.py into a temporary repository and served by its
own `sr-gateway serve` (Triton as a child); its logits are checked against ONNX Runtime run here on the same pair
encoding. Building and starting that server is most of this file's time, so it starts in the background first.
"""

from __future__ import annotations

import math
from collections.abc import Iterator
from functools import cache
from typing import Any

import httpx
import numpy as np
import onnxruntime as ort
import pytest
from tokenizers import Tokenizer

from gateway.text import TextEncoder

from .conftest import CROSS, MODEL, ROOT, Served
from .contract import check

QUERY = "What is the capital of France?"
DOCS = [
    "Berlin is the capital of Germany.",
    "The Eiffel Tower is a landmark in Paris.",
    "Paris is the capital of France.",
    "Bananas are rich in potassium.",
    "Bordeaux is famous for its red wine.",
]


def post(client: httpx.Client, body: Any, model: str | None = MODEL) -> httpx.Response:
    """POST a rerank request (for `model` unless it names one) and check the answer against the contract."""
    if isinstance(body, dict) and "model" not in body and model is not None:
        body = {"model": model, **body}
    r = client.post("/v1/rerank", json=body)
    check("/v1/rerank", "post", r.status_code, r.json(), r.headers)
    assert "Server-Timing" in r.headers
    return r


@cache
def _tokenizer() -> Tokenizer:
    tokenizer = Tokenizer.from_file(str(ROOT / "model_repository" / MODEL / "1" / "tokenizer.json"))
    tokenizer.no_padding()
    return tokenizer


def n_tokens(text: str) -> int:
    """Tokens of one text with its special tokens (MiniLM's tokenizer, as served)."""
    return len(_tokenizer().encode(text).ids)


def sigmoid(x: float) -> float:
    return 1 / (1 + math.exp(-x))


def assert_sorted(results: list[dict[str, Any]]) -> None:
    scores = [r["relevance_score"] for r in results if "error" not in r]
    assert scores == sorted(scores, reverse=True)


# -- bi-encoder (MiniLM, the shared session gateway) --------------------------------------------------------------
def test_the_document_that_answers_the_query_ranks_first(http: httpx.Client) -> None:
    r = post(http, {"query": QUERY, "documents": DOCS})
    assert r.status_code == 200
    body = r.json()
    assert body["model"] == MODEL
    results = body["results"]
    assert results[0]["index"] == 2
    assert sorted(x["index"] for x in results) == list(range(len(DOCS)))
    assert_sorted(results)
    assert all("document" not in x for x in results)
    assert body["usage"] == {"input_tokens": n_tokens(QUERY) + sum(n_tokens(d) for d in DOCS), "output_tokens": 0}
    for x in results:
        size = n_tokens(DOCS[x["index"]])
        assert x["input"] == {"tokens": size, "processed_tokens": size, "truncated": False}
    assert "meta" not in body
    assert "forward;dur=" in r.headers["Server-Timing"]


def test_indices_refer_to_request_order_whatever_the_order(http: httpx.Client) -> None:
    order = [3, 0, 4, 2, 1]
    shuffled = [DOCS[i] for i in order]
    a = {DOCS[x["index"]]: x["logit"] for x in post(http, {"query": QUERY, "documents": DOCS}).json()["results"]}
    results = post(http, {"query": QUERY, "documents": shuffled, "return_documents": True}).json()["results"]
    assert results[0]["index"] == order.index(2)
    for x in results:
        assert x["document"] == {"text": shuffled[x["index"]]}
        assert x["logit"] == pytest.approx(a[shuffled[x["index"]]], abs=1e-5)


def test_top_n_keeps_the_best_and_return_documents_echoes_them(http: httpx.Client) -> None:
    full = post(http, {"query": QUERY, "documents": DOCS}).json()["results"]
    top = post(http, {"query": QUERY, "documents": DOCS, "top_n": 2, "return_documents": True}).json()["results"]
    assert [x["index"] for x in top] == [x["index"] for x in full[:2]]
    assert [x["document"]["text"] for x in top] == [DOCS[x["index"]] for x in full[:2]]
    assert len(post(http, {"query": QUERY, "documents": DOCS, "top_n": 99}).json()["results"]) == len(DOCS)


def test_scores_are_the_cosine_of_the_embeddings_mapped_monotonically_to_0_1(http: httpx.Client) -> None:
    r = http.post("/v1/embeddings", json={"model": MODEL, "input": [QUERY, *DOCS]})
    check("/v1/embeddings", "post", r.status_code, r.json(), r.headers)
    v = np.array([d["embedding"] for d in r.json()["data"]], dtype=np.float64)
    cosine = v[1:] @ v[0]
    results = post(http, {"query": QUERY, "documents": DOCS}).json()["results"]
    for x in results:
        assert x["logit"] == pytest.approx(cosine[x["index"]], abs=1e-4)
        assert x["relevance_score"] == pytest.approx((1 + x["logit"]) / 2, abs=1e-12)
    assert [x["index"] for x in results] == list(np.argsort(-cosine, kind="stable"))


def test_a_document_over_budget_fails_alone_and_last_and_top_n_never_cuts_failures(http: httpx.Client) -> None:
    docs = ["", DOCS[2], "word " * 300, DOCS[0]]
    body = post(http, {"query": QUERY, "documents": docs, "top_n": 1}).json()
    ok, *failed = body["results"]
    assert ok["index"] == 1 and "error" not in ok
    assert {x["index"]: x["error"] for x in failed} == {0: "invalid_input", 2: "max_length_exceeded"}
    assert all(set(x) == {"index", "error", "message"} for x in failed)
    assert "256" in next(x for x in failed if x["index"] == 2)["message"]
    everything = post(http, {"query": QUERY, "documents": docs}).json()
    assert [x["index"] for x in everything["results"][:2]] == [1, 3]
    # the query and the answered documents
    assert everything["usage"]["input_tokens"] == n_tokens(QUERY) + n_tokens(DOCS[2]) + n_tokens(DOCS[0])


def test_truncate_scores_the_kept_prefix_and_reports_it(http: httpx.Client) -> None:
    options = {"overflow": "truncate", "max_tokens": 32}
    x = post(http, {"query": QUERY, "documents": ["word " * 300], "options": options}).json()["results"][0]
    usage = x["input"]
    assert usage["processed_tokens"] == 32 and usage["truncated"] is True
    # read only as far as the budget needs: all 302 tokens, or a lower bound past the budget
    assert usage["tokens"] == 302 or (usage.get("tokens_lower_bound") is True and 32 < usage["tokens"] < 302)
    kept = post(http, {"query": QUERY, "documents": ["word " * 30]}).json()["results"][0]  # 30 words + 2 specials
    assert x["logit"] == pytest.approx(kept["logit"], abs=1e-5)
    long_query = post(http, {"query": "word " * 300, "documents": ["word"], "options": options}).json()
    assert long_query["usage"]["input_tokens"] > 32 + 3  # the truncated query counts what was read of it


def test_max_tokens_applies_to_each_text_and_the_card_limit_at_their_edges(http: httpx.Client) -> None:
    small = {"max_tokens": 10}
    r = post(http, {"query": "word " * 8, "documents": ["word " * 8, "word " * 9], "options": small}).json()
    assert [x.get("error") for x in r["results"]] == [None, "max_length_exceeded"]
    over = post(http, {"query": "word " * 9, "documents": ["x"], "options": small})
    assert over.status_code == 400 and over.json()["error"]["code"] == "invalid_request"
    assert over.json()["error"]["message"].startswith("query: ")
    edge = post(http, {"query": "x", "documents": ["word " * 254, "word " * 255]}).json()["results"]
    assert edge[0]["input"]["tokens"] == 256 and edge[1]["error"] == "max_length_exceeded"
    assert post(http, {"query": "x", "documents": ["y"], "options": {"max_tokens": 256}}).status_code == 200
    too_big = post(http, {"query": "x", "documents": ["y"], "options": {"max_tokens": 257}})
    assert too_big.status_code == 400 and "max_input_tokens 256" in too_big.json()["error"]["message"]


def test_max_inputs_per_request_is_enforced_at_its_edge(http: httpx.Client) -> None:
    # empty documents fail alone without running, which keeps this cheap: only "y" and the query are embedded
    r = post(http, {"query": "x", "documents": [""] * 2047 + ["y"], "top_n": 1})
    assert r.status_code == 200
    results = r.json()["results"]
    assert results[0]["index"] == 2047 and len(results) == 2048
    assert {x["error"] for x in results[1:]} == {"invalid_input"}
    r = post(http, {"query": "x", "documents": ["y"] * 2049})
    assert r.status_code == 400 and "2048" in r.json()["error"]["message"]


@pytest.mark.parametrize("body, fragment", [
    ({"query": "", "documents": ["a"]}, "query"),
    ({"documents": ["a"]}, "query"),
    ({"query": "q"}, "documents"),
    ({"query": "q", "documents": []}, "documents"),
    ({"query": "q", "documents": "a"}, "documents"),
    ({"query": "q", "documents": [1]}, "documents[0]"),
    ({"query": 5, "documents": ["a"]}, "query"),
    ({"query": "q", "documents": ["a"], "top_n": 0}, "top_n"),
    ({"query": "q", "documents": ["a"], "top_n": "1"}, "top_n"),
    ({"query": "q", "documents": ["a"], "return_documents": 1}, "return_documents"),
    ({"query": "q", "documents": ["a"], "options": {"overflow": "window"}}, "overflow"),
    ({"query": "q", "documents": ["a"], "options": {"max_tokens": 0}}, "max_tokens"),
    ({"query": "q", "documents": ["a"], "extra": 1}, "unknown member: extra"),
    ({"query": "q", "documents": ["a"], "options": {"stream": True}}, "unknown member: options.stream"),
])
def test_invalid_requests_get_400_naming_the_problem(http: httpx.Client, body: Any, fragment: str) -> None:
    r = post(http, body)
    assert r.status_code == 400 and r.json()["error"]["code"] == "invalid_request"
    assert fragment in r.json()["error"]["message"]


def test_an_unknown_model_is_404(http: httpx.Client) -> None:
    r = post(http, {"model": "nope", "query": "q", "documents": ["a"]})
    assert r.status_code == 404 and r.json()["error"]["code"] == "model_not_found"


def test_return_meta_says_what_answered(http: httpx.Client) -> None:
    meta = post(http, {"query": "q", "documents": ["a"], "options": {"return_meta": True}}).json()["meta"]
    assert meta["model_id"] == MODEL and len(meta["model_sha256"]) == 64 and meta["compute_ms"] > 0


def test_a_deadline_that_has_passed_fails_every_document(http: httpx.Client) -> None:
    r = post(http, {"query": "q", "documents": ["a", "b"], "options": {"deadline_ms": 0.001}}).json()
    assert [x["error"] for x in r["results"]] == ["deadline_exceeded", "deadline_exceeded"]
    assert r["usage"]["input_tokens"] == 0


# -- cross-encoder (random-weight fixture, its own `sr-gateway serve`: conftest.fixtures_served) -------------
@pytest.fixture(scope="module")
def cross(fixtures_served: Served) -> Served:
    return fixtures_served


@pytest.fixture(scope="module")
def cross_http(cross: Served) -> Iterator[httpx.Client]:
    with httpx.Client(base_url=cross.url, timeout=60) as client:
        yield client


@pytest.fixture(scope="module")
def reference(cross: Served) -> tuple[TextEncoder, ort.InferenceSession]:
    """The same tokenizer and graph, run in-process: what the gateway must reproduce."""
    version = cross.repo / CROSS / "1"
    encoder = TextEncoder(Tokenizer.from_file(str(version / "tokenizer.json")))
    return encoder, ort.InferenceSession(str(version / "model.onnx"), providers=["CPUExecutionProvider"])


def ort_logit(session: ort.InferenceSession, ids: list[int], type_ids: list[int]) -> float:
    a = np.array([ids], dtype=np.int64)
    feed = {"input_ids": a, "attention_mask": np.ones_like(a), "token_type_ids": np.array([type_ids], dtype=np.int64)}
    return float(session.run(None, feed)[0][0, 0])


def test_cross_encoder_logits_equal_onnx_runtime_on_the_same_pair_encoding(
        cross_http: httpx.Client, reference: tuple[TextEncoder, ort.InferenceSession]) -> None:
    encoder, session = reference
    request = {"model": CROSS, "query": QUERY, "documents": DOCS, "return_documents": True}
    body = post(cross_http, request, model=CROSS).json()
    results = body["results"]
    assert body["model"] == CROSS and sorted(x["index"] for x in results) == list(range(len(DOCS)))
    assert_sorted(results)
    tokens = 0
    types_matter = False
    for x in results:
        enc = encoder.encode_pair(QUERY, DOCS[x["index"]], max_tokens=256)
        want = ort_logit(session, enc.ids, enc.type_ids)
        assert x["logit"] == pytest.approx(want, abs=1e-4)
        assert x["relevance_score"] == pytest.approx(sigmoid(x["logit"]), abs=1e-9)
        assert x["input"] == {"tokens": len(enc.ids), "processed_tokens": len(enc.ids), "truncated": False}
        assert x["document"] == {"text": DOCS[x["index"]]}
        tokens += len(enc.ids)
        types_matter |= abs(ort_logit(session, enc.ids, [0] * len(enc.ids)) - want) > 1e-3
    assert body["usage"] == {"input_tokens": tokens, "output_tokens": 0}
    assert types_matter, "the token type ids should change the fixture's logits (else this test proves nothing)"
    assert len({round(x["logit"], 4) for x in results}) == len(DOCS), "the fixture should tell documents apart"


def test_cross_encoder_truncation_keeps_the_query_whole_and_cuts_the_document(
        cross_http: httpx.Client, reference: tuple[TextEncoder, ort.InferenceSession]) -> None:
    encoder, session = reference
    query = " ".join(f"query{i}" for i in range(20))  # longer than half the room: longest-first would cut it
    q_ids = encoder.encode(query, max_tokens=256).ids[1:-1]
    doc = "word " * 100
    options = {"overflow": "truncate", "max_tokens": 48}
    x = post(cross_http, {"query": query, "documents": [doc], "options": options}, model=CROSS).json()["results"][0]
    room = 48 - 3 - len(q_ids)
    assert 0 < room < len(q_ids)
    ids = [101, *q_ids, 102, *[2773] * room, 102]  # 2773 = "word"
    type_ids = [0] * (len(q_ids) + 2) + [1] * (room + 1)
    assert x["input"] == {"tokens": len(q_ids) + 100 + 3, "processed_tokens": 48, "truncated": True}
    assert x["logit"] == pytest.approx(ort_logit(session, ids, type_ids), abs=1e-4)


def test_cross_encoder_budget_is_per_pair_under_reject(cross_http: httpx.Client) -> None:
    options = {"max_tokens": 12}  # "q" takes 1 token: [CLS] q [SEP] ... [SEP] leaves 8 for a document
    request = {"query": "q", "documents": ["word " * 8, "word " * 9, ""], "options": options}
    body = post(cross_http, request, model=CROSS).json()
    assert [(x["index"], x.get("error")) for x in body["results"]] == [
        (0, None), (1, "max_length_exceeded"), (2, "invalid_input")]
    assert body["results"][0]["input"]["tokens"] == 12
    full = post(cross_http, {"query": "word " * 9, "documents": ["x"], "options": options}, model=CROSS)
    assert full.status_code == 400 and full.json()["error"]["message"].startswith("query: ")
