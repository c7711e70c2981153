"""A picture's forward fails as a text's does: one execution core maps every Triton failure, so out of memory is the
request's 413 alone or 429 shared (the spec), never an item's `invalid_model_output` inside a 200. Over real HTTP
with the in-process engine behind the Triton seam (no tritonserver)."""

from __future__ import annotations

import asyncio
from typing import Any

import pytest
from PIL import Image

from gateway.triton import TritonFailure

from .fake_engine import FakeEngine, served_by_fake
from .image_samples import encode, image_part

IMAGE_MODEL = "efficientnet-lite0"
TEXT_MODEL = "all-minilm-l6-v2"
OOM = TritonFailure("CUDA out of memory. Tried to allocate 2.00 GiB", out_of_memory=True)


def picture(shade: int = 120) -> dict[str, Any]:
    return image_part(encode(Image.new("RGB", (64, 48), (shade, 80, 40))))


async def until(check: Any, what: str) -> None:
    for _ in range(500):
        if check():
            return
        await asyncio.sleep(0.01)
    raise AssertionError(f"timed out waiting for {what}")


async def _status(client: Any, path: str, body: dict[str, Any]) -> tuple[int, dict[str, Any]]:
    r = await client.post(path, json=body)
    return r.status, await r.json()


@pytest.mark.parametrize("path, body", [
    ("/v1/embeddings", {"model": TEXT_MODEL, "input": ["a text whose forward runs out of memory"]}),
    ("/v1/embeddings", {"model": IMAGE_MODEL, "input": [picture()]}),
    ("/v1/classify", {"model": IMAGE_MODEL, "input": [picture()]}),
])
async def test_a_forward_out_of_memory_alone_is_413_for_texts_and_pictures_alike(path: str,
                                                                                   body: dict[str, Any]) -> None:
    async with served_by_fake(body["model"]) as (client, engine):
        engine.fail = lambda ids: OOM
        status, answer = await _status(client, path, body)
    assert status == 413 and answer["error"]["code"] == "request_too_large"
    assert "out of memory" in answer["error"]["message"]


async def test_a_picture_out_of_memory_in_a_shared_forward_is_429_overloaded() -> None:
    async with served_by_fake(IMAGE_MODEL) as (client, engine):
        first = len(engine.calls)
        engine.hold = lambda ids: len(engine.calls) == first + 1  # the first picture waits in the model
        other = asyncio.create_task(_status(client, "/v1/embeddings", {"model": IMAGE_MODEL, "input": [picture(10)]}))
        await until(lambda: engine.started == 1, "another request in flight on the model")
        engine.fail = lambda ids: OOM
        r = await client.post("/v1/embeddings", json={"model": IMAGE_MODEL, "input": [picture(200)]})
        status, answer = r.status, await r.json()
        engine.fail = lambda ids: None
        engine.release.set()
        assert (await other)[0] == 200
    assert status == 429 and answer["error"]["code"] == "overloaded" and r.headers["Retry-After"] == "1"


@pytest.mark.parametrize("failure, code", [
    (TritonFailure("Request timeout expired", deadline=True), "deadline_exceeded"),
    (TritonFailure("model is not ready", unavailable=True), "unavailable"),
    (TritonFailure("the forward crashed"), "invalid_model_output"),
])
async def test_every_other_failure_kind_fails_only_its_picture_as_it_fails_a_text(failure: TritonFailure,
                                                                                  code: str) -> None:
    answers: dict[str, str] = {}
    for model, good, bad in ((TEXT_MODEL, "fine", "bad input"), (IMAGE_MODEL, picture(10), picture(250))):
        async with served_by_fake(model) as (client, engine):
            engine.max_rows = 0  # each text its own forward, as each picture is (coalesced rows: test_coalescing_api)
            failing = _failing_call(engine)
            engine.fail = lambda ids, failing=failing: failure if failing(ids) else None
            status, answer = await _status(client, "/v1/embeddings", {"model": model, "input": [good, bad]})
        assert status == 200 and "embedding" in answer["data"][0]
        answers[model] = answer["data"][1]["error"]
    assert answers == {TEXT_MODEL: code, IMAGE_MODEL: code}


def _failing_call(engine: FakeEngine) -> Any:
    """The second input a request sends fails: the engine asks `fail` once per input, in the order they were sent
    (asyncio wakes tasks first in, first out)."""
    asked = [0]

    def second(ids: list[int]) -> bool:
        asked[0] += 1
        return asked[0] == 2

    return second


async def test_a_bundle_runs_the_same_picture_for_one_model_once() -> None:
    async with served_by_fake(IMAGE_MODEL) as (client, engine):
        task = {"model": IMAGE_MODEL, "input": [picture(90)]}
        r = await client.post("/v1/bundle", json={"tasks": [{"id": "a", "embeddings": task},
                                                            {"id": "b", "embeddings": task}]})
        results = (await r.json())["results"]
    assert r.status == 200 and [t["status"] for t in results] == [200, 200]
    assert results[0]["embeddings"]["data"][0]["embedding"] == results[1]["embeddings"]["data"][0]["embedding"]
    assert engine.started == 1
