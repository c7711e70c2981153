"""The Triton Python-backend model every ONNX model directory reuses (its `1/model.py` imports this).

Inputs (per request, batch dim 1, ragged): INPUT_IDS int64 [1, L], optional TOKEN_TYPE_IDS int64 [1, L] (pairs),
optional LAYER int32 [1, 1] (embedders: one of the card's `embedding.layers`; absent = the last, the default).
Outputs: the config's first output (EMBEDDING / LOGITS: [1, D], or [1, L, C] for per-token graphs) and
TIMING int64 [1, 4] = (execute start, unix ns; ONNX Runtime ns; rows in this execute; real tokens in it).
TIMING is how the gateway reports Triton's own queue and forward time per request instead of guessing.
"""

from __future__ import annotations

import json
import os
import sys
import time
from pathlib import Path
from typing import Any

import numpy as np
import triton_python_backend_utils as pb_utils

from sr_backend.engines import load_engine
from sr_backend.engines.configs import model_parameter, parameters
from sr_backend.engines.ort_gpu import OrtGpuEngine, gpu_request
from sr_backend.ragged import RaggedRunner, Row


class TritonPythonModel:
    def initialize(self, args: dict[str, str]) -> None:
        config = json.loads(args["model_config"])
        version_dir = os.path.join(args["model_repository"], args["model_version"])
        threads = int(os.environ.get("SR_BACKEND_THREADS") or model_parameter(config, "intra_op_threads", "0"))
        # a GPU variant's provider on the GPU Triton gave this instance (it fails to load rather than run on CPU)
        gpu = gpu_request(parameters(config), Path(version_dir), int(args.get("model_instance_device_id") or 0),
                          args.get("model_instance_kind", "CPU"))
        # else the engine and precision `sr-gateway models tune` chose for this host (fp32 ONNX Runtime by default)
        engine = load_engine(model_parameter(config, "engine", "onnxruntime"),
                             model_parameter(config, "precision", "fp32"),
                             Path(version_dir) / model_parameter(config, "onnx_file", "model.onnx"), threads, gpu,
                             model_parameter(config, "int8_recipe", "dynamic"))
        if isinstance(engine, OrtGpuEngine):  # what actually runs it, in Triton's output whatever its log level
            print(f"sr_backend {args.get('model_instance_name', '')}: {engine.describe()}", file=sys.stderr, flush=True)
        self.runner = RaggedRunner(engine, int(model_parameter(config, "max_batch_tokens", "8192")))
        self.output = next(o["name"] for o in config["output"] if o["name"] != "TIMING")
        # the layers the graph's pooled output holds, in its order (the card declares them; the build exports them)
        self.layers = declared_layers(Path(args["model_repository"]) / "card.yaml")

    def execute(self, requests: list[Any]) -> list[Any]:
        started = time.time_ns()
        # a request whose client went away while it waited is never run; one asking for an undeclared layer fails
        # alone (the gateway checks layers first, so this guards other callers of the model)
        refused: list[Any] = [_cancelled_error() if _cancelled(r) else None for r in requests]
        rows = []
        for k, r in enumerate(requests):
            if refused[k] is not None:
                continue
            layer = self._layer_index(pb_utils.get_input_tensor_by_name(r, "LAYER"))
            if isinstance(layer, str):
                refused[k] = _invalid_error(layer)
                continue
            types = pb_utils.get_input_tensor_by_name(r, "TOKEN_TYPE_IDS")
            rows.append(Row(pb_utils.get_input_tensor_by_name(r, "INPUT_IDS").as_numpy().reshape(-1),
                            None if types is None else types.as_numpy().reshape(-1), layer))
        outputs: list[np.ndarray] = []
        if rows:
            try:
                outputs, stats = self.runner.run(rows)
            except Exception as exc:  # one failed forward fails this batch's requests, never the server
                error = pb_utils.TritonError(f"forward failed: {exc}")
                return [pb_utils.InferenceResponse(output_tensors=[], error=error) for _ in requests]
            timing = np.array([[started, stats.forward_ns, stats.rows, stats.tokens]], dtype=np.int64)
        answers = iter(outputs)
        responses = []
        for error in refused:
            if error is not None:
                responses.append(pb_utils.InferenceResponse(output_tensors=[], error=error))
                continue
            out = next(answers)
            responses.append(pb_utils.InferenceResponse(output_tensors=[
                pb_utils.Tensor(self.output, np.ascontiguousarray(out[None, ...], dtype=np.float32)),
                pb_utils.Tensor("TIMING", timing),
            ]))
        return responses

    def _layer_index(self, tensor: Any) -> int | str:
        """The index of a request's LAYER in the graph's layers axis (-1, the last, when absent), or why not."""
        if tensor is None:
            return -1
        values = tensor.as_numpy().reshape(-1)
        layer = int(values[0]) if values.size == 1 else None
        if layer is None or layer not in self.layers:
            return f"LAYER {values.tolist()} is not one of this model's layers {self.layers}"
        return self.layers.index(layer)


def declared_layers(card: Path) -> list[int]:
    """A card's `embedding.layers` ([] for a model that declares none: then only the default is served)."""
    import yaml

    if not card.is_file():
        return []
    embedding = (yaml.safe_load(card.read_text()) or {}).get("embedding") or {}
    return [int(k) for k in embedding.get("layers") or []]


def _cancelled(request: Any) -> bool:
    """Triton marks a request whose gRPC call was cancelled (the gateway cancels when its client disconnects)."""
    check = getattr(request, "is_cancelled", None)
    return bool(check()) if check is not None else False


def _invalid_error(message: str) -> Any:
    code = getattr(pb_utils.TritonError, "INVALID_ARG", None)
    return pb_utils.TritonError(message, code) if code is not None else pb_utils.TritonError(message)


def _cancelled_error() -> Any:
    code = getattr(pb_utils.TritonError, "CANCELLED", None)
    message = "cancelled before it ran: the caller went away"
    return pb_utils.TritonError(message, code) if code is not None else pb_utils.TritonError(message)
