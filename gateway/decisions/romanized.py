"""Names in Latin letters inside Chinese text: a Chinese name in pinyin (Sun Mingze, Ouyang Hao, Mingze Sun) or an
English given name before a Chinese surname (Grace Tan, Tina Wu), as colleagues write each other in a Chinese work
chat. The English tagger reads such a sentence as a few English words among unknown tokens and finds half of the
name or none of it (the seen span sets' mixed items, v4–v8: `Sun Mingze` → `Mingze`, `Grace Tan` → `Tan`, `Ma
Jingyu` → `yu`, `Liu Yang`, `Xu Jiayi`, `Tiffany Ma` missed), and LAC reads no Latin at all. Lexicons from
libraries decide what a part may be: pypinyin's syllable inventory, the romanised forms (pypinyin's readings) of
the common surnames, and Faker's English given names. Only in a sentence with Han characters: in English text the
tagger reads names in context, and the lexicons would only add false ones."""

from __future__ import annotations

import re
import unicodedata
from dataclasses import dataclass
from functools import lru_cache

# The hundred-odd commonest Chinese surnames (about 85 % of people; a rarer one in Latin letters is left to the tagger,
# since nearly every pinyin syllable is some rare surname), read as surnames are (曾 Zeng, 覃 Qin, not the
# dictionary's first reading), the compound ones, and romanisations that are not pinyin (Cantonese, Hokkien,
# Wade-Giles) which people keep in Latin-script names.
_COMMON_SURNAMES = ("王李张刘陈杨黄赵吴周徐孙马胡朱郭何罗高林郑梁谢唐宋许邓冯韩曹曾彭萧肖蔡潘田董袁于余叶"
                    "蒋杜苏魏程吕丁沈任姚卢傅钟姜崔谭廖范汪陆金石戴贾韦夏邱方侯邹熊孟秦白江阎闫薛尹段雷黎史龙"
                    "陶贺顾毛郝龚邵万钱严赖覃洪武莫孔")
_SURNAME_READINGS = {"曾": "zeng", "覃": "qin"}
_OTHER_ROMANISATIONS = ("wong", "chan", "lee", "cheung", "chang", "lau", "ng", "ho", "leung", "tse", "yeung", "chow",
                   "chu", "kwok", "kwan", "lam", "lai", "tsang", "tsui", "fung", "yip", "mak", "choi", "chung",
                   "tan", "lim", "goh", "teo", "ong", "koh", "tay", "chua", "khoo", "hsu", "hsieh", "tsai", "cheng",
                   "chiang", "chao", "kuo", "kao", "liao", "lin", "huang", "wu", "soong", "tung", "yuen", "szeto")
_HONORIFIC = re.compile(r"(?:Mr|Mrs|Ms|Miss|Mx|Dr|Prof|Sir|Madam|Dear)\.?\s*$")
# Two capitalised Latin words side by side (a hyphen or an apostrophe may join the syllables of a given name:
# Jia-yi, Xi'an), not part of an address, handle or longer Latin run of letters and digits
_WORD = r"([A-Z][a-z]+(?:['\-][A-Za-z][a-z]*)?)"
_PAIR = rf"(?<![A-Za-z0-9@._\-/]){_WORD} {_WORD}(?![A-Za-z0-9@_\-/])"
MAX_GIVEN_SYLLABLES = 2  # a Chinese given name has one or two characters (rarely three: not read)


@dataclass(frozen=True)
class Name:
    start: int
    end: int


def _plain(reading: str) -> str:
    """A pinyin reading without its tone marks (lǜ → lu)."""
    return "".join(c for c in unicodedata.normalize("NFD", reading) if not unicodedata.combining(c))


@lru_cache(maxsize=1)
def syllables() -> frozenset[str]:
    """Every toneless pinyin syllable pypinyin knows a character for (≈ 420), plus the ü spellings lv, lyu, nv."""
    from pypinyin.pinyin_dict import pinyin_dict

    found = {_plain(r) for readings in pinyin_dict.values() for r in readings.split(",")}
    return frozenset(found | {"lv", "lyu", "nv", "nyu", "lve", "nve"})


@lru_cache(maxsize=1)
def surnames() -> frozenset[str]:
    """The surnames above as they are written in Latin letters (pypinyin's reading of each, or its surname reading),
    the compound ones joined (Ouyang, Situ), and the non-pinyin romanisations."""
    from pypinyin import lazy_pinyin

    from .pii_zh import _COMPOUND_SURNAMES

    out = set(_OTHER_ROMANISATIONS)
    out.update(_SURNAME_READINGS.get(ch) or lazy_pinyin(ch)[0] for ch in _COMMON_SURNAMES)
    out.update("".join(lazy_pinyin(pair)) for pair in _COMPOUND_SURNAMES)
    return frozenset(out)


@lru_cache(maxsize=1)
def given_names() -> frozenset[str]:
    """English given names (Faker's en_US and en_GB lists, ≈ 780), less those that are also months."""
    from faker.providers.person.en_GB import Provider as British
    from faker.providers.person.en_US import Provider as American

    months = {"January", "February", "March", "April", "May", "June", "July", "August", "September", "October",
              "November", "December"}
    return frozenset(set(American.first_names) | set(British.first_names)) - months


def pinyin_syllables(word: str) -> int:
    """How many pinyin syllables `word` is made of (0: it is not pinyin). Apostrophes and hyphens split syllables."""
    known = syllables()
    best = 0
    for part in re.split(r"['\-]", word.lower()):
        n = len(part)
        fewest = [0] + [99] * n  # fewest syllables spelling part[:i]
        for i in range(1, n + 1):
            for j in range(max(0, i - 6), i):
                if fewest[j] < 99 and part[j:i] in known:
                    fewest[i] = min(fewest[i], fewest[j] + 1)
        if not part or fewest[n] >= 99:
            return 0
        best += fewest[n]
    return best


def _given(word: str) -> bool:
    return 0 < pinyin_syllables(word) <= MAX_GIVEN_SYLLABLES


def _surname(word: str) -> bool:
    return word.lower() in surnames()


def is_name(first: str, second: str) -> bool:
    """Surname + pinyin given name (Sun Mingze), the Western order (Mingze Sun), or an English given name + a
    Chinese surname (Grace Tan)."""
    return ((_surname(first) and _given(second)) or (_given(first) and _surname(second))
            or (first in given_names() and _surname(second)))


def find(text: str) -> list[Name]:
    """The names in Latin letters of `text` that sit in a sentence with Han characters."""
    import regex

    from .pii_zh import in_han_sentence

    out: list[Name] = []
    for m in regex.finditer(_PAIR, text, overlapped=True):
        first, second = m.group(1), m.group(2)
        if out and m.start() < out[-1].end:
            continue
        if re.match(r" [A-Z][a-z]", text[m.end():m.end() + 3]):  # the start of a longer proper name (Hang Seng Bank)
            continue
        if _HONORIFIC.search(text, 0, m.start()) or not is_name(first, second):
            continue
        if not in_han_sentence(text, m.start(), m.end()):
            continue
        out.append(Name(m.start(), m.end()))
    return out
