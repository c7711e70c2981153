"""Every engine/precision the host's tuner accepted, served for real, not only the one it chose.

An AVX2 host serves MiniLM in fp32 and an AMX host in OpenVINO bf16; each would otherwise only ever test its own pick.
Here each accepted pair other than the served one gets its own gateway and tritonserver over a repository that serves
the model with that pair (`precision.repository_at`: the version directory linked, the pair written as the generated
config), with every card that rides on the model. Readiness is earned by every golden — the model's own and each
rider's decisions answers — at the card's tolerance for that precision; an embedder with layers is also compared with
PyTorch at each layer.
"""

from __future__ import annotations

from pathlib import Path

import httpx
import numpy as np
import pytest

from gateway.cards import Card, discover
from sr_build.recipes.sentence_embedding import reference_embeddings
from sr_build.sources import package_dir
from sr_build.tune import tunable

from .conftest import ROOT, serving
from .precision import accepted_choices, golden_tolerance, label, repository_at, same_path, served

REPO = ROOT / "model_repository"
LAYER_TEXTS = ["A man is playing a guitar.", "一位男士正在弹吉他。", "hi",
               "The stock market fell sharply today after the central bank raised rates again."]


def _rounds() -> list[dict[str, tuple[Card, dict[str, str]]]]:
    """Every accepted pair that is not the one this host serves (the session gateway tests that), in rounds: round k
    serves each model at its k-th other pair, so one gateway start covers a pair of every model."""
    if not REPO.is_dir():
        return []
    cards = {card.directory.name: card for card in discover(REPO, None)}
    others = {name: [c for c in accepted_choices(card) if not same_path(c, served(card))]
              for name, card in cards.items() if tunable(card)}
    depth = max((len(pairs) for pairs in others.values()), default=0)
    return [{model: (cards[model], pairs[k]) for model, pairs in others.items() if k < len(pairs)}
            for k in range(depth)]


ROUNDS = _rounds()


@pytest.mark.skipif(not ROUNDS, reason="the host's tuner accepted only the pair it serves, for every model")
@pytest.mark.parametrize("pairs", ROUNDS, ids=[", ".join(f"{m}={label(c)}" for m, (_, c) in r.items()) for r in ROUNDS])
def test_each_accepted_precision_earns_readiness_by_every_golden_riders_included(
        pairs: dict[str, tuple[Card, dict[str, str]]], tmp_path: Path) -> None:
    repo = tmp_path / "repo"
    riders = repository_at(repo, REPO, {model: choice for model, (_, choice) in pairs.items()})
    with serving(repo, f"accepted-{tmp_path.name}.log", f"gateway serving {len(pairs)} models at other pairs",
                 timeout=600) as url:
        health = httpx.get(url + "/health", timeout=10).json()
        models = {m["id"]: m for m in httpx.get(url + "/v1/models", timeout=10).json()["data"]}
        assert health["status"] == "ready", health
        cards = {c.id: c for c in discover(repo, None)}
        for rider in riders:  # each model and every card riding on it run at the pair under test, goldens matched
            choice = pairs[cards[rider].triton_name][1]
            assert models[rider]["golden"]["status"] == ("matched" if cards[rider].golden else "unverified"), \
                (rider, label(choice), models[rider]["golden"])
            assert models[rider]["engine_args"]["engine"] == choice["engine"], (rider, models[rider]["engine_args"])
            assert models[rider]["engine_args"]["precision"] == choice["precision"], \
                (rider, models[rider]["engine_args"])
        for card, choice in pairs.values():
            if _has_pytorch_layers(card):
                _layers_match_pytorch(url, card, choice)


def _has_pytorch_layers(card: Card) -> bool:
    """A text embedder built from PyTorch weights (the sentence-embedding recipe) with several layers to ask for."""
    return (card.embedding is not None and len(card.embedding.layers) > 1 and card.build is not None
            and card.build.get("recipe") == "sentence-embedding")


def _layers_match_pytorch(url: str, card: Card, choice: dict[str, str]) -> None:
    assert card.build is not None and card.embedding is not None
    weights = package_dir(card.build["source"]["package"], card.build["source"].get("dir", ""))
    tolerance = golden_tolerance(card, choice)
    for layer in card.embedding.layers:
        r = httpx.post(url + "/v1/embeddings", json={"model": card.id, "input": LAYER_TEXTS, "layer": layer},
                       timeout=60)
        assert r.status_code == 200, r.text
        got = np.array([d["embedding"] for d in r.json()["data"]], dtype=np.float64)
        diff = float(np.max(np.abs(got - reference_embeddings(weights, LAYER_TEXTS, layer))))
        print(f"{card.id} {label(choice)} layer {layer}: max abs diff vs PyTorch {diff:.2e} (tolerance {tolerance})")
        assert diff <= tolerance


def test_the_pairs_come_from_the_tune_record_and_a_model_without_one_has_only_its_config(tmp_path: Path) -> None:
    """The list is the tuner's own record of what passed its checks; no record (an untuned model) is its config."""
    import json
    import shutil

    from gateway.cards import load_card

    card = load_card(REPO / "all-minilm-l6-v2" / "card.yaml")
    record = json.loads((card.version_dir / ".cache" / "tune.json").read_text())
    measured = {(c["engine"], c["precision"], c["recipe"] if c["precision"] == "int8" else "")
                for c in record["choice"]["candidates"] if c["status"] == "measured"}
    assert {(c["engine"], c["precision"], c["int8_recipe"] if c["precision"] == "int8" else "")
            for c in accepted_choices(card)} == measured
    assert any(same_path(c, served(card)) for c in accepted_choices(card))  # the served pair was accepted too

    copy = tmp_path / "m"
    shutil.copytree(card.directory, copy, ignore=shutil.ignore_patterns("1", "configs"))
    (copy / "1").mkdir()
    assert accepted_choices(load_card(copy / "card.yaml")) == [served(load_card(copy / "card.yaml"))]
