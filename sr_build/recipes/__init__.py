"""Build recipes by name (a card's `build.recipe`). A recipe writes `model.onnx` (and its tokenizer or other
artifacts) into the version directory and returns its export check; the heavy imports (torch, transformers) happen
inside each recipe, so importing this table is cheap."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path
from typing import Any

from ..onnx_export import ExportReport
from .e5 import e5
from .images import efficientnet_lite, ppocr
from .lm_state import lm_state
from .nanoguard import prompt_guard
from .prebuilt import prebuilt_onnx
from .sentence_embedding import sentence_embedding

Recipe = Callable[[Path, Path, dict[str, Any]], ExportReport]
# Bumped when what a recipe exports changes; with the card fields it reads beyond `build` (CARD_INPUTS), part of
# the build cache key, so a cached model is rebuilt when its export or its declaration changes.
# sentence-embedding 2: the pooled output of every declared layer; 3 (and prompt-guard 1): + the torch program
# lm-state 1: the layer-k state at each row's last real token (the card's `embedding.layers` is k)
REVISIONS: dict[str, int] = {"sentence-embedding": 3, "prompt-guard": 1, "e5": 1, "lm-state": 1}
CARD_INPUTS: dict[str, dict[str, tuple[str, str]]] = {"sentence-embedding": {"layers": ("embedding", "layers")},
                                                      "e5": {"layers": ("embedding", "layers")},
                                                      "lm-state": {"layers": ("embedding", "layers")}}
# Packages beyond the exporters (build.py's key) whose version can change what a recipe writes: lm-state's weights
# are dequantised by `gguf` and its tokenizer.json is written by `tokenizers`.
EXPORTER_EXTRAS: dict[str, tuple[str, ...]] = {"lm-state": ("gguf", "tokenizers")}
RECIPES: dict[str, Recipe] = {
    "e5": e5,
    "efficientnet-lite": efficientnet_lite,
    "lm-state": lm_state,
    "ppocr": ppocr,
    "prebuilt-onnx": prebuilt_onnx,
    "sentence-embedding": sentence_embedding,
    "prompt-guard": prompt_guard,
}
