"""The served model reads the GPU parameters `models build --target gpu` writes: which ONNX Runtime providers, with
which TensorRT options, on which GPU; and it refuses to load rather than quietly run a GPU model on the CPU.

This machine's ONNX Runtime is the CPU build (no CUDA, no TensorRT), so the refusals are real ONNX Runtime
behaviour here; the GPU itself is exercised by tools/gpu_check.sh where one is lent."""

from __future__ import annotations

import re
from pathlib import Path
from typing import Any

import httpx
import numpy as np
import onnxruntime as ort
import pytest

from sr_backend.engines import EngineError, load_engine
from sr_backend.engines.ort_gpu import GpuRequest, gpu_request
from sr_build import gpu
from sr_common.config_text import text_parameters
from sr_common.engine_choice import parameters

from .conftest import ROOT, serving
from .test_serve_process import copy_model

MODEL = "all-minilm-l6-v2"
ONNX = ROOT / "model_repository" / MODEL / "1" / "model.onnx"


def triton_config(config_pbtxt: Path) -> dict[str, Any]:
    """The parameters of a config.pbtxt in the JSON form Triton hands initialize() (`args["model_config"]`)."""
    return {"parameters": {k: {"string_value": v} for k, v in text_parameters(config_pbtxt.read_text()).items()}}


def gpu_variant(tmp_path: Path, monkeypatch: pytest.MonkeyPatch | None = None) -> tuple[Path, list[dict[str, Any]]]:
    """MiniLM moved to the GPU by the real build code. With `monkeypatch`, plan building (which needs TensorRT)
    is replaced by a recorder of the options the build gives TensorRT, answering with the CPU graph's outputs
    (so fp16 "passes" its golden check); without, configs only."""
    copy_model(tmp_path, MODEL)
    built: list[dict[str, Any]] = []
    if monkeypatch is None:
        gpu.build_gpu_repository(tmp_path, plans=False)
        return tmp_path / MODEL, built

    def record(onnx_path: Path, names: list[str], options: dict[str, Any], max_tokens: int,
               golden: np.ndarray) -> np.ndarray:
        built.append(dict(options))
        session = ort.InferenceSession(str(onnx_path), providers=["CPUExecutionProvider"])
        return np.asarray(session.run(None, gpu._feeds(names, golden))[0], dtype=np.float64)

    monkeypatch.setattr(gpu, "build_plans", record)
    assert gpu.build_gpu_variant(tmp_path / MODEL) is not None
    return tmp_path / MODEL, built


def test_a_cpu_config_asks_for_no_gpu_session() -> None:
    config = triton_config(ROOT / "model_repository" / MODEL / "config.pbtxt")
    assert "execution_provider" not in config["parameters"]
    assert gpu_request(parameters(config), Path("/v"), 0, "CPU") is None
    assert gpu_request({"execution_provider": "cpu"}, Path("/v"), 0, "CPU") is None


def test_a_tensorrt_config_gives_tensorrt_then_cuda_then_cpu_on_the_instance_gpu_with_the_build_options(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    model_dir, built = gpu_variant(tmp_path, monkeypatch)
    version_dir = model_dir / "1"
    request = gpu_request(parameters(triton_config(model_dir / "config.pbtxt")), version_dir, 3, "GPU")
    assert request is not None and request.execution_provider == "tensorrt" and request.device_id == 3
    trt, cuda, cpu = request.providers
    assert cuda == ("CUDAExecutionProvider", {"device_id": 3}) and cpu == "CPUExecutionProvider"
    name, options = trt
    assert name == "TensorrtExecutionProvider" == request.provider
    assert options["device_id"] == 3
    assert options["trt_profile_max_shapes"] == "input_ids:256x256,attention_mask:256x256"  # 256 rows x card max
    assert options["trt_profile_min_shapes"] == "input_ids:1x1,attention_mask:1x1"
    assert options["trt_engine_cache_path"] == str(version_dir / "trt")  # relative in the config: the version dir
    # exactly what the build gave TensorRT for the plan it kept (the first, fp16, passed): the cache finds it
    assert request.fp16 is True and len(built) == 1
    assert {k: v for k, v in options.items() if k != "device_id"} == built[0]


def test_an_fp32_config_turns_fp16_off_and_cuda_alone_has_no_tensorrt_options(tmp_path: Path) -> None:
    model_dir, _ = gpu_variant(tmp_path)  # configs only: fp16 not decided, so off
    params = parameters(triton_config(model_dir / "config.pbtxt"))
    request = gpu_request(params, model_dir / "1", 0, "GPU")
    assert request is not None and request.fp16 is False
    assert isinstance(request.providers[0], tuple) and request.providers[0][1]["trt_fp16_enable"] is False
    cuda = gpu_request({**params, "execution_provider": "cuda"}, model_dir / "1", 1, "GPU")
    assert cuda == GpuRequest("cuda", 1, [("CUDAExecutionProvider", {"device_id": 1}), "CPUExecutionProvider"])


@pytest.mark.parametrize(("params", "message"), [
    ({"execution_provider": "rocm"}, "execution_provider 'rocm' is not one of cpu, tensorrt, cuda"),
    ({"execution_provider": "tensorrt", "trt_fp16": "yes"}, "trt_fp16='yes': expected 0 or 1"),
    ({"execution_provider": "tensorrt", "trt_profile_min_shapes": "input_ids:1x1"},
     "profile incomplete: trt_profile_opt_shapes, trt_profile_max_shapes missing"),
    ({"execution_provider": "tensorrt", "trt_max_workspace_size": "4G"}, "trt_max_workspace_size='4G'"),
])
def test_a_malformed_gpu_config_is_refused_with_the_parameter_named(params: dict[str, str], message: str) -> None:
    with pytest.raises(EngineError, match=re.escape(message)):
        gpu_request(params, Path("/v"), 0, "GPU")


@pytest.mark.parametrize("provider", ["tensorrt", "cuda"])
def test_asking_for_a_gpu_provider_this_onnx_runtime_lacks_fails_instead_of_running_on_cpu(provider: str) -> None:
    assert "CUDAExecutionProvider" not in ort.get_available_providers()  # the CPU build this machine has
    request = gpu_request({"execution_provider": provider}, ONNX.parent, 0, "GPU")
    with pytest.raises(EngineError) as refused:
        load_engine("openvino", "int8", ONNX, 2, request)  # the CPU tuner's choice is not what decides
    message = str(refused.value)
    assert f"asked for {request.provider if request else ''}" in message
    assert "refusing to run a GPU model on the CPU" in message and "CPUExecutionProvider" in message


def test_a_session_that_fell_back_to_cpu_is_refused(monkeypatch: pytest.MonkeyPatch) -> None:
    # claim the provider exists: ONNX Runtime then builds the session, warns, and really falls back to the CPU
    available = ort.get_available_providers()
    monkeypatch.setattr(ort, "get_available_providers", lambda: ["TensorrtExecutionProvider", *available])
    request = gpu_request({"execution_provider": "tensorrt"}, ONNX.parent, 0, "GPU")
    fell_back = r"fell back to \['CPUExecutionProvider'\]; refusing to run a GPU model"
    with pytest.raises(EngineError, match=fell_back), pytest.warns(UserWarning, match="TensorrtExecutionProvider"):
        load_engine("onnxruntime", "fp32", ONNX, 1, request)


def test_a_gpu_provider_on_a_cpu_instance_is_refused(monkeypatch: pytest.MonkeyPatch) -> None:
    available = ort.get_available_providers()
    monkeypatch.setattr(ort, "get_available_providers", lambda: ["CUDAExecutionProvider", *available])
    request = gpu_request({"execution_provider": "cuda"}, ONNX.parent, 0, "CPU")
    with pytest.raises(EngineError, match="needs a KIND_GPU instance"):
        load_engine("onnxruntime", "fp32", ONNX, 1, request)


def test_triton_fails_a_model_whose_config_asks_for_tensorrt_here_with_the_reason(tmp_path: Path) -> None:
    """Through the real path: tritonserver, the Python backend's initialize(), the gateway's model status. The
    instance stays KIND_CPU (a KIND_GPU one cannot even be placed without a GPU): the provider is what is refused."""
    copy_model(tmp_path, "asks-tensorrt")
    config = tmp_path / "asks-tensorrt" / "config.pbtxt"
    config.write_text(config.read_text() + 'parameters: { key: "execution_provider", value: { string_value: '
                      '"tensorrt" } }\n')
    with serving(tmp_path, "serve-gpu-refused.log", "gateway (tensorrt on CPU)", ("ready", "failed", "degraded"),
                 180) as url:
        health = httpx.get(url + "/health")
        assert health.status_code == 503 and health.json()["status"] == "failed", health.json()
        (model,) = httpx.get(url + "/v1/models").json()["data"]
        assert model["id"] == "asks-tensorrt" and model["status"] == "failed", model
        assert "TensorrtExecutionProvider" in model["reason"], model
        assert "refusing to run a GPU model on the CPU" in model["reason"], model
        answer = httpx.post(url + "/v1/embeddings", json={"model": "asks-tensorrt", "input": "x"})
        assert answer.status_code == 503 and answer.json()["error"]["code"] == "not_ready"
