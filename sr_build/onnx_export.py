"""ONNX export shared by every build recipe: one dynamo export path, reproducible bytes, and the report a recipe
returns. Recipes (sr_build.recipes) import this module; it imports none of them.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np


@dataclass(frozen=True)
class ExportReport:
    max_abs_diff: float
    checked_rows: int
    opset: int
    per_layer: dict[str, float] = field(default_factory=dict)  # max abs diff of each exported layer, where several
    engine_check: dict[str, Any] = field(default_factory=dict)  # agreement with the source's own engine (e5 recipe)


def random_batch(rng: np.random.Generator, vocab: int, rows: int, length: int) -> tuple[np.ndarray, np.ndarray]:
    ids = rng.integers(1000, vocab, size=(rows, length), dtype=np.int64)
    ids[:, 0] = 101  # [CLS]
    lengths = rng.integers(2, length + 1, size=rows)
    lengths[0] = length
    mask = (np.arange(length)[None, :] < lengths[:, None]).astype(np.int64)
    ids[np.arange(rows), lengths - 1] = 102  # [SEP]
    ids = ids * mask
    return ids, mask


def strip_provenance(path: Path) -> None:
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
                  min_sequence: int = 2, max_sequence: int = 512, pt2: Path | None = None) -> None:
    """torch.onnx.export(dynamo=True) with dynamic batch and sequence on every input, saved as one file with
    provenance stripped (reproducible sha256) and checked by onnx. The legacy tracer bakes mask shapes in with
    transformers 5, so every recipe (and the test fixtures) goes through here. With `pt2`, the same module is
    also saved as a `torch.export` program (the torch engine's graph, sr_backend/engines/torch_engine.py)."""
    import onnx
    import torch

    batch = torch.export.Dim("batch", min=1, max=4096)
    sequence = torch.export.Dim("sequence", min=min_sequence, max=max_sequence)
    if pt2 is not None:
        with torch.no_grad():
            exported = torch.export.export(module, tuple(torch.from_numpy(a) for a in example.values()),
                                           dynamic_shapes={name: {0: batch, 1: sequence} for name in example})
        torch.export.save(exported, str(pt2))
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
    strip_provenance(path)
    onnx.checker.check_model(str(path))
