"""Every model call of every surface, over any `Engine`: token inputs packed into rows and coalesced, tensors as given.

The engine (gateway/triton.py's `Triton` in production, an in-process fake in the fast tests) runs one request of
tensors. What a request carries is decided here, above the seam, so that the fast tests run the same packing,
coalescing, deadline and row-fault rules as production: concurrent token inputs for a model whose config takes
ROW_LENGTHS go as one request of N rows (gateway.coalesce); a model without it gets one input per request.
"""

from __future__ import annotations

from dataclasses import replace
from typing import Any

import numpy as np

from .coalesce import Coalescer, Row
from .triton import Engine, Result, TritonFailure

COALESCE_MAX_ROWS = 32  # rows one coalesced request carries at most (Triton batches several such requests)


def row_capacity(config: dict[str, Any]) -> int:
    """Rows one request may carry for a model config: 0 (one input, no ROW_LENGTHS) unless it takes ROW_LENGTHS,
    then its max_batch_size, at most COALESCE_MAX_ROWS."""
    takes = any(i.get("name") == "ROW_LENGTHS" for i in config.get("input", []))
    return min(int(config.get("max_batch_size", 0)), COALESCE_MAX_ROWS) if takes else 0


def _expired() -> TritonFailure:
    return TritonFailure("Request timeout expired: the deadline passed before the answer came", deadline=True)


def _row_fault(failure: Exception) -> bool:
    """A failed call may be one row's fault (the model refused an input) unless it says why none was run."""
    return isinstance(failure, TritonFailure) and not (failure.deadline or failure.unavailable
                                                       or failure.out_of_memory)


def pack(rows: list[Row], *, lengths: bool = True) -> dict[str, np.ndarray]:
    """One request's tensors for `rows`: INPUT_IDS [N, longest] (zero-padded) with ROW_LENGTHS [N, 1], or without
    ROW_LENGTHS the one row as [1, L]; TOKEN_TYPE_IDS and LAYER when the rows carry them."""
    width = max(len(r.ids) for r in rows)
    ids = np.zeros((len(rows), width), dtype=np.int64)
    types = np.zeros_like(ids) if rows[0].type_ids is not None else None
    for i, r in enumerate(rows):
        ids[i, : len(r.ids)] = r.ids
        if types is not None and r.type_ids is not None:
            types[i, : len(r.type_ids)] = r.type_ids
    tensors: dict[str, np.ndarray] = {"INPUT_IDS": ids}
    if types is not None:
        tensors["TOKEN_TYPE_IDS"] = types
    if rows[0].layer is not None:
        tensors["LAYER"] = np.array([[r.layer] for r in rows], dtype=np.int32)
    if lengths:
        tensors["ROW_LENGTHS"] = np.array([[len(r.ids)] for r in rows], dtype=np.int32)
    return tensors


class Inference:
    """The one way surfaces run a model: `infer` for token ids (coalesced where the model takes rows),
    `infer_tensors` for named tensors such as a picture's pixels (one request each)."""

    def __init__(self, engine: Engine) -> None:
        self.engine = engine
        self._row_capacity: dict[str, int] = {}  # per model, from its loaded config
        self._coalescer: Coalescer[Result] = Coalescer(
            self._run_rows, lambda result, submitted: replace(result, submitted_ns=submitted), _expired, _row_fault)

    def adopt(self, model: str, config: dict[str, Any]) -> None:
        """Take the row capacity from the config the engine just loaded (a reload may change it)."""
        self._row_capacity[model] = row_capacity(config)

    async def infer(self, model: str, output: str, ids: list[int], type_ids: list[int] | None = None, *,
                    timeout_us: int | None = None, layer: int | None = None) -> Result:
        """Run one token sequence (at `layer`, an embedder's declared layer; None: its default). Concurrent calls
        for a model that takes ROW_LENGTHS go to the engine together as one request (gateway.coalesce); Triton
        batches requests into one execute() either way."""
        row = Row(ids, type_ids, layer)
        max_rows = await self._max_rows(model)
        if max_rows:
            return await self._coalescer.submit(model, output, row, timeout_us=timeout_us, max_rows=max_rows)
        return (await self._run_rows(model, output, [row], timeout_us, lengths=False))[0]

    async def infer_tensors(self, model: str, inputs: dict[str, np.ndarray], output: str, *,
                            timeout_us: int | None = None) -> Result:
        """Run one request of named tensors (images: uint8 pixels, batch dim 1); returns its one row's `output`."""
        result = await self.engine.run(model, inputs, output, timeout_us=timeout_us)
        return replace(result, values=result.values[0])

    async def close(self) -> None:
        """Cancel the calls in flight, then close the engine."""
        await self._coalescer.close()
        await self.engine.close()

    async def _max_rows(self, model: str) -> int:
        """Rows one request may carry; asked of the engine once per model unless a load told it first."""
        known = self._row_capacity.get(model)
        if known is None:
            try:
                config = await self.engine.model_config(model)
            except TritonFailure:
                return 0  # not loaded yet: the call itself says why
            known = self._row_capacity[model] = row_capacity(config)
        return known

    async def _run_rows(self, model: str, output: str, rows: list[Row], timeout_us: int | None, *,
                        lengths: bool = True) -> list[Result]:
        """One request for `rows`; each row's answer cut from the batch (per-token outputs at its own length)."""
        batch = await self.engine.run(model, pack(rows, lengths=lengths), output, timeout_us=timeout_us)
        per_token = batch.values.ndim == 3  # [N, W, C]: each row's own length back
        return [replace(batch, values=batch.values[i, : len(r.ids)] if per_token else batch.values[i])
                for i, r in enumerate(rows)]
