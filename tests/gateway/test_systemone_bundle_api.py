"""/v1/systemone(/batch) in both schemas, /v1/bundle, overload at the edge of --max-queue, client disconnects and
the result cache — through real gateways on the session's real Triton.

The session gateway speaks vllm-sr/5.0. Two more gateways share the session's Triton (no model is loaded twice):
one in vllm-sr/4.0 with the result cache on for approximate models, and one in vllm-sr/5.0 with a small
--max-queue and --max-bundle-tasks, so the limits can be reached with small requests.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Iterator
from typing import Any

import httpx
import pytest
from prometheus_client.parser import text_string_to_metric_families

from .conftest import NLI, Served, serve_gateway, settled_stats, wait_for
from .contract import check, timings

MODEL = "decision-zeroshot"
MODELS = "all-minilm-l6-v2,pii-rampart,decision-zeroshot,domain-zeroshot"
GOOD = {"type": "noul", "instructions": "Is this a question about cooking?"}
BAD = {"type": "noul", "instructions": "Is it?", "colour": "red"}
SMALL_QUEUE = 64


def metric(url: str, name: str, **labels: str) -> float:
    text = httpx.get(url + "/metrics", timeout=5).text
    return sum(s.value for f in text_string_to_metric_families(text) for s in f.samples
               if s.name == name and all(s.labels.get(k) == v for k, v in labels.items()))


def _serve(triton_url: str, name: str, *flags: str) -> Iterator[str]:
    yield from serve_gateway(triton_url, name, "--models", MODELS, *flags, timeout=180)


@pytest.fixture(scope="module")
def v4(triton_url: str) -> Iterator[str]:
    yield from _serve(triton_url, "gateway-4.0.log", "--systemone-schema", "vllm-sr/4.0", "--result-cache", "all")


@pytest.fixture(scope="module")
def small(triton_url: str) -> Iterator[str]:
    yield from _serve(triton_url, "gateway-small.log", "--max-queue", str(SMALL_QUEUE), "--max-bundle-tasks", "2")


def systemone(url: str, body: Any, path: str = "/v1/systemone", headers: dict[str, str] | None = None
              ) -> httpx.Response:
    if isinstance(body, dict) and "model" not in body and "requests" not in body:
        body = {"model": MODEL, **body}
    r = httpx.post(url + path, json=body, headers=headers, timeout=60)
    check(path, "post", r.status_code, r.json(), r.headers)
    timings(r)
    return r


# -- System One --------------------------------------------------------------------------------------------------
def test_systemone_answers_like_decisions_when_every_question_succeeds(gateway_url: str) -> None:
    body = {"state": "How do I bake sourdough bread?", "questions": {"q": GOOD}}
    one = systemone(gateway_url, body)
    assert one.status_code == 200
    plain = httpx.post(gateway_url + "/v1/decisions", json={"model": MODEL, **body}).json()
    assert one.json()["answers"].keys() == plain["answers"].keys()
    assert abs(one.json()["answers"]["q"]["noul"] - plain["answers"]["q"]["noul"]) < 1e-4


def test_one_failed_question_fails_the_request_as_a_whole_in_both_schemas(gateway_url: str, v4: str) -> None:
    body = {"state": "hi", "questions": {"good": GOOD, "bad": BAD, "worse": {"type": "score", "instructions": "x",
                                                                           "levels": ["one"]}}}
    five, four = systemone(gateway_url, body), systemone(v4, body)
    assert five.status_code == four.status_code == 422
    f = five.json()
    assert f["code"] == "question_failed" and f["question_error"] == "invalid_question" and f["question"] == "bad"
    assert [d["loc"][-1] for d in f["detail"]] == ["bad", "worse"] and "error" not in f
    g = four.json()
    assert g["error"]["code"] == "question_failed" and g["error"]["question"] == "bad"
    assert "bad: invalid_question" in g["error"]["message"] and "worse: invalid_question" in g["error"]["message"]
    assert g["detail"] == f["detail"] and g["code"] == f["code"] and g["question"] == "bad"


@pytest.mark.parametrize(("state", "question", "status", "code"), [
    ("word " * 6000, {"type": "noul", "instructions": "Long?"}, 400, "scan_budget_exceeded"),
    ("hi", {"type": "span", "instructions": "x", "labels": [{"key": "COLOUR", "description": "a colour"}]}, 422,
     "invalid_question"),
    # decision-zeroshot's card reads video and lists box, so a box at a time with no video in the state is
    # box_needs_image (box_unsupported on a card without box is in test_videos_api)
    ("hi", {"type": "box", "instructions": "find it", "at": 2.5}, 422, "box_needs_image"),
])
def test_a_failed_question_sets_the_status_of_the_whole_request(gateway_url: str, state: str,
                                                                 question: dict[str, Any], status: int, code: str
                                                                 ) -> None:
    r = systemone(gateway_url, {"state": state, "questions": {"q": question}})
    assert r.status_code == status and r.json()["question_error"] == code


def test_a_deadline_that_passed_is_504(gateway_url: str) -> None:
    r = systemone(gateway_url, {"state": "hi", "questions": {"q": GOOD}, "options": {"deadline_ms": 0.001}})
    assert r.status_code == 504 and r.json()["question_error"] == "deadline_exceeded"


def test_whole_request_errors_take_each_schemas_shape(gateway_url: str, v4: str) -> None:
    unknown = {"model": "nope", "state": "hi", "questions": {"q": GOOD}}
    five, four = systemone(gateway_url, unknown), systemone(v4, unknown)
    assert five.status_code == four.status_code == 404
    assert five.json()["code"] == "model_not_found" and MODEL in five.json()["detail"]
    assert four.json()["error"]["code"] == "model_not_found" and MODEL in four.json()["detail"]
    assert four.json()["error"]["message"] == four.json()["detail"] and four.json()["code"] == "model_not_found"
    extra = {"state": "hi", "questions": {"q": GOOD}, "extra": 1}
    assert "extra" in systemone(gateway_url, extra).json()["detail"]


def test_vllm_sr_5_reads_an_object_state_without_roles_as_parts_without_roles(gateway_url: str, v4: str) -> None:
    q = {"type": "choice", "instructions": "Topic?", "criteria": {"cooking": "Baking and cooking",
                                                                   "finance": "Money and banks"}}
    state = {"request": "How do I bake bread?", "candidate": "Mix flour, water and yeast."}
    five = systemone(gateway_url, {"state": state, "questions": {"q": q}}).json()["answers"]["q"]
    no_roles = httpx.post(gateway_url + "/v1/decisions", json={"model": MODEL, "state": state, "roles": None,
                                                               "questions": {"q": q}}).json()["answers"]["q"]
    keyed = systemone(v4, {"state": state, "questions": {"q": q}}).json()["answers"]["q"]
    assert five["probabilities"] == no_roles["probabilities"] != keyed["probabilities"]


def test_long_context_is_turned_on_by_the_option_or_the_header(fixtures_served: Served) -> None:
    body = {"model": NLI, "state": "word " * 100, "questions": {"q": {"type": "noul", "instructions": "Long?"}}}
    r = systemone(fixtures_served.url, body)
    assert r.status_code == 400 and r.json()["question_error"] == "max_length_exceeded"
    assert r.json()["reason"] == "question_tokens"
    header = systemone(fixtures_served.url, body, headers={"TypeSafe-Danger-Zone-Long-Context": "true"})
    option = systemone(fixtures_served.url, {**body, "options": {"long_context": True}})
    assert header.status_code == option.status_code == 200
    assert header.json()["answers"]["q"]["noul"] == option.json()["answers"]["q"]["noul"]


def test_the_batch_answers_each_request_as_if_sent_alone(gateway_url: str) -> None:
    good = {"model": MODEL, "state": "How do I bake bread?", "questions": {"q": GOOD}}
    bad = {"model": MODEL, "state": "hi", "questions": {"q": BAD}}
    r = systemone(gateway_url, {"requests": {"good": good, "bad": bad, "gone": {**good, "model": "nope"}}},
                  "/v1/systemone/batch")
    out = r.json()["responses"]
    assert list(out) == ["good", "bad", "gone"]
    alone = {name: systemone(gateway_url, body) for name, body in (("good", good), ("bad", bad))}
    for name, response in alone.items():
        assert out[name]["status"] == response.status_code
        if response.status_code == 200:
            assert abs(out[name]["body"]["answers"]["q"]["noul"] - response.json()["answers"]["q"]["noul"]) < 1e-4
        else:
            assert out[name]["body"] == response.json()
    assert out["gone"]["status"] == 404


def test_models_shows_the_schema_the_process_limits_and_the_served_models(gateway_url: str, v4: str) -> None:
    body = httpx.get(gateway_url + "/v1/models").json()
    check("/v1/models", "get", 200, body)
    assert body["systemone_schema"] == "vllm-sr/5.0" and httpx.get(v4 + "/v1/models").json()[
        "systemone_schema"] == "vllm-sr/4.0"
    assert body["limits"]["max_bundle_tasks"] == 64 and body["limits"]["max_request_bytes"] == 8_388_608
    assert MODEL in body["models"]


# -- bundle ----------------------------------------------------------------------------------------------------------
def bundle(url: str, body: Any) -> httpx.Response:
    r = httpx.post(url + "/v1/bundle", json=body, timeout=60)
    check("/v1/bundle", "post", r.status_code, r.json(), r.headers)
    timings(r)
    return r


def test_a_bundle_answers_every_task_in_order_with_the_status_it_would_have_had_alone(gateway_url: str) -> None:
    tasks = [
        {"id": "domain", "classify": {"model": "domain-zeroshot", "input": ["What is 2 + 2?"]}},
        {"id": "kind", "decisions": {"model": MODEL, "state": "What is 2 + 2?", "questions": {"math": GOOD}}},
        {"id": "gone", "classify": {"model": "nope", "input": ["x"]}},
        {"id": "bad", "embeddings": {"model": "all-minilm-l6-v2", "input": []}},
        {"id": "vec", "embeddings": {"model": "all-minilm-l6-v2", "input": "hello"}},
    ]
    r = bundle(gateway_url, {"tasks": tasks, "options": {"deadline_ms": 30000}})
    results = r.json()["results"]
    assert [x["id"] for x in results] == ["domain", "kind", "gone", "bad", "vec"]
    assert [x["status"] for x in results] == [200, 200, 404, 400, 200]
    assert results[0]["classify"]["results"][0]["label"] == "math"
    alone = httpx.post(gateway_url + "/v1/decisions", json=tasks[1]["decisions"]).json()
    assert abs(results[1]["decisions"]["answers"]["math"]["noul"] - alone["answers"]["math"]["noul"]) < 1e-4
    assert results[2]["error"]["code"] == "model_not_found" and timings(r)["forward"] > 0


def test_the_bundle_deadline_applies_unless_a_tasks_own_is_earlier(gateway_url: str) -> None:
    task = {"model": MODEL, "state": "x", "questions": {"q": GOOD}}
    r = bundle(gateway_url, {"tasks": [{"id": "a", "decisions": task},
                                       {"id": "b", "decisions": {**task, "options": {"deadline_ms": 0.001}}}],
                             "options": {"deadline_ms": 30000}}).json()["results"]
    assert "noul" in r[0]["decisions"]["answers"]["q"]
    assert r[1]["decisions"]["answers"]["q"]["error"] == "deadline_exceeded"
    late = bundle(gateway_url, {"tasks": [{"id": "a", "decisions": task}], "options": {"deadline_ms": 0.001}})
    assert late.json()["results"][0]["decisions"]["answers"]["q"]["error"] == "deadline_exceeded"


@pytest.mark.parametrize(("body", "message"), [
    ({"tasks": []}, "non-empty"),
    ({}, "non-empty"),
    ({"tasks": [{"id": "a", "classify": {"input": "x"}}, {"id": "a", "classify": {"input": "y"}}]}, "twice"),
    ({"tasks": [{"id": "a", "classify": {"input": "x"}, "rerank": {"query": "q", "documents": ["d"]}}]},
     "exactly one of"),
    ({"tasks": [{"id": "", "classify": {"input": "x"}}]}, "id must be"),
    ({"tasks": [{"id": "a", "classify": {"input": "x"}}], "extra": 1}, "extra"),
    ({"tasks": [{"id": "a", "classify": {"input": "x"}}], "options": {"deadline_ms": 0}}, "deadline_ms"),
    ({"tasks": [{"id": "a", "classify": {"input": "x"}}], "options": {"deadline_ms": None}}, "deadline_ms"),
])
def test_a_malformed_bundle_is_400(gateway_url: str, body: dict[str, Any], message: str) -> None:
    r = bundle(gateway_url, body)
    assert r.status_code == 400 and message in r.json()["error"]["message"]


def test_a_bundle_over_max_bundle_tasks_is_413_and_at_the_limit_is_answered(small: str) -> None:
    task = {"embeddings": {"model": "all-minilm-l6-v2", "input": "x"}}
    ok = bundle(small, {"tasks": [{"id": str(i), **task} for i in range(2)]})
    over = bundle(small, {"tasks": [{"id": str(i), **task} for i in range(3)]})
    assert ok.status_code == 200 and over.status_code == 413
    assert over.json()["error"]["code"] == "request_too_large"


# -- overload at the edge of --max-queue -------------------------------------------------------------------------
async def _hold_queue(url: str, inputs: int) -> httpx.Response:
    long = "token " * 250
    async with httpx.AsyncClient(timeout=120) as client:
        return await client.post(url + "/v1/embeddings", json={"model": "all-minilm-l6-v2",
                                                               "input": [f"{i} {long}" for i in range(inputs)]})


async def _while_queue_is_full(url: str) -> tuple[httpx.Response, list[httpx.Response]]:
    holder = asyncio.create_task(_hold_queue(url, SMALL_QUEUE))
    deadline = time.monotonic() + 60
    while metric(url, "sr_gateway_queue_depth", model="all-minilm-l6-v2") < SMALL_QUEUE:
        assert time.monotonic() < deadline and not holder.done(), "the queue never filled"
        await asyncio.sleep(0.01)
    async with httpx.AsyncClient(timeout=60) as client:
        tries = await asyncio.gather(
            client.post(url + "/v1/embeddings", json={"model": "all-minilm-l6-v2", "input": "one more"}),
            client.post(url + "/v1/decisions", json={"model": "decision-zeroshot", "state": "x",
                                                     "questions": {"q": GOOD}}),
            client.post(url + "/v1/systemone", json={"model": "decision-zeroshot", "state": "x",
                                                     "questions": {"q": GOOD}}),
        )
    return await holder, list(tries)


def test_a_full_queue_answers_429_with_retry_after_and_systemone_5_answers_529(small: str) -> None:
    held, (embed, decide, sysone) = asyncio.run(_while_queue_is_full(small))
    assert held.status_code == 200  # exactly --max-queue inputs fit
    assert embed.status_code == 429 and embed.headers["Retry-After"] == "1"
    assert embed.json()["error"]["code"] == "overloaded"
    # decision-zeroshot reads through the same Triton model, so it shares that queue
    assert decide.status_code == 429 and decide.headers["Retry-After"] == "1"
    assert sysone.status_code == 529 and sysone.headers["Retry-After"] == "1" and sysone.json()["code"] == "overloaded"
    over = httpx.post(small + "/v1/embeddings", json={"model": "all-minilm-l6-v2",
                                                      "input": ["x"] * (SMALL_QUEUE + 1)})
    assert over.status_code == 413


# -- disconnects ---------------------------------------------------------------------------------------------------
# (the first test here runs before any test that leaves cancelled work behind on prompt-guard)
def test_inputs_of_a_client_that_went_away_are_never_run_by_triton(gateway_url: str, triton_url: str) -> None:
    """Cancelling reaches Triton: the inputs of a disconnected client still waiting in Triton's queue are dropped
    by the model (they fail as cancelled), not computed for nobody."""
    import tritonclient.grpc as grpcclient
    import tritonclient.grpc.aio as grpcaio

    triton = grpcclient.InferenceServerClient(triton_url)

    def ran_and_failed(stats: dict[str, Any]) -> tuple[int, int]:
        """(inputs run, requests failed): the gateway sends inputs in hand together as one request of rows."""
        return int(stats.get("inference_count", 0)), int(stats["inference_stats"].get("fail", {}).get("count", 0))

    def counts() -> tuple[int, int]:
        return ran_and_failed(triton.get_inference_statistics("prompt-guard", as_json=True)["model_stats"][0])

    async def scenario() -> None:
        async with httpx.AsyncClient(timeout=120) as client:
            def classify(n: int, tag: str) -> Any:
                return client.post(gateway_url + "/v1/classify", json={
                    "model": "prompt-guard", "input": [f"{tag} {i} {time.time()}" for i in range(n)]})

            holder = asyncio.create_task(classify(32, "hold"))
            while metric(gateway_url, "sr_gateway_queue_depth", model="prompt-guard") < 32:
                await asyncio.sleep(0.005)
            victim = asyncio.create_task(classify(16, "gone"))
            while metric(gateway_url, "sr_gateway_queue_depth", model="prompt-guard") < 48:
                assert not victim.done()
                await asyncio.sleep(0.005)
            victim.cancel()
            assert (await holder).status_code == 200

    def settled() -> tuple[int, int]:
        """Triton's counts once earlier tests' cancelled work has been accounted for."""
        async def read() -> dict[str, Any]:
            client = grpcaio.InferenceServerClient(triton_url)
            try:
                return await settled_stats(client, "prompt-guard", timeout=60)
            finally:
                await client.close()

        return ran_and_failed(asyncio.run(read()))

    before = settled()
    asyncio.run(scenario())
    wait_for(lambda: counts()[0] - before[0] >= 32 and counts()[1] > before[1], 60,
             "Triton to run the 32 held inputs and drop the other request")
    ran, dropped = (a - b for a, b in zip(settled(), before, strict=True))
    assert ran == 32 and dropped >= 1, (ran, dropped)  # not one of the 16 inputs of the client that left ran


async def _disconnect(url: str, path: str, body: dict[str, Any], model: str) -> None:
    async with httpx.AsyncClient(timeout=120) as client:
        task = asyncio.create_task(client.post(url + path, json=body))
        deadline = time.monotonic() + 60
        while metric(url, "sr_gateway_queue_depth", model=model) == 0:
            assert time.monotonic() < deadline and not task.done(), "the request never reached Triton"
            await asyncio.sleep(0.005)
        task.cancel()  # the client goes away while its inputs are in Triton
        with pytest.raises(asyncio.CancelledError):
            await task


@pytest.mark.parametrize(("endpoint", "body", "model"), [
    ("decisions", {"model": MODEL, "states": {str(i): {"state": f"{i} " + "token " * 250, "questions": {"q": GOOD}}
                                              for i in range(48)}}, "all-minilm-l6-v2"),
    ("classify", {"model": "prompt-guard", "input": [f"{i} text" for i in range(48)]}, "prompt-guard"),
    ("bundle", {"tasks": [{"id": "a", "classify": {"model": "prompt-guard", "input": [f"{i} t" for i in range(48)]}}]},
     "prompt-guard"),
])
def test_a_client_that_disconnects_cancels_its_work_and_is_counted_as_499(gateway_url: str, endpoint: str,
                                                                           body: dict[str, Any], model: str) -> None:
    before = metric(gateway_url, "sr_gateway_requests_total", endpoint=endpoint, status="499")
    asyncio.run(_disconnect(gateway_url, f"/v1/{endpoint}", body, model))
    wait_for(lambda: metric(gateway_url, "sr_gateway_requests_total", endpoint=endpoint, status="499") > before,
             30, "the 499 count")
    wait_for(lambda: metric(gateway_url, "sr_gateway_queue_depth", model=model) == 0, 30, "the queue to drain")
    assert httpx.get(gateway_url + "/health").json()["status"] == "ready"


# -- result cache --------------------------------------------------------------------------------------------------
def test_the_result_cache_answers_repeated_questions_without_the_model(v4: str, gateway_url: str) -> None:
    body = {"model": MODEL, "state": f"Cache me {time.time()}", "questions": {"q": GOOD}}
    hits = metric(v4, "sr_gateway_result_cache_total", model=MODEL, result="hit")
    first = httpx.post(v4 + "/v1/decisions", json=body)
    second = httpx.post(v4 + "/v1/decisions", json=body)
    assert first.json() == second.json()
    assert timings(first)["forward"] > 0 and timings(second)["forward"] == 0
    assert metric(v4, "sr_gateway_result_cache_total", model=MODEL, result="hit") == hits + 1
    # the session gateway keeps the default policy: approximate models are not cached
    httpx.post(gateway_url + "/v1/decisions", json=body)
    assert timings(httpx.post(gateway_url + "/v1/decisions", json=body))["forward"] > 0


def test_identical_inputs_across_a_bundles_tasks_for_one_model_run_once(gateway_url: str, triton_url: str) -> None:
    import tritonclient.grpc.aio as grpcaio

    async def count(inferences: int | None = None) -> int:
        client = grpcaio.InferenceServerClient(triton_url)
        try:
            return int((await settled_stats(client, "pii-rampart", inferences)).get("inference_count", 0))
        finally:
            await client.close()

    text = f"Write to jane.doe@example.com at {time.time()}"  # pii-rampart: no other test here cancels its work
    task = {"classify": {"model": "pii-rampart", "input": [text]}}
    before = asyncio.run(count())
    r = bundle(gateway_url, {"tasks": [{"id": "a", **task}, {"id": "b", **task}, {"id": "c", **task}]})
    results = r.json()["results"]
    assert [x["status"] for x in results] == [200, 200, 200]
    assert results[0]["classify"]["results"] == results[1]["classify"]["results"] == results[2]["classify"]["results"]
    assert asyncio.run(count(before + 1)) == before + 1  # one model input for the three tasks
    httpx.post(gateway_url + "/v1/classify", json=task["classify"])
    httpx.post(gateway_url + "/v1/classify", json=task["classify"])
    assert asyncio.run(count(before + 3)) == before + 3  # separate requests are not merged


def test_a_body_that_is_not_json_gets_the_schemas_error_shape_too(gateway_url: str, v4: str) -> None:
    for url, path in ((gateway_url, "/v1/systemone"), (v4, "/v1/systemone"), (gateway_url, "/v1/systemone/batch")):
        r = httpx.post(url + path, content=b"{", headers={"Content-Type": "application/json"})
        check(path, "post", r.status_code, r.json(), r.headers)
        assert r.status_code == 400 and r.json()["code"] == "invalid_request" and "not JSON" in r.json()["detail"]
    assert "error" in httpx.post(v4 + "/v1/systemone", content=b"{").json()
