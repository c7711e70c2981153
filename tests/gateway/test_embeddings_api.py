"""POST /v1/embeddings through the real gateway and the real Triton serving MiniLM."""

from __future__ import annotations

import base64

import httpx
import numpy as np
import openai
import pytest

from .conftest import MODEL, model_stats
from .contract import check, timings


def post(http: httpx.Client, body: dict, **kw) -> httpx.Response:  # type: ignore[type-arg]
    r = http.post("/v1/embeddings", json={"model": MODEL, **body}, **kw)
    check("/v1/embeddings", "post", r.status_code, r.json(), r.headers)
    return r


def vectors(r: httpx.Response) -> np.ndarray:
    return np.array([d["embedding"] for d in r.json()["data"]], dtype=np.float32)


def test_the_unmodified_openai_sdk_gets_float_and_base64_vectors_that_agree(gateway_url: str) -> None:
    client = openai.OpenAI(base_url=gateway_url + "/v1", api_key="unused")
    texts = ["How do I reset my password?", "Open Settings, then Security."]
    as_float = client.embeddings.create(model=MODEL, input=texts, encoding_format="float")
    as_b64 = client.embeddings.create(model=MODEL, input=texts)  # the SDK asks for base64 and decodes it
    assert [d.index for d in as_float.data] == [0, 1]
    assert len(as_float.data[0].embedding) == 384
    assert np.allclose(np.array(as_float.data[0].embedding), np.array(as_b64.data[0].embedding), atol=1e-6)
    assert as_float.usage.prompt_tokens == as_float.usage.total_tokens > 0


def test_base64_vectors_are_little_endian_float32(http: httpx.Client) -> None:
    text = "A man is playing a guitar."
    f = post(http, {"input": text}).json()["data"][0]["embedding"]
    b = post(http, {"input": text, "encoding_format": "base64"}).json()["data"][0]["embedding"]
    decoded = np.frombuffer(base64.b64decode(b), dtype="<f4")
    assert decoded.shape == (384,)
    assert np.allclose(decoded, np.array(f, dtype=np.float32), atol=1e-7)


def test_related_sentences_are_closer_than_unrelated_ones(http: httpx.Client) -> None:
    r = post(http, {"input": ["A man is playing a guitar.", "Someone strums an acoustic guitar.",
                              "The stock market fell sharply today.", "How do I reset my password?",
                              "I forgot my login and need to recover my account.", "Penguins live in Antarctica."]})
    v = vectors(r)
    assert np.allclose(np.linalg.norm(v, axis=1), 1.0, atol=1e-5)
    sim = v @ v.T
    assert sim[0, 1] > 0.5 > sim[0, 2]
    assert sim[3, 4] > 0.4 > sim[3, 5]


def test_a_string_input_and_a_one_item_list_give_the_same_vector(http: httpx.Client) -> None:
    a = vectors(post(http, {"input": "same text"}))
    b = vectors(post(http, {"input": ["same text"]}))
    assert np.allclose(a, b, atol=1e-6)


def test_vectors_do_not_depend_on_what_else_is_in_the_batch(http: httpx.Client) -> None:
    short = "hello"
    alone = vectors(post(http, {"input": [short]}))[0]
    mixed = vectors(post(http, {"input": ["a much longer sentence " * 20, short, "mid length text here"]}))[1]
    assert np.max(np.abs(alone - mixed)) < 1e-5


def test_usage_counts_tokens_including_special_tokens(http: httpx.Client) -> None:
    r = post(http, {"input": ["A man is playing a guitar.", "How do I reset my password?"]}).json()
    assert r["usage"] == {"prompt_tokens": 18, "total_tokens": 18}
    assert r["data"][0]["input"] == {"tokens": 9, "processed_tokens": 9, "truncated": False}


def test_an_input_over_the_budget_fails_alone_under_reject(http: httpx.Client) -> None:
    r = post(http, {"input": ["fine", "word " * 300, "also fine"]}).json()
    assert [("embedding" in d) for d in r["data"]] == [True, False, True]
    assert r["data"][1]["error"] == "max_length_exceeded"
    assert "256" in r["data"][1]["message"]
    assert r["usage"]["prompt_tokens"] == 3 + 4  # the failed input is not counted


def test_max_input_tokens_is_enforced_exactly_at_its_edge(http: httpx.Client) -> None:
    # "word" is one token; [CLS] + n words + [SEP]
    fits = post(http, {"input": "word " * 254}).json()["data"][0]
    over = post(http, {"input": "word " * 255}).json()["data"][0]
    assert fits["input"]["tokens"] == 256 and "embedding" in fits
    assert over["error"] == "max_length_exceeded"


def test_options_max_tokens_is_a_budget_enforced_at_its_edge(http: httpx.Client) -> None:
    fits = post(http, {"input": "word " * 8, "options": {"max_tokens": 10}}).json()["data"][0]
    over = post(http, {"input": "word " * 9, "options": {"max_tokens": 10}}).json()["data"][0]
    assert "embedding" in fits and over["error"] == "max_length_exceeded"
    too_big = post(http, {"input": "x", "options": {"max_tokens": 257}})
    assert too_big.status_code == 400 and "max_input_tokens 256" in too_big.json()["error"]["message"]
    assert post(http, {"input": "x", "options": {"max_tokens": 256}}).status_code == 200
    assert post(http, {"input": "x", "options": {"max_tokens": 0}}).status_code == 400


def test_truncate_keeps_the_budget_and_reports_it(http: httpx.Client) -> None:
    r = post(http, {"input": "word " * 300, "options": {"overflow": "truncate", "max_tokens": 32}}).json()
    item = r["data"][0]
    assert item["input"]["processed_tokens"] == 32 and item["input"]["truncated"] is True
    assert item["input"]["tokens"] >= 32
    kept = post(http, {"input": "word " * 30}).json()["data"][0]  # exactly the kept text: 30 words + 2 specials
    assert np.allclose(item["embedding"], kept["embedding"], atol=1e-5)


def test_a_long_input_is_read_only_as_far_as_the_budget_needs_and_says_so(http: httpx.Client) -> None:
    text = "word " * 400_000  # 2 MB: far more than any budget
    item = post(http, {"input": text, "options": {"overflow": "truncate"}}).json()["data"][0]
    usage = item["input"]
    assert usage["processed_tokens"] == 256 and usage["truncated"] is True
    assert usage.get("tokens_lower_bound") is True and 256 < usage["tokens"] < 400_000
    kept = post(http, {"input": "word " * 254}).json()["data"][0]
    assert np.allclose(item["embedding"], kept["embedding"], atol=1e-5)
    rejected = post(http, {"input": text}).json()["data"][0]
    assert rejected["error"] == "max_length_exceeded"


def test_an_empty_string_fails_alone_and_an_empty_list_fails_the_request(http: httpx.Client) -> None:
    r = post(http, {"input": ["", "ok"]}).json()
    assert r["data"][0]["error"] == "invalid_input" and "embedding" in r["data"][1]
    assert post(http, {"input": []}).status_code == 400


def test_max_inputs_per_request_is_enforced_at_its_edge(http: httpx.Client) -> None:
    assert post(http, {"input": ["x"] * 2048}).status_code == 200
    r = post(http, {"input": ["x"] * 2049})
    assert r.status_code == 400 and "2048" in r.json()["error"]["message"]


@pytest.mark.parametrize("body, fragment", [
    ({"input": "x", "dimensions": 128}, "dimensions must be one of [384]"),
    ({"input": "x", "layer": 4}, "layer must be one of [3, 6]"),
    ({"input": "x", "layer": 0}, "layer must be one of [3, 6]"),
    ({"input": "x", "input_type": "query"}, "takes no input_type"),
    ({"input": "x", "encoding_format": "int8"}, "encoding_format"),
    ({"input": "x", "options": {"overflow": "window"}}, "overflow"),
    ({"input": [1, 2]}, "input"),
    ({"input": "x", "options": {"max_tokens": "12"}}, "max_tokens"),
    ({"input": "x", "options": {"return_meta": 1}}, "return_meta"),
    ({"input": "x", "extra": 1}, "unknown member: extra"),
    ({"input": "x", "options": {"stream": True}}, "unknown member: options.stream"),
])
def test_invalid_requests_get_400_naming_the_problem(http: httpx.Client, body: dict, fragment: str) -> None:  # type: ignore[type-arg]
    r = post(http, body)
    assert r.status_code == 400
    assert r.json()["error"]["code"] == "invalid_request"
    assert fragment in r.json()["error"]["message"]


def test_declared_dimensions_and_layer_are_accepted(http: httpx.Client) -> None:
    assert post(http, {"input": "x", "dimensions": 384, "layer": 6}).status_code == 200
    assert post(http, {"input": "x", "dimensions": 384, "layer": 3}).status_code == 200


def test_an_unknown_model_is_404_listing_the_served_models(http: httpx.Client) -> None:
    r = post(http, {"model": "nope", "input": "x"})
    assert r.status_code == 404
    assert r.json()["error"]["code"] == "model_not_found"
    assert r.json()["error"]["message"].startswith("this runtime serves ") and MODEL in r.json()["error"]["message"]
    assert r.json()["error"]["message"].endswith(", not nope")


def test_a_model_that_does_not_serve_embeddings_is_422(http: httpx.Client) -> None:
    r = post(http, {"model": "pii-rampart", "input": "x"})
    assert r.status_code == 422 and r.json()["error"]["code"] == "unsupported_surface"


def test_without_a_model_name_a_multi_model_process_answers_400(http: httpx.Client) -> None:
    r = http.post("/v1/embeddings", json={"input": "x"})
    check("/v1/embeddings", "post", 400, r.json(), r.headers)
    assert r.status_code == 400 and r.json()["error"]["message"].startswith("model is required")


def test_return_meta_identifies_the_vector_space(http: httpx.Client) -> None:
    r = post(http, {"input": "x", "options": {"return_meta": True}}).json()
    rep = r["meta"]["representation"]
    assert rep["dimension"] == 384 and rep["layer"] == 6 and rep["normalized"] is True
    assert len(rep["model_sha256"]) == 64
    assert r["meta"]["compute_ms"] > 0
    assert "meta" not in post(http, {"input": "x"}).json()


def test_a_deadline_that_has_passed_fails_each_input_with_deadline_exceeded(http: httpx.Client) -> None:
    r = post(http, {"input": ["a", "b"], "options": {"deadline_ms": 0.001}}).json()
    assert [d.get("error") for d in r["data"]] == ["deadline_exceeded", "deadline_exceeded"]
    ok = post(http, {"input": ["a"], "options": {"deadline_ms": 30000}}).json()
    assert "embedding" in ok["data"][0]


def test_a_huge_request_does_not_starve_others_and_deadlines_hold_while_queued(gateway_url: str,
                                                                             triton_url: str) -> None:
    """A small request overtakes a huge one, and a deadlined input never runs after waiting past its deadline.

    Whether the late input is dropped or slips into an instance that frees up in time depends on where in a
    batch's execution it arrives, so the invariant is checked, not a lucky outcome: every late input either
    fails with `deadline_exceeded`, or it succeeded and Triton's own timing shows it waited less than its deadline.
    """
    import asyncio

    import tritonclient.grpc.aio as grpcaio

    async def executed(triton: grpcaio.InferenceServerClient) -> int:
        return int((await model_stats(triton)).get("inference_count", 0))

    async def run() -> tuple[dict, dict, httpx.Response, list[str]]:  # type: ignore[type-arg]
        done: list[str] = []
        triton = grpcaio.InferenceServerClient(triton_url)
        async with httpx.AsyncClient(base_url=gateway_url, timeout=120) as client:
            async def send(name: str, body: dict) -> httpx.Response:  # type: ignore[type-arg]
                r = await client.post("/v1/embeddings", json={"model": MODEL, **body})
                done.append(name)
                return r

            before = await executed(triton)
            busy = asyncio.create_task(send("huge", {"input": [f"keep the model busy {i} " * 40 for i in range(512)]}))
            # Wait on Triton's own count, not a fixed sleep: a slow machine may still be tokenizing the huge request
            # (then nothing would be queued ahead of the late one). Once Triton has run a few of its inputs, the
            # gateway keeps up to 64 of them queued.
            for _ in range(1200):
                if await executed(triton) >= before + 8 or busy.done():
                    break
                await asyncio.sleep(0.05)
            assert not busy.done(), "the huge request finished before the late one was sent"
            small = asyncio.create_task(send("small", {"input": ["a small request"]}))
            late = await send("late", {"input": ["short"] * 4, "options": {"deadline_ms": 150}})
            result = (await busy).json(), (await small).json(), late, done
        await triton.close()
        return result

    busy, small, late, done = asyncio.run(run())
    assert all("embedding" in d for d in busy["data"]) and "embedding" in small["data"][0]
    assert done.index("small") < done.index("huge") and done.index("late") < done.index("huge")
    outcomes = [d.get("error", "ok") for d in late.json()["data"]]
    assert set(outcomes) <= {"ok", "deadline_exceeded"}, outcomes
    if "ok" in outcomes:  # queue covers the answered inputs only; Triton checks the deadline when it forms a batch
        phases = timings(late)
        assert phases["queue"] < 150 + 25, (outcomes, phases)
