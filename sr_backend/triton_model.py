"""The Triton Python-backend model every pooled-encoder directory reuses (its `1/model.py` imports this).

Inputs (per request, batch dim 1, ragged): INPUT_IDS int64 [1, L]. Outputs: EMBEDDING fp32 [1, D] and
TIMING int64 [1, 4] = (execute start, unix ns; forward ns; rows in this execute; real tokens in this execute).
TIMING is how the gateway reports Triton's own queue and forward time per request instead of guessing.
"""

from __future__ import annotations

import json
import os
import time
from typing import Any

import numpy as np
import triton_python_backend_utils as pb_utils

from sr_backend.encoder import PooledEncoder, make_session


def _parameter(config: dict[str, Any], key: str, default: str) -> str:
    value = config.get("parameters", {}).get(key, {}).get("string_value")
    return str(value) if value not in (None, "") else default


class TritonPythonModel:
    def initialize(self, args: dict[str, str]) -> None:
        config = json.loads(args["model_config"])
        version_dir = os.path.join(args["model_repository"], args["model_version"])
        threads = int(os.environ.get("SR_BACKEND_THREADS") or _parameter(config, "intra_op_threads", "0"))
        session = make_session(os.path.join(version_dir, _parameter(config, "onnx_file", "model.onnx")), threads)
        self.encoder = PooledEncoder(session, int(_parameter(config, "max_batch_tokens", "8192")))

    def execute(self, requests: list[Any]) -> list[Any]:
        started = time.time_ns()
        rows = [pb_utils.get_input_tensor_by_name(r, "INPUT_IDS").as_numpy().reshape(-1) for r in requests]
        try:
            vectors, stats = self.encoder.run(rows)
        except Exception as exc:  # one failed forward fails this batch's requests, never the server
            error = pb_utils.TritonError(f"forward failed: {exc}")
            return [pb_utils.InferenceResponse(output_tensors=[], error=error) for _ in requests]
        timing = np.array([[started, stats.forward_ns, stats.rows, stats.tokens]], dtype=np.int64)
        return [
            pb_utils.InferenceResponse(output_tensors=[
                pb_utils.Tensor("EMBEDDING", vectors[i : i + 1]),
                pb_utils.Tensor("TIMING", timing),
            ])
            for i in range(len(requests))
        ]
