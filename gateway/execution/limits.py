"""A card's per-request limits: how many inputs, and how many tokens each may be read to."""

from __future__ import annotations

from ..errors import ApiError
from ..runtime import ServedModel


def check_inputs(model: ServedModel, count: int, what: str = "input") -> None:
    """The card's per-request input limit, enforced before any tokenization."""
    if count > model.card.limits.max_inputs:
        raise ApiError("invalid_request", f"{what} has {count} items; model {model.id} takes at most "
                                          f"{model.card.limits.max_inputs} per request")


def token_budget(model: ServedModel, max_tokens: int | None, ceiling: int | None = None,
                 ceiling_name: str = "max_input_tokens") -> int:
    """options.max_tokens, capped by the card's limit (max_input_tokens unless a scan ceiling is given). A budget
    that cannot hold the tokenizer's special tokens answers no input at all, so it is the request's error (the
    served document states the smallest such bound as max_tokens' minimum)."""
    limit = ceiling if ceiling is not None else model.card.limits.max_input_tokens
    if max_tokens is None:
        return limit
    if max_tokens > limit:
        raise ApiError("invalid_request", f"options.max_tokens {max_tokens} exceeds model {model.id}'s "
                                          f"{ceiling_name} {limit}")
    special = model.text_encoder().layout.size if "text" in model.card.modalities else 0
    if max_tokens < special:
        raise ApiError("invalid_request", f"options.max_tokens {max_tokens} is smaller than the {special} special "
                                          f"tokens every input needs (model {model.id})")
    return max_tokens
