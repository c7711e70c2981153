"""An in-process engine behind the gateway's seam (`gateway.triton.Engine`), for fast tests of the gateway's own
logic: admission, 413/429 edges, deadlines, cancellation and item errors. Outputs are deterministic (a vector
filled with the input's length); what it does to each input is decided by the test.

It never stands in for a model: every test of model behaviour uses the real tritonserver.
"""

from __future__ import annotations

import asyncio
import contextlib
import time
from collections.abc import AsyncIterator, Callable
from dataclasses import dataclass, field
from typing import Any

import numpy as np
from aiohttp.test_utils import TestClient, TestServer

from gateway.triton import Execution, Result, TritonFailure


@dataclass
class FakeEngine:
    url: str = "fake://engine"
    dimension: int = 384
    delay_s: float = 0.0
    hold: Callable[[list[int]], bool] = lambda ids: False  # held until `release` is set
    fail: Callable[[list[int]], TritonFailure | None] = lambda ids: None
    poison: Callable[[list[int]], bool] = lambda ids: False  # answered with NaN (a model gone numerically wrong)
    release: asyncio.Event = field(default_factory=asyncio.Event)
    started: int = 0
    finished: int = 0
    cancelled: int = 0
    calls: list[list[int]] = field(default_factory=list)
    layers: list[int | None] = field(default_factory=list)  # the LAYER each call asked for (None: the default)

    async def is_live(self) -> bool:
        return True

    async def wait_live(self, timeout: float) -> None:
        return None

    async def load(self, model: str) -> None:
        return None

    async def reload(self, model: str) -> None:
        return None

    async def is_ready(self, model: str) -> bool:
        return True

    async def model_config(self, model: str) -> dict[str, Any]:
        return {"name": model, "instance_group": [{"kind": "KIND_CPU", "count": 1}]}

    async def statistics(self, model: str) -> dict[str, Any]:
        return {"name": model, "inference_count": self.finished}

    async def infer(self, model: str, output: str, ids: list[int], type_ids: list[int] | None = None, *,
                    timeout_us: int | None = None, layer: int | None = None) -> Result:
        submitted = time.time_ns()
        self.started += 1
        self.calls.append(list(ids))
        self.layers.append(layer)
        poisoned = self.poison(ids)  # decided at the call (tests pick a call by its order)
        try:
            if self.hold(ids):
                await self.release.wait()
            if timeout_us is not None and self.delay_s * 1e6 > timeout_us:
                await asyncio.sleep(timeout_us / 1e6)
                raise TritonFailure("Request timeout expired", deadline=True)
            begun = time.time_ns()
            await asyncio.sleep(self.delay_s)
            failure = self.fail(ids)
            if failure is not None:
                raise failure
        except asyncio.CancelledError:
            self.cancelled += 1
            raise
        self.finished += 1
        values = np.full(self.dimension, np.nan if poisoned else float(len(ids)), dtype=np.float32)
        return Result(values / np.linalg.norm(values), Execution(begun, time.time_ns() - begun, 1, len(ids)),
                      submitted, time.time_ns())

    async def infer_tensors(self, model: str, inputs: dict[str, np.ndarray], output: str, *,
                            timeout_us: int | None = None) -> Result:
        """Image models' tensors: answered like a token sequence as long as the first tensor's size."""
        first = next(iter(inputs.values()))
        return await self.infer(model, output, list(range(min(int(first.size), 512))), timeout_us=timeout_us)

    async def close(self) -> None:
        return None


@contextlib.asynccontextmanager
async def served_by_fake(model: str, **settings: Any) -> AsyncIterator[tuple[TestClient, FakeEngine]]:  # type: ignore[type-arg]
    """The real app over real HTTP with this fake behind the Triton seam and `model` ready (no tritonserver)."""
    from gateway.app import create_app
    from gateway.settings import Settings
    from gateway.surfaces.common import RUNTIME_KEY

    from .conftest import ROOT

    app = create_app(Settings(model_repository=ROOT / "model_repository", models=model, **settings),
                     start_models=False)
    runtime = app[RUNTIME_KEY]
    engine = FakeEngine()
    runtime.triton = engine
    served = runtime.models[model]
    served.load_tokenizer()
    served.engine_args = await engine.model_config(model)
    runtime.set_status(served, "ready")
    client = TestClient(TestServer(app, host="127.0.0.1"))
    await client.start_server()
    try:
        yield client, engine
    finally:
        await client.close()
