"""The coalescing path through the HTTP surface: concurrent inputs, from one request or from many, reach the engine as
one request of rows, and each row keeps its own failure, deadline and caller. The in-process engine is injected
through `create_app(settings, engine=...)`, behind the same `Inference` as Triton (no tritonserver); the engine's
`requests` (rows per request it received) is what would differ if coalescing were bypassed.

Requests "from many" are a burst: written to their sockets while the event loop is busy, as under load, so the
gateway reads them all in one pass of its loop.
"""

from __future__ import annotations

import asyncio
import http.client
import json
import socket
from collections.abc import AsyncIterator
from typing import Any

import pytest
from aiohttp.test_utils import TestClient

from gateway.triton import TritonFailure

from .fake_engine import FakeEngine, served_by_fake, until

MODEL = "all-minilm-l6-v2"
LONG = "a much longer input with many more words in it than twelve ids"  # 16 ids with [CLS] and [SEP]
LONG_IDS = 12  # rows with more ids than this are LONG's


def send(client: TestClient, path: str, body: dict[str, Any]) -> socket.socket:  # type: ignore[type-arg]
    """Write one HTTP request to a new connection without running the event loop (the kernel completes the
    handshake and holds the bytes until the gateway reads them)."""
    data = json.dumps(body).encode()
    sock = socket.create_connection((client.server.host, client.server.port))
    sock.sendall(f"POST {path} HTTP/1.1\r\nHost: gateway\r\nContent-Type: application/json\r\n"
                 f"Content-Length: {len(data)}\r\nConnection: close\r\n\r\n".encode() + data)
    return sock


def _answer(sock: socket.socket) -> tuple[int, dict[str, Any]]:
    with sock:
        response = http.client.HTTPResponse(sock)
        response.begin()
        return response.status, json.loads(response.read())


async def answer(sock: socket.socket) -> tuple[int, dict[str, Any]]:
    return await asyncio.to_thread(_answer, sock)


async def burst(client: TestClient, bodies: list[dict[str, Any]]) -> list[tuple[int, dict[str, Any]]]:  # type: ignore[type-arg]
    """POST every body to /v1/embeddings at once and return each answer, in order."""
    sockets = [send(client, "/v1/embeddings", body) for body in bodies]
    return list(await asyncio.gather(*map(answer, sockets)))


@pytest.fixture
async def stack() -> AsyncIterator[tuple[TestClient, FakeEngine]]:  # type: ignore[type-arg]
    async with served_by_fake(MODEL) as (client, engine):
        try:
            yield client, engine
        finally:
            engine.release.set()


def embedding(status: int, body: dict[str, Any]) -> list[float]:
    assert status == 200 and "embedding" in body["data"][0], body
    return list(body["data"][0]["embedding"])


async def test_concurrent_embeddings_requests_reach_the_engine_as_one_request_and_each_gets_its_own_row(
        stack: tuple[TestClient, FakeEngine]) -> None:  # type: ignore[type-arg]
    client, engine = stack
    engine.poison = lambda ids: len(ids) > LONG_IDS  # LONG's row answers NaN: only its request may see it
    texts = ["one", "two words", LONG, "three words here"]
    answers = await burst(client, [{"model": MODEL, "input": [t]} for t in texts])
    assert engine.requests == [4]  # one request of four rows, not four requests
    assert sorted(map(len, engine.calls)) == [3, 4, 5, 16]
    for text, (status, body) in zip(texts, answers, strict=True):
        if text == LONG:
            assert status == 200 and body["data"][0]["error"] == "invalid_model_output", body
        else:
            assert len(embedding(status, body)) == 384


async def test_one_requests_inputs_go_in_requests_of_at_most_the_models_rows(
        stack: tuple[TestClient, FakeEngine]) -> None:  # type: ignore[type-arg]
    client, engine = stack
    for inputs, requests in ((32, [32]), (33, [32, 1])):  # the fake's config: max_batch_size 32 with ROW_LENGTHS
        engine.requests.clear()
        r = await client.post("/v1/embeddings", json={"model": MODEL, "input": [f"text {i}" for i in range(inputs)]})
        body = await r.json()
        assert r.status == 200 and len(body["data"]) == inputs and all("embedding" in d for d in body["data"])
        assert engine.requests == requests


async def test_a_model_without_row_lengths_gets_one_input_per_request() -> None:
    async with served_by_fake(MODEL) as (client, engine):
        engine.max_rows = 0  # its config declares no ROW_LENGTHS: the fake refuses a request of rows
        r = await client.post("/v1/embeddings", json={"model": MODEL, "input": ["a", "b c", "d e f"]})
        body = await r.json()
    assert r.status == 200 and all("embedding" in d for d in body["data"]), body
    assert engine.requests == [1, 1, 1] and sorted(map(len, engine.calls)) == [3, 4, 5]


async def test_a_row_the_model_refuses_fails_only_its_own_request_in_a_coalesced_call(
        stack: tuple[TestClient, FakeEngine]) -> None:  # type: ignore[type-arg]
    client, engine = stack
    engine.fail = lambda ids: TritonFailure("LAYER [4] is not one of this model's layers") \
        if len(ids) > LONG_IDS else None
    texts = ["fine", LONG, "also fine"]
    answers = await burst(client, [{"model": MODEL, "input": [t]} for t in texts])
    assert engine.requests == [3, 1, 1, 1]  # the call failed as a whole, then each row went alone
    (s1, first), (s2, refused), (s3, third) = answers
    assert embedding(s1, first) and embedding(s3, third)
    assert s2 == 200 and refused["data"][0]["error"] == "invalid_model_output", refused


async def test_a_failure_that_is_no_rows_fault_fails_every_row_of_the_call_without_a_retry(
        stack: tuple[TestClient, FakeEngine]) -> None:  # type: ignore[type-arg]
    client, engine = stack
    engine.fail = lambda ids: TritonFailure("model is not ready", unavailable=True)
    r = await client.post("/v1/embeddings", json={"model": MODEL, "input": ["a", "b", "c"]})
    body = await r.json()
    assert r.status == 200 and [d["error"] for d in body["data"]] == ["unavailable"] * 3
    assert engine.requests == [3]


async def test_a_row_whose_deadline_passes_while_queued_fails_with_the_deadline_while_the_others_answer(
        stack: tuple[TestClient, FakeEngine]) -> None:  # type: ignore[type-arg]
    client, engine = stack
    engine.delay_s = 0.3  # longer than the short deadline; the call carries the latest (none here)
    bodies: list[dict[str, Any]] = [{"model": MODEL, "input": ["a"], "options": {"deadline_ms": 20}},
                                    {"model": MODEL, "input": ["b"]}, {"model": MODEL, "input": ["c"]}]
    (s1, short), *others = await burst(client, bodies)
    assert engine.requests == [3] and engine.cancelled == 0
    assert s1 == 200 and short["data"][0]["error"] == "deadline_exceeded", short
    assert "queued" in short["data"][0]["message"]
    for status, body in others:
        assert embedding(status, body)


async def test_a_caller_that_goes_away_does_not_cancel_the_rows_of_the_others(
        stack: tuple[TestClient, FakeEngine]) -> None:  # type: ignore[type-arg]
    client, engine = stack
    engine.hold = lambda ids: True
    sockets = [send(client, "/v1/embeddings", {"model": MODEL, "input": [t]}) for t in ("a", "b", "c")]
    await until(lambda: engine.started == 3, "three rows in the engine")
    assert engine.requests == [3]
    sockets[0].close()  # its client disconnects: its handler is cancelled (499)

    async def gone() -> bool:
        metrics = await (await client.get("/metrics")).text()
        return 'sr_gateway_requests_total{endpoint="embeddings",status="499"} 1.0' in metrics

    for _ in range(500):
        if await gone():
            break
        await asyncio.sleep(0.01)
    assert await gone()
    assert engine.cancelled == 0  # the call goes on for the other two
    engine.release.set()
    for sock in sockets[1:]:
        assert embedding(*await answer(sock))
    assert engine.finished == 3 and engine.cancelled == 0


async def test_an_engine_given_to_create_app_is_the_one_the_lifecycle_brings_models_up_on(
        monkeypatch: pytest.MonkeyPatch) -> None:
    """No child tritonserver and no gRPC: the given engine is tracked like an external Triton."""
    from aiohttp.test_utils import TestServer

    from gateway.app import LIFECYCLE_KEY, create_app
    from gateway.settings import Settings

    from .conftest import ROOT

    async def no_golden(runtime: Any, model: Any) -> None:
        """The fake's vectors are not MiniLM's: the golden check is what this test does not test."""

    monkeypatch.setattr("gateway.lifecycle.check_golden", no_golden)
    engine = FakeEngine()
    loaded: list[str] = []

    async def load(model: str) -> None:
        loaded.append(model)
    engine.load = load  # type: ignore[method-assign]
    app = create_app(Settings(model_repository=ROOT / "model_repository", models=MODEL), engine=engine)
    async with TestClient(TestServer(app, host="127.0.0.1")) as client:
        for _ in range(500):
            if (await client.get("/health")).status == 200:
                break
            await asyncio.sleep(0.02)
        health = await (await client.get("/health")).json()
        assert health["status"] == "ready", health
        assert app[LIFECYCLE_KEY].process is None and loaded == [MODEL]
        r = await client.post("/v1/embeddings", json={"model": MODEL, "input": ["a", "b"]})
        assert r.status == 200 and engine.requests == [2]


async def test_a_reload_that_changes_the_models_rows_per_request_is_followed_from_the_next_input(
        monkeypatch: pytest.MonkeyPatch) -> None:
    from gateway.lifecycle import Lifecycle
    from gateway.surfaces.common import RUNTIME_KEY

    async def no_golden(runtime: Any, model: Any) -> None:
        """The fake's vectors are not MiniLM's: the golden check is what this test does not test."""

    monkeypatch.setattr("gateway.lifecycle.check_golden", no_golden)
    async with served_by_fake(MODEL) as (client, engine):
        runtime = client.server.app[RUNTIME_KEY]
        body = {"model": MODEL, "input": ["a", "b"]}
        assert (await client.post("/v1/embeddings", json=body)).status == 200
        engine.max_rows = 0  # the reloaded config declares no ROW_LENGTHS: a request of rows would be refused
        await Lifecycle(runtime)._bring_up(runtime.models[MODEL], reload=True)  # starts no task when it passes
        assert runtime.models[MODEL].status == "ready"
        r = await client.post("/v1/embeddings", json=body)
        answer = await r.json()
    assert r.status == 200 and all("embedding" in d for d in answer["data"]), answer
    assert engine.requests == [2, 1, 1]
