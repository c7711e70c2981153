"""A bundle answers each task with the status it would get alone, even when one task hits a bug: that task is a 500,
its siblings are answered (fast, over real HTTP with the in-process engine behind the Triton seam)."""

from __future__ import annotations

from typing import Any

import pytest

from gateway.runtime import Runtime, ServedModel
from gateway.surfaces import bundle
from gateway.surfaces.common import Call

from .fake_engine import served_by_fake

MODEL = "all-minilm-l6-v2"


async def test_a_task_that_raises_an_unexpected_error_is_its_own_500(monkeypatch: pytest.MonkeyPatch,
                                                                       caplog: pytest.LogCaptureFixture) -> None:
    parser, work = bundle.SURFACES["embeddings"]

    async def buggy(runtime: Runtime, model: ServedModel, req: Any, call: Call | None) -> dict[str, Any]:
        if req.input == ["boom"]:
            raise KeyError("a bug in one task")
        return await work(runtime, model, req, call)

    monkeypatch.setitem(bundle.SURFACES, "embeddings", (parser, buggy))
    async with served_by_fake(MODEL) as (client, _):
        r = await client.post("/v1/bundle", json={"tasks": [
            {"id": "ok", "embeddings": {"model": MODEL, "input": ["fine"]}},
            {"id": "bug", "embeddings": {"model": MODEL, "input": ["boom"]}}]})
        assert r.status == 200
        ok, bug = (await r.json())["results"]
    assert ok["status"] == 200 and len(ok["embeddings"]["data"]) == 1
    assert bug == {"id": "bug", "status": 500, "error": {"code": "internal_error",
                                                         "message": "internal error; see the gateway log"}}
    assert "a bug in one task" not in str(bug) and any("bundle task 'bug'" in m for m in caplog.messages)


def test_a_windowed_text_of_no_tokens_has_no_spans_rather_than_a_server_error() -> None:
    """Found by schemathesis through a bundle task (now that one task's bug is logged as its own 500): a text the
    tokenizer reads as no token, under overflow window, left nothing to stack."""
    import numpy as np

    from gateway.execution.items import Item, token_probabilities

    item = Item(text="\u200b", spans=[(0, 0)], offsets=[[(0, 0), (0, 0)]], content=[[]])
    probs, offsets = token_probabilities(item, [np.zeros((2, 5), dtype=np.float32)])
    assert probs.shape == (0, 5) and offsets == []
