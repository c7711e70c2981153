"""Text → model input ids under a token budget (reject or truncate), with honest usage.

Interim implementation: it tokenizes the whole text. The budget-bounded reader in `gateway.text` replaces it.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from tokenizers import Tokenizer

from ..errors import ItemError


@dataclass(frozen=True)
class Encoded:
    ids: list[int]
    tokens: int  # tokens the text has (incl. special tokens), or tokens read when read in part
    truncated: bool = False
    tokens_lower_bound: bool = False

    def usage(self) -> dict[str, Any]:
        out: dict[str, Any] = {"tokens": self.tokens, "processed_tokens": len(self.ids),
                               "truncated": self.truncated}
        if self.tokens_lower_bound:
            out["tokens_lower_bound"] = True
        return out


def encode(tokenizer: Tokenizer, text: str, budget: int, overflow: str) -> Encoded:
    if not text:
        raise ItemError("invalid_input", "the input is an empty string")
    ids = tokenizer.encode(text).ids
    if len(ids) <= budget:
        return Encoded(ids, len(ids))
    if overflow == "reject":
        raise ItemError("max_length_exceeded", f"the input has {len(ids)} tokens, which exceeds max_length {budget}")
    if budget < 3:
        raise ItemError("max_length_exceeded", f"max_tokens {budget} leaves no room for text inside the special tokens")
    return Encoded([*ids[: budget - 1], ids[-1]], len(ids), truncated=True)
