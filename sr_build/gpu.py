"""`sr-gateway models build --target gpu`: the same ONNX files, served on an NVIDIA GPU through ONNX Runtime's
TensorRT execution provider, with TensorRT plans built ahead of time (not on the first request).

Per text model (ONNX inputs all [batch, tokens]) the model's config.pbtxt in the given repository gets:
- a GPU instance (KIND_GPU) instead of the CPU instances;
- `execution_provider: tensorrt` and the TensorRT options as parameters: one optimisation profile for the ragged
  batches the runner packs (min 1x1, opt 64x128, max max_batch_rows x max_input_tokens), an engine cache in the
  version directory, and fp16 only where the fp16 plan reproduces the fp32 CPU answer within the card's golden
  tolerance on the card's golden inputs (otherwise fp32 plans);
- the plans themselves, built here by running each profile's min/opt/max shapes once.
Models with other inputs (images) keep their CPU instances. The repository is changed in place: run it on a copy
(the k8s init container does). A CPU choice that `models tune` generated (configs/tuned.pbtxt, which tritonserver
would load instead of config.pbtxt) is removed from a model moved to the GPU, and `models tune` leaves GPU configs
alone. The served model reads the parameters in sr_backend (see docs/operations.md).
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import yaml

from sr_common.config_text import ConfigError, ConfigText
from sr_common.tuned_config import generated_config

OPT_SHAPE = (64, 128)
MAX_BATCH_ROWS = 256


@dataclass(frozen=True)
class GpuVariant:
    model: str
    fp16: bool
    max_abs_diff: float  # fp16 (or fp32) plan vs fp32 on CPU, on the golden inputs
    profile: dict[str, str]
    plans: bool  # False: configs only (--configs-only), fp16 not decided, no plan built


def text_inputs(onnx_path: Path) -> list[str] | None:
    """The ONNX input names when every input is a [batch, tokens] int64 tensor (a text model), else None."""
    import onnxruntime as ort

    session = ort.InferenceSession(str(onnx_path), providers=["CPUExecutionProvider"])
    inputs = session.get_inputs()
    if not inputs or any(len(i.shape) != 2 or i.type != "tensor(int64)" for i in inputs):
        return None
    return [i.name for i in inputs]


def profile(names: list[str], max_tokens: int, max_rows: int = MAX_BATCH_ROWS) -> dict[str, str]:
    def shapes(rows: int, tokens: int) -> str:
        return ",".join(f"{n}:{rows}x{tokens}" for n in names)

    return {"trt_profile_min_shapes": shapes(1, 1), "trt_profile_opt_shapes": shapes(*OPT_SHAPE),
            "trt_profile_max_shapes": shapes(max_rows, max_tokens)}


def gpu_config(config: str, parameters: dict[str, str]) -> str:
    """config.pbtxt with one GPU instance and the given parameters (replacing any of the same key), edited in place
    (sr_common.config_text: the author's comments and layout kept)."""
    text = ConfigText(config)
    try:
        text.set_instances(1, kind="KIND_GPU")
    except ConfigError as exc:
        raise RuntimeError(f"config.pbtxt has no single instance_group to move to the GPU: {exc}") from exc
    for key, value in parameters.items():
        text.set_parameter(key, value)
    return text.text


def _feeds(names: list[str], ids: np.ndarray) -> dict[str, np.ndarray]:
    feeds = {}
    for name in names:
        if name == "input_ids":
            feeds[name] = ids
        elif name == "token_type_ids":
            feeds[name] = np.zeros_like(ids)
        else:  # attention_mask and the like
            feeds[name] = (ids != -1).astype(np.int64)
    return feeds


def _golden_ids(version_dir: Path, card: dict[str, Any]) -> np.ndarray:
    """The card's golden inputs, tokenized and padded into one batch (fallback: a fixed token run)."""
    from tokenizers import Tokenizer

    texts = (card.get("golden") or {}).get("request", {}).get("input") or ["The quick brown fox."]
    texts = [texts] if isinstance(texts, str) else [t for t in texts if isinstance(t, str)]
    tokenizer = Tokenizer.from_file(str(version_dir / "tokenizer.json"))
    rows = [tokenizer.encode(t).ids for t in texts]
    width = max(len(r) for r in rows)
    return np.asarray([r + [0] * (width - len(r)) for r in rows], dtype=np.int64)


def build_plans(onnx_path: Path, names: list[str], options: dict[str, Any], max_tokens: int,
                golden: np.ndarray) -> np.ndarray:
    """Build (and cache) the TensorRT plans for the profile's min/opt/max shapes; return the golden outputs."""
    import onnxruntime as ort

    session = ort.InferenceSession(str(onnx_path), providers=[("TensorrtExecutionProvider", options),
                                                              "CUDAExecutionProvider"])
    if session.get_providers()[0] != "TensorrtExecutionProvider":
        raise RuntimeError(f"ONNX Runtime fell back to {session.get_providers()} for {onnx_path}")
    for rows, tokens in ((1, 1), OPT_SHAPE, (MAX_BATCH_ROWS, max_tokens)):
        session.run(None, _feeds(names, np.ones((rows, tokens), dtype=np.int64)))
    return np.asarray(session.run(None, _feeds(names, golden))[0], dtype=np.float64)


def require_tensorrt() -> None:
    import onnxruntime as ort

    available = ort.get_available_providers()
    if "TensorrtExecutionProvider" not in available:
        raise RuntimeError("--target gpu needs ONNX Runtime with the TensorRT execution provider (onnxruntime-gpu "
                           f"and TensorRT) on a machine with an NVIDIA GPU; this one has {available}")


def build_gpu_variant(model_dir: Path, *, plans: bool = True) -> GpuVariant | None:
    """Move one model to the GPU (see the module docstring); None for a model that stays on CPU."""
    import onnxruntime as ort

    card = yaml.safe_load((model_dir / "card.yaml").read_text())
    version_dir = model_dir / str(card.get("version", 1))
    onnx_path = version_dir / "model.onnx"
    config_path = model_dir / "config.pbtxt"
    if not onnx_path.is_file() or not config_path.is_file():
        return None
    names = text_inputs(onnx_path)
    if names is None:
        return None
    max_tokens = int((card.get("limits") or {}).get("max_input_tokens", 512))
    shapes = profile(names, max_tokens)
    fp16, diff = False, 0.0
    if plans:
        golden = _golden_ids(version_dir, card)
        cpu = ort.InferenceSession(str(onnx_path), providers=["CPUExecutionProvider"])
        reference = np.asarray(cpu.run(None, _feeds(names, golden))[0], dtype=np.float64)
        tolerance = float((card.get("golden") or {}).get("tolerance", 1e-3))
        cache = version_dir / "trt"
        cache.mkdir(exist_ok=True)
        for fp16 in (True, False):
            options = {"trt_fp16_enable": fp16, "trt_engine_cache_enable": True, "trt_engine_cache_path": str(cache),
                       "trt_max_workspace_size": 4 << 30, **shapes}
            answer = build_plans(onnx_path, names, options, max_tokens, golden)
            diff = float(np.max(np.abs(answer - reference)))
            if diff <= tolerance:
                break
        else:
            raise RuntimeError(f"{card['id']}: the fp32 TensorRT plan differs from CPU by {diff:.2e} "
                               f"(> golden tolerance {tolerance:g})")
    parameters = {"execution_provider": "tensorrt", "trt_fp16": "1" if fp16 else "0",
                  "trt_engine_cache_path": "trt", **shapes}
    config_path.write_text(gpu_config(config_path.read_text(), parameters))
    generated_config(model_dir).unlink(missing_ok=True)  # this host's CPU choice must not shadow the GPU config
    variant = GpuVariant(card["id"], fp16, diff, shapes, plans)
    (version_dir / "gpu.json").write_text(json.dumps(variant.__dict__, indent=2))
    return variant


def build_gpu_repository(repo: Path, *, plans: bool = True) -> list[GpuVariant]:
    if plans:
        require_tensorrt()
    return [v for d in sorted(p.parent for p in repo.glob("*/card.yaml"))
            if (v := build_gpu_variant(d, plans=plans)) is not None]
