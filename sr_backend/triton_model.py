"""The Triton Python-backend model every ONNX model directory reuses (its `1/model.py` imports this).

Inputs (per request, ragged): INPUT_IDS int64 [1, L], optional TOKEN_TYPE_IDS int64 [1, L] (pairs), optional
LAYER int32 [1, 1] (embedders: one of the card's `embedding.layers`; absent = the last, the default). A request may
carry N rows instead (the gateway coalesces concurrent inputs into one call): then ROW_LENGTHS int32 [N, 1] gives
each row's length, INPUT_IDS / TOKEN_TYPE_IDS are [N, W] (W ≥ every length, padded past it) and LAYER, if sent,
is [N, 1]. Outputs: the config's first output (EMBEDDING / LOGITS: [N, D], or [N, W, C] for per-token graphs,
zero past each row's length) and TIMING int64 [N, 4] = (execute start, unix ns; engine ns; rows in this execute;
real tokens in it). TIMING is how the gateway reports Triton's own queue and forward time per request instead of
guessing.
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
from sr_backend.engines.ort_gpu import OrtGpuEngine, gpu_request
from sr_backend.ragged import RaggedRunner, Row
from sr_common.engine_choice import model_parameter, parameters


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
        self.runner = RaggedRunner(engine, int(model_parameter(config, "max_batch_tokens", "8192")),
                                   max_batch_rows=int(model_parameter(config, "max_batch_rows", "0")))
        self.output = next(o["name"] for o in config["output"] if o["name"] != "TIMING")
        # the layers the graph's pooled output holds, in its order (the card declares them; the build exports them)
        card = read_card(Path(args["model_repository"]) / "card.yaml")
        self.layers = declared_layers(card)
        # the largest chunks once, so the memory this instance holds when ready is its plateau (RaggedRunner.warm)
        self.runner.warm(int((card.get("limits") or {}).get("max_input_tokens") or self.runner.max_batch_tokens))
        self.memory = memory_gauge(args)

    def execute(self, requests: list[Any]) -> list[Any]:
        started = time.time_ns()
        # a request whose client went away while it waited is never run; one asking for an undeclared layer fails
        # alone (the gateway checks layers first, so this guards other callers of the model)
        refused: list[Any] = [_cancelled_error() if _cancelled(r) else None for r in requests]
        rows: list[Row] = []
        counts: list[int] = []  # rows each request carried (in request order, refused ones skipped)
        for k, r in enumerate(requests):
            if refused[k] is not None:
                continue
            parsed = self._rows(r)
            if isinstance(parsed, str):
                refused[k] = _invalid_error(parsed)
                continue
            rows += parsed
            counts.append(len(parsed))
        outputs: list[np.ndarray] = []
        if rows:
            try:
                outputs, stats = self.runner.run(rows)
            except Exception as exc:  # one failed forward fails this batch's requests, never the server
                error = pb_utils.TritonError(f"forward failed: {exc}")
                return [pb_utils.InferenceResponse(output_tensors=[], error=error) for _ in requests]
            timing = np.array([[started, stats.forward_ns, stats.rows, stats.tokens]], dtype=np.int64)
            if self.memory is not None:
                self.memory.set(resident_bytes())
        answers = iter(outputs)
        carried = iter(counts)
        responses = []
        for error in refused:
            if error is not None:
                responses.append(pb_utils.InferenceResponse(output_tensors=[], error=error))
                continue
            mine = [next(answers) for _ in range(next(carried))]
            responses.append(pb_utils.InferenceResponse(output_tensors=[
                pb_utils.Tensor(self.output, stacked(mine)),
                pb_utils.Tensor("TIMING", np.repeat(timing, len(mine), axis=0)),
            ]))
        return responses

    def _rows(self, request: Any) -> list[Row] | str:
        """The rows one request carries (one, or ROW_LENGTHS' many), or why it is refused."""
        ids = pb_utils.get_input_tensor_by_name(request, "INPUT_IDS").as_numpy()
        types_tensor = pb_utils.get_input_tensor_by_name(request, "TOKEN_TYPE_IDS")
        types = None if types_tensor is None else types_tensor.as_numpy()
        layer_tensor = pb_utils.get_input_tensor_by_name(request, "LAYER")
        lengths_tensor = pb_utils.get_input_tensor_by_name(request, "ROW_LENGTHS")
        if lengths_tensor is None:  # one row: the whole tensor
            layer = self._layer_index(None if layer_tensor is None else layer_tensor.as_numpy().reshape(-1))
            if isinstance(layer, str):
                return layer
            return [Row(ids.reshape(-1), None if types is None else types.reshape(-1), layer)]
        # Triton has checked that every input has the request's N rows
        lengths = lengths_tensor.as_numpy().reshape(-1)
        layers = None if layer_tensor is None else layer_tensor.as_numpy().reshape(-1)
        if types is not None and types.shape != ids.shape:
            return f"TOKEN_TYPE_IDS {list(types.shape)} must have INPUT_IDS' shape {list(ids.shape)}"
        if lengths.min() < 1 or lengths.max() > ids.shape[1]:
            return f"ROW_LENGTHS {lengths.tolist()} must be within 1..{ids.shape[1]}"
        rows = []
        for i, n in enumerate(lengths.tolist()):
            layer = self._layer_index(None if layers is None else layers[i : i + 1])
            if isinstance(layer, str):
                return layer
            rows.append(Row(ids[i, :n], None if types is None else types[i, :n], layer))
        return rows

    def _layer_index(self, values: np.ndarray | None) -> int | str:
        """The index of a row's LAYER in the graph's layers axis (-1, the last, when absent), or why not."""
        if values is None:
            return -1
        layer = int(values[0]) if values.size == 1 else None
        if layer is None or layer not in self.layers:
            return f"LAYER {values.tolist()} is not one of this model's layers {self.layers}"
        return self.layers.index(layer)


# The same name and labels as the gateway's own gauge (gateway/metrics.py), which reads /proc where Triton is its
# child; this one is for a Triton the gateway cannot see (the k8s pod: its own container, metrics on port 8002).
INSTANCE_GAUGE = "sr_gateway_model_instance_resident_bytes"
_FAMILIES: list[Any] = []


def memory_gauge(args: dict[str, str]) -> Any | None:
    """This instance's resident-memory gauge on Triton's metrics endpoint; None where Triton's metrics are off
    (`sr-gateway serve` by default: the gateway reports it then) or this Triton has no custom metrics."""
    family = getattr(pb_utils, "MetricFamily", None)
    if family is None:
        return None
    try:
        gauge = family(name=INSTANCE_GAUGE, description="Resident memory of each Python-backend model instance",
                       kind=family.GAUGE)
        metric = gauge.Metric(labels={"model": args.get("model_name", ""),
                                      "instance": args.get("model_instance_name", "")})
        metric.set(resident_bytes())
        _FAMILIES.append(gauge)  # a family dropped by the garbage collector would leave Triton's registry
    except Exception as exc:  # metrics disabled: the gateway's /proc reading covers it
        print(f"sr_backend: no memory gauge on Triton's metrics ({exc})", file=sys.stderr, flush=True)
        return None
    return metric


_PAGE = os.sysconf("SC_PAGE_SIZE")


def resident_bytes() -> int:
    """This process's RSS (/proc/self/statm: one short read, cheap enough after every execute)."""
    with open("/proc/self/statm") as f:
        return int(f.read().split()[1]) * _PAGE


def stacked(answers: list[np.ndarray]) -> np.ndarray:
    """One request's answers as its output tensor: [N, D] pooled, [N, W, C] per token (zero past a row's length)."""
    if answers[0].ndim == 1 or len(answers) == 1:
        return np.ascontiguousarray(np.stack(answers), dtype=np.float32)
    width = max(a.shape[0] for a in answers)
    out = np.zeros((len(answers), width, *answers[0].shape[1:]), dtype=np.float32)
    for i, a in enumerate(answers):
        out[i, : a.shape[0]] = a
    return out


def read_card(path: Path) -> dict[str, Any]:
    """The model's card as plain YAML ({} where the directory has none): the backend reads two fields of it and
    need not validate the whole card, which the gateway and the build do."""
    import yaml

    if not path.is_file():
        return {}
    return dict(yaml.safe_load(path.read_text(encoding="utf-8")) or {})


def declared_layers(card: dict[str, Any]) -> list[int]:
    """A card's `embedding.layers` ([] for a model that declares none: then only the default is served)."""
    embedding = card.get("embedding") or {}
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
