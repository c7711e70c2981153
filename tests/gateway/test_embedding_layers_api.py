"""`layer` on /v1/embeddings: MiniLM's card declares layers [3, 6]; the graph pools both in one forward and each
input gets the layer it asked for, checked against PyTorch (transformers' hidden states from the same package
weights, mean-pooled and normalised), through the real gateway and the real Triton."""

from __future__ import annotations

import asyncio
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import httpx
import numpy as np
import pytest

from gateway.cards import load_card
from gateway.inference import Inference
from gateway.triton import Result, Triton, TritonFailure
from sr_backend.engines import load_engine
from sr_backend.ragged import RaggedRunner, Row
from sr_build.recipes.sentence_embedding import reference_embeddings
from sr_build.sources import package_dir

from .conftest import MODEL, ROOT
from .contract import check
from .precision import FP32, golden_tolerance

CARD = load_card(ROOT / "model_repository" / MODEL / "card.yaml")
ONNX = CARD.version_dir / "model.onnx"
TOLERANCE = golden_tolerance(CARD)  # at the precision this host serves (bf16 on AMX hosts, fp32 on AVX2 ones)
FP32_TOLERANCE = golden_tolerance(CARD, FP32)  # the in-process checks below run fp32 on every engine
TEXTS = ["A man is playing a guitar.", "How do I reset my password?", "hi",
         "The stock market fell sharply today after the central bank raised rates again.",
         "Penguins live in Antarctica " * 12]


@pytest.fixture(scope="module")
def weights() -> Path:
    assert CARD.build is not None
    return package_dir(CARD.build["source"]["package"], CARD.build["source"].get("dir", ""))


@pytest.fixture(scope="module")
def pytorch(weights: Path) -> dict[int, np.ndarray]:
    """PyTorch's vectors of TEXTS at each declared layer."""
    return {layer: reference_embeddings(weights, TEXTS, layer) for layer in (3, 6)}


def embed(http: httpx.Client, body: dict) -> dict:  # type: ignore[type-arg]
    r = http.post("/v1/embeddings", json={"model": MODEL, **body})
    check("/v1/embeddings", "post", r.status_code, r.json(), r.headers)
    assert r.status_code == 200, r.text
    return r.json()  # type: ignore[no-any-return]


def vectors(answer: dict) -> np.ndarray:  # type: ignore[type-arg]
    return np.array([d["embedding"] for d in answer["data"]], dtype=np.float64)


def test_the_card_declares_layers_3_and_6_with_the_last_as_default() -> None:
    assert CARD.embedding is not None and CARD.embedding.layers == [3, 6]


def test_each_layer_matches_pytorch_at_that_layer_and_the_layers_differ(http: httpx.Client,
                                                                       pytorch: dict[int, np.ndarray]) -> None:
    got = {layer: vectors(embed(http, {"input": TEXTS, "layer": layer})) for layer in (3, 6)}
    default = vectors(embed(http, {"input": TEXTS}))
    for layer in (3, 6):
        diff = float(np.max(np.abs(got[layer] - pytorch[layer])))
        print(f"layer {layer}: max abs diff vs PyTorch {diff:.2e}")
        assert diff <= TOLERANCE
    assert np.max(np.abs(default - got[6])) < 1e-6  # no layer = the last
    cosine = np.sum(got[3] * got[6], axis=1)
    assert np.all(cosine < 0.9), cosine  # layer 3 is a different vector space, not layer 6 again
    assert np.allclose(np.linalg.norm(got[3], axis=1), 1.0, atol=1e-5)  # normalised at every layer


def test_meta_representation_reports_the_layer_asked_for(http: httpx.Client) -> None:
    for body, layer in (({}, 6), ({"layer": 6}, 6), ({"layer": 3}, 3)):
        rep = embed(http, {"input": "x", **body, "options": {"return_meta": True}})["meta"]["representation"]
        assert rep["layer"] == layer and rep["dimension"] == 384 and rep["normalized"] is True


def test_an_undeclared_layer_is_400_invalid_request_and_dimensions_stay_what_the_card_declares(
        http: httpx.Client) -> None:
    for body in ({"layer": 5}, {"layer": 7}, {"layer": -1}, {"layer": 3, "dimensions": 256}):
        r = http.post("/v1/embeddings", json={"model": MODEL, "input": "x", **body})
        check("/v1/embeddings", "post", r.status_code, r.json(), r.headers)
        assert r.status_code == 400 and r.json()["error"]["code"] == "invalid_request"
        assert ("layer must be one of [3, 6]" if "dimensions" not in body else "dimensions must be one of [384]") \
            in r.json()["error"]["message"]


def test_concurrent_requests_for_different_layers_each_get_their_own(http: httpx.Client,
                                                                     pytorch: dict[int, np.ndarray]) -> None:
    asks = [(i % len(TEXTS), (3, 6, None)[i % 3]) for i in range(30)]

    def one(ask: tuple[int, int | None]) -> np.ndarray:
        text, layer = ask
        body = {"input": [TEXTS[text]], **({} if layer is None else {"layer": layer})}
        return vectors(embed(http, body))[0]

    with ThreadPoolExecutor(10) as pool:
        answers = list(pool.map(one, asks))
    for (text, layer), vector in zip(asks, answers, strict=True):
        assert np.max(np.abs(vector - pytorch[layer or 6][text])) <= TOLERANCE


def test_one_triton_batch_mixing_layers_gives_each_row_its_own_layer(triton_url: str,
                                                                     pytorch: dict[int, np.ndarray]) -> None:
    """Straight at the seam: concurrent requests with LAYER 3, LAYER 6 and none; Triton's TIMING shows which ran
    in one execute(), and at least one execute() must have held several layers."""
    from tokenizers import Tokenizer

    tokenizer = Tokenizer.from_file(str(CARD.tokenizer_path))
    tokenizer.no_padding()
    tokenizer.no_truncation()
    ids = [tokenizer.encode(t).ids for t in TEXTS]
    asks = [(i % len(TEXTS), (3, 6, None)[i % 3]) for i in range(48)]

    async def run() -> list[Result]:
        inference = Inference(Triton(triton_url))
        try:
            return list(await asyncio.gather(*(inference.infer(MODEL, "EMBEDDING", ids[t], layer=layer)
                                               for t, layer in asks)))
        finally:
            await inference.close()

    mixed: set[frozenset[int | None]] = set()
    for _ in range(5):  # batches form by timing; a few rounds make a mixed one all but certain
        results = asyncio.run(run())
        executions: dict[tuple[int, int], set[int | None]] = {}
        for (text, layer), result in zip(asks, results, strict=True):
            assert np.max(np.abs(result.values - pytorch[layer or 6][text])) <= TOLERANCE
            executions.setdefault((result.execution.started_ns, result.execution.forward_ns), set()).add(layer)
        mixed |= {frozenset(layers) for layers in executions.values() if len(layers) > 1}
        if any({3, 6} <= m for m in mixed):
            break
    print(f"layer sets seen together in one execute(): {sorted(map(sorted, mixed), key=str)}")
    assert any({3, 6} <= m for m in mixed), "no execute() ever held layers 3 and 6 together"


def test_triton_refuses_an_undeclared_layer_for_that_request_only(triton_url: str) -> None:
    async def run() -> tuple[Exception | Result, Result]:
        inference = Inference(Triton(triton_url))
        try:
            bad, good = await asyncio.gather(inference.infer(MODEL, "EMBEDDING", [101, 7592, 102], layer=4),
                                             inference.infer(MODEL, "EMBEDDING", [101, 7592, 102], layer=3),
                                             return_exceptions=True)
            assert isinstance(good, Result)
            return bad, good
        finally:
            await inference.close()

    bad, good = asyncio.run(run())
    assert isinstance(bad, TritonFailure) and "not one of this model's layers [3, 6]" in str(bad)
    assert good.values.shape == (384,)


def test_a_bundle_runs_one_input_at_two_layers_twice_not_once(http: httpx.Client,
                                                               pytorch: dict[int, np.ndarray]) -> None:
    """Identical inputs in a bundle's tasks are run once, but the layer is part of what makes them identical."""
    tasks = [{"id": f"l{layer}", "embeddings": {"model": MODEL, "input": [TEXTS[0]], "layer": layer}}
             for layer in (3, 6)]
    r = http.post("/v1/bundle", json={"tasks": tasks})
    check("/v1/bundle", "post", r.status_code, r.json(), r.headers)
    got = {x["id"]: np.array(x["embeddings"]["data"][0]["embedding"]) for x in r.json()["results"]}
    for layer in (3, 6):
        assert np.max(np.abs(got[f"l{layer}"] - pytorch[layer][0])) <= TOLERANCE


def test_rerank_scores_with_the_default_layer(http: httpx.Client, pytorch: dict[int, np.ndarray]) -> None:
    r = http.post("/v1/rerank", json={"model": MODEL, "query": TEXTS[0], "documents": TEXTS[1:]})
    check("/v1/rerank", "post", r.status_code, r.json(), r.headers)
    logits = {x["index"]: x["logit"] for x in r.json()["results"]}
    at = {layer: pytorch[layer][1:] @ pytorch[layer][0] for layer in (3, 6)}
    assert all(abs(logits[i] - at[6][i]) <= 2 * TOLERANCE for i in logits)
    assert any(abs(logits[i] - at[3][i]) > 0.05 for i in logits)


async def test_every_input_to_the_layered_model_names_its_layer_so_all_of_them_can_share_a_batch() -> None:
    """Triton batches only requests with the same inputs, so the gateway sends LAYER for the default too, from
    every surface that reads through the embedder (fake engine behind the seam: it records what was asked)."""
    from .fake_engine import served_by_fake

    async with served_by_fake(MODEL) as (client, engine):
        for path, body, layers in (
                ("/v1/embeddings", {"input": ["a", "b"]}, [6, 6]),
                ("/v1/embeddings", {"input": ["a"], "layer": 3}, [3]),
                ("/v1/embeddings", {"input": ["a"], "layer": 6}, [6]),
                ("/v1/rerank", {"query": "q", "documents": ["d1", "d2"]}, [6, 6, 6])):
            engine.layers.clear()
            r = await client.post(path, json={"model": MODEL, **body})
            assert r.status == 200, await r.text()
            assert engine.layers == layers, (path, body)


@pytest.mark.parametrize("engine", ["onnxruntime", "openvino", "torch"])
def test_engines_read_the_layered_output_as_pooled_and_rows_take_their_own_layer(
        engine: str, pytorch: dict[int, np.ndarray]) -> None:
    """In process: `[B, layers, D]` is not mistaken for per-token, and one padded chunk mixing layers answers each
    row at its layer (index into the card's layers; -1 = the last)."""
    from tokenizers import Tokenizer

    runner = RaggedRunner(load_engine(engine, "fp32", ONNX, 1))
    assert not runner.per_token
    tokenizer = Tokenizer.from_file(str(CARD.tokenizer_path))
    tokenizer.no_padding()
    tokenizer.no_truncation()
    rows = [Row(np.array(tokenizer.encode(t).ids, dtype=np.int64), layer=k % 2) for k, t in enumerate(TEXTS)]
    rows.append(Row(rows[0].ids))  # no layer: the last
    out, stats = runner.run(rows)
    assert stats.chunks == 1  # every row in one forward
    for k, vector in enumerate(out[:-1]):
        assert np.max(np.abs(vector - pytorch[(3, 6)[k % 2]][k])) <= FP32_TOLERANCE
    assert np.max(np.abs(out[-1] - pytorch[6][0])) <= FP32_TOLERANCE


def test_the_precision_check_sees_every_layer() -> None:
    """`models tune` checks a faster precision at every declared layer: a candidate right at layer 6 but wrong at
    layer 3 is rejected."""
    from sr_build.tune_samples import verification_rows
    from sr_build.tune_text import check, every_layer, fp32_reference

    rows = verification_rows(CARD)
    layered = every_layer(CARD, rows)
    assert len(layered) == 2 * len(rows)
    reference = fp32_reference(ONNX, layered)
    spec = CARD.precisions["int8"]
    assert check(CARD, spec, reference, reference)[0]
    wrong_at_3 = reference[len(rows):] + reference[len(rows):]  # layer 6's answers given for layer 3 too
    ok, metrics, why = check(CARD, spec, reference, wrong_at_3)
    assert not ok and metrics["min_cosine"] < 0.9, why
