"""Which inference protocols a workload speaks, found by asking it (``GET /deployments/api-schemas``).

- OpenAI: ``GET {endpoint}/v1/models`` answers 200 with an OpenAI model list (``data`` array).
- Cohere: ``POST {endpoint}/v1/rerank`` with a one-document query answers 200 with ``results``
  (the Cohere rerank shape; sr-gateway serves it).

Why bounded and cached: the list page calls this for every visible deployment. At most ``concurrency``
probes run at once, each one (queueing included) ends within twice the probe timeout, and an answer is
kept per workload generation (uid, ``metadata.generation``, endpoint, model), so the rerank probe costs a
workload one tiny inference per configuration change, not one per page view. Only answers from a workload
that responded are cached: an unreachable one is asked again next time.
"""

from __future__ import annotations

import asyncio
from collections.abc import Hashable
from dataclasses import dataclass
from typing import Any

import aiohttp

OPENAI, COHERE = "OpenAI", "Cohere"
DEFAULT = {"schemas": [OPENAI], "recommended": OPENAI, "unreachable": True}
CACHE_MAX = 10_000


@dataclass(frozen=True)
class Target:
    """Where to probe one deployment, and what identifies the workload generation behind it."""

    endpoint: str
    model: str | None
    generation: Hashable


async def _openai(http: aiohttp.ClientSession, endpoint: str) -> tuple[bool, bool, str | None]:
    """(answered at all, speaks OpenAI, first model id used for the rerank probe)."""
    try:
        async with http.get(f"{endpoint}/v1/models") as resp:
            if resp.status != 200:
                return True, False, None
            body = await resp.json(content_type=None)
    except (aiohttp.ClientError, TimeoutError):
        return False, False, None
    except ValueError:
        return True, False, None
    data = body.get("data") if isinstance(body, dict) else None
    if not isinstance(data, list):
        return True, False, None
    first = data[0].get("id") if data and isinstance(data[0], dict) else None
    return True, True, str(first) if first else None


async def _cohere(http: aiohttp.ClientSession, endpoint: str, model: str | None) -> bool:
    """Whether the endpoint speaks the Cohere rerank API."""
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
    """The protocols one endpoint speaks. Reachable means ``/v1/models`` got an HTTP answer of any status;
    a workload that answers but speaks neither protocol gets the compatibility default without
    ``unreachable`` (it was reached). One that never answers is not sent the rerank probe at all."""
    endpoint = endpoint.rstrip("/")
    reached, is_openai, first_model = await _openai(http, endpoint)
    if not reached:
        return dict(DEFAULT)
    is_cohere = await _cohere(http, endpoint, model or first_model)
    schemas = [name for name, ok in ((OPENAI, is_openai), (COHERE, is_cohere)) if ok]
    if not schemas:
        return {"schemas": [OPENAI], "recommended": OPENAI}
    return {"schemas": schemas, "recommended": OPENAI if is_openai else schemas[0]}


class Prober:
    """Probes with a concurrency bound and a per-generation cache shared by every request."""

    def __init__(self, timeout_s: float, concurrency: int) -> None:
        self.timeout_s = timeout_s
        self._limit = asyncio.Semaphore(concurrency)
        self._cache: dict[str, tuple[Hashable, dict[str, Any]]] = {}

    async def probe_all(self, targets: dict[str, Target | None]) -> dict[str, Any]:
        """Probe every ``id -> target``; ``None`` targets (not ready, stopped, no Service) get the default."""
        timeout = aiohttp.ClientTimeout(total=self.timeout_s)
        async with aiohttp.ClientSession(timeout=timeout) as http:

            async def one(dep_id: str, target: Target | None) -> dict[str, Any]:
                if target is None:
                    return dict(DEFAULT)
                hit = self._cache.get(dep_id)
                if hit is not None and hit[0] == target.generation:
                    return dict(hit[1])
                try:
                    result = await asyncio.wait_for(self._limited(http, target), self.timeout_s * 2)
                except TimeoutError:
                    return dict(DEFAULT)
                if not result.get("unreachable"):
                    if len(self._cache) >= CACHE_MAX:
                        self._cache.clear()
                    self._cache[dep_id] = (target.generation, dict(result))
                return result

            ids = list(targets)
            results = await asyncio.gather(*(one(i, targets[i]) for i in ids))
        return dict(zip(ids, results, strict=True))

    async def _limited(self, http: aiohttp.ClientSession, target: Target) -> dict[str, Any]:
        async with self._limit:
            return await probe(http, target.endpoint, target.model)
