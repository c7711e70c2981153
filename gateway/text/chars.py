"""Character classes where a text may be cut, and fast searches for them.

A long input is tokenized only up to a cut. Cuts are placed before characters that
tokenizers treat as word boundaries (spaces, other whitespace, punctuation, symbols, CJK
characters), one class per character so the probe can judge each class on its own. Inside a
run with none of them (base64, hex, unspaced Chinese for a whitespace tokenizer) the cut goes
before a letter or digit that never composes with what precedes it.

The searches use compiled ``re`` character classes so that finding a cut in a multi-megabyte
text costs a C-speed scan of a few kilobytes, not a Python loop.
"""

from __future__ import annotations

import enum
import re
import threading
import unicodedata
from collections.abc import Iterable
from functools import lru_cache


class CutClass(enum.Enum):
    """A class of characters before which a text may be cut."""

    SPACE = "space"
    WHITESPACE = "whitespace"
    PUNCTUATION = "punctuation"
    SYMBOL = "symbol"
    IDEOGRAPH = "ideograph"
    KANA = "kana"
    HANGUL = "hangul"


# Unicode White_Space other than U+0020 (Python's isspace() also counts U+001C..U+001F, which
# tokenizers written in Rust treat as controls).
_WHITESPACE = (
    "\t\n\x0b\x0c\r\x85\xa0\u1680\u2000\u2001\u2002\u2003\u2004\u2005\u2006\u2007\u2008"
    "\u2009\u200a\u2028\u2029\u202f\u205f\u3000"
)

# CJK characters, one class per script because tokenizers differ: BERT splits every ideograph
# into its own word but reads a kana run as one word. Ideographs: CJK unified (with extension
# A), the compatibility block, planes 2 and 3.
_IDEOGRAPHS = ((0x3400, 0x4DBF), (0x4E00, 0x9FFF), (0xF900, 0xFAFF), (0x20000, 0x323AF))
_KANA = ((0x3040, 0x30FF), (0x31F0, 0x31FF))
_HANGUL = ((0xAC00, 0xD7A3),)
_CJK = ((CutClass.IDEOGRAPH, _IDEOGRAPHS), (CutClass.KANA, _KANA), (CutClass.HANGUL, _HANGUL))
_CJK_ASTRAL = _IDEOGRAPHS[-1]

# Hangul jamo compose into syllables under NFC; a run is never cut before one.
_JAMO = ((0x1100, 0x11FF), (0xA960, 0xA97F), (0xD7B0, 0xD7FF))

# Punctuation and symbols are assigned only in planes 0 and 1.
_LAST_CLASSIFIED = 0x1FFFF


def class_of(ch: str) -> CutClass | None:
    """The cut class of one character, or None when a text is never cut before it."""
    if ch == " ":
        return CutClass.SPACE
    if ch in _WHITESPACE:
        return CutClass.WHITESPACE
    category = unicodedata.category(ch)
    if category[0] == "P":
        return CutClass.PUNCTUATION
    if category[0] == "S":
        return CutClass.SYMBOL
    if category[0] == "L":
        code = ord(ch)
        for cls, blocks in _CJK:
            if any(lo <= code <= hi for lo, hi in blocks):
                return cls
    return None


def _ranges(codes: Iterable[int]) -> list[tuple[int, int]]:
    out: list[tuple[int, int]] = []
    for code in codes:
        if out and out[-1][1] == code - 1:
            out[-1] = (out[-1][0], code)
        else:
            out.append((code, code))
    return out


_table_lock = threading.Lock()
_table: dict[CutClass, list[tuple[int, int]]] = {}


def _class_ranges() -> dict[CutClass, list[tuple[int, int]]]:
    """Code-point ranges of every class, built once per process (about 0.1 s)."""
    with _table_lock:
        if not _table:
            members: dict[CutClass, list[int]] = {cls: [] for cls in CutClass}
            for code in range(_LAST_CLASSIFIED + 1):
                if 0xD800 <= code <= 0xDFFF:
                    continue
                cls = class_of(chr(code))
                if cls is not None:
                    members[cls].append(code)
            for cls, codes in members.items():
                _table[cls] = _ranges(codes)
            _table[CutClass.IDEOGRAPH].append(_CJK_ASTRAL)
        return _table


def _char_class(ranges: Iterable[tuple[int, int]]) -> str:
    return "".join(f"\\U{lo:08x}" if lo == hi else f"\\U{lo:08x}-\\U{hi:08x}" for lo, hi in ranges)


@lru_cache(maxsize=64)
def class_pattern(classes: frozenset[CutClass]) -> re.Pattern[str] | None:
    """A pattern matching one character of any of ``classes`` (None for no class)."""
    if not classes:
        return None
    table = _class_ranges()
    body = "".join(_char_class(table[cls]) for cls in sorted(classes, key=lambda c: c.value))
    return re.compile(f"[{body}]")


# A letter or digit (word character, not underscore) that is not a Hangul jamo. Marks are not
# letters, so a cut never separates a base character from its combining marks.
RUN_CUT = re.compile("[^\\W_" + _char_class(_JAMO) + "]")


def search_forward(pattern: re.Pattern[str], text: str, start: int, stop: int | None = None) -> int | None:
    """The first match position in ``text[start:stop]``."""
    match = pattern.search(text, start, len(text) if stop is None else stop)
    return None if match is None else match.start()


def search_backward(pattern: re.Pattern[str], text: str, last: int, first: int = 0) -> int | None:
    """The last match position ``p`` with ``first <= p <= last``, scanning back in growing steps."""
    if last < first:
        return None
    stop = last + 1
    step = 256
    while True:
        lo = max(first, stop - step)
        found = None
        for match in pattern.finditer(text, lo, stop):
            found = match.start()
        if found is not None:
            return found
        if lo == first:
            return None
        stop = lo
        step *= 4
