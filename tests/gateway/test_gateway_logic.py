"""The gateway's own logic in milliseconds, over real HTTP, with an in-process engine injected through
`create_app(settings, engine=...)` behind the same coalescer as Triton (tests/gateway/fake_engine.py): admission and
its 413/429 edges, deadlines, cancellation on disconnect, item errors and out-of-memory statuses. Model behaviour is
tested against the real tritonserver elsewhere."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator
from dataclasses import dataclass
from typing import Any

import pytest
from aiohttp.test_utils import TestClient

from gateway.surfaces.common import RUNTIME_KEY
from gateway.triton import TritonFailure

from .fake_engine import FakeEngine, served_by_fake, until

MODEL = "all-minilm-l6-v2"
LONG = 12  # inputs with more ids than this are "long" for the fake's rules


@dataclass
class Stack:
    client: TestClient  # type: ignore[type-arg]
    engine: FakeEngine

    async def embed(self, texts: list[str], **options: Any) -> tuple[int, dict[str, Any], Any]:
        body: dict[str, Any] = {"model": MODEL, "input": texts}
        if options:
            body["options"] = options
        r = await self.client.post("/v1/embeddings", json=body)
        return r.status, await r.json(), r.headers


@pytest.fixture
async def stack() -> AsyncIterator[Stack]:
    async with served_by_fake(MODEL, max_queue=4) as (client, engine):
        try:
            yield Stack(client, engine)
        finally:
            engine.release.set()


async def test_admission_is_413_past_max_queue_and_429_when_full_then_recovers(stack: Stack) -> None:
    stack.engine.hold = lambda ids: True
    held = asyncio.create_task(stack.embed(["a", "b", "c"]))
    await until(lambda: stack.engine.started == 3, "three inputs in the engine")
    status, body, headers = await stack.embed(["d", "e"])
    assert status == 429 and body["error"]["code"] == "overloaded" and headers["Retry-After"] == "1"
    too_many, body, _ = await stack.embed(["x"] * 5)
    assert too_many == 413 and body["error"]["code"] == "request_too_large"
    stack.engine.release.set()
    assert (await held)[0] == 200


async def test_exactly_max_queue_inputs_fit_and_admission_frees_them_once_answered(stack: Stack) -> None:
    stack.engine.hold = lambda ids: len(ids) > 3
    held = asyncio.create_task(stack.embed(["one two three four five six"] * 4))
    await until(lambda: stack.engine.started == 4, "the queue full")
    assert (await stack.embed(["x"]))[0] == 429
    stack.engine.release.set()
    assert (await held)[0] == 200
    assert (await stack.embed(["x"]))[0] == 200


async def test_an_input_whose_deadline_passes_in_the_engine_fails_alone(stack: Stack) -> None:
    stack.engine.delay_s = 0.05
    status, body, _ = await stack.embed(["a", "b"], deadline_ms=10)
    assert status == 200 and [d["error"] for d in body["data"]] == ["deadline_exceeded"] * 2
    status, body, _ = await stack.embed(["a"], deadline_ms=5000)
    assert status == 200 and "embedding" in body["data"][0]


async def test_a_disconnect_cancels_every_engine_call_and_is_counted_as_499(stack: Stack) -> None:
    stack.engine.hold = lambda ids: True
    call = asyncio.create_task(stack.client.post("/v1/embeddings", json={"model": MODEL, "input": ["a", "b", "c"]}))
    await until(lambda: stack.engine.started == 3, "three inputs in the engine")
    call.cancel()
    await until(lambda: stack.engine.cancelled == 3, "every engine call cancelled")
    metrics = await (await stack.client.get("/metrics")).text()
    assert 'sr_gateway_requests_total{endpoint="embeddings",status="499"} 1.0' in metrics
    assert 'sr_gateway_queue_depth{model="all-minilm-l6-v2"} 0.0' in metrics


async def test_an_engine_failure_fails_only_its_input(stack: Stack) -> None:
    stack.engine.fail = lambda ids: TritonFailure("the forward crashed") if len(ids) > LONG else None
    status, body, _ = await stack.embed(["short", "a much longer input with many more words in it than twelve ids"])
    assert status == 200
    assert "embedding" in body["data"][0] and body["data"][1]["error"] == "invalid_model_output"
    stack.engine.fail = lambda ids: TritonFailure("model is not ready", unavailable=True)
    status, body, _ = await stack.embed(["short"])
    assert status == 200 and body["data"][0]["error"] == "unavailable"


async def test_out_of_memory_is_413_for_a_request_alone_and_429_when_it_shared_the_model(stack: Stack) -> None:
    oom = TritonFailure("CUDA out of memory", out_of_memory=True)
    stack.engine.fail = lambda ids: oom if len(ids) > LONG else None
    long = "a much longer input with many more words in it than twelve ids"
    status, body, _ = await stack.embed([long])
    assert status == 413 and body["error"]["code"] == "request_too_large"
    stack.engine.hold = lambda ids: len(ids) <= LONG
    other = asyncio.create_task(stack.embed(["short"]))
    await until(lambda: stack.engine.started == 2, "another request in flight")
    status, body, headers = await stack.embed([long])
    assert status == 429 and body["error"]["code"] == "overloaded" and headers["Retry-After"] == "1"
    stack.engine.release.set()
    assert (await other)[0] == 200


async def test_a_failed_model_still_reports_its_limits_device_and_engine_args(stack: Stack) -> None:
    from .contract import check

    runtime = stack.client.server.app[RUNTIME_KEY]
    runtime.set_status(runtime.models[MODEL], "failed", "RuntimeError: the golden check failed")
    body = await (await stack.client.get("/v1/models")).json()
    check("/v1/models", "get", 200, body)
    card = body["data"][0]
    assert card["status"] == "failed" and card["surfaces"] == []
    assert card["limits"]["max_input_tokens"] == 256 and card["device"] == "cpu" and card["engine_args"]


async def test_a_model_not_ready_is_503_with_retry_after_5_on_every_surface(stack: Stack) -> None:
    runtime = stack.client.server.app[RUNTIME_KEY]
    runtime.set_status(runtime.models[MODEL], "loading")
    status, body, headers = await stack.embed(["x"])
    assert status == 503 and body["error"]["code"] == "not_ready" and headers["Retry-After"] == "5"
    r = await stack.client.post("/v1/bundle", json={"tasks": [{"id": "a", "embeddings": {"model": MODEL,
                                                                                          "input": "x"}}]})
    assert r.status == 200 and (await r.json())["results"][0]["status"] == 503


@pytest.mark.parametrize("surface", ["embeddings", "rerank", "classify", "image classify", "image embeddings"])
async def test_a_non_finite_model_output_fails_only_that_input_on_every_surface(surface: str) -> None:
    """The spec makes a NaN/inf readout that input's invalid_model_output; its siblings are answered (200)."""
    from .image_samples import image_part, photo

    model = {"classify": "prompt-guard", "image classify": "efficientnet-lite0",
             "image embeddings": "efficientnet-lite0"}.get(surface, MODEL)
    async with served_by_fake(model) as (client, engine):
        if surface == "classify":
            engine.dimension = len(runtime_labels(client, model))
        elif surface == "image classify":
            engine.dimension = 1000
        elif surface == "image embeddings":
            engine.dimension = 1280
        if surface.startswith("image"):
            pictures = [image_part(photo("coffee.png")), image_part(photo("rocket.jpg"), "image/jpeg")]
            engine.poison = lambda ids: engine.started == 2  # the second picture
            path = "/v1/classify" if surface == "image classify" else "/v1/embeddings"
            r = await client.post(path, json={"model": model, "input": pictures})
        else:
            engine.poison = lambda ids: len(ids) > LONG
            texts = ["short", "a much longer input with many more words in it than twelve ids"]
            if surface == "rerank":
                r = await client.post("/v1/rerank", json={"model": model, "query": "q", "documents": texts})
            else:
                r = await client.post(f"/v1/{surface}", json={"model": model, "input": texts})
        body = await r.json()
    assert r.status == 200, body
    items = body.get("data") or body.get("results")
    if surface == "rerank":  # ranked documents first, failed ones last
        assert [x["index"] for x in items] == [0, 1] and "relevance_score" in items[0]
    assert "error" not in items[0], items[0]
    assert items[1]["error"] == "invalid_model_output" and "non-finite" in items[1]["message"]


def runtime_labels(client: TestClient, model: str) -> list[str]:  # type: ignore[type-arg]
    heads = client.server.app[RUNTIME_KEY].models[model].card.heads
    assert heads is not None
    return list(heads[0].labels)
