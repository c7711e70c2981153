"""PyTorch on the CPU: the graph `torch.export` wrote beside model.onnx at build time (`model.pt2`, the same module
the ONNX came from), at fp32 or under bf16 autocast (oneDNN's AVX512-BF16 / AMX kernels). A candidate like any other
engine: where it is faster than OpenVINO and ONNX Runtime on a host and passes the card's check, `models tune`
serves it there. A CPU without native bf16 is refused at bf16 rather than run emulated (0.16x fp32 on an AVX2 host).
Loading the program needs no model code, so a model directory stays data."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import numpy as np

from . import EngineError
from .host import detect
from .shapes import per_token_output


def program_path(onnx: Path) -> Path:
    """Where the build put the exported program of a graph: model.onnx → model.pt2."""
    return onnx.with_suffix(".pt2")


class TorchEngine:
    name = "torch"

    def __init__(self, module: Any, precision: str, inputs: list[str], per_token: bool) -> None:
        self.module = module
        self.precision = precision
        self.order = inputs  # the program's positional inputs, by name
        self.inputs = frozenset(inputs)
        self.per_token = per_token

    @classmethod
    def from_file(cls, onnx: Path, precision: str, threads: int) -> TorchEngine:
        path = program_path(onnx)
        if not path.is_file():
            raise EngineError(f"{path} is missing: the torch engine runs the program `sr-gateway models build` "
                              "exports beside model.onnx (models built from PyTorch weights only)")
        try:
            import torch
        except ImportError as exc:
            raise EngineError("the torch engine needs PyTorch (the `export` extra)") from exc
        host = detect()
        if precision == "bf16" and not host.native_bf16:
            raise EngineError(f"this CPU has no native bf16 (ISA flags: {' '.join(host.flags) or 'none listed'})")
        if threads:
            torch.set_num_threads(threads)
        program = torch.export.load(str(path))
        inputs = [spec.arg.name for spec in program.graph_signature.input_specs
                  if spec.kind == torch.export.graph_signature.InputKind.USER_INPUT]
        output = next(iter(n for n in program.graph.nodes if n.op == "output")).args[0][0]
        shape = [d if isinstance(d, int) else None for d in output.meta["val"].shape]
        return cls(program.module(), precision, inputs, per_token_output(shape))

    def forward(self, feed: dict[str, np.ndarray]) -> np.ndarray:
        import torch

        args = [torch.from_numpy(feed[name]) for name in self.order]
        with torch.inference_mode(), torch.autocast("cpu", torch.bfloat16, enabled=self.precision == "bf16"):
            out = self.module(*args)
        return np.asarray(out.float().numpy(), dtype=np.float32)

    def forward_all(self, feed: dict[str, np.ndarray]) -> dict[str, np.ndarray]:
        raise EngineError("the torch engine serves text graphs (one output)")
