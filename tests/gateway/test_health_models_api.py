"""GET endpoints of a ready process, validated against the contract."""

from __future__ import annotations

import asyncio
from pathlib import Path

import httpx
import tritonclient.grpc.aio as grpcaio
import yaml

from gateway.surfaces.info import MODEL_REQUESTS, OPENAPI_PATH

from .conftest import MODEL, settled_stats
from .contract import check, document


def test_models_lists_the_card_limits_and_api_version(http: httpx.Client) -> None:
    r = http.get("/v1/models")
    body = r.json()
    check("/v1/models", "get", 200, body)
    assert body["api_version"] == document()["info"]["version"]
    assert body["limits"]["max_request_bytes"] == 8_388_608
    cards = {c["id"]: c for c in body["data"]}
    assert set(cards) >= {MODEL, "pii-rampart", "domain-zeroshot"}
    assert all(c["status"] == "ready" and c["golden"]["status"] == "matched" for c in cards.values())
    card = cards[MODEL]
    assert card["id"] == MODEL and card["status"] == "ready" and card["ready"] is True
    # two golden inputs at each declared layer (the default 6 and the early exit 3)
    assert card["golden"] == {"status": "matched", "checked": 4, "matched": 4, "reference": "cpu"}
    assert card["embedding"]["layers"] == [3, 6]
    assert card["surfaces"] == ["embeddings", "rerank"]
    assert card["rerank"]["kind"] == "bi-encoder"
    assert card["limits"] == {"max_input_tokens": 256, "max_inputs": 2048, "max_scan_tokens": None}
    pii = cards["pii-rampart"]["heads"][0]
    assert pii["kind"] == "token" and pii["overflow"] == "window" and pii["window"] == {"tokens": 512, "overlap": 64}
    assert cards["domain-zeroshot"]["heads"][0]["zero_shot"] is True
    assert "CC-BY-4.0" in cards["pii-rampart"]["attribution"]
    assert card["embedding"]["dimensions"] == [384]
    assert card["engine_args"]["max_batch_size"] == 128
    assert card["licence"] == "apache-2.0"


def test_health_is_200_ready_and_liveness_is_alive(http: httpx.Client) -> None:
    r = http.get("/health")
    check("/health", "get", 200, r.json())
    assert r.status_code == 200
    body = r.json()
    assert (body["api_version"], body["status"], body["reason"], body["model"]) == (
        document()["info"]["version"], "ready", None, None)  # model is null when several are served
    assert body["models"][MODEL] == {"status": "ready", "reason": None}
    live = http.get("/health/live")
    check("/health/live", "get", 200, live.json())
    assert live.json() == {"api_version": document()["info"]["version"], "status": "alive"}


def test_openapi_yaml_is_the_file_with_the_served_models_named_and_required(http: httpx.Client) -> None:
    r = http.get("/openapi.yaml")
    served, file = yaml.safe_load(r.content), yaml.safe_load(OPENAPI_PATH.read_bytes())
    assert r.status_code == 200 and served["openapi"].startswith("3.0")
    cards = http.get("/v1/models").json()["data"]
    schemas = served["components"]["schemas"]
    for name, surface in MODEL_REQUESTS.items():  # model: one of the served models that serve the surface
        assert "model" in schemas[name]["required"]
        assert schemas[name]["properties"]["model"]["enum"] == [c["id"] for c in cards if surface in c["surfaces"]]
        file["components"]["schemas"][name] = schemas[name]
    types = {t for c in cards if c.get("decisions") for t in c["decisions"]["question_types"]}
    written = [v["$ref"] for v in schemas["Question"]["oneOf"] if "$ref" in v]  # the types the cards answer
    assert written == [v["$ref"] for v in file["components"]["schemas"]["Question"]["oneOf"]
                       if v["$ref"].rsplit("/", 1)[1].removesuffix("Question").lower() in types]
    presets = {n for c in cards if c.get("decisions") for n in c["decisions"]["presets"]}
    bare = {n for v in schemas["Question"]["oneOf"] if "$ref" not in v for n in v["properties"]["preset"]["enum"]}
    assert bare == presets
    for name in ("Question", "BoxQuestion", "DecisionImages", "DecisionStandardRequest", "DecisionStateEntry"):
        file["components"]["schemas"][name] = schemas[name]  # what the decision cards answer and read
    for name in ("EmbeddingsOptions", "ClassifyOptions", "RerankOptions"):  # budgets hold the special tokens
        least = schemas[name]["properties"]["max_tokens"]["minimum"]
        assert least >= file["components"]["schemas"][name]["properties"]["max_tokens"]["minimum"]
        file["components"]["schemas"][name] = schemas[name]
    assert served == file  # nothing else differs
    assert http.post("/v1/embeddings", json={"input": "x"}).status_code == 400


def test_metrics_count_requests_phases_batches_and_readiness(http: httpx.Client) -> None:
    http.post("/v1/embeddings", json={"model": MODEL, "input": ["metrics probe"]})
    http.post("/v1/embeddings", content=b"{")
    text = http.get("/metrics").text
    assert 'sr_gateway_requests_total{endpoint="embeddings",status="200"}' in text
    assert 'sr_gateway_requests_total{endpoint="embeddings",status="400"}' in text
    assert 'sr_gateway_phase_duration_seconds_count{endpoint="embeddings",phase="forward"}' in text
    assert "sr_gateway_ready 1.0" in text
    assert f'sr_gateway_model_ready{{model="{MODEL}"}} 1.0' in text
    assert "sr_gateway_batch_rows_count" in text and "sr_gateway_batch_tokens_sum" in text
    assert f'sr_gateway_queue_depth{{model="{MODEL}"}} 0.0' in text
    assert 'sr_gateway_model_info{device="cpu"' in text


def test_concurrent_requests_are_batched_by_triton(gateway_url: str, triton_url: str) -> None:
    async def run() -> tuple[int, int]:
        client = grpcaio.InferenceServerClient(triton_url)
        before = await settled_stats(client)
        async with httpx.AsyncClient(base_url=gateway_url, timeout=60) as http:
            texts = [f"concurrent request number {i} about topic {i % 7}" for i in range(32)]
            rs = await asyncio.gather(*(http.post("/v1/embeddings", json={"model": MODEL, "input": t})
                                        for t in texts))
        assert all(r.status_code == 200 for r in rs)
        after = await settled_stats(client, inferences=int(before.get("inference_count", 0)) + len(texts))
        await client.close()
        return (int(after["inference_count"]) - int(before.get("inference_count", 0)),
                int(after["execution_count"]) - int(before.get("execution_count", 0)))

    inferences, executions = asyncio.run(run())
    assert inferences == 32
    assert executions < inferences


# the best instruction set for each precision, best first (the flag /proc/cpuinfo lists for it)
# The unit each precision's kernels use, best first, as a reader of /proc/cpuinfo would name it; a CPU without
# the precision's own unit runs it on its vector unit (an AVX2-only host serves int8 on AVX2)
_ISA = {"bf16": [("AMX", "amx_bf16"), ("AVX-512 BF16", "avx512_bf16"), ("AVX-512 emulated", "avx512f"),
                 ("AVX2 emulated", "avx2")],
        "int8": [("AMX", "amx_int8"), ("AVX-512 VNNI", "avx512_vnni"), ("AVX-VNNI", "avx_vnni"),
                 ("AVX-512", "avx512bw"), ("AVX2", "avx2")],
        "fp32": [("AVX-512", "avx512f"), ("AVX2", "avx2")]}


def _this_cpu() -> tuple[str, set[str]]:
    lines = [line.partition(":") for line in Path("/proc/cpuinfo").read_text().splitlines()]
    model = next(value.strip() for key, _, value in lines if key.strip() == "model name")
    flags = next(set(value.split()) for key, _, value in lines if key.strip() == "flags")
    return model, flags


def test_the_accelerator_names_this_hosts_cpu_and_the_isa_of_the_served_precision(http: httpx.Client) -> None:
    model, flags = _this_cpu()
    cards = {c["id"]: c for c in http.get("/v1/models").json()["data"]}
    for card in cards.values():
        precision = card["engine_args"]["precision"]
        isa = next(name for name, flag in _ISA[precision] if flag in flags)
        assert card["accelerator"] == f"{model} ({isa} {precision})", card["id"]
    # more than one precision is checked: every host measured serves fp32 beside bf16 and/or int8 (the tuner chose
    # int8 for prompt-guard on all three host kinds; bf16 only where the CPU has it)
    assert len({c["engine_args"]["precision"] for c in cards.values()}) >= 2
    r = http.post("/v1/embeddings", json={"model": MODEL, "input": "x", "options": {"return_meta": True}})
    assert r.status_code == 200
    assert r.json()["meta"]["accelerator"] == cards[MODEL]["accelerator"]
    assert r.json()["meta"]["device"] == "cpu"


def test_models_declares_which_question_types_answer_abstain_probability(http: httpx.Client) -> None:
    body = http.get("/v1/models").json()
    check("/v1/models", "get", 200, body)
    cards = {c["id"]: c for c in body["data"]}
    abstain = cards["decision-zeroshot"]["decisions"]["abstain"]
    assert abstain["types"] == ["choice"] and "softmax" in abstain["description"]
    assert all("abstain" not in c["decisions"] for c in cards.values()
               if c.get("decisions") and c["id"] != "decision-zeroshot")  # a card without the option says nothing
    choice = {"type": "choice", "instructions": "Which topic is this?",
              "choices": [{"key": "billing", "description": "Invoices"}, {"key": "weather", "description": "Rain"}]}
    r = http.post("/v1/decisions", json={"model": "decision-zeroshot", "state": "The invoice is overdue.",
                                         "questions": {"q": choice}})
    assert r.status_code == 200 and "abstain_probability" in r.json()["answers"]["q"]  # as declared
