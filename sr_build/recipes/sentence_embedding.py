"""Recipe `sentence-embedding`: a Hugging Face encoder directory → one ONNX graph that does the whole model-side job.

The graph includes pooling and L2 normalisation, so Triton returns finished vectors and only vectors cross gRPC.
A card that declares several layers (`embedding.layers`, e.g. [3, 6]) gets the pooled, normalised output of each
of them from the one forward, stacked `[B, layers, D]` in the card's order (the last is the default); a card with
one layer gets `[B, D]` as before. Choosing a layer is then a row of that output, so a batch mixing layers runs once.
Every export is checked against the PyTorch model, layer by layer, on fresh random inputs (shapes the export never
saw).
"""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path
from typing import Any

import numpy as np

from sr_backend.engines.torch_engine import program_path

from ..onnx_export import ExportReport, dynamo_export, random_batch


def _sentence_embedder(model_dir: Path, layers: Sequence[int] | None = None) -> Any:
    import torch
    from transformers import AutoModel

    class SentenceEmbedder(torch.nn.Module):
        """Encoder + mean pooling over real tokens + L2 normalisation (sentence-transformers semantics), at the
        last layer or at each of `layers` (hidden state k = the output of encoder layer k)."""

        def __init__(self) -> None:
            super().__init__()
            self.encoder = AutoModel.from_pretrained(str(model_dir), local_files_only=True)
            self.depth = int(self.encoder.config.num_hidden_layers)
            self.layers = list(layers) if layers else [self.depth]
            if any(not 1 <= k <= self.depth for k in self.layers) or sorted(set(self.layers)) != self.layers:
                raise ValueError(f"embedding.layers {self.layers} must ascend within 1..{self.depth}")

        def _pool(self, hidden: torch.Tensor, attention_mask: torch.Tensor) -> torch.Tensor:
            mask = attention_mask.unsqueeze(-1).to(hidden.dtype)
            pooled = (hidden * mask).sum(dim=1) / mask.sum(dim=1).clamp(min=1e-9)
            return torch.nn.functional.normalize(pooled, p=2.0, dim=1)

        def forward(self, input_ids: torch.Tensor, attention_mask: torch.Tensor) -> torch.Tensor:
            early = self.layers != [self.depth]  # the last layer alone needs no hidden states (the old graph)
            out = self.encoder(input_ids=input_ids, attention_mask=attention_mask,
                               token_type_ids=torch.zeros_like(input_ids), output_hidden_states=early)
            states = [out.hidden_states[k] for k in self.layers] if early else [out.last_hidden_state]
            pooled = [self._pool(h, attention_mask) for h in states]
            return pooled[0] if len(pooled) == 1 else torch.stack(pooled, dim=1)

    return SentenceEmbedder().eval()


def reference_embeddings(model_dir: Path, texts: Sequence[str], layer: int) -> np.ndarray:
    """PyTorch's answer for `texts` at `layer`, straight from transformers (`output_hidden_states`, mean pooling,
    L2 norm) without the export module: the independent reference for goldens and tests."""
    import torch
    from tokenizers import Tokenizer
    from transformers import AutoModel

    tokenizer = Tokenizer.from_file(str(model_dir / "tokenizer.json"))
    tokenizer.no_padding()
    tokenizer.no_truncation()
    model = AutoModel.from_pretrained(str(model_dir), local_files_only=True).eval()
    rows = []
    for text in texts:  # one row at a time: no padding at all in the reference
        ids = torch.tensor([tokenizer.encode(text).ids], dtype=torch.int64)
        with torch.no_grad():
            hidden = model(input_ids=ids, attention_mask=torch.ones_like(ids), token_type_ids=torch.zeros_like(ids),
                           output_hidden_states=True).hidden_states[layer]
        pooled = hidden.mean(dim=1)
        rows.append(torch.nn.functional.normalize(pooled, p=2.0, dim=1)[0].numpy())
    return np.stack(rows)


def export_checked(model_dir: Path, out: Path, *, vocab: int, opset: int = 18, layers: Sequence[int] | None = None,
                   seed: int = 20261129) -> ExportReport:
    """Export the sentence embedder and verify it against PyTorch on shapes and values the export never saw."""
    import onnxruntime as ort
    import torch

    torch.manual_seed(seed)
    module = _sentence_embedder(model_dir, layers)
    rng = np.random.default_rng(seed)
    ids, mask = random_batch(rng, vocab, rows=2, length=16)
    tmp = out.with_suffix(".tmp.onnx")
    program = out.with_name(out.stem + ".tmp.pt2")
    dynamo_export(module, {"input_ids": ids, "attention_mask": mask}, "sentence_embedding", tmp, opset=opset,
                  pt2=program)

    # Verify on shapes and values the exporter never saw, every exported layer on its own.
    session = ort.InferenceSession(str(tmp), providers=["CPUExecutionProvider"])
    worst = dict.fromkeys(module.layers, 0.0)
    rows = 0
    for n, length in ((1, 7), (5, 33), (3, 128)):
        ids, mask = random_batch(rng, vocab, rows=n, length=length)
        with torch.no_grad():
            want = module(torch.from_numpy(ids), torch.from_numpy(mask)).numpy()
        got = session.run(None, {"input_ids": ids, "attention_mask": mask})[0]
        if got.shape != want.shape:
            tmp.unlink(missing_ok=True)
            program.unlink(missing_ok=True)
            raise RuntimeError(f"ONNX export answers shape {got.shape}, PyTorch {want.shape}")
        for i, k in enumerate(module.layers):
            pick = (slice(None), i) if want.ndim == 3 else (slice(None),)
            worst[k] = max(worst[k], float(np.max(np.abs(want[pick] - got[pick]))))
        rows += n
    if max(worst.values()) > 1e-4:
        tmp.unlink(missing_ok=True)
        program.unlink(missing_ok=True)
        raise RuntimeError(f"ONNX export disagrees with PyTorch: max abs diff per layer {worst} > 1e-4")
    tmp.replace(out)
    program.replace(program_path(out))  # checked where it is used: the tuner's check against this graph
    return ExportReport(max_abs_diff=max(worst.values()), checked_rows=rows, opset=opset,
                        per_layer={str(k): v for k, v in worst.items()})


def sentence_embedding(src: Path, out_dir: Path, spec: dict[str, Any]) -> ExportReport:
    """Recipe: a Hugging Face encoder directory → `model.onnx` (pooled, normalised, at every declared layer) + its
    `tokenizer.json`. `spec["layers"]` is the card's `embedding.layers` (build.py passes it)."""
    import shutil

    report = export_checked(src, out_dir / "model.onnx", vocab=int(spec.get("vocab_size", 30522)),
                            opset=int(spec.get("opset", 18)), layers=spec.get("layers"))
    shutil.copyfile(src / "tokenizer.json", out_dir / "tokenizer.json")
    return report
