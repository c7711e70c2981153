"""ONNX Runtime on an NVIDIA GPU, as the GPU variant of a model's Triton config asks (`sr-gateway models build
--target gpu` writes it): the TensorRT execution provider with the config's optimisation profile, fp16 flag and
engine cache (the plans the build made ahead of time), or CUDA alone; on the GPU Triton gave the instance.

A GPU that was asked for and not obtained is an error, never a quiet CPU run: ONNX Runtime only warns when a
provider is missing and carries on with the CPU, which would leave a "GPU" model serving at CPU speed while it
reports ready. The session's providers are checked after it is built and the model fails to load otherwise.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from . import EngineError
from .ort_engine import OrtEngine

# the config's `execution_provider` values that mean a GPU, and the ONNX Runtime provider each names
GPU_PROVIDERS = {"tensorrt": "TensorrtExecutionProvider", "cuda": "CUDAExecutionProvider"}
CPU_VALUES = ("", "cpu")
PROFILE_KEYS = ("trt_profile_min_shapes", "trt_profile_opt_shapes", "trt_profile_max_shapes")
# what the GPU build gave TensorRT when it built the plans: the same options find them in the cache again
DEFAULT_WORKSPACE_BYTES = 4 << 30

ProviderSpec = str | tuple[str, dict[str, Any]]


@dataclass(frozen=True)
class GpuRequest:
    """What a GPU instance must run: the provider asked for, on which device, with which provider options."""

    execution_provider: str  # "tensorrt" or "cuda"
    device_id: int
    providers: list[ProviderSpec] = field(default_factory=list)
    fp16: bool = False
    instance_kind: str = "GPU"  # Triton's kind for the instance: GPU unless the config is inconsistent

    @property
    def provider(self) -> str:
        """The ONNX Runtime name of the provider that must come first in the session."""
        return GPU_PROVIDERS[self.execution_provider]


def _flag(params: Mapping[str, str], key: str) -> bool:
    value = params.get(key, "0").strip().lower()
    if value in ("1", "true"):
        return True
    if value in ("0", "false", ""):
        return False
    raise EngineError(f"parameter {key}={value!r}: expected 0 or 1")


def gpu_request(params: Mapping[str, str], version_dir: Path, device_id: int,
                instance_kind: str = "GPU") -> GpuRequest | None:
    """The GPU session a model config asks for (None: a CPU model), with the provider list ONNX Runtime gets.

    TensorRT options mirror the GPU build's (sr_build/gpu.py): profile shapes, fp16, the engine cache (a relative
    `trt_engine_cache_path` is under the version directory, so a copied repository still finds its plans), and
    the workspace size; CUDA follows TensorRT for the nodes TensorRT does not take, and the CPU provider is last
    only for the few ops neither GPU provider implements (a session whose *first* provider is not the requested
    one is refused by `OrtGpuEngine`)."""
    wanted = params.get("execution_provider", "").strip().lower()
    if wanted in CPU_VALUES:
        return None
    if wanted not in GPU_PROVIDERS:
        known = ", ".join(["cpu", *GPU_PROVIDERS])
        raise EngineError(f"execution_provider {wanted!r} is not one of {known}")
    cuda: ProviderSpec = ("CUDAExecutionProvider", {"device_id": device_id})
    if wanted == "cuda":
        return GpuRequest("cuda", device_id, [cuda, "CPUExecutionProvider"], instance_kind=instance_kind.upper())
    fp16 = _flag(params, "trt_fp16")
    options: dict[str, Any] = {"device_id": device_id, "trt_fp16_enable": fp16}
    profile = {k: params[k] for k in PROFILE_KEYS if params.get(k)}
    if profile and len(profile) != len(PROFILE_KEYS):
        missing = ", ".join(k for k in PROFILE_KEYS if k not in profile)
        raise EngineError(f"TensorRT optimisation profile incomplete: {missing} missing")
    options.update(profile)
    cache = params.get("trt_engine_cache_path", "")
    if cache:
        path = Path(cache) if Path(cache).is_absolute() else version_dir / cache
        options.update(trt_engine_cache_enable=True, trt_engine_cache_path=str(path))
    workspace = params.get("trt_max_workspace_size", "")
    try:
        options["trt_max_workspace_size"] = int(workspace) if workspace else DEFAULT_WORKSPACE_BYTES
    except ValueError as exc:
        raise EngineError(f"parameter trt_max_workspace_size={workspace!r}: expected bytes") from exc
    return GpuRequest("tensorrt", device_id, [("TensorrtExecutionProvider", options), cuda, "CPUExecutionProvider"],
                      fp16, instance_kind.upper())


class OrtGpuEngine(OrtEngine):
    """The fp32 graph in an ONNX Runtime session whose first provider is the GPU provider that was asked for; runs
    like the CPU engine, only the session is built differently."""

    def __init__(self, session: Any, request: GpuRequest) -> None:
        super().__init__(session, "fp16" if request.fp16 else "fp32")
        self.request = request
        self.providers: list[str] = list(session.get_providers())

    @classmethod
    def on_gpu(cls, path: Path, request: GpuRequest) -> OrtGpuEngine:
        import onnxruntime as ort

        available = ort.get_available_providers()
        if request.provider not in available:
            raise EngineError(f"execution_provider {request.execution_provider} asked for {request.provider}, which "
                              f"this ONNX Runtime {ort.__version__} does not have (it has {', '.join(available)}); "
                              "refusing to run a GPU model on the CPU: install onnxruntime-gpu (and TensorRT) in "
                              "the Triton image")
        if request.instance_kind != "GPU":
            raise EngineError(f"execution_provider {request.execution_provider} needs a KIND_GPU instance (this one is "
                              f"KIND_{request.instance_kind}): Triton must place the instance on the GPU it runs on")
        options = ort.SessionOptions()
        options.graph_optimization_level = ort.GraphOptimizationLevel.ORT_ENABLE_ALL
        session = ort.InferenceSession(str(path), sess_options=options, providers=request.providers)
        first = session.get_providers()[0]
        if first != request.provider:  # e.g. no CUDA device or libraries: ORT warns and falls back
            raise EngineError(f"ONNX Runtime could not start {request.provider} on GPU {request.device_id} for "
                              f"{path.name} and fell back to {session.get_providers()}; refusing to run a GPU "
                              "model on the CPU (see the Triton log for ONNX Runtime's reason)")
        return cls(session, request)

    def describe(self) -> str:
        """One line for the log: what actually runs this model."""
        return (f"ONNX Runtime providers {self.providers} on GPU {self.request.device_id}, precision "
                f"{self.precision}")
