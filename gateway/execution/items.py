"""Classify items: one text (or pair, or grounded triple) read as one model input or as windows of inputs, and
token probabilities merged back over windows. Decisions' zero-shot family reads texts the way /v1/classify does,
so both take it from here.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Literal

import numpy as np
from pydantic import StrictStr

from ..errors import ItemError, too_long
from ..heads import best_context_windows, softmax
from ..text import InputTooLong, TextEncoder
from .jobs import Job
from .meta import input_usage
from .requests import Strict

Overflow = Literal["reject", "truncate", "window"]


class Pair(Strict):
    text: StrictStr
    text_pair: StrictStr


class Grounded(Strict):
    context: StrictStr
    question: StrictStr
    answer: StrictStr


@dataclass
class Item:
    """One classify input: its model inputs (one job, or one per window) and what reading it cost."""

    text: str = ""
    jobs: list[Job] = field(default_factory=list)
    spans: list[tuple[int, int]] = field(default_factory=list)  # content-token range of each window
    offsets: list[list[tuple[int, int]]] = field(default_factory=list)  # per job: code points per id
    content: list[list[int]] = field(default_factory=list)  # per job: positions of content (non-special) ids
    usage: dict[str, Any] = field(default_factory=dict)
    error: ItemError | None = None


def prepare_item(encoder: TextEncoder, value: Any, overflow: Overflow, budget: int, tokens: int, overlap: int) -> Item:
    item = Item(text=value if isinstance(value, str) else getattr(value, "text", ""))
    try:
        if isinstance(value, Grounded):
            enc = encoder.encode_grounded(value.context, value.question, value.answer, max_tokens=budget,
                                          overflow=_linear(overflow))
        elif isinstance(value, Pair):
            enc = encoder.encode_pair(value.text, value.text_pair, max_tokens=budget, overflow=_linear(overflow))
        elif not value:
            raise ItemError("invalid_input", "the input is an empty string")
        elif overflow == "window":
            windows = encoder.windows(value, window_tokens=tokens, overlap=overlap, scan_budget=budget)
            item.jobs = [Job(w.ids) for w in windows]
            item.spans = [(w.content_start, w.content_end) for w in windows]
            item.offsets = [w.offsets for w in windows]
            prefix = len(encoder.envelope[0])
            item.content = [list(range(prefix, prefix + w.content_end - w.content_start)) for w in windows]
            content = windows[-1].content_end
            item.usage = {"tokens": content + sum(len(x) for x in encoder.envelope),
                          "processed_tokens": sum(len(w.ids) for w in windows), "truncated": False,
                          "windows": len(windows)}
            return item
        else:
            enc = encoder.encode(value, max_tokens=budget, overflow=_linear(overflow))
    except InputTooLong as exc:
        item.error = too_long(exc)
        return item
    except ItemError as exc:
        item.error = exc
        return item
    paired = isinstance(value, Pair | Grounded)
    item.jobs = [Job(enc.ids, enc.type_ids if paired else None)]
    item.offsets = [enc.offsets]
    # A token head reads spans off the last text of a pair (the text_pair, or a grounded item's answer: the part
    # being judged), so offsets always index one text; a single text is its own last text.
    last = 1 if paired else 0
    item.content = [[i for i, seq in enumerate(enc.sequence_ids) if seq == last]]
    if isinstance(value, Pair):
        item.text = value.text_pair
    elif isinstance(value, Grounded):
        item.text = value.answer
    item.usage = input_usage(enc)
    return item


def _linear(overflow: Overflow) -> Literal["reject", "truncate"]:
    return "truncate" if overflow == "truncate" else "reject"


def token_probabilities(item: Item, results: list[np.ndarray]) -> tuple[np.ndarray, list[tuple[int, int]]]:
    """Content tokens of the whole input with their probabilities; windows merged by best context."""
    if not item.spans:  # read at once: only the content tokens, special tokens dropped
        keep = item.content[0]
        return softmax(results[0][keep]), [item.offsets[0][i] for i in keep]
    total = item.spans[-1][1]
    if total == 0:  # a text the tokenizer reads as no token at all (windows hold only special tokens): no spans
        return np.zeros((0, results[0].shape[-1]), dtype=np.float32), []
    owner = best_context_windows(item.spans, total)
    rows: list[np.ndarray] = []
    offsets: list[tuple[int, int]] = []
    for t in range(total):
        w = owner[t]
        position = item.content[w][t - item.spans[w][0]]
        rows.append(results[w][position])
        offsets.append(item.offsets[w][position])
    return softmax(np.stack(rows)), offsets
