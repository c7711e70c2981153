"""Pure pieces without a server: settings, readiness rules, admission, body decoding, chunk planning."""

from __future__ import annotations

import gzip
from pathlib import Path

import numpy as np
import pytest

from gateway.body import content_encoding, decode, parse_json
from gateway.cards import discover
from gateway.errors import ApiError
from gateway.metrics import Metrics
from gateway.runtime import Runtime
from gateway.settings import Settings, SettingsError
from sr_backend.engines.ort_engine import make_session
from sr_backend.engines.shapes import Buckets
from sr_backend.ragged import RaggedRunner, plan_chunks

REPO = Path(__file__).resolve().parents[2] / "model_repository"


def runtime(**settings: object) -> Runtime:
    cards = discover(REPO, ["all-minilm-l6-v2"])
    return Runtime(Settings(model_repository=REPO, **settings), cards, Metrics())  # type: ignore[arg-type]


def test_every_setting_has_an_env_twin_and_flags_win_over_env() -> None:
    import argparse

    parser = argparse.ArgumentParser()
    Settings.add_arguments(parser)
    env = {"SR_GATEWAY_PORT": "9000", "SR_GATEWAY_MAX_REQUEST_BYTES": "64", "SR_GATEWAY_HOST": "127.0.0.2"}
    s = Settings.resolve(parser.parse_args(["--port", "9100"]), env)
    assert (s.port, s.max_request_bytes, s.host) == (9100, 64, "127.0.0.2")
    assert Settings.resolve(parser.parse_args([]), {}).port == 8080
    with pytest.raises(SettingsError, match=r"^port \(SR_GATEWAY_PORT\): 'eighty' is not a valid int$"):
        Settings.resolve(parser.parse_args([]), {"SR_GATEWAY_PORT": "eighty"})


def test_a_model_that_is_not_ready_answers_503_and_health_reports_its_status() -> None:
    rt = runtime()
    with pytest.raises(ApiError) as err:
        rt.resolve(None, "embeddings")
    assert err.value.code == "not_ready" and err.value.status == 503
    assert rt.process_status() == ("starting", "model all-minilm-l6-v2 is starting")


def test_a_surface_the_model_does_not_serve_is_422() -> None:
    rt = runtime()
    with pytest.raises(ApiError) as err:
        rt.resolve("all-minilm-l6-v2", "classify")
    assert err.value.status == 422 and err.value.code == "unsupported_surface"


def test_admission_is_all_or_nothing_and_a_request_that_can_never_fit_is_413() -> None:
    rt = runtime(max_queue=10)
    model = rt.models["all-minilm-l6-v2"]
    rt.admit(model, 6)
    with pytest.raises(ApiError) as busy:
        rt.admit(model, 5)
    assert busy.value.code == "overloaded" and rt.inflight["all-minilm-l6-v2"] == 6
    rt.admit(model, 4)
    rt.release(model, 10)
    with pytest.raises(ApiError) as never:
        rt.admit(model, 11)
    assert never.value.code == "request_too_large" and rt.inflight["all-minilm-l6-v2"] == 0


@pytest.mark.parametrize("header, expected", [(None, None), ("", None), ("identity", None), ("GZIP", "gzip"),
                                              ("x-gzip", "x-gzip"), ("zstd", "zstd")])
def test_content_encoding_names_one_supported_coding(header: str | None, expected: str | None) -> None:
    assert content_encoding(header) == expected


def test_gzip_decoding_stops_one_byte_past_the_limit() -> None:
    data = gzip.compress(b"a" * 1000)
    assert decode(data, "gzip", 1000) == b"a" * 1000
    with pytest.raises(ApiError) as err:
        decode(data, "gzip", 999)
    assert err.value.status == 413
    assert decode(gzip.compress(b"ab") + gzip.compress(b"cd"), "gzip", 10) == b"abcd"  # concatenated members


def test_json_parsing_keeps_valid_non_bmp_text() -> None:
    assert parse_json('{"a": "😀 \\ud83d\\ude00"}'.encode()) == {"a": "😀 😀"}


def test_chunks_are_length_sorted_and_stay_under_the_token_budget() -> None:
    lengths = [5, 100, 7, 50, 3, 100]
    chunks = plan_chunks(lengths, 200)
    assert sorted(i for c in chunks for i in c) == list(range(6))
    for chunk in chunks:
        assert len(chunk) * max(lengths[i] for i in chunk) <= 200 or len(chunk) == 1
    assert chunks[0] == [1, 5]
    assert plan_chunks([600], 200) == [[0]]  # one row alone always runs


def test_a_ragged_batch_gives_each_row_what_it_gets_alone() -> None:
    onnx = REPO / "all-minilm-l6-v2" / "1" / "model.onnx"
    if not onnx.is_file():
        pytest.fail("model repository is not built: run `make models`")
    encoder = RaggedRunner(make_session(str(onnx), threads=1), max_batch_tokens=64)
    rng = np.random.default_rng(7)
    rows = [np.array([101, *rng.integers(2000, 29000, n), 102], dtype=np.int64) for n in (3, 40, 9, 1, 25)]
    batched, stats = encoder.run_pooled(rows)
    assert batched.shape == (5, 384) and not encoder.per_token
    assert stats.rows == 5 and stats.chunks > 1 and stats.tokens == sum(len(r) for r in rows)
    for i, row in enumerate(rows):
        alone, _ = encoder.run_pooled([row])
        assert np.max(np.abs(alone[0] - batched[i])) < 1e-5


def test_the_readme_configuration_table_lists_every_setting() -> None:
    from dataclasses import fields

    readme = (REPO.parent / "README.md").read_text()
    for f in fields(Settings):
        row = f"| `--{f.name.replace('_', '-')}` | `{Settings.env_name(f.name)}` |"
        assert row in readme, f"README lacks {row}"


def test_forward_counts_overlapping_executions_once_and_queue_is_the_rest() -> None:
    from gateway.execution.phases import phase_times
    from gateway.triton import Execution, Result

    ms = 1_000_000
    v = np.zeros(1, dtype=np.float32)

    def vector(start: int, received: int) -> Result:
        return Result(v, Execution(start * ms, 1, 1, 1), 0, received * ms)

    # submitted at 0; executions 2→5 and 4→7 overlap (5 ms of forward), then a gap, then 9→10
    queue, forward = phase_times([vector(2, 5), vector(4, 7), vector(9, 10)], 0)
    assert (queue, forward) == (4.0, 6.0)
    assert phase_times([], 0) == (0.0, 0.0)


def test_a_scores_head_gives_independent_sigmoids_selected_by_threshold_and_max_over_windows() -> None:
    from gateway.cards import HeadSpec
    from gateway.execution.items import Item
    from gateway.execution.jobs import Job
    from gateway.runtime import ServedModel
    from gateway.surfaces.classify import _answer
    from gateway.triton import Execution, Result

    head = HeadSpec(name="topics", kind="scores", labels=["a", "b", "c"], default_threshold=0.5)
    model = ServedModel(discover(REPO, ["all-minilm-l6-v2"])[0])
    execution = Execution(0, 1, 1, 1)
    windows = [np.array([2.0, -2.0, -0.5], dtype=np.float32), np.array([-1.0, 1.0, -3.0], dtype=np.float32)]
    item = Item(text="t", jobs=[Job([1], result=Result(w, execution, 0, 1)) for w in windows],
                spans=[(0, 4), (2, 6)], usage={"tokens": 8, "processed_tokens": 12, "truncated": False, "windows": 2})
    answer = _answer(model, head, item, threshold=0.5, return_tokens=False)
    sig = 1 / (1 + np.exp(-np.maximum(windows[0], windows[1])))
    assert answer["scores"] == {k: round(float(v), 6) for k, v in zip("abc", sig, strict=True)}
    assert answer["selected"] == ["a", "b"]  # per-label max: sigmoid(2), sigmoid(1) ≥ 0.5 > sigmoid(-0.5)
    assert [w["start"] for w in answer["windows"]] == [0, 2] and "probabilities" not in answer


def test_a_non_finite_model_output_fails_only_that_input() -> None:
    from gateway.execution.items import Item
    from gateway.execution.jobs import Job
    from gateway.surfaces.classify import _answer
    from gateway.surfaces.embeddings import _vector
    from gateway.triton import Execution, Result

    model = Runtime(Settings(model_repository=REPO), discover(REPO, ["prompt-guard"]), Metrics()).models["prompt-guard"]
    assert model.card.heads is not None
    head = model.card.heads[0]
    nan = Result(np.asarray([np.nan, 1.0], dtype=np.float32), Execution(0, 0, 1, 3), 0, 0)
    answer = _answer(model, head, Item(jobs=[Job([1, 2, 3], result=nan)], usage={"tokens": 3}), 0.5, False)
    assert answer == {"error": "invalid_model_output", "message": "the model produced a non-finite number"}
    from gateway.errors import ItemError

    with pytest.raises(ItemError) as err:
        _vector(np.asarray([np.inf, 0.0], dtype=np.float32), 2, True, "float")
    assert err.value.code == "invalid_model_output"


def test_a_set_lists_every_label_that_reaches_its_threshold_not_only_those_above_it() -> None:
    """Spec: sets lists the labels that reach their threshold (达到其阈值), as classify's heads select ≥ threshold."""
    from gateway.decisions.answers import Outcome, assemble
    from gateway.decisions.questions import Option, Question

    q = Question("q", "set", "Which?", options=(Option("a", "A"), Option("b", "B"), Option("c", "C")))
    _, extras = assemble(q, Outcome(np.array([0.5, 0.75, 0.25])), {}, threshold=0.5)
    assert extras["sets"]["selected"] == ["a", "b"]  # 0.5 reaches 0.5; 0.25 does not
    _, extras = assemble(q, Outcome(np.array([0.5, 0.75, 0.25])), {}, threshold=0.75)
    assert extras["sets"]["selected"] == ["b"]


def test_a_row_cap_splits_chunks_the_token_budget_alone_would_keep_whole() -> None:
    from sr_backend.engines.shapes import DEFAULT_BUCKETS

    lengths = [6] * 300  # 8-token rows: 1,024 would fit 8,192 tokens
    assert len(plan_chunks(lengths, 8192, DEFAULT_BUCKETS)) == 1
    chunks = plan_chunks(lengths, 8192, DEFAULT_BUCKETS, max_batch_rows=64)
    assert [len(c) for c in chunks] == [64, 64, 64, 64, 44]
    assert sorted(i for c in chunks for i in c) == list(range(300))
    assert [len(c) for c in plan_chunks([6] * 70, 8192, None, max_batch_rows=64)] == [64, 6]


class _ShapeRecorder:
    """An engine that records the input shapes it runs; `shape_memory` as the engine under test would name it."""

    per_token = False
    inputs = frozenset({"input_ids", "attention_mask"})

    def __init__(self, shape_memory: Buckets | None = None) -> None:
        self.shape_memory = shape_memory
        self.shapes: list[tuple[int, ...]] = []

    def forward(self, feed: dict[str, np.ndarray]) -> np.ndarray:
        self.shapes.append(feed["input_ids"].shape)
        return np.zeros((feed["input_ids"].shape[0], 4), dtype=np.float32)


def test_warming_runs_the_widest_chunk_and_the_one_with_most_rows_that_the_limits_allow() -> None:
    graph = _ShapeRecorder()
    assert RaggedRunner(graph, 8192).warm(512) == [(16, 512), (1024, 8)]  # type: ignore[arg-type]
    assert graph.shapes == [(16, 512), (1024, 8)]
    assert RaggedRunner(graph, 8192).warm_shapes(256) == [(32, 256), (1024, 8)]  # type: ignore[arg-type]
    assert RaggedRunner(graph, 8192, max_batch_rows=64).warm_shapes(512) == [(16, 512), (64, 8)]  # type: ignore[arg-type]
    assert RaggedRunner(graph, 8192, buckets=None).warm(512) == []  # type: ignore[arg-type]  # unbounded: the old way


def test_an_engine_that_keeps_memory_per_shape_runs_with_its_own_buckets_and_warms_every_shape_a_chunk_can_have(
) -> None:
    from sr_backend.engines.shapes import COARSE_BUCKETS, DEFAULT_BUCKETS
    from sr_backend.engines.torch_engine import TorchEngine

    graph = _ShapeRecorder(COARSE_BUCKETS)
    runner = RaggedRunner(graph, 8192)  # type: ignore[arg-type]
    assert runner.buckets is COARSE_BUCKETS
    warmed = runner.warm(256)
    assert graph.shapes == warmed and len(set(warmed)) == len(warmed) == 153
    assert warmed[0] == (32, 256) and all(r * w <= 8192 and w <= 256 for r, w in warmed)
    # every chunk the planner can make over any batch is one of them
    rng = np.random.default_rng(5)
    for _ in range(300):
        lengths = [int(n) for n in rng.integers(1, 257, int(rng.integers(1, 1200)))]
        for chunk in plan_chunks(lengths, 8192, COARSE_BUCKETS):
            assert (COARSE_BUCKETS.count(len(chunk)), COARSE_BUCKETS.width(max(lengths[i] for i in chunk))) in warmed
    assert RaggedRunner(graph, 8192, buckets=None).warm(256) == []  # type: ignore[arg-type]  # unbounded: nothing
    # PyTorch names the coarse buckets at bf16 (oneDNN keeps its primitives per shape), not at fp32
    assert TorchEngine(None, "bf16", ["input_ids"], False).shape_memory is COARSE_BUCKETS
    assert TorchEngine(None, "fp32", ["input_ids"], False).shape_memory is None
    assert RaggedRunner(TorchEngine(None, "fp32", ["input_ids"], False)).buckets is DEFAULT_BUCKETS


def test_concurrent_loads_of_one_triton_model_send_one_load_request_and_share_its_failure() -> None:
    """Riders on one encoder are brought up at once; Triton builds every instance again for a second request."""
    import asyncio

    from tritonclient.utils import InferenceServerException

    from gateway.triton import Triton, TritonFailure

    class Client:
        def __init__(self, fail: bool) -> None:
            self.fail, self.loads, self.ready = fail, 0, False

        async def is_model_ready(self, model: str) -> bool:
            return self.ready

        async def load_model(self, model: str) -> None:
            self.loads += 1
            await asyncio.sleep(0.05)
            if self.fail:
                raise InferenceServerException("load failed", status="StatusCode.INTERNAL")
            self.ready = True

    async def scenario(fail: bool) -> tuple[int, list[object]]:
        triton = Triton("127.0.0.1:1")
        client = triton._client = Client(fail)  # type: ignore[assignment]
        results = await asyncio.gather(*(triton.load("m") for _ in range(3)), return_exceptions=True)
        assert not triton._loading  # nothing left in flight
        if not fail:
            await triton.load("m")  # a later load of a ready model sends none
        return client.loads, list(results)

    loads, results = asyncio.run(scenario(fail=False))
    assert loads == 1 and results == [None, None, None]
    loads, results = asyncio.run(scenario(fail=True))
    assert loads == 1 and all(isinstance(r, TritonFailure) for r in results)
