"""The gateway never gives up silently: a failed model is tried again with backoff, and a process whose every model
has stayed failed for --liveness-failed-s answers 503 on /health/live, so Kubernetes replaces it (fake engine
behind the Triton seam; the real child Triton's restart limit is in test_self_healing.py)."""

from __future__ import annotations

import asyncio
import time
from typing import Any

import pytest

from gateway.lifecycle import Lifecycle
from gateway.surfaces.common import RUNTIME_KEY

from .conftest import MODEL
from .contract import check
from .fake_engine import served_by_fake


async def test_liveness_stays_200_while_a_model_is_failed_within_the_grace_and_turns_503_after_it() -> None:
    async with served_by_fake(MODEL, liveness_failed_s=60.0) as (client, _):
        runtime = client.server.app[RUNTIME_KEY]
        r = await client.get("/health/live")
        assert r.status == 200 and (await r.json())["status"] == "alive"
        runtime.set_status(runtime.models[MODEL], "failed", "RuntimeError: the golden check failed")
        r = await client.get("/health/live")
        check("/health/live", "get", r.status, await r.json())
        assert r.status == 200  # failed for less than the grace: the retries may still heal it
        runtime.failed_since = time.monotonic() - 61  # as if it had stayed failed past the grace
        r = await client.get("/health/live")
        body = await r.json()
        check("/health/live", "get", r.status, body)
        assert r.status == 503 and body["status"] == "failed"
        assert "every model has been failed for more than 60 s" in body["reason"]
        assert "the golden check failed" in body["reason"]
        runtime.set_status(runtime.models[MODEL], "ready")  # any model back: alive again, the clock reset
        assert runtime.failed_since is None
        assert (await client.get("/health/live")).status == 200


async def test_liveness_never_fails_when_the_grace_is_zero() -> None:
    async with served_by_fake(MODEL, liveness_failed_s=0.0) as (client, _):
        runtime = client.server.app[RUNTIME_KEY]
        runtime.set_status(runtime.models[MODEL], "failed", "boom")
        runtime.failed_since = time.monotonic() - 10_000
        assert (await client.get("/health/live")).status == 200


async def _no_golden(runtime: Any, model: Any) -> None:
    """The fake engine's vectors are not MiniLM's: the golden check is what these tests do not test."""


async def _config(model: str) -> dict[str, Any]:
    return {"name": model, "instance_group": [{"kind": "KIND_CPU", "count": 1}], "output": [{"name": "EMBEDDING"}]}


async def test_a_model_that_failed_to_load_is_tried_again_with_backoff_and_becomes_ready(
        monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr("gateway.lifecycle.check_golden", _no_golden)
    async with served_by_fake(MODEL, model_retry_s=0.05) as (client, engine):
        runtime = client.server.app[RUNTIME_KEY]
        runtime.triton_health["live"] = True
        engine.model_config = _config  # type: ignore[method-assign]
        loads: list[float] = []

        async def flaky_load(model: str) -> None:
            loads.append(time.monotonic())
            if len(loads) <= 2:
                raise RuntimeError(f"load {len(loads)} failed")
        engine.load = flaky_load  # type: ignore[method-assign]
        lifecycle = Lifecycle(runtime)
        served = runtime.models[MODEL]
        statuses: list[tuple[str, Any]] = []
        real = runtime.set_status

        def record(model: Any, status: str, reason: str | None = None) -> None:
            statuses.append((status, reason))
            real(model, status, reason)
        runtime.set_status = record  # type: ignore[method-assign]
        try:
            await lifecycle._bring_up(served)
            deadline = time.monotonic() + 30
            while served.status != "ready":
                assert time.monotonic() < deadline, statuses
                await asyncio.sleep(0.02)
        finally:
            await lifecycle.stop()
    assert len(loads) == 3
    assert loads[1] - loads[0] >= 0.05 and loads[2] - loads[1] >= 0.1  # waited at least the doubling backoff
    failed = [reason for status, reason in statuses if status == "failed"]
    assert any("load 1 failed; trying again in 0.05 s (try 2)" in r for r in failed), failed
    assert any("load 2 failed; trying again in 0.1 s (try 3)" in r for r in failed), failed
    # a retry keeps the model failed until it passes: no loading/warming flicker for clients to see
    first_retry = next(i for i, (s, r) in enumerate(statuses) if s == "failed" and "try 2" in (r or ""))
    assert [s for s, _ in statuses[first_retry:]][-1] == "ready"
    assert {s for s, _ in statuses[first_retry:-1]} == {"failed"}


async def test_no_retry_when_model_retry_s_is_zero(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr("gateway.lifecycle.check_golden", _no_golden)
    async with served_by_fake(MODEL, model_retry_s=0.0) as (client, engine):
        runtime = client.server.app[RUNTIME_KEY]
        runtime.triton_health["live"] = True
        loads = 0

        async def failing_load(model: str) -> None:
            nonlocal loads
            loads += 1
            raise RuntimeError("broken model")
        engine.load = failing_load  # type: ignore[method-assign]
        lifecycle = Lifecycle(runtime)
        try:
            await lifecycle._bring_up(runtime.models[MODEL])
            await asyncio.sleep(0.3)
        finally:
            await lifecycle.stop()
        assert loads == 1 and runtime.models[MODEL].status == "failed"
        assert runtime.models[MODEL].reason == "RuntimeError: broken model"
