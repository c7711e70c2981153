"""Hypothesis strategies for hostile texts: the probe's kinds, recombined and stretched.

Texts are long enough (thousands of characters) that small budgets are read in part, and they
mix what breaks naive cutting: whitespace variants next to words, combining marks after
boundaries, ZWJ emoji sequences, literal special tokens, and long runs with no boundary.
"""

from __future__ import annotations

from hypothesis import strategies as st

from gateway.text import probe_texts

ALPHABET = (
    "abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ0123456789"
    "     \t\n\r\u3000\u00a0\u2009\u200b\u200d\ufeff"
    ".,;:!?'\"()[]{}<>-_/\\|@#$%^&*+=~`…—–«»「」。,、"
    "中文字符测试長い日本語ひらがなカタカナ한국어가나다"
    "éüßçñøåÆŒﬁ\u0301\u0300\u0308\u0323\u0303"
    "ΑβγδЖжЯяعربيةעבריתहिन्दीไทย"
    "😀👍🏽❤\ufe0f⭐🇺🇸\u20e3①²½Ｆｕｌ"
)

RUN_UNITS = (
    "QmFzZTY0IGVuY29kZWQgdGV4dA+/9aZ",
    "3f9a0c7be12d45f68a9b0c1d2e3f4a5b",
    "31415926535897932384626433832795",
    "长输入按预算读取所以内存和时间跟着预算走",
    "pneumonoultramicroscopicsilicovolcanoconiosis",
    "ภาษาไทยเขียนติดกันโดยไม่มีช่องว่าง",
    "a",
    " ",
    "\r\n",
    "\u3000",
    "e\u0301",
    "👨\u200d👩\u200d👧",
    "-",
    "가",
    "→",
    "€",
    "カ",
    "\u03a9\u0314\u0342\u0345",
)


@st.composite
def runs(draw: st.DrawFn) -> str:
    """A run of one repeated unit, up to a few thousand characters."""
    unit = draw(st.sampled_from(RUN_UNITS))
    length = draw(st.integers(1, 3000))
    return (unit * (length // len(unit) + 1))[:length]


@st.composite
def probe_slices(draw: st.DrawFn) -> str:
    """A slice of one probe kind, cut anywhere (so boundaries fall in odd places)."""
    text = draw(st.sampled_from(list(probe_texts.BOUNDARY_TEXTS.values())))
    start = draw(st.integers(0, len(text) - 1))
    end = draw(st.integers(start, len(text)))
    return text[start:end]


def fragments(special_tokens: list[str]) -> st.SearchStrategy[str]:
    """One piece of a hostile text."""
    choices = [
        probe_slices(),
        runs(),
        st.text(alphabet=ALPHABET, min_size=1, max_size=200),
        st.sampled_from([" ", "  ", "\r\n", "\t", "\u3000", "\n\n", " \u0301", "\u200d"]),
    ]
    if special_tokens:
        choices.append(st.sampled_from(special_tokens))
    return st.one_of(*choices)


@st.composite
def hostile_texts(draw: st.DrawFn, special_tokens: list[str], min_size: int = 0, max_size: int = 9000) -> str:
    """A few fragments, each repeated, making a text of about a drawn length.

    Repetition keeps long texts cheap to generate (few draws per example) and adds periodicity,
    which sub-word models may segment differently at different lengths.
    """
    target = draw(st.integers(min_size, max_size))
    count = draw(st.integers(1, 10))
    parts: list[str] = []
    for _ in range(count):
        part = draw(fragments(special_tokens))
        repeats = max(1, target // (count * max(1, len(part)))) + draw(st.integers(0, 2))
        parts.append(part * repeats)
    text = "".join(parts)
    while len(text) < min_size:
        text += text or " "
    return text[:max_size]
