"""Concurrent inputs for one Triton model, sent as one request.

Triton's dynamic batcher already runs many requests in one forward, but every request still costs a gRPC call in
the gateway, a request in Triton's core and a round trip to the Python-backend stub: at 16 tokens that is about a
third of a request's CPU on a 2-core host (docs/benchmarks.md). So the inputs that reach the gateway's event loop
in the same turn — from one HTTP request or from many — go to Triton as one request of N rows (ROW_LENGTHS, see
sr_backend/triton_model.py), which Triton still batches with others. Nothing waits for company: an input is sent
on the next turn of the loop, alone if it is alone.

Each input keeps its own deadline and its own cancellation: it stops waiting when its deadline passes (a deadline
failure, as if Triton's queue had dropped it) or its caller goes away; the call is cancelled only when every input
in it is gone, and it carries the latest deadline among them.
"""

from __future__ import annotations

import asyncio
import copy
import time
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field
from functools import partial
from typing import Generic, TypeVar

R = TypeVar("R")  # one row's answer


@dataclass(frozen=True)
class Row:
    """One model input: token ids, segment ids of a pair, an embedder's declared layer."""

    ids: list[int]
    type_ids: list[int] | None = None
    layer: int | None = None


@dataclass
class _Pending(Generic[R]):
    row: Row
    timeout_us: int | None
    submitted_ns: int
    future: asyncio.Future[R] = field(repr=False)


class Coalescer(Generic[R]):
    """`send(model, output, rows, timeout_us)` makes one call and answers every row; `stamp(answer, submitted_ns)`
    dates an answer from when its own row was submitted; `expired()` is the failure of a row whose deadline passed
    while it waited; `row_fault(failure)` says a failed call may be one row's fault (the model refused an input),
    and then each row is sent again alone, so that row fails alone."""

    def __init__(self, send: Callable[[str, str, list[Row], int | None], Awaitable[list[R]]],
                 stamp: Callable[[R, int], R], expired: Callable[[], Exception],
                 row_fault: Callable[[Exception], bool]) -> None:
        self._send = send
        self._stamp = stamp
        self._expired = expired
        self._row_fault = row_fault
        self._waiting: dict[tuple[str, str, bool, bool], tuple[int, list[_Pending[R]]]] = {}
        self._calls: set[asyncio.Task[None]] = set()

    async def submit(self, model: str, output: str, row: Row, *, timeout_us: int | None, max_rows: int) -> R:
        """This row's answer from the next call to `model` (at most `max_rows` rows per call)."""
        loop = asyncio.get_running_loop()
        key = (model, output, row.type_ids is not None, row.layer is not None)  # one call: one set of inputs
        pending: _Pending[R] = _Pending(row, timeout_us, time.time_ns(), loop.create_future())
        if key not in self._waiting:
            self._waiting[key] = (max_rows, [])
            loop.call_soon(self._flush, key)
        self._waiting[key][1].append(pending)
        try:
            waiting = asyncio.shield(pending.future)
            return await (waiting if timeout_us is None else asyncio.wait_for(waiting, timeout_us / 1e6))
        except TimeoutError:
            raise self._expired() from None
        finally:
            if not pending.future.done():
                pending.future.cancel()  # gone (deadline or caller): its call is cancelled once all of it is

    def _flush(self, key: tuple[str, str, bool, bool]) -> None:
        max_rows, queue = self._waiting.pop(key)
        live = [p for p in queue if not p.future.done()]
        size = max(1, max_rows)
        for start in range(0, len(live), size):
            group = live[start : start + size]
            call = asyncio.get_running_loop().create_task(self._call(key[0], key[1], group))
            self._calls.add(call)
            call.add_done_callback(self._calls.discard)
            for p in group:
                p.future.add_done_callback(partial(_abandon, call, group))

    async def _call(self, model: str, output: str, group: list[_Pending[R]]) -> None:
        try:
            await self._answer(model, output, group)
        except asyncio.CancelledError:  # every input gone, or the gateway closing: none waits on
            for p in group:
                p.future.cancel()
            raise

    async def _answer(self, model: str, output: str, group: list[_Pending[R]]) -> None:
        timeouts = [p.timeout_us for p in group]
        timeout_us = None if any(t is None for t in timeouts) else max(t for t in timeouts if t is not None)
        try:
            results = await self._send(model, output, [p.row for p in group], timeout_us)
        except Exception as exc:  # every input of the call gets the call's failure, unless it may be one row's
            if len(group) > 1 and self._row_fault(exc):
                await asyncio.gather(*(self._answer(model, output, [p]) for p in group if not p.future.done()))
                return
            for p in group:
                if not p.future.done():
                    p.future.set_exception(copy.copy(exc))
            return
        for p, result in zip(group, results, strict=True):
            if not p.future.done():
                p.future.set_result(self._stamp(result, p.submitted_ns))

    async def close(self) -> None:
        for call in list(self._calls):
            call.cancel()
        await asyncio.gather(*self._calls, return_exceptions=True)


def _abandon(call: asyncio.Task[None], group: list[_Pending[R]], _: asyncio.Future[R]) -> None:
    """Cancel a call nobody waits for any more (Triton then skips it if it has not run yet)."""
    if not call.done() and all(p.future.cancelled() for p in group):
        call.cancel()
