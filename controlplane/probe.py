"""Which inference protocols a workload speaks, found by asking it (``GET /deployments/api-schemas``).

- OpenAI: ``GET {endpoint}/v1/models`` answers 200 with an OpenAI model list (``data`` array).
- Cohere: ``POST {endpoint}/v1/rerank`` with a one-document query answers 200 with ``results``
  (the Cohere rerank shape; sr-gateway serves it).

Each probe is bounded in time and all probes run in parallel, so one hung workload costs at most the
probe timeout, not the sum of them.
"""

from __future__ import annotations

import asyncio
from typing import Any

import aiohttp

OPENAI, COHERE = "OpenAI", "Cohere"
DEFAULT = {"schemas": [OPENAI], "recommended": OPENAI, "unreachable": True}


async def _openai(http: aiohttp.ClientSession, endpoint: str) -> tuple[bool, str | None]:
    """Whether /v1/models answers like OpenAI, and the first model id (used for the rerank probe)."""
    try:
        async with http.get(f"{endpoint}/v1/models") as resp:
            if resp.status != 200:
                return False, None
            body = await resp.json(content_type=None)
    except (aiohttp.ClientError, TimeoutError, ValueError):
        return False, None
    data = body.get("data") if isinstance(body, dict) else None
    if not isinstance(data, list):
        return False, None
    first = data[0].get("id") if data and isinstance(data[0], dict) else None
    return True, str(first) if first else None


async def _cohere(http: aiohttp.ClientSession, endpoint: str, model: str | None) -> bool:
    body: dict[str, Any] = {"query": "ping", "documents": ["ping"], "top_n": 1}
    if model:
        body["model"] = model
    try:
        async with http.post(f"{endpoint}/v1/rerank", json=body) as resp:
            if resp.status != 200:
                return False
            out = await resp.json(content_type=None)
    except (aiohttp.ClientError, TimeoutError, ValueError):
        return False
    return isinstance(out, dict) and isinstance(out.get("results"), list)


async def probe(http: aiohttp.ClientSession, endpoint: str, model: str | None) -> dict[str, Any]:
    """The protocols one reachable endpoint speaks; the compatibility default when it speaks none."""
    endpoint = endpoint.rstrip("/")
    is_openai, first_model = await _openai(http, endpoint)
    is_cohere = await _cohere(http, endpoint, model or first_model)
    schemas = [name for name, ok in ((OPENAI, is_openai), (COHERE, is_cohere)) if ok]
    if not schemas:
        return dict(DEFAULT)
    return {"schemas": schemas, "recommended": OPENAI if is_openai else schemas[0]}


async def probe_all(targets: dict[str, tuple[str, str | None] | None], timeout_s: float) -> dict[str, Any]:
    """Probe every ``id -> (endpoint, model)`` in parallel; ``None`` targets get the default result."""
    timeout = aiohttp.ClientTimeout(total=timeout_s)
    async with aiohttp.ClientSession(timeout=timeout) as http:

        async def one(target: tuple[str, str | None] | None) -> dict[str, Any]:
            if target is None:
                return dict(DEFAULT)
            try:
                return await asyncio.wait_for(probe(http, *target), timeout_s * 2)
            except TimeoutError:
                return dict(DEFAULT)

        ids = list(targets)
        results = await asyncio.gather(*(one(targets[i]) for i in ids))
    return dict(zip(ids, results, strict=True))
