"""The request-side contract schemathesis found loose, stated in the served document and enforced at its edge:
deadline_ms from one microsecond (a smaller positive JSON number can round to 0.0 or to a deadline nothing meets),
classify heads enumerated, and token budgets no smaller than the special tokens (fast: in-process engine)."""

from __future__ import annotations

from typing import Any

import pytest
import yaml

from .fake_engine import served_by_fake

MODEL = "all-minilm-l6-v2"


async def test_the_served_document_states_the_bounds_the_server_enforces() -> None:
    async with served_by_fake(MODEL) as (client, _):
        doc = yaml.safe_load(await (await client.get("/openapi.yaml")).text())
    schemas = doc["components"]["schemas"]
    for name in ("EmbeddingsOptions", "ClassifyOptions", "RerankOptions", "DecisionOptions"):
        deadline = schemas[name]["properties"]["deadline_ms"]
        assert deadline["minimum"] == 0.001 and not deadline.get("exclusiveMinimum"), name
    assert schemas["EmbeddingsOptions"]["properties"]["max_tokens"]["minimum"] == 2  # MiniLM's [CLS] and [SEP]
    bundle = schemas["BundleRequest"]["properties"]["options"]["properties"]["deadline_ms"]
    assert bundle["minimum"] == 0.001


@pytest.mark.parametrize(("deadline", "status"), [("0.001", 200), ("1", 200), ("0.0009", 400), ("5e-324", 400),
                                                  ("1e-400", 400)])
async def test_deadline_ms_is_taken_from_one_microsecond(deadline: str, status: int) -> None:
    """The numbers as JSON text: 1e-400 reads as 0.0, 5e-324 as the smallest double."""
    options = '"options": {"deadline_ms": ' + deadline + "}"
    json = {"Content-Type": "application/json"}
    async with served_by_fake(MODEL) as (client, _):
        r = await client.post("/v1/embeddings", data='{"input": ["a"], ' + options + "}", headers=json)
        body: dict[str, Any] = await r.json()
        task = '{"id": "a", "embeddings": {"input": ["a"]}}'
        bundle = await client.post("/v1/bundle", data='{"tasks": [' + task + "], " + options + "}", headers=json)
        bundled: dict[str, Any] = await bundle.json()
    assert r.status == status and bundle.status == status, (body, bundled)
    if status == 400:
        assert "deadline_ms" in body["error"]["message"] and "deadline_ms" in bundled["error"]["message"]


@pytest.mark.parametrize(("budget", "status"), [(2, 200), (1, 400)])
async def test_a_budget_below_the_special_tokens_is_the_requests_400(budget: int, status: int) -> None:
    """MiniLM frames every input with [CLS] and [SEP]: a budget of 1 answers nothing, so it is refused as a whole
    (the served document's max_tokens minimum says the same)."""
    async with served_by_fake(MODEL) as (client, _):
        r = await client.post("/v1/embeddings", json={"input": ["a"], "options": {"max_tokens": budget}})
        body: dict[str, Any] = await r.json()
    assert r.status == status, body
    if status == 400:
        assert body["error"]["message"] == ("options.max_tokens 1 is smaller than the 2 special tokens every input "
                                            f"needs (model {MODEL})")
