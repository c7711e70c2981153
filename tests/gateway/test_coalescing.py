"""Concurrent inputs reach Triton as one request of several rows (gateway.coalesce, ROW_LENGTHS in the backend).

The queueing rules are checked against a recording `send` (fast, no Triton); the row contract of the Python
backend and the seam's use of it against the session's real tritonserver and models.
"""

from __future__ import annotations

import asyncio
from dataclasses import dataclass, replace
from typing import Any

import numpy as np
import pytest

from gateway.cards import load_card
from gateway.coalesce import Coalescer, Row
from gateway.inference import Inference
from gateway.triton import Result, Triton, TritonFailure

from .conftest import MODEL, ROOT, settled_stats
from .precision import golden_tolerance

PII = "pii-rampart"


@dataclass(frozen=True)
class Answer:
    ids: tuple[int, ...]
    submitted_ns: int = 0


class Expired(Exception):
    pass


class Refused(Exception):
    pass


class Recorder:
    """A `send` that records each call's rows, answers after `delay` seconds, and refuses rows whose first id is
    negative (the whole call, like a model refusing one input of a request)."""

    def __init__(self, delay: float = 0.0) -> None:
        self.calls: list[list[Row]] = []
        self.cancelled = 0
        self.delay = delay

    async def send(self, model: str, output: str, rows: list[Row], timeout_us: int | None) -> list[Answer]:
        self.calls.append(rows)
        try:
            await asyncio.sleep(self.delay)
        except asyncio.CancelledError:
            self.cancelled += 1
            raise
        if any(r.ids[0] < 0 for r in rows):
            raise Refused(f"refused {[r.ids for r in rows]}")
        return [Answer(tuple(r.ids)) for r in rows]


def coalescer(recorder: Recorder) -> Coalescer[Answer]:
    return Coalescer(recorder.send, lambda a, ns: replace(a, submitted_ns=ns), Expired,
                     lambda exc: isinstance(exc, Refused))


def submit(c: Coalescer[Answer], ids: list[int], timeout_us: int | None = None, max_rows: int = 32) -> Any:
    return c.submit("m", "OUT", Row(ids), timeout_us=timeout_us, max_rows=max_rows)


def test_inputs_submitted_in_one_loop_turn_share_one_call_and_a_lone_one_goes_alone() -> None:
    recorder = Recorder()

    async def run() -> tuple[list[Answer], Answer]:
        c = coalescer(recorder)
        together = await asyncio.gather(*(submit(c, [i, i]) for i in range(1, 6)))
        alone = await submit(c, [9])
        return together, alone

    together, alone = asyncio.run(run())
    assert [a.ids for a in together] == [(i, i) for i in range(1, 6)]  # each row its own answer, in order
    assert alone.ids == (9,)
    assert [len(call) for call in recorder.calls] == [5, 1]
    assert all(a.submitted_ns > 0 for a in together)


def test_rows_with_different_inputs_go_in_different_calls() -> None:
    recorder = Recorder()

    async def run() -> None:
        c = coalescer(recorder)
        await asyncio.gather(submit(c, [1]), c.submit("m", "OUT", Row([2], type_ids=[0]), timeout_us=None, max_rows=8),
                             c.submit("m", "OUT", Row([3], layer=3), timeout_us=None, max_rows=8),
                             c.submit("other", "OUT", Row([4]), timeout_us=None, max_rows=8))

    asyncio.run(run())
    assert sorted(len(call) for call in recorder.calls) == [1, 1, 1, 1]


def test_a_call_carries_at_most_max_rows() -> None:
    recorder = Recorder()

    async def run() -> None:
        c = coalescer(recorder)
        await asyncio.gather(*(submit(c, [i], max_rows=4) for i in range(1, 11)))

    asyncio.run(run())
    assert [len(call) for call in recorder.calls] == [4, 4, 2]


def test_an_input_past_its_deadline_fails_alone_while_the_call_answers_the_others() -> None:
    recorder = Recorder(delay=0.3)

    async def run() -> list[Answer | BaseException]:
        c = coalescer(recorder)
        return await asyncio.gather(submit(c, [1], timeout_us=20_000), submit(c, [2], timeout_us=5_000_000),
                                    submit(c, [3]), return_exceptions=True)

    short, long, unbounded = asyncio.run(run())
    assert isinstance(short, Expired)
    assert isinstance(long, Answer) and long.ids == (2,)
    assert isinstance(unbounded, Answer) and unbounded.ids == (3,)
    assert len(recorder.calls) == 1 and recorder.cancelled == 0


def test_a_call_is_cancelled_only_when_every_input_in_it_is_gone() -> None:
    recorder = Recorder(delay=0.5)

    async def run() -> tuple[Answer, int, int]:
        c = coalescer(recorder)
        first = asyncio.ensure_future(submit(c, [1]))
        second = asyncio.ensure_future(submit(c, [2]))
        await asyncio.sleep(0.05)
        first.cancel()  # its caller went away: the call goes on for the other
        answer = await second
        kept = recorder.cancelled
        third = asyncio.ensure_future(submit(c, [3]))
        fourth = asyncio.ensure_future(submit(c, [4]))
        await asyncio.sleep(0.05)
        third.cancel()
        fourth.cancel()  # now nobody waits: the call is cancelled
        await asyncio.sleep(0.05)
        return answer, kept, recorder.cancelled

    answer, kept, cancelled = asyncio.run(run())
    assert answer.ids == (2,)
    assert kept == 0
    assert cancelled == 1


def test_a_call_refused_for_one_rows_fault_is_retried_row_by_row() -> None:
    recorder = Recorder()

    async def run() -> list[Answer | BaseException]:
        c = coalescer(recorder)
        return await asyncio.gather(submit(c, [1]), submit(c, [-1]), submit(c, [3]), return_exceptions=True)

    good, bad, other = asyncio.run(run())
    assert isinstance(good, Answer) and isinstance(other, Answer)
    assert isinstance(bad, Refused) and "[-1]" in str(bad)
    assert [len(call) for call in recorder.calls] == [3, 1, 1, 1]


# ---- against the session's tritonserver -----------------------------------------------------------------------

def _cosine(a: np.ndarray, b: np.ndarray) -> float:
    return float(np.dot(a, b) / np.linalg.norm(a) / np.linalg.norm(b))


def test_concurrent_inputs_reach_triton_as_one_request_and_each_gets_its_own_answer(gateway_url: str,
                                                                                     triton_url: str) -> None:
    rows = [[101, *range(2000, 2000 + n), 102] for n in (3, 40, 1, 17, 90, 8, 8, 25)]
    layers = [3, 6, 6, 3, 6, 3, 6, 6]

    async def run() -> tuple[list[Result], list[Result], int, int]:
        inference = Inference(client := Triton(triton_url))
        try:
            start = await settled_stats(client._client)
            alone = [await inference.infer(MODEL, "EMBEDDING", r, layer=k) for r, k in zip(rows, layers, strict=True)]
            before = await settled_stats(client._client, inferences=int(start["inference_count"]) + len(rows))
            together = await asyncio.gather(*(inference.infer(MODEL, "EMBEDDING", r, layer=k)
                                              for r, k in zip(rows, layers, strict=True)))
            after = await settled_stats(client._client, inferences=int(before["inference_count"]) + len(rows))
        finally:
            await inference.close()
        success = [int(stats["inference_stats"]["success"]["count"]) for stats in (before, after)]
        requests = success[1] - success[0]
        inferences = int(after["inference_count"]) - int(before["inference_count"])
        return alone, list(together), requests, inferences

    alone, together, requests, inferences = asyncio.run(run())
    assert (requests, inferences) == (1, len(rows))  # one request of 8 rows, not 8 requests
    for a, t in zip(alone, together, strict=True):
        assert t.values.shape == (384,)
        assert _cosine(a.values, t.values) > 0.9999  # same answer as alone (bf16 engines differ by batch shape)
    for i, a in enumerate(alone):  # and no row got another's answer
        assert max(range(len(together)), key=lambda j: _cosine(a.values, together[j].values)) == i


def test_per_token_rows_come_back_at_their_own_length(gateway_url: str, triton_url: str) -> None:
    rows = [[101, *range(3000, 3000 + n), 102] for n in (5, 30, 12)]

    async def run() -> tuple[list[Result], list[Result]]:
        inference = Inference(Triton(triton_url))
        try:
            alone = [await inference.infer(PII, "LOGITS", r) for r in rows]
            together = await asyncio.gather(*(inference.infer(PII, "LOGITS", r) for r in rows))
        finally:
            await inference.close()
        return alone, list(together)

    alone, together = asyncio.run(run())
    for r, a, t in zip(rows, alone, together, strict=True):
        assert t.values.shape == a.values.shape == (len(r), 35)
        assert np.array_equal(a.values.argmax(-1), t.values.argmax(-1))
        # rows padded with others round differently; by how much depends on the precision this host serves
        assert np.max(np.abs(a.values - t.values)) <= golden_tolerance(load_card(ROOT / "model_repository" / PII
                                                                                  / "card.yaml"))


@pytest.mark.parametrize(("lengths", "width", "layers", "why"), [
    ([3, 2, 1], 2, None, "ROW_LENGTHS [3, 2, 1] must be within 1..2"),  # a length past the tensor's width
    ([0, 2, 1], 3, None, "must be within 1..3"),
    ([2, 2, 2], 3, [3, 3], "'ROW_LENGTHS' batch size does not match other inputs"),  # Triton's own check
    ([2, 2, 2], 3, [3, 4, 6], "LAYER [4] is not one of this model's layers [3, 6]"),
])
def test_a_malformed_request_of_rows_is_refused_alone(gateway_url: str, triton_url: str,
                                                               lengths: list[int], width: int,
                                                               layers: list[int] | None, why: str) -> None:
    import tritonclient.grpc.aio as grpcclient
    from tritonclient.grpc import InferInput, InferRequestedOutput

    def request(n: int, w: int, row_lengths: list[int], layer: list[int] | None) -> list[Any]:
        ids = np.full((n, w), 2000, dtype=np.int64)
        tensors: list[tuple[str, np.ndarray, str]] = [
            ("INPUT_IDS", ids, "INT64"), ("ROW_LENGTHS", np.array([[x] for x in row_lengths], np.int32), "INT32")]
        if layer is not None:
            tensors.append(("LAYER", np.array([[x] for x in layer], np.int32), "INT32"))
        out = []
        for name, array, kind in tensors:
            tensor = InferInput(name, list(array.shape), kind)
            tensor.set_data_from_numpy(array)
            out.append(tensor)
        return out

    async def run() -> tuple[Any, Any]:
        client = grpcclient.InferenceServerClient(triton_url)
        outputs = [InferRequestedOutput("EMBEDDING")]
        try:
            answers: tuple[Any, ...] = await asyncio.gather(
                client.infer(MODEL, request(len(lengths), width, lengths, layers), outputs=outputs),
                client.infer(MODEL, request(2, 4, [4, 2], [6, 6]), outputs=outputs), return_exceptions=True)
        finally:
            await client.close()
        return answers[0], answers[1]

    bad, good = asyncio.run(run())
    assert isinstance(bad, Exception) and why in str(bad)
    assert not isinstance(good, BaseException) and good.as_numpy("EMBEDDING").shape == (2, 384)


def test_a_row_the_model_refuses_fails_alone_in_a_coalesced_call(gateway_url: str, triton_url: str) -> None:
    async def run() -> list[Result | BaseException]:
        inference = Inference(Triton(triton_url))
        try:
            await inference.infer(MODEL, "EMBEDDING", [101, 102], layer=6)  # the model's row capacity is known now
            return list(await asyncio.gather(*(inference.infer(MODEL, "EMBEDDING", [101, 7592, 102], layer=k)
                                               for k in (6, 4, 3)), return_exceptions=True))
        finally:
            await inference.close()

    good, bad, other = asyncio.run(run())
    assert isinstance(bad, TritonFailure) and "not one of this model's layers" in str(bad)
    assert isinstance(good, Result) and isinstance(other, Result)
