"""Recipe `prebuilt-onnx`: the package already ships an ONNX graph and its tokenizer."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from ..onnx_export import ExportReport


def prebuilt_onnx(src: Path, out_dir: Path, spec: dict[str, Any]) -> ExportReport:
    """Recipe: the package already ships ONNX; copy it and its tokenizer, and check the graph is what the card
    says (inputs input_ids/attention_mask[/token_type_ids], output width = the head's label count)."""
    import shutil

    import onnxruntime as ort

    onnx_file = src / spec.get("onnx", "model.onnx")
    session = ort.InferenceSession(str(onnx_file), providers=["CPUExecutionProvider"])
    names = {i.name for i in session.get_inputs()}
    if not {"input_ids", "attention_mask"} <= names:
        raise RuntimeError(f"{onnx_file}: inputs {sorted(names)} lack input_ids/attention_mask")
    width = session.get_outputs()[0].shape[-1]
    if "labels" in spec and width != int(spec["labels"]):
        raise RuntimeError(f"{onnx_file}: output width {width} != {spec['labels']} labels")
    shutil.copyfile(onnx_file, out_dir / "model.onnx")
    shutil.copyfile(src / spec.get("tokenizer", "tokenizer.json"), out_dir / "tokenizer.json")
    return ExportReport(max_abs_diff=0.0, checked_rows=0, opset=0)
