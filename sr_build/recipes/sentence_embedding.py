"""Recipe `sentence-embedding`: a Hugging Face encoder directory → one ONNX graph that does the whole model-side job.

The graph includes pooling and L2 normalisation, so Triton returns finished vectors and only vectors cross gRPC.
Every export is checked against the PyTorch model on fresh random inputs (shapes the export never saw).
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import numpy as np

from ..onnx_export import ExportReport, dynamo_export, random_batch


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



def export_checked(model_dir: Path, out: Path, *, vocab: int, opset: int = 18,
                seed: int = 20261129) -> ExportReport:
    """Export the sentence embedder and verify it against PyTorch on shapes and values the export never saw."""
    import onnxruntime as ort
    import torch

    torch.manual_seed(seed)
    module = _sentence_embedder(model_dir)
    rng = np.random.default_rng(seed)
    ids, mask = random_batch(rng, vocab, rows=2, length=16)
    tmp = out.with_suffix(".tmp.onnx")
    dynamo_export(module, {"input_ids": ids, "attention_mask": mask}, "sentence_embedding", tmp, opset=opset)

    # Verify on shapes and values the exporter never saw.
    session = ort.InferenceSession(str(tmp), providers=["CPUExecutionProvider"])
    worst, rows = 0.0, 0
    for n, length in ((1, 7), (5, 33), (3, 128)):
        ids, mask = random_batch(rng, vocab, rows=n, length=length)
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

    report = export_checked(src, out_dir / "model.onnx", vocab=int(spec.get("vocab_size", 30522)),
                         opset=int(spec.get("opset", 18)))
    shutil.copyfile(src / "tokenizer.json", out_dir / "tokenizer.json")
    return report
