"""Reading a text only as far as its token budget needs.

A model reads at most its budget, so tokenizing a 5 MiB input to answer from its first 256
tokens wastes memory and time in proportion to the input. ``read`` tokenizes a prefix that is
long enough for the budget and keeps only tokens the cut cannot have changed (``rules.py``),
doubling the prefix until enough tokens are kept or the whole text was read. The kept tokens
are exactly the whole text's first tokens, so answers are the same as when reading it whole.

``surely_over`` decides, from the length alone, that a text cannot fit: a tokenizer that never
drops or folds characters covers at most ``chars_per_token`` characters with one token.
"""

from __future__ import annotations

import re
from collections.abc import Callable, Sequence
from dataclasses import dataclass

from .chars import RUN_CUT, class_of, class_pattern, search_forward
from .probe import Facts, Tokenize
from .rules import class_cut_boundary, count_kept, run_cut_boundary

# Characters a first reading takes per token needed: English averages 4 to 5, so 6 reads
# enough in one pass for most texts; the fixed slack covers short budgets and markup.
CHARS_PER_TOKEN = 6
SLACK = 1024

# A cut at a class boundary is searched this far after the wanted position before the text is
# treated as a run.
SEARCH = 4096


def reach(need: int) -> int:
    """Characters of a first reading for ``need`` tokens; texts this short are read whole."""
    return max(1, need) * CHARS_PER_TOKEN + SLACK


@dataclass(frozen=True)
class Reading:
    """The whole text's first tokens, as far as one reading could vouch for them."""

    ids: list[int]
    offsets: list[tuple[int, int]]
    complete: bool
    """True when the whole text was tokenized: ``ids`` are all its tokens."""
    chars_read: int
    """Characters tokenized by the last (largest) reading."""


@dataclass(frozen=True)
class Cut:
    """Where to end a prefix and which of its tokens to trust."""

    end: int
    boundary: int


def find_cut(text: str, position: int, facts: Facts) -> Cut | None:
    """The first usable cut at or after ``position`` (None: read the text whole)."""
    pattern = class_pattern(facts.classes)
    if pattern is not None:
        end = search_forward(pattern, text, position, min(len(text), position + SEARCH))
        if end is not None:
            return Cut(end, class_cut_boundary(text, end, _own_class(text[end]), facts.lookback))
    if facts.run_cuts:
        end = search_forward(RUN_CUT, text, position, min(len(text), position + SEARCH))
        if end is not None:
            return Cut(end, run_cut_boundary(end))
    if pattern is not None:
        # Read the run whole: cut at the first class boundary after it.
        end = search_forward(pattern, text, position)
        if end is not None:
            return Cut(end, class_cut_boundary(text, end, _own_class(text[end]), facts.lookback))
    if facts.run_cuts:
        end = search_forward(RUN_CUT, text, position)
        if end is not None:
            return Cut(end, run_cut_boundary(end))
    return None


def _own_class(ch: str) -> re.Pattern[str]:
    """The pattern of ``ch``'s class alone: a class cut trusts tokens up to its own class."""
    cls = class_of(ch)
    assert cls is not None
    pattern = class_pattern(frozenset({cls}))
    assert pattern is not None
    return pattern


def read(text: str, need: int, tokenize: Tokenize, facts: Callable[[], Facts]) -> Reading:
    """The first ``need`` or more tokens of ``text``, or all of them if it has fewer.

    ``facts`` is called only for texts too long to read whole at once, so short texts never
    wait for the probe.
    """
    position = reach(need)
    while position < len(text):
        cut = find_cut(text, position, facts())
        if cut is None:
            break
        part = tokenize(text[: cut.end])
        kept = count_kept(part.offsets, cut.boundary)
        if kept >= need:
            return Reading(part.ids[:kept], part.offsets[:kept], False, cut.end)
        position = 2 * cut.end
    whole = tokenize(text)
    return Reading(whole.ids, whole.offsets, True, len(text))


def surely_over(texts: Sequence[str], limit: int, facts: Facts) -> bool:
    """Whether ``texts`` together certainly hold more than ``limit`` content tokens.

    Short texts are never judged by length: they are cheap to read, and reading gives the
    exact count for the error message. Added tokens that swallow whitespace must be absent.
    """
    length = sum(len(text) for text in texts)
    if facts.chars_per_token is None or length <= reach(limit + 1):
        return False
    if length <= limit * facts.chars_per_token:
        return False
    return not any(token in text for token in facts.strip_tokens for text in texts)
