"""The Triton Python-backend model of the image directories (their `1/model.py` imports this).

`kind` (config parameter) picks the model:
- `classifier`: PIXELS uint8 [1, 224, 224, 3] per request (preprocessed by the gateway); the dynamic batcher's
  requests are stacked into one forward; outputs LOGITS [1, C] and EMBEDDING [1, D].
- `ocr`: IMAGE uint8 [1, H, W, 3] per request (ragged: every picture has its own size); each is read by
  sr_backend/ocr.py; output LINES, one JSON string: [{"text", "top", "left", "bottom", "right", "score"}] in pixels.
Both also return TIMING int64 [1, 4] = (execute start unix ns, forward ns, rows in this execute, 0), the same
contract as the text models, so the gateway reports Triton's own queue and forward times.
Both run on the engine and precision the config names (`engine`, `precision`, `int8_recipe`: written per host by
`sr-gateway models tune`, sr_build/tune.py), through sr_backend/image_runners.py, as the tuner measured them.
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

from sr_backend.image_runners import load_classifier, load_ocr
from sr_common.engine_choice import model_parameter


class TritonPythonModel:
    def initialize(self, args: dict[str, str]) -> None:
        config = json.loads(args["model_config"])
        version_dir = Path(args["model_repository"]) / args["model_version"]
        threads = int(os.environ.get("SR_BACKEND_THREADS") or model_parameter(config, "intra_op_threads", "0"))
        # the engine and precision `sr-gateway models tune` chose on this host (configs/tuned.pbtxt), else the
        # author's ONNX Runtime fp32 (config.pbtxt)
        engine = model_parameter(config, "engine", "onnxruntime")
        precision = model_parameter(config, "precision", "fp32")
        recipe = model_parameter(config, "int8_recipe", "dynamic")
        self.kind = model_parameter(config, "kind", "classifier")
        onnx = version_dir / model_parameter(config, "onnx_file", "model.onnx")
        if self.kind == "ocr":
            self.ocr = load_ocr(engine, precision, onnx,
                                version_dir / model_parameter(config, "recognizer_file", "recognizer.onnx"),
                                threads, recipe)
        else:
            self.classifier = load_classifier(engine, precision, onnx, threads, recipe)
        print(f"sr_backend {args.get('model_instance_name', '')}: {self.kind} on {engine}/{precision}, "
              f"{threads} thread(s)", file=sys.stderr, flush=True)

    def execute(self, requests: list[Any]) -> list[Any]:
        started = time.time_ns()
        try:
            if self.kind == "ocr":
                return self._read(requests, started)
            return self._classify(requests, started)
        except Exception as exc:  # one failed forward fails this batch's requests, never the server
            error = pb_utils.TritonError(f"forward failed: {exc}")
            return [pb_utils.InferenceResponse(output_tensors=[], error=error) for _ in requests]

    def _classify(self, requests: list[Any], started: int) -> list[Any]:
        pixels = np.concatenate([pb_utils.get_input_tensor_by_name(r, "PIXELS").as_numpy() for r in requests])
        t0 = time.perf_counter_ns()
        results = self.classifier.run(pixels)  # logits → LOGITS, embedding → EMBEDDING
        forward_ns = time.perf_counter_ns() - t0
        timing = np.array([[started, forward_ns, len(requests), 0]], dtype=np.int64)
        responses = []
        for i, _ in enumerate(requests):
            tensors = [pb_utils.Tensor(name.upper(), np.ascontiguousarray(out[i : i + 1], dtype=np.float32))
                       for name, out in results.items()]
            responses.append(pb_utils.InferenceResponse(output_tensors=[*tensors, pb_utils.Tensor("TIMING", timing)]))
        return responses

    def _read(self, requests: list[Any], started: int) -> list[Any]:
        answers = []
        total_ns = 0
        for r in requests:
            image = pb_utils.get_input_tensor_by_name(r, "IMAGE").as_numpy()[0]
            lines, ns = self.ocr.read(np.ascontiguousarray(image))
            total_ns += ns
            answers.append(json.dumps([{"text": ln.text, "top": ln.top, "left": ln.left, "bottom": ln.bottom,
                                        "right": ln.right, "score": round(ln.score, 6)} for ln in lines]))
        timing = np.array([[started, total_ns, len(requests), 0]], dtype=np.int64)
        return [pb_utils.InferenceResponse(output_tensors=[
                    pb_utils.Tensor("LINES", np.array([[a.encode("utf-8")]], dtype=np.object_)),
                    pb_utils.Tensor("TIMING", timing)])
                for a in answers]
