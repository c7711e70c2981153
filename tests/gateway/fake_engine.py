"""An in-process engine behind the gateway's seam (`gateway.triton.Engine`), for fast tests of the gateway's own
logic: admission, 413/429 edges, deadlines, cancellation, item errors and the coalescing of concurrent inputs. It is
injected through `create_app(settings, engine=...)`, like Infinity's dummy engine, so it sits behind the same
`gateway.inference.Inference` as Triton: it receives the packed INPUT_IDS [N, W] with ROW_LENGTHS and answers each
row. Outputs are deterministic (a vector filled with the row's length); what it does to each input is decided by
the test, row by row, and a request fails as a whole when any of its rows fails, as Triton's does.

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
    max_rows: int = 32  # rows one request may carry, as its model config says (0: no ROW_LENGTHS, one per request)
    hold: Callable[[list[int]], bool] = lambda ids: False  # a request with such a row is held until `release` is set
    fail: Callable[[list[int]], TritonFailure | None] = lambda ids: None  # a row's failure fails its whole request
    poison: Callable[[list[int]], bool] = lambda ids: False  # answered with NaN (a model gone numerically wrong)
    release: asyncio.Event = field(default_factory=asyncio.Event)
    started: int = 0  # rows, as are finished and cancelled
    finished: int = 0
    cancelled: int = 0
    calls: list[list[int]] = field(default_factory=list)  # each row's ids, in the order rows arrived
    layers: list[int | None] = field(default_factory=list)  # the LAYER each row asked for (None: the default)
    requests: list[int] = field(default_factory=list)  # rows per request, in the order requests arrived

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
        inputs = [{"name": "INPUT_IDS"}] + ([{"name": "ROW_LENGTHS"}] if self.max_rows else [])
        return {"name": model, "max_batch_size": self.max_rows or 1, "input": inputs,
                "output": [{"name": "EMBEDDING"}, {"name": "TIMING"}],
                "instance_group": [{"kind": "KIND_CPU", "count": 1}]}

    async def statistics(self, model: str) -> dict[str, Any]:
        return {"name": model, "inference_count": self.finished}

    async def run(self, model: str, inputs: dict[str, np.ndarray], output: str, *,
                  timeout_us: int | None = None) -> Result:
        submitted = time.time_ns()
        rows, layers = self._rows(inputs)
        self.requests.append(len(rows))
        poisoned: list[bool] = []
        held = False
        for ids, layer in zip(rows, layers, strict=True):
            self.started += 1
            self.calls.append(ids)
            self.layers.append(layer)
            poisoned.append(self.poison(ids))  # decided as the row arrives (tests pick a row by its order)
            held = self.hold(ids) or held
        try:
            if held:
                await self.release.wait()
            if timeout_us is not None and self.delay_s * 1e6 > timeout_us:
                await asyncio.sleep(timeout_us / 1e6)
                raise TritonFailure("Request timeout expired", deadline=True)
            begun = time.time_ns()
            await asyncio.sleep(self.delay_s)
            failure = next((f for f in map(self.fail, rows) if f is not None), None)
            if failure is not None:
                raise failure
        except asyncio.CancelledError:
            self.cancelled += len(rows)
            raise
        self.finished += len(rows)
        values = np.array([[np.nan if bad else float(len(ids))] * self.dimension
                           for ids, bad in zip(rows, poisoned, strict=True)], dtype=np.float32)
        values /= np.linalg.norm(values, axis=1, keepdims=True)
        return Result(values, Execution(begun, time.time_ns() - begun, len(rows), sum(map(len, rows))),
                      submitted, time.time_ns())

    def _rows(self, inputs: dict[str, np.ndarray]) -> tuple[list[list[int]], list[int | None]]:
        """Each row's ids and LAYER, unpacked from the request as the model contract packs them; a request the
        contract refuses is refused like Triton's. Image models' tensors: each row as ids as long as its pixels."""
        if "INPUT_IDS" not in inputs:
            first = next(iter(inputs.values()))
            return [list(range(min(int(row.size), 512))) for row in first], [None] * len(first)
        ids = inputs["INPUT_IDS"]
        lengths = inputs.get("ROW_LENGTHS")
        if (lengths is not None) != bool(self.max_rows) or len(ids) > max(self.max_rows, 1):
            raise TritonFailure(f"the fake's config takes {self.max_rows} rows per request "
                                f"{'with' if self.max_rows else 'without'} ROW_LENGTHS; got {len(ids)} rows "
                                f"{'with' if lengths is not None else 'without'} it")
        widths = [int(n) for n in lengths.reshape(-1)] if lengths is not None else [ids.shape[1]] * len(ids)
        layer = inputs.get("LAYER")
        layers: list[int | None] = [int(k) for k in layer.reshape(-1)] if layer is not None else [None] * len(ids)
        return [ids[i, :w].tolist() for i, w in enumerate(widths)], layers

    async def close(self) -> None:
        return None


async def until(check: Callable[[], Any], what: str) -> None:
    """Wait (at most ≈ 2 s of loop turns) until `check()` holds: for states the fake reaches between awaits."""
    for _ in range(2000):
        if check():
            return
        await asyncio.sleep(0.001)
    raise AssertionError(f"never observed: {what}")


@contextlib.asynccontextmanager
async def served_by_fake(model: str, **settings: Any) -> AsyncIterator[tuple[TestClient, FakeEngine]]:  # type: ignore[type-arg]
    """The real app over real HTTP with the fake injected as its engine and `model` ready (no tritonserver)."""
    from gateway.app import create_app
    from gateway.settings import Settings
    from gateway.surfaces.common import RUNTIME_KEY

    from .conftest import ROOT

    engine = FakeEngine()
    app = create_app(Settings(model_repository=ROOT / "model_repository", models=model, **settings),
                     engine=engine, start_models=False)
    runtime = app[RUNTIME_KEY]
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
        if runtime.inference is not None:
            await runtime.inference.close()
