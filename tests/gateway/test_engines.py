"""Engines behind the ragged runner, declared and verified precisions, and the per-host tuning cache.

Real graphs from the built repository (MiniLM), real ONNX Runtime / OpenVINO / dynamic quantisation; the timing
window is shortened so the measurements stay quick, the decisions they drive are the tuner's own.
"""

from __future__ import annotations

import shutil
import warnings
from dataclasses import replace
from pathlib import Path

import httpx
import numpy as np
import pytest
import yaml

from gateway import cli
from gateway.cards import Card, PrecisionSpec, discover, load_card
from gateway.runtime import ServedModel, apply_loaded_config, served_dtype, served_engine, served_precision
from gateway.surfaces.info import OPENAPI_PATH
from sr_backend.engines import (
    ENGINES,
    PRECISIONS,
    EngineError,
    configured_choice,
    int8_path,
    load_configured,
    load_engine,
)
from sr_backend.engines.host import detect
from sr_backend.engines.ort_engine import quantize_int8
from sr_backend.ragged import RaggedRunner
from sr_build import tune, tune_measure, tune_samples, tune_text
from sr_build.store import ModelStore
from sr_common.tuned_config import generated_config, is_stale, refresh

from .conftest import LOGS, serving

REPO = Path(__file__).resolve().parents[2] / "model_repository"
MODEL = "all-minilm-l6-v2"


def _card() -> Card:
    card = discover(REPO, [MODEL])[0]
    if not (card.version_dir / "model.onnx").is_file():
        pytest.fail("model repository is not built: run `make models`")
    return card


@pytest.fixture
def repo_copy(tmp_path: Path) -> Path:
    """MiniLM's directory with its own config (tuning generates configs/tuned.pbtxt beside it) and the built graph
    linked, not copied."""
    source = REPO / MODEL
    target = tmp_path / MODEL
    (target / "1").mkdir(parents=True)
    for name in ("card.yaml", "config.pbtxt"):
        shutil.copy(source / name, target / name)
    shutil.copy(source / "1" / "model.py", target / "1" / "model.py")
    for name in ("model.onnx", "model.pt2", "tokenizer.json"):
        (target / "1" / name).symlink_to(source / "1" / name)
    return tmp_path


@pytest.fixture
def quick(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(tune_measure, "MIN_SECONDS", 0.05)
    monkeypatch.setattr(tune_measure, "MIN_REPEATS", 1)
    monkeypatch.setattr(tune_text, "THROUGHPUT_SHAPE", (4, 64))


def test_openvino_and_onnxruntime_give_the_same_embeddings_through_the_ragged_runner() -> None:
    card = _card()
    rows = tune_samples.verification_rows(card)
    onnx = card.version_dir / "model.onnx"
    reference, _ = RaggedRunner(load_engine("onnxruntime", "fp32", onnx, 1), max_batch_tokens=64).run(rows)
    other, stats = RaggedRunner(load_engine("openvino", "fp32", onnx, 1), max_batch_tokens=64).run(rows)
    assert stats.chunks > 1 and stats.rows == len(rows)  # the chunking is the runner's, whatever the engine
    for a, b in zip(reference, other, strict=True):
        assert float(np.dot(a, b) / (np.linalg.norm(a) * np.linalg.norm(b))) > 0.99999


def test_openvino_fp32_is_fp32_on_every_cpu_not_int8_activations_behind_an_f32_hint() -> None:
    """On VNNI/AVX-512 CPUs OpenVINO quantises fully-connected activations on the fly unless told not to; the PII
    tagger's logits then moved by 0.2 and two tokens changed label (AMD EPYC with avx512_vnni, 2026-12-01)."""
    card = discover(REPO, ["pii-rampart"])[0]
    onnx = card.version_dir / "model.onnx"
    rows = tune_samples.verification_rows(card)
    reference, _ = RaggedRunner(load_engine("onnxruntime", "fp32", onnx, 1), max_batch_tokens=256).run(rows)
    engine = load_engine("openvino", "fp32", onnx, 1)
    assert int(engine.compiled.get_property("DYNAMIC_QUANTIZATION_GROUP_SIZE")) == 0  # type: ignore[attr-defined]
    other, _ = RaggedRunner(engine, max_batch_tokens=256).run(rows)
    for a, b in zip(reference, other, strict=True):
        assert float(np.max(np.abs(a - b))) < 1e-3
        assert np.array_equal(a.argmax(-1), b.argmax(-1))


def test_openvino_leaves_thread_placement_to_the_os_so_separate_instances_do_not_share_a_core() -> None:
    """Triton runs each instance in its own process; pinned, each pinned its threads from core 0 on."""
    engine = load_engine("openvino", "fp32", _card().version_dir / "model.onnx", 1)
    assert engine.compiled.get_property("ENABLE_CPU_PINNING") is False  # type: ignore[attr-defined]


def test_an_engine_without_the_precision_or_a_cpu_without_native_bf16_is_refused_with_a_reason() -> None:
    onnx = _card().version_dir / "model.onnx"
    with pytest.raises(EngineError, match="not available"):
        load_engine("onnxruntime", "bf16", onnx)
    with pytest.raises(EngineError, match="not available"):
        load_engine("torch", "int8", onnx)
    pii = discover(REPO, ["pii-rampart"])[0].version_dir / "model.onnx"  # a prebuilt ONNX: no PyTorch program
    with pytest.raises(EngineError, match=r"model\.pt2 is missing: the torch engine runs the program"):
        load_engine("torch", "fp32", pii)
    if not detect().native_bf16:
        for engine in ("openvino", "torch"):
            with pytest.raises(EngineError, match="no native bf16"):
                load_engine(engine, "bf16", onnx)


def test_int8_is_accepted_only_at_a_tolerance_its_answers_meet(tmp_path: Path) -> None:
    card = _card()
    rows = tune_samples.verification_rows(card)
    onnx = card.version_dir / "model.onnx"
    target = tmp_path / "model.int8.onnx"
    quantize_int8(onnx, target)
    reference, _ = RaggedRunner(load_engine("onnxruntime", "fp32", onnx, 1)).run(rows)
    quantised, _ = RaggedRunner(load_engine("onnxruntime", "int8", tmp_path / "model.onnx", 1)).run(rows)
    ok, metrics, _ = tune_text.check(card, PrecisionSpec(min_cosine=0.9), reference, quantised)
    assert ok and 0.9 < metrics["min_cosine"] < 1.0  # int8 rounds: close, never identical
    ok, _, why = tune_text.check(card, PrecisionSpec(min_cosine=0.99999), reference, quantised)
    assert not ok and "min cosine" in why
    ok, _, why = tune_text.check(card, PrecisionSpec(max_prob_diff=0.5), reference, quantised)
    assert not ok and "states no min_cosine" in why  # an embedding precision needs a cosine bound


def test_classifier_precisions_must_keep_the_argmax_and_stay_within_the_probability_difference() -> None:
    card = discover(REPO, ["prompt-guard"])[0]
    reference = [np.array([2.0, -1.0]), np.array([-3.0, 3.0])]
    close = [np.array([2.01, -1.0]), np.array([-3.0, 3.02])]
    flipped = [np.array([-1.0, 2.0]), np.array([-3.0, 3.0])]
    assert tune_text.check(card, PrecisionSpec(max_prob_diff=0.01), reference, close)[0]
    ok, metrics, why = tune_text.check(card, PrecisionSpec(max_prob_diff=0.99), reference, flipped)
    assert not ok and metrics["argmax_mismatches"] == 1 and "argmax" in why
    ok, _, why = tune_text.check(card, PrecisionSpec(max_prob_diff=1e-6), reference, close)
    assert not ok and "probability difference" in why


def test_a_precision_the_card_does_not_allow_is_refused_before_anything_is_measured(repo_copy: Path,
                                                                                    capsys: pytest.CaptureFixture[str]
                                                                                    ) -> None:
    card_path = repo_copy / MODEL / "card.yaml"
    text = card_path.read_text()
    start = text.index("precisions:")
    end = text.index("numerics:")
    card_path.write_text(text[:start] + text[end:])  # the card allows fp32 only
    before = (repo_copy / MODEL / "config.pbtxt").read_text()
    code = cli.main(["models", "tune", "--model-repository", str(repo_copy), "--precision", "int8"])
    assert code == 1
    assert "precision 'int8' is not allowed by its card (allowed: fp32)" in capsys.readouterr().err
    assert (repo_copy / MODEL / "config.pbtxt").read_text() == before
    assert not generated_config(repo_copy / MODEL).exists()


def test_tuning_writes_its_choice_into_a_generated_config_and_is_cached_per_host_and_graph(
        repo_copy: Path, quick: None, monkeypatch: pytest.MonkeyPatch) -> None:
    card = load_card(repo_copy / MODEL / "card.yaml")
    authored = (repo_copy / MODEL / "config.pbtxt").read_text()
    first = tune.tune_model(card, engine="onnxruntime", precision="fp32", log=lambda _: None)
    assert first.source == "override" and (first.engine, first.precision) == ("onnxruntime", "fp32")
    assert (first.instances, first.threads) in tune_measure.cpu_layouts(detect().cores)
    written = tune.read_config_choice(repo_copy / MODEL)
    assert written == {"engine": "onnxruntime", "precision": "fp32", "threads": str(first.threads),
                       "instances": str(first.instances), "int8_recipe": "dynamic"}
    assert (repo_copy / MODEL / "config.pbtxt").read_text() == authored  # the tracked file keeps the defaults
    generated = generated_config(repo_copy / MODEL).read_text()
    assert generated.startswith("# GENERATED by `sr-gateway models tune`") and detect().model in generated
    assert {c["status"] for c in first.candidates} == {"measured"} and len(first.layouts) >= 2

    again = tune.tune_model(card, engine="onnxruntime", precision="fp32", log=lambda _: None)
    assert again.source == "cached" and again.layouts == first.layouts  # nothing measured again

    other = replace(detect(), flags=(*detect().flags, "amx_bf16"))  # another CPU: its own measurement
    monkeypatch.setattr("sr_backend.engines.host.detect", lambda: other)
    moved = tune.tune_model(card, engine="onnxruntime", precision="fp32", log=lambda _: None)
    assert moved.source == "override" and moved.host["key"] == other.key != first.host["key"]


def test_a_fresh_checkout_takes_the_tune_and_an_int8_choices_quantised_copy_from_the_model_store(
        repo_copy: Path, quick: None, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """The engine loads an int8 choice from its quantised copy and never makes one at load, so the store keeps it
    with the record; a second checkout on this host measures nothing and serves the same choice."""
    store = ModelStore(tmp_path / "store", 1 << 30)
    card_path = repo_copy / MODEL / "card.yaml"
    card_path.write_text(card_path.read_text().replace("int8: {min_cosine: 0.999", "int8: {min_cosine: 0.9"))
    first = tune.tune_model(load_card(card_path), engine="onnxruntime", precision="int8",
                            log=lambda _: None, store=store)
    assert first.precision == "int8"  # dynamic or static, whichever measured faster

    fresh = tmp_path / "fresh"
    shutil.copytree(repo_copy / MODEL, fresh / MODEL, symlinks=True,
                    ignore=shutil.ignore_patterns(".cache", "configs", "model.int8*"))

    def measure(*_: object, **__: object) -> None:
        raise AssertionError("measured again")

    monkeypatch.setattr(tune_text, "measure_text", measure)
    again = tune.tune_model(load_card(fresh / MODEL / "card.yaml"), engine="onnxruntime", precision="int8",
                            log=lambda _: None, store=store)
    assert again.source == "cached" and (again.instances, again.threads) == (first.instances, first.threads)
    assert tune.read_config_choice(fresh / MODEL)["precision"] == "int8"
    accepted = {c["recipe"] for c in first.candidates if c["precision"] == "int8" and c["status"] == "measured"}
    assert first.int8_recipe in accepted
    for recipe in accepted:  # every int8 copy that passed its check comes along, not only the chosen one
        copy = int8_path(fresh / MODEL / "1" / "model.onnx", recipe)
        assert copy.read_bytes() == int8_path(repo_copy / MODEL / "1" / "model.onnx", recipe).read_bytes()
    load_engine("onnxruntime", "int8", fresh / MODEL / "1" / "model.onnx", 1, recipe=again.int8_recipe)


def test_the_tuner_serves_the_fastest_passing_candidate_and_says_why_the_others_lost(
        repo_copy: Path, quick: None) -> None:
    card = load_card(repo_copy / MODEL / "card.yaml")
    lines: list[str] = []
    choice = tune.tune_model(card, log=lines.append)
    by = {(c["engine"], c["precision"], c["recipe"]): c for c in choice.candidates}
    measured = [c for c in choice.candidates if c["status"] == "measured"]
    best_latency = min(c["latency_ms"] for c in measured)
    best_rows = max(c["rows_per_s"] for c in measured)

    def loss(c: dict[str, float]) -> float:
        return max(c["latency_ms"] / best_latency, best_rows / c["rows_per_s"])

    chosen = by[(choice.engine, choice.precision, choice.int8_recipe if choice.precision == "int8" else "")]
    assert chosen["status"] == "measured"
    assert all(loss(chosen) <= loss(c) * tune_measure.MARGIN for c in measured)  # nobody beats it beyond the noise
    assert by[("onnxruntime", "bf16", "")]["status"] == "unavailable"
    spec = card.precisions["int8"]
    assert spec.min_cosine is not None
    for recipe in ("dynamic", "static"):  # both int8 recipes are candidates, each held to the card's int8 check
        int8 = by[("onnxruntime", "int8", recipe)]
        assert (int8["status"] == "measured") == (int8["check"]["min_cosine"] >= spec.min_cosine), int8
    static = repo_copy / MODEL / "1" / "model.int8-static.onnx"
    assert static.is_file() and "calibration" in static.with_name(static.name + ".recipe").read_text()
    assert any(line.startswith(f"{MODEL}: chose {choice.engine}/{choice.precision}") for line in lines)


def test_models_reports_the_engine_precision_and_layout_triton_was_configured_with(http: httpx.Client) -> None:
    cards = {c["id"]: c for c in http.get("/v1/models").json()["data"]}
    for model in (MODEL, "pii-rampart", "prompt-guard"):
        configured = tune.read_config_choice(REPO / model)  # the config Triton loads: generated, else tracked
        card = cards[model]
        assert card["engine"] == f"triton/{configured['engine']}"
        assert card["engine_args"]["precision"] == configured["precision"]
        assert card["engine_args"]["instances"] == int(configured["instances"])  # what Triton itself reports
        assert card["engine_args"]["threads"] == int(configured["threads"])
        assert card["dtype"].endswith(configured["precision"])
        assert card["golden"]["status"] == "matched"


@pytest.mark.parametrize("engine", ["openvino", "torch"])
def test_a_model_tuned_to_another_engine_is_served_by_triton_and_passes_its_golden_check(engine: str, repo_copy: Path,
                                                                                         quick: None) -> None:
    card = load_card(repo_copy / MODEL / "card.yaml")
    tune.tune_model(card, engine=engine, precision="fp32", log=lambda _: None)
    # the tracked config still names ONNX Runtime: only the generated one (--model-config-name) names the engine
    assert configured_choice(repo_copy / MODEL / "config.pbtxt")["engine"] == "onnxruntime"
    # ready, not merely settled: a load that failed once is tried again (--model-retry-s), as in production; a
    # model that keeps failing times out with the log's tail, and one that healed is reported, not hidden
    with serving(repo_copy, f"serve-{engine}.log", f"gateway ({engine})", settled=("ready",)) as url:
        served = httpx.get(url + "/v1/models").json()["data"][0]
        assert served["status"] == "ready", (served["reason"], served["golden"])
        failed_loads = [line for line in (LOGS / f"serve-{engine}.log").read_text().splitlines() if " failed: " in line]
        if failed_loads:
            warnings.warn(f"{engine}: ready after failed loads: {failed_loads}", stacklevel=1)
        assert served["engine"] == f"triton/{engine}" and served["engine_args"]["precision"] == "fp32"
        assert served["golden"]["status"] == "matched"
        got = httpx.post(url + "/v1/embeddings", json={"model": MODEL, "input": "How do I reset my password?"})
        assert got.status_code == 200
        vector = np.array(got.json()["data"][0]["embedding"])
        reference, _ = RaggedRunner(load_engine("onnxruntime", "fp32", card.version_dir / "model.onnx", 1)).run(
            [tune_samples.verification_rows(card)[1]])
        assert float(np.dot(vector, reference[0]) / np.linalg.norm(reference[0])) > 0.99999


def test_an_edited_config_pbtxt_is_carried_into_the_generated_config_with_the_same_choice(repo_copy: Path,
                                                                                           quick: None) -> None:
    card = load_card(repo_copy / MODEL / "card.yaml")
    choice = tune.tune_model(card, engine="onnxruntime", precision="fp32", log=lambda _: None)
    source = repo_copy / MODEL / "config.pbtxt"
    source.write_text(source.read_text().replace("max_queue_delay_microseconds: 500",
                                                 "max_queue_delay_microseconds: 750"))
    assert is_stale(repo_copy / MODEL)
    assert refresh(repo_copy) == [MODEL] and not is_stale(repo_copy / MODEL)
    generated = generated_config(repo_copy / MODEL).read_text()
    assert "max_queue_delay_microseconds: 750" in generated
    assert tune.read_config_choice(repo_copy / MODEL)["instances"] == str(choice.instances)
    assert refresh(repo_copy) == []  # nothing stale, nothing written


def test_the_in_process_baseline_loads_the_engine_and_precision_of_the_served_config(repo_copy: Path,
                                                                                     quick: None) -> None:
    assert load_configured(repo_copy / MODEL).name == "onnxruntime"  # config.pbtxt: the author's default
    tune.tune_model(load_card(repo_copy / MODEL / "card.yaml"), engine="openvino", precision="fp32",
                    log=lambda _: None)
    engine = load_configured(repo_copy / MODEL, threads=1)
    assert (engine.name, engine.precision) == ("openvino", "fp32")


def test_the_gateway_serves_the_precision_triton_reports_it_loaded_not_the_local_file() -> None:
    card = _card()
    spec = card.precisions["int8"]
    assert card.golden is not None and spec.golden_tolerance not in (None, card.golden.tolerance)
    model = ServedModel(card, written=card)
    loaded = {"parameters": {"engine": {"string_value": "onnxruntime"}, "precision": {"string_value": "int8"},
                             "intra_op_threads": {"string_value": "2"}},
              "instance_group": [{"kind": "KIND_CPU", "count": 1}]}
    apply_loaded_config(model, loaded)
    assert model.engine == {"engine": "onnxruntime", "precision": "int8", "threads": 2, "int8_recipe": "dynamic"}
    assert model.card.golden is not None and model.card.golden.tolerance == spec.golden_tolerance
    apply_loaded_config(model, {"parameters": {}, "instance_group": [{"kind": "KIND_CPU", "count": 2}]})
    assert model.engine == {"engine": "onnxruntime", "precision": "fp32", "threads": 0}
    assert model.card.golden.tolerance == card.golden.tolerance  # back to the card's own fp32 tolerance


def test_a_gpu_variant_reports_its_own_provider_and_fp16_not_the_cpu_tuners_choice() -> None:
    card = _card()
    model = ServedModel(card, written=card)
    gpu = {"engine": {"string_value": "openvino"}, "precision": {"string_value": "bf16"},  # left by the CPU tuner
           "execution_provider": {"string_value": "tensorrt"}, "trt_fp16": {"string_value": "1"}}
    apply_loaded_config(model, {"parameters": gpu, "instance_group": [{"kind": "KIND_GPU", "count": 1}]})
    assert model.engine == {"engine": "tensorrt", "precision": "fp16", "threads": 0}
    assert served_dtype(model) == "fp16" and served_engine(model) == "triton/tensorrt"
    gpu["trt_fp16"] = {"string_value": "0"}
    apply_loaded_config(model, {"parameters": gpu, "instance_group": [{"kind": "KIND_GPU", "count": 1}]})
    assert model.engine["precision"] == "fp32"
    gpu["execution_provider"] = {"string_value": "cuda"}
    apply_loaded_config(model, {"parameters": gpu, "instance_group": [{"kind": "KIND_GPU", "count": 1}]})
    assert model.engine == {"engine": "cuda", "precision": "fp32", "threads": 0}


def test_static_int8_lives_beside_the_dynamic_copy_and_an_unknown_recipe_is_refused(tmp_path: Path) -> None:
    onnx = tmp_path / "model.onnx"
    assert int8_path(onnx).name == "model.int8.onnx"
    assert int8_path(onnx, "static").name == "model.int8-static.onnx"
    with pytest.raises(EngineError, match="int8_recipe 'qat' is not one of dynamic, static"):
        load_engine("onnxruntime", "int8", onnx, recipe="qat")


def test_openvino_int8_is_an_nncf_ir_made_once_from_real_texts_and_passes_prompt_guards_int8_check(
        tmp_path: Path) -> None:
    from sr_backend.engines.openvino_engine import ensure_int8_nncf

    card = discover(REPO, ["prompt-guard"])[0]
    onnx = tmp_path / "model.onnx"
    onnx.symlink_to(card.version_dir / "model.onnx")
    target = int8_path(onnx, "nncf")
    assert target.name == "model.int8-nncf.xml"
    with pytest.raises(EngineError, match="missing"):
        load_engine("openvino", "int8", onnx, recipe="nncf")
    feeds = tune_samples.calibration_feeds(card, card.version_dir / "model.onnx")
    assert ensure_int8_nncf(onnx, target, feeds) and target.with_suffix(".bin").is_file()
    assert not ensure_int8_nncf(onnx, target, feeds)  # recorded beside it: not made again
    engine = load_engine("openvino", "int8", onnx, 1, recipe="nncf")
    assert (engine.name, engine.precision) == ("openvino", "int8")
    rows = tune_samples.verification_rows(card)
    reference, _ = RaggedRunner(load_engine("onnxruntime", "fp32", onnx, 1), max_batch_tokens=2048).run(rows)
    answers, _ = RaggedRunner(engine, max_batch_tokens=2048).run(rows)
    ok, metrics, why = tune_text.check(card, card.precisions["int8"], reference, answers)
    assert ok, why
    assert 0 < metrics["max_prob_diff"] <= 0.01  # int8 really ran: not bit-equal to fp32, within the card's bound
    with pytest.raises(EngineError, match="nncf"):
        load_engine("openvino", "int8", onnx, recipe="dynamic")
    with pytest.raises(EngineError, match="not one of dynamic, static"):
        load_engine("onnxruntime", "int8", onnx, recipe="nncf")


def test_static_int8_calibrates_on_real_request_texts_not_on_the_verification_texts() -> None:
    card = _card()
    feeds = tune_samples.calibration_feeds(card, card.version_dir / "model.onnx")
    assert len(feeds) == tune_samples.CALIBRATION_ROWS and {"input_ids", "attention_mask"} <= set(feeds[0])
    verification = {tuple(r.tolist()) for r in tune_samples.verification_rows(card)}
    assert not any(tuple(f["input_ids"][0].tolist()) in verification for f in feeds)
    assert len({f["input_ids"].shape[1] for f in feeds}) > 1  # each row at its own length, no padding calibrated


def test_the_tune_is_keyed_by_the_calibration_texts_so_editing_an_items_split_re_tunes_nothing(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    import json

    card = _card()
    onnx = card.version_dir / "model.onnx"
    lines = [json.loads(line) for line in tune_samples.CALIBRATION_TEXTS.read_text(encoding="utf-8").splitlines()]
    copy = tmp_path / "items.jsonl"

    def key_with(items: list[dict[str, object]]) -> object:
        copy.write_text("".join(json.dumps(i, ensure_ascii=False) + "\n" for i in items), encoding="utf-8")
        monkeypatch.setattr(tune_samples, "CALIBRATION_TEXTS", copy)
        return tune._key(card, onnx, detect(), None, None)["calibration"]

    before = key_with(lines)
    assert key_with([{**i, "split": "fit", "moved_from": i["split"]} for i in lines]) == before
    calibrated = tune_samples.calibration_texts(card)[0]
    assert key_with([{**i, "state": i["state"] + " (edited)"} if i["state"] == calibrated else i
                     for i in lines]) != before


def test_a_model_other_cards_ride_on_is_offered_only_the_precisions_every_rider_allows() -> None:
    """The zero-shot families run on MiniLM's Triton graph: its precision is theirs, so a precision one of them
    does not allow (int8) is never a candidate, and each rider's golden has its own tolerance at the others."""
    cards = discover(REPO, None)
    minilm = next(c for c in cards if c.id == MODEL)
    riders = [c for c in cards if c.triton_name == MODEL and c.id != MODEL]
    assert {c.id for c in riders} == {"domain-zeroshot", "decision-zeroshot"}
    assert set(minilm.precisions) == {"int8", "bf16"}
    assert set(tune.with_riders(minilm, riders).precisions) == {"bf16"}
    assert tune.with_riders(minilm, []) is minilm
    for rider in riders:  # served at bf16, a rider's golden is checked at the tolerance its card states for bf16
        served, _ = served_precision(rider, {"engine": "openvino", "precision": "bf16", "threads": "2"})
        assert served.golden is not None and served.golden.tolerance == rider.precisions["bf16"].golden_tolerance


def test_the_openapi_contract_names_every_engine_and_precision_the_tuner_can_serve() -> None:
    """`/v1/models` reports engine_args.engine/precision from sr_backend's lists (the CLI's choices too): the
    contract's enums must grow with them, or a response would break its own schema."""
    args = yaml.safe_load(OPENAPI_PATH.read_bytes())["components"]["schemas"]["ModelCard"]["properties"]["engine_args"]
    assert set(ENGINES) <= set(args["properties"]["engine"]["enum"])
    assert set(PRECISIONS) <= set(args["properties"]["precision"]["enum"])


# -- bounded memory (issue 23): bucketed shapes, capped per-shape caches ----------------------------------------------
class _ShapeLog:
    """An engine that records every input shape it is given and answers zeros of the pooled shape (what the runner
    sends is under test here, not the graph)."""

    per_token = False
    inputs = frozenset({"input_ids", "attention_mask"})
    shape_memory = None

    def __init__(self) -> None:
        self.shapes: set[tuple[int, ...]] = set()

    def forward(self, feed: dict[str, np.ndarray]) -> np.ndarray:
        self.shapes.add(tuple(feed["input_ids"].shape))
        return np.zeros((feed["input_ids"].shape[0], 384), dtype=np.float32)


def _ragged_batches(count: int, seed: int = 5, most_rows: int = 32) -> list[list[np.ndarray]]:
    """`count` batches of 1..most_rows rows of 3..121 tokens, as Triton's ragged batching hands them over (ids
    within every test model's vocabulary)."""
    rng = np.random.default_rng(seed)
    return [[np.array([101, *rng.integers(2000, 19000, int(rng.integers(1, 120))), 102], dtype=np.int64)
             for _ in range(int(rng.integers(1, most_rows + 1)))] for _ in range(count)]


def test_ragged_traffic_reaches_an_engine_as_a_few_bucketed_shapes_not_one_per_batch() -> None:
    from sr_backend.ragged import DEFAULT_BUCKETS

    bucketed, unbucketed = _ShapeLog(), _ShapeLog()
    for rows in _ragged_batches(300):
        RaggedRunner(bucketed, max_batch_tokens=1024).run(rows)
        RaggedRunner(unbucketed, max_batch_tokens=1024, buckets=None).run(rows)
    assert len(unbucketed.shapes) > 200  # nearly a new shape per batch: what grew every engine's caches
    assert all(r in DEFAULT_BUCKETS.rows and w in DEFAULT_BUCKETS.lengths for r, w in bucketed.shapes)
    assert all(r * w <= 1024 for r, w in bucketed.shapes)  # padding never breaks the token budget
    assert len(bucketed.shapes) <= 120, sorted(bucketed.shapes)


@pytest.mark.parametrize("engine", ["onnxruntime", "openvino", "torch"])
def test_bucketed_padding_leaves_fp32_embeddings_and_token_logits_as_they_were(engine: str) -> None:
    """Padding rows repeat a real row and padding tokens are masked, so every answer equals the unbucketed one."""
    for model in (MODEL, "pii-rampart"):
        onnx = discover(REPO, [model])[0].version_dir / "model.onnx"
        if engine == "torch" and not onnx.with_suffix(".pt2").is_file():
            continue
        runner = load_engine(engine, "fp32", onnx, 1)
        for rows in _ragged_batches(2, seed=11, most_rows=7):
            plain, _ = RaggedRunner(runner, buckets=None).run(rows)
            padded, stats = RaggedRunner(runner).run(rows)
            assert stats.padded_tokens > stats.tokens
            for a, b in zip(plain, padded, strict=True):
                assert a.shape == b.shape and float(np.max(np.abs(a - b))) < 1e-5, (model, engine)


def test_openvino_caps_its_per_shape_kernel_cache_unless_told_to_run_unbounded(
        monkeypatch: pytest.MonkeyPatch) -> None:
    onnx = _card().version_dir / "model.onnx"
    engine = load_engine("openvino", "fp32", onnx, 1)
    assert engine.config["CPU_RUNTIME_CACHE_CAPACITY"] == 8  # type: ignore[attr-defined]
    monkeypatch.setenv("SR_BACKEND_UNBOUNDED", "1")
    old = load_engine("openvino", "fp32", onnx, 1)
    assert "CPU_RUNTIME_CACHE_CAPACITY" not in old.config  # type: ignore[attr-defined]  # the plugin's 5,000


def test_a_cards_instance_cap_drops_the_layouts_above_it() -> None:
    from sr_build import tune_measure

    assert tune_measure.cpu_layouts(16) == [(16, 1), (2, 16), (2, 8)]
    assert tune_measure.cpu_layouts(16, max_instances=2) == [(2, 16), (2, 8)]
    assert tune_measure.cpu_layouts(2, max_instances=2) == [(2, 1), (2, 2)]
    assert tune_measure.cpu_layouts(8, max_instances=1) == [(1, 8)]
