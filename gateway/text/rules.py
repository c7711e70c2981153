"""Which tokens of a prefix's tokenization are also the whole text's first tokens.

Tokenizing ``text[:cut]`` agrees with tokenizing ``text`` everywhere except near the cut:
the last word may continue past it, a whitespace run may attach differently, a literal
special token may straddle it, a sub-word model may segment the last word differently. Each
rule below names the tokens it trusts; the probe (``probe.py``) checks every rule on hostile
texts per tokenizer and disables the ones that ever disagree.
"""

from __future__ import annotations

import re
from collections.abc import Sequence

from .chars import search_backward

# Smallest look-back of a class cut: tokens must end before a boundary at least this far before
# the cut. Covers the whitespace a byte-level regex attaches to the next word and sub-word
# models re-segmenting the last word. Raised per tokenizer to the longest added token + 1.
LOOKBACK = 16

# Inside a run (no class cut nearby) tokens are kept only if they end this many characters
# before the cut: far beyond any sub-word model's reach, yet small against a long run.
RUN_MARGIN = 1024


def class_cut_boundary(text: str, cut: int, pattern: re.Pattern[str], lookback: int) -> int:
    """The last boundary of the cut's own class at least ``lookback`` before it (-1 if none).

    Tokens ending at or before this boundary are trusted: everything from the start of the word
    that holds it up to the cut is tokenized again from the next reading.
    """
    found = search_backward(pattern, text, cut - lookback)
    return -1 if found is None else found


def run_cut_boundary(cut: int) -> int:
    """Tokens ending at or before this position are trusted after a cut inside a run."""
    return cut - RUN_MARGIN


def count_kept(offsets: Sequence[tuple[int, int]], boundary: int) -> int:
    """How many leading tokens end at or before ``boundary`` (stops at the first that does not)."""
    kept = 0
    for _, end in offsets:
        if end > boundary:
            break
        kept += 1
    return kept
