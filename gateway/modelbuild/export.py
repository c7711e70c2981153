"""Export recipes: PyTorch weights → one ONNX graph that does the whole model-side job.

The graph includes pooling and L2 normalisation, so Triton returns finished vectors and only vectors cross gRPC.
Every export is checked against the PyTorch model on fresh random inputs (shapes the export never saw).
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

from .nanoguard import prompt_guard


@dataclass(frozen=True)
class ExportReport:
    max_abs_diff: float
    checked_rows: int
    opset: int


def _sentence_embedder(model_dir: Path) -> Any:
    import torch
    from transformers import AutoModel

    class SentenceEmbedder(torch.nn.Module):
        """Encoder + mean pooling over real tokens + L2 normalisation (sentence-transformers semantics)."""

        def __init__(self) -> None:
            super().__init__()
            self.encoder = AutoModel.from_pretrained(str(model_dir), local_files_only=True)

        def forward(self, input_ids: torch.Tensor, attention_mask: torch.Tensor) -> torch.Tensor:
            hidden = self.encoder(
                input_ids=input_ids,
                attention_mask=attention_mask,
                token_type_ids=torch.zeros_like(input_ids),
            ).last_hidden_state
            mask = attention_mask.unsqueeze(-1).to(hidden.dtype)
            pooled = (hidden * mask).sum(dim=1) / mask.sum(dim=1).clamp(min=1e-9)
            return torch.nn.functional.normalize(pooled, p=2.0, dim=1)

    return SentenceEmbedder().eval()


MODULES = {"sentence-embedding": _sentence_embedder}


def _random_batch(rng: np.random.Generator, vocab: int, rows: int, length: int) -> tuple[np.ndarray, np.ndarray]:
    ids = rng.integers(1000, vocab, size=(rows, length), dtype=np.int64)
    ids[:, 0] = 101  # [CLS]
    lengths = rng.integers(2, length + 1, size=rows)
    lengths[0] = length
    mask = (np.arange(length)[None, :] < lengths[:, None]).astype(np.int64)
    ids[np.arange(rows), lengths - 1] = 102  # [SEP]
    ids = ids * mask
    return ids, mask


def _strip_provenance(path: Path) -> None:
    """Drop per-node stack traces and doc strings: they name our source lines, so any edit to this file would
    change the artifact's sha256 without changing the model."""
    import onnx

    model = onnx.load(str(path))
    for graph in [model.graph, *(f for f in model.functions)]:
        for node in graph.node:
            del node.metadata_props[:]
            node.doc_string = ""
    onnx.save(model, str(path))


def dynamo_export(module: Any, example: dict[str, np.ndarray], output: str, path: Path, *, opset: int,
                  min_sequence: int = 2, max_sequence: int = 512) -> None:
    """torch.onnx.export(dynamo=True) with dynamic batch and sequence on every input, saved as one file with
    provenance stripped (reproducible sha256) and checked by onnx. The legacy tracer bakes mask shapes in with
    transformers 5, so every recipe (and the test fixtures) goes through here."""
    import onnx
    import torch

    batch = torch.export.Dim("batch", min=1, max=4096)
    sequence = torch.export.Dim("sequence", min=min_sequence, max=max_sequence)
    with torch.no_grad():
        program = torch.onnx.export(
            module,
            tuple(torch.from_numpy(a) for a in example.values()),
            dynamo=True,
            opset_version=opset,
            input_names=list(example),
            output_names=[output],
            dynamic_shapes={name: {0: batch, 1: sequence} for name in example},
            optimize=True,
        )
    if program is None:
        raise RuntimeError("torch.onnx.export returned no program")
    program.save(str(path), external_data=False)
    _strip_provenance(path)
    onnx.checker.check_model(str(path))


def export_onnx(recipe: str, model_dir: Path, out: Path, *, vocab: int, opset: int = 18,
                seed: int = 20261129) -> ExportReport:
    """Export a recipe's module and verify it against PyTorch on shapes and values the export never saw."""
    import onnxruntime as ort
    import torch

    torch.manual_seed(seed)
    module = MODULES[recipe](model_dir)
    rng = np.random.default_rng(seed)
    ids, mask = _random_batch(rng, vocab, rows=2, length=16)
    tmp = out.with_suffix(".tmp.onnx")
    dynamo_export(module, {"input_ids": ids, "attention_mask": mask}, "sentence_embedding", tmp, opset=opset)

    # Verify on shapes and values the exporter never saw.
    session = ort.InferenceSession(str(tmp), providers=["CPUExecutionProvider"])
    worst, rows = 0.0, 0
    for n, length in ((1, 7), (5, 33), (3, 128)):
        ids, mask = _random_batch(rng, vocab, rows=n, length=length)
        with torch.no_grad():
            want = module(torch.from_numpy(ids), torch.from_numpy(mask)).numpy()
        got = session.run(None, {"input_ids": ids, "attention_mask": mask})[0]
        worst = max(worst, float(np.max(np.abs(want - got))))
        rows += n
    if worst > 1e-4:
        tmp.unlink(missing_ok=True)
        raise RuntimeError(f"ONNX export disagrees with PyTorch: max abs diff {worst:.2e} > 1e-4")
    tmp.replace(out)
    return ExportReport(max_abs_diff=worst, checked_rows=rows, opset=opset)


def sentence_embedding(src: Path, out_dir: Path, spec: dict[str, Any]) -> ExportReport:
    """Recipe: a Hugging Face encoder directory → `model.onnx` (pooled, normalised) + its `tokenizer.json`."""
    import shutil

    report = export_onnx("sentence-embedding", src, out_dir / "model.onnx", vocab=int(spec.get("vocab_size", 30522)),
                         opset=int(spec.get("opset", 18)))
    shutil.copyfile(src / "tokenizer.json", out_dir / "tokenizer.json")
    return report


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


from . import images as _images  # noqa: E402  (image recipes import this module's helpers)

# A recipe writes `model.onnx` and `tokenizer.json` into the version directory and returns its export check.
Recipe = Callable[[Path, Path, dict[str, Any]], ExportReport]
RECIPES: dict[str, Recipe] = {
    "efficientnet-lite": _images.efficientnet_lite,
    "ppocr": _images.ppocr,
    "prebuilt-onnx": prebuilt_onnx,
    "sentence-embedding": sentence_embedding,
    "prompt-guard": prompt_guard,
}
