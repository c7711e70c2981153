"""The engine choice a Triton model config names: engine, precision, threads, instances and int8 recipe, read
from the JSON form of a model config (what Triton hands the Python backend's `initialize()` and what gRPC
`ModelConfig` reports for a loaded model).

Imported by the models' Python backend inside the Triton image (Python 3.10, no tritonclient): standard library
only. The text form (config.pbtxt) is read by sr_common.config_text.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

DEFAULTS = {"engine": "onnxruntime", "precision": "fp32", "threads": "0", "instances": "1", "int8_recipe": "dynamic"}


def parameters(config: Mapping[str, Any]) -> dict[str, str]:
    """A JSON model config's string parameters."""
    params = config.get("parameters") or {}
    return {str(k): str((v or {}).get("string_value", "")) for k, v in params.items()}


def model_parameter(config: Mapping[str, Any], key: str, default: str) -> str:
    """One string parameter of a JSON model config, else `default` (an empty value counts as unset)."""
    return parameters(config).get(key) or default


def choice_of_loaded(config: Mapping[str, Any]) -> dict[str, str]:
    """The choice in the JSON model config Triton reports for a loaded model (gRPC `ModelConfig`)."""
    params = parameters(config)
    groups = config.get("instance_group") or []
    instances = sum(int(g.get("count", 1)) for g in groups) if groups else int(DEFAULTS["instances"])
    provider = params.get("execution_provider", "").strip().lower()
    if provider in ("tensorrt", "cuda"):  # a GPU variant (sr_build/gpu.py): the CPU tuner's choice does not apply
        fp16 = provider == "tensorrt" and params.get("trt_fp16", "0").strip().lower() in ("1", "true")
        return {"engine": provider, "precision": "fp16" if fp16 else "fp32", "threads": "0",
                "instances": str(instances), "int8_recipe": DEFAULTS["int8_recipe"]}
    return {"engine": params.get("engine") or DEFAULTS["engine"],
            "precision": params.get("precision") or DEFAULTS["precision"],
            "threads": params.get("intra_op_threads") or DEFAULTS["threads"], "instances": str(instances),
            "int8_recipe": params.get("int8_recipe") or DEFAULTS["int8_recipe"]}
