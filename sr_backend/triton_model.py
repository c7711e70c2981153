"""The Triton Python-backend model every ONNX model directory reuses (its `1/model.py` imports this).

Inputs (per request, batch dim 1, ragged): INPUT_IDS int64 [1, L], optional TOKEN_TYPE_IDS int64 [1, L] (pairs).
Outputs: the config's first output (EMBEDDING / LOGITS: [1, D], or [1, L, C] for per-token graphs) and
TIMING int64 [1, 4] = (execute start, unix ns; ONNX Runtime ns; rows in this execute; real tokens in it).
TIMING is how the gateway reports Triton's own queue and forward time per request instead of guessing.
"""

from __future__ import annotations

import json
import os
import time
from typing import Any

import numpy as np
import triton_python_backend_utils as pb_utils

from sr_backend.encoder import RaggedRunner, Row, make_session


def _parameter(config: dict[str, Any], key: str, default: str) -> str:
    value = config.get("parameters", {}).get(key, {}).get("string_value")
    return str(value) if value not in (None, "") else default


class TritonPythonModel:
    def initialize(self, args: dict[str, str]) -> None:
        config = json.loads(args["model_config"])
        version_dir = os.path.join(args["model_repository"], args["model_version"])
        threads = int(os.environ.get("SR_BACKEND_THREADS") or _parameter(config, "intra_op_threads", "0"))
        session = make_session(os.path.join(version_dir, _parameter(config, "onnx_file", "model.onnx")), threads)
        self.runner = RaggedRunner(session, int(_parameter(config, "max_batch_tokens", "8192")))
        self.output = next(o["name"] for o in config["output"] if o["name"] != "TIMING")

    def execute(self, requests: list[Any]) -> list[Any]:
        started = time.time_ns()
        rows = []
        for r in requests:
            types = pb_utils.get_input_tensor_by_name(r, "TOKEN_TYPE_IDS")
            rows.append(Row(pb_utils.get_input_tensor_by_name(r, "INPUT_IDS").as_numpy().reshape(-1),
                            None if types is None else types.as_numpy().reshape(-1)))
        try:
            outputs, stats = self.runner.run(rows)
        except Exception as exc:  # one failed forward fails this batch's requests, never the server
            error = pb_utils.TritonError(f"forward failed: {exc}")
            return [pb_utils.InferenceResponse(output_tensors=[], error=error) for _ in requests]
        timing = np.array([[started, stats.forward_ns, stats.rows, stats.tokens]], dtype=np.int64)
        return [
            pb_utils.InferenceResponse(output_tensors=[
                pb_utils.Tensor(self.output, np.ascontiguousarray(out[None, ...], dtype=np.float32)),
                pb_utils.Tensor("TIMING", timing),
            ])
            for out in outputs
        ]
