"""Image model recipes: EfficientNet-Lite0 (classify + embeddings in one graph) and PP-OCRv4 (prebuilt ONNX).

EfficientNet-Lite0's graph takes the preprocessed picture as uint8 `pixels [B, 224, 224, 3]` (see
gateway/images/preprocess.py) and does the rest: `(x - 127) / 128` (the TF-Lite reference constants), the network,
global average pooling, then two outputs: `logits [B, 1000]` (ImageNet-1k, the classifier) and `embedding [B, 1280]`
(the pooled features, L2-normalised). The export is checked against PyTorch on random pictures it never saw.
"""

from __future__ import annotations

import shutil
from pathlib import Path
from typing import Any

import numpy as np

from ..onnx_export import ExportReport, strip_provenance

MEAN = 127.0
STD = 128.0


def efficientnet_module(weights: Path) -> Any:
    import torch
    from efficientnet_lite_pytorch import EfficientNet

    class Lite0(torch.nn.Module):
        """uint8 NHWC pixels → (logits, L2-normalised pooled features)."""

        def __init__(self) -> None:
            super().__init__()
            self.net = EfficientNet.from_pretrained("efficientnet-lite0", weights_path=str(weights))

        def forward(self, pixels: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
            x = (pixels.to(torch.float32) - MEAN) / STD
            features = self.net.extract_features(x.permute(0, 3, 1, 2))
            pooled = features.mean(dim=(2, 3))
            return self.net._fc(pooled), torch.nn.functional.normalize(pooled, p=2.0, dim=1)

    return Lite0().eval()


def efficientnet_lite(src: Path, out_dir: Path, spec: dict[str, Any]) -> ExportReport:
    """Recipe: the package's state dict → `model.onnx` (pixels → logits, embedding), checked against PyTorch."""
    import onnx
    import onnxruntime as ort
    import torch


    opset = int(spec.get("opset", 18))
    module = efficientnet_module(src / spec["weights"])
    rng = np.random.default_rng(20261130)
    example = rng.integers(0, 256, size=(2, 224, 224, 3), dtype=np.uint8)
    tmp = out_dir / "model.tmp.onnx"
    with torch.no_grad():
        program = torch.onnx.export(module, (torch.from_numpy(example),), dynamo=True, opset_version=opset,
                                    input_names=["pixels"], output_names=["logits", "embedding"],
                                    dynamic_shapes={"pixels": {0: torch.export.Dim("batch", min=1, max=4096)}},
                                    optimize=True)
    if program is None:
        raise RuntimeError("torch.onnx.export returned no program")
    program.save(str(tmp), external_data=False)
    strip_provenance(tmp)
    onnx.checker.check_model(str(tmp))
    session = ort.InferenceSession(str(tmp), providers=["CPUExecutionProvider"])
    worst, rows = 0.0, 0
    for n in (1, 3):
        pixels = rng.integers(0, 256, size=(n, 224, 224, 3), dtype=np.uint8)
        with torch.no_grad():
            want = [t.numpy() for t in module(torch.from_numpy(pixels))]
        got = session.run(None, {"pixels": pixels})
        worst = max(worst, *(float(np.max(np.abs(w - g))) for w, g in zip(want, got, strict=True)))
        rows += n
    if worst > 1e-3:
        tmp.unlink(missing_ok=True)
        raise RuntimeError(f"ONNX export disagrees with PyTorch: max abs diff {worst:.2e} > 1e-3")
    tmp.replace(out_dir / "model.onnx")
    return ExportReport(max_abs_diff=worst, checked_rows=rows, opset=opset)


def ppocr(src: Path, out_dir: Path, spec: dict[str, Any]) -> ExportReport:
    """Recipe: rapidocr's PP-OCRv4 detector (→ `model.onnx`) and recogniser (→ `recognizer.onnx`), checked to be
    the graphs sr_backend/ocr.py expects (input `x`, recogniser character list in the metadata)."""
    import onnxruntime as ort


    det, rec = src / spec["detector"], src / spec["recognizer"]
    for path in (det, rec):
        names = [i.name for i in ort.InferenceSession(str(path), providers=["CPUExecutionProvider"]).get_inputs()]
        if names != ["x"]:
            raise RuntimeError(f"{path}: inputs {names}, expected ['x']")
    meta = ort.InferenceSession(str(rec), providers=["CPUExecutionProvider"]).get_modelmeta().custom_metadata_map
    if "character" not in meta:
        raise RuntimeError(f"{rec}: no character list in the model metadata")
    shutil.copyfile(det, out_dir / "model.onnx")
    shutil.copyfile(rec, out_dir / "recognizer.onnx")
    return ExportReport(max_abs_diff=0.0, checked_rows=0, opset=0)
