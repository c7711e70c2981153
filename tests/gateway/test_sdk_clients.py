"""Real client SDKs, unmodified, against the served stack: the OpenAI client (embeddings) and both Cohere clients
(v1 `Client.rerank` → POST /v1/rerank, v2 `ClientV2.rerank` → POST /v2/rerank)."""

from __future__ import annotations

import cohere
import httpx
import openai

from .contract import check

MODEL = "all-minilm-l6-v2"
QUERY = "How do I reset my password?"
DOCS = ["Our offices are closed on Sunday.", "Open Settings, then Security, and choose Reset password.",
        "Bananas are rich in potassium."]


def test_the_openai_client_embeds_through_v1(gateway_url: str) -> None:
    client = openai.OpenAI(base_url=gateway_url + "/v1", api_key="unused")
    out = client.embeddings.create(model=MODEL, input=[QUERY, DOCS[1]])
    assert [d.index for d in out.data] == [0, 1] and len(out.data[0].embedding) == 384
    assert out.usage.prompt_tokens > 0


def test_the_cohere_v1_client_reranks(gateway_url: str) -> None:
    client = cohere.Client(base_url=gateway_url, api_key="unused")
    out = client.rerank(model=MODEL, query=QUERY, documents=DOCS, top_n=2)
    assert [r.index for r in out.results] == [1, 0]
    assert out.results[0].relevance_score > out.results[1].relevance_score


def test_the_cohere_v2_client_reranks_through_v2(gateway_url: str) -> None:
    client = cohere.ClientV2(base_url=gateway_url, api_key="unused")
    out = client.rerank(model=MODEL, query=QUERY, documents=DOCS, top_n=2, max_tokens_per_doc=64)
    assert [r.index for r in out.results] == [1, 0] and 0 <= out.results[1].relevance_score <= 1
    assert out.meta is not None and out.meta.tokens is not None and out.meta.tokens.input_tokens


def test_v2_rerank_truncates_long_documents_instead_of_refusing_them_and_answers_in_the_contract(
        gateway_url: str) -> None:
    body = {"model": MODEL, "query": QUERY, "documents": ["word " * 2000, DOCS[1]], "max_tokens_per_doc": 32}
    r = httpx.post(gateway_url + "/v2/rerank", json=body)
    check("/v2/rerank", "post", r.status_code, r.json(), r.headers)
    assert r.status_code == 200 and sorted(x["index"] for x in r.json()["results"]) == [0, 1]
    bad = httpx.post(gateway_url + "/v2/rerank", json={**body, "documents": [""]})
    check("/v2/rerank", "post", bad.status_code, bad.json(), bad.headers)
    assert bad.status_code == 400 and "document 0" in bad.json()["error"]["message"]
    missing = httpx.post(gateway_url + "/v2/rerank", json={"query": QUERY, "documents": DOCS})
    assert missing.status_code == 400 and "model" in missing.json()["error"]["message"]
