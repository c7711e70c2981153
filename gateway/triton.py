"""The engine seam, and `Triton`, the only module that talks to Triton (gRPC, `tritonclient.grpc.aio`).

`Engine` is the low-level thing that runs models: one request of named tensors in, one named output and the
`Execution` that produced it out, plus the repository and health calls. Every model speaks the same tensor
contract (see sr_backend/triton_model.py): INPUT_IDS [N, W] (+ ROW_LENGTHS for a model that takes rows, +
TOKEN_TYPE_IDS for pairs, + LAYER for an embedder's declared earlier layer) or an image model's tensors in; one
output (EMBEDDING, LOGITS, …) + TIMING out. TIMING carries Triton-side execution timestamps so the gateway can
report queue and forward time from what actually happened in Triton. How inputs become requests (row packing,
coalescing) lives above the seam, in gateway/inference.py, so that it is the same whatever engine runs them.
"""

from __future__ import annotations

import asyncio
import json
import re
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any, Protocol

import numpy as np
import tritonclient.grpc.aio as grpcclient
from tritonclient.grpc import InferInput, InferRequestedOutput
from tritonclient.utils import InferenceServerException, np_to_triton_dtype

_TIMING = InferRequestedOutput("TIMING")
_OUTPUTS: dict[str, list[InferRequestedOutput]] = {}  # per output name; built once, not per call
_LOST_INSTANCE = re.compile(r"Stub process '([^']+)' is not healthy")  # a Python-backend instance died


@dataclass(frozen=True)
class Execution:
    """One Triton execute() that served a request: when it started, its forward time and batch size."""

    started_ns: int  # unix ns, taken in the model at the start of execute()
    forward_ns: int
    rows: int
    tokens: int


@dataclass(frozen=True)
class Result:
    """What a model call answered. From an `Engine`, the request's output, batch dimension first; from
    `gateway.inference.Inference`, one input's own: float32 [D] for pooled outputs, [L, C] for per-token ones."""

    values: np.ndarray
    execution: Execution
    submitted_ns: int  # unix ns when the gateway sent it
    received_ns: int  # unix ns when the answer was back in the gateway (end of readout)


class TritonFailure(Exception):
    """A Triton call failed. `deadline`: Triton dropped it from its queue when the deadline passed; `unavailable`:
    the server or model is away; `out_of_memory`: the forward ran out of device memory (413 or 429, not an item)."""

    def __init__(self, message: str, *, deadline: bool = False, unavailable: bool = False,
                 out_of_memory: bool = False) -> None:
        super().__init__(message)
        self.deadline = deadline
        self.unavailable = unavailable
        self.out_of_memory = out_of_memory


# gRPC status codes first (the Python backend sets coded TritonErrors), message text only where no code says it.
_DEADLINE = ("DEADLINE_EXCEEDED",)
_UNAVAILABLE = ("UNAVAILABLE", "CANCELLED")
_MEMORY = ("RESOURCE_EXHAUSTED",)


def failure_of(status: str, text: str) -> TritonFailure:
    code = status.upper().rsplit(".", 1)[-1]
    lowered = text.lower()
    deadline = code in _DEADLINE or "timeout" in lowered  # Triton's queue policy rejects with "Request timeout"
    memory = code in _MEMORY or "out of memory" in lowered
    unavailable = code in _UNAVAILABLE or "not ready" in lowered or "unavailable" in lowered
    return TritonFailure(text, deadline=deadline, unavailable=unavailable and not deadline, out_of_memory=memory)


def _failure(exc: InferenceServerException) -> TritonFailure:
    return failure_of(exc.status() or "", exc.message() or str(exc))


class Engine(Protocol):
    """The seam between the gateway and what runs the models: Triton over gRPC in production, an in-process fake in
    the fast tests (injected through `create_app(settings, engine=...)`). It runs one request of tensors as it is
    given; `gateway.inference.Inference` above it decides what a request carries."""

    url: str

    async def is_live(self) -> bool: ...

    async def wait_live(self, timeout: float) -> None: ...

    async def load(self, model: str) -> None: ...

    async def reload(self, model: str) -> None: ...

    async def is_ready(self, model: str) -> bool: ...

    async def model_config(self, model: str) -> dict[str, Any]: ...

    async def statistics(self, model: str) -> dict[str, Any]: ...

    async def run(self, model: str, inputs: dict[str, np.ndarray], output: str, *,
                  timeout_us: int | None = None) -> Result:
        """One request: `output` for every row of `inputs` (batch dimension first), or a `TritonFailure`."""
        ...

    async def close(self) -> None: ...


class Triton:
    """The `Engine` over gRPC: one client (one channel) to one tritonserver, child or external."""

    def __init__(self, url: str, on_instance_lost: Callable[[str, str], None] | None = None) -> None:
        self.url = url
        self._client = grpcclient.InferenceServerClient(url)
        self.on_instance_lost = on_instance_lost  # (model, instance): Triton named a dead instance in an error
        self._loading: dict[str, asyncio.Future[None]] = {}  # model → its load request in flight

    async def is_live(self) -> bool:
        try:
            return bool(await self._client.is_server_live(client_timeout=2.0))
        except InferenceServerException:
            return False

    async def reload(self, model: str) -> None:
        """Repository API (explicit model control). A load of a loaded, unchanged model is a no-op, dead instance
        included, so the load carries the model's own config with a new `sr_gateway_generation` parameter: Triton
        then builds every instance afresh and swaps them in."""
        try:
            config = (await self._client.get_model_config(model, as_json=True)).get("config", {})
            config.setdefault("parameters", {})["sr_gateway_generation"] = {"string_value": str(time.time_ns())}
            await self._client.load_model(model, config=json.dumps(config))
        except InferenceServerException as exc:
            raise _failure(exc) from exc

    async def close(self) -> None:
        await self._client.close()

    async def wait_live(self, timeout: float) -> None:
        deadline = time.monotonic() + timeout
        last: Exception | None = None
        while time.monotonic() < deadline:
            try:
                if await self._client.is_server_live():
                    return
            except InferenceServerException as exc:
                last = exc
            await asyncio.sleep(0.2)
        raise TritonFailure(f"Triton at {self.url} was not live within {timeout:.0f} s: {last}", unavailable=True)

    async def load(self, model: str) -> None:
        """Load unless ready. The models that ride on one Triton model (decision families over their encoder) are
        brought up at once, and a second load request while the first is in flight makes Triton build every
        instance again (seen: four MiniLM stubs for two instances, and PyTorch bf16's two-minute warm run twice),
        so concurrent callers share the one request in flight."""
        task = self._loading.get(model)
        if task is None:
            task = self._loading[model] = asyncio.ensure_future(self._load(model))
            task.add_done_callback(lambda done: self._loaded(model, done))
        await asyncio.shield(task)  # a cancelled caller leaves the load to the others

    def _loaded(self, model: str, done: asyncio.Future[None]) -> None:
        if self._loading.get(model) is done:
            del self._loading[model]
        if not done.cancelled():
            done.exception()  # marked retrieved: the callers that still wait get it from their await

    async def _load(self, model: str) -> None:
        try:
            if await self._client.is_model_ready(model):
                return
            await self._client.load_model(model)
        except InferenceServerException as exc:
            raise _failure(exc) from exc

    async def is_ready(self, model: str) -> bool:
        try:
            return bool(await self._client.is_model_ready(model, client_timeout=2.0))
        except InferenceServerException:
            return False

    async def model_config(self, model: str) -> dict[str, Any]:
        try:
            response = await self._client.get_model_config(model, as_json=True)
        except InferenceServerException as exc:
            raise _failure(exc) from exc
        return dict(response.get("config", response))

    async def statistics(self, model: str) -> dict[str, Any]:
        """Triton's own statistics for one model (inference/execution counts and times)."""
        try:
            response = await self._client.get_inference_statistics(model, as_json=True)
        except InferenceServerException as exc:
            raise _failure(exc) from exc
        stats = response.get("model_stats") or [{}]
        return dict(stats[0])

    async def run(self, model: str, inputs: dict[str, np.ndarray], output: str, *,
                  timeout_us: int | None = None) -> Result:
        """One gRPC infer: `output` (batch dim first), the execution its TIMING describes, and when it was sent."""
        request = []
        for name, array in inputs.items():
            tensor = InferInput(name, list(array.shape), np_to_triton_dtype(array.dtype))
            tensor.set_data_from_numpy(array)
            request.append(tensor)
        submitted = time.time_ns()
        try:
            # timeout: Triton drops the request if it is still queued then; client_timeout: the gRPC deadline, which
            # also covers waiting for a stream on the channel before Triton has even seen the request.
            outputs = _OUTPUTS.get(output) or _OUTPUTS.setdefault(output, [InferRequestedOutput(output), _TIMING])
            result = await self._client.infer(model, request, outputs=outputs,
                                              timeout=timeout_us,
                                              client_timeout=None if timeout_us is None else timeout_us / 1e6)
        except InferenceServerException as exc:
            failure = _failure(exc)
            lost = _LOST_INSTANCE.search(str(failure))
            if lost:
                failure.unavailable = True  # the input was fine; the instance that had it is gone
                if self.on_instance_lost is not None:
                    self.on_instance_lost(model, lost.group(1))
            raise failure from exc
        values = result.as_numpy(output)
        timing = result.as_numpy("TIMING")
        if values is None or timing is None:
            raise TritonFailure(f"model {model} returned no {output}/TIMING")
        t = timing.reshape(-1)
        return Result(values, Execution(int(t[0]), int(t[1]), int(t[2]), int(t[3])), submitted, time.time_ns())
