"""Cheap, documented signals for the trained presets where a sentence embedding is blind.

An embedding of "drivers must be 25" sits next to one of "drivers must be 21", and "这个 bug 明天再说" next to a
code-mixed sentence; a handful of counted features fixes what the vector cannot see. The same functions build the
features at training (sr_build/presets.py) and when serving (presets.py), so the two cannot drift. Each list below
names its entries in order; a change to any of them is a change to the heads (sr_build/presets.py's REVISION).

- `pii_signals`: an e-mail, a run of ≥ 7 digits, an 18-character Chinese ID number, a masked value (`138xxxx`);
  then what the field's libraries validate (`gateway.decisions.pii_zh`, the span questions' own recognisers): an
  e-mail, a CN phone number, a resident identity number (check digit), a bank card (Luhn), a person's name and a
  postal address (LAC), plus a phone number valid in the US, GB or CN numbering plan (`phonenumbers`) and an IBAN
  (`stdnum.iban`, check digits). The regexes say "looks like a number"; the libraries say "is a valid one", which
  separates an order number from a mobile number. Read over the first `PII_SCAN_CHARS` code points (the encoder
  reads at most 512 tokens anyway), so a huge state costs a bounded analysis.
- `grounded_signals` (context, answer): numbers of the answer whose VALUE is not in the context (Arabic and Chinese
  numerals, thousands separators ignored), weekdays the answer names that the context does not, Latin names and
  codes (capitalised words, `KT-200`) the answer adds, a negation on one side only, and the share of the answer's
  words and CJK character pairs the context lacks.
- `relevance_signals` (request, candidate): the share of the request's words and CJK pairs the candidate has, and
  the gap between the parts' CJK shares (the head learns to discount overlap across languages).
- `language_features`: lingua-language-detector's confidences over the languages in play, the shares of CJK, Latin,
  kana and hangul letters, and counts that separate a borrowed token from code-mixing: Latin words left once URLs,
  identifiers, acronyms and numbers are removed, CJK characters, and English function words.
"""

from __future__ import annotations

import math
import re
import unicodedata
from functools import lru_cache
from typing import Any

import numpy as np

_NUMBER = re.compile(r"\d+(?:[.,:/\-]\d+)*")
_ARABIC = re.compile(r"\d+(?:,\d{3})*(?:\.\d+)?")
_CN_NUMERAL = re.compile(r"[零〇一二两三四五六七八九十百千万]+")
_CN_UNIT_AFTER = "个年月日号天点岁元块次倍折分秒层楼人周期位种项张本台辆件公里米克斤"
_CJK = re.compile(r"[\u3400-\u9fff\uf900-\ufaff]")
_KANA = re.compile(r"[\u3040-\u30ff]")
_HANGUL = re.compile(r"[\uac00-\ud7af\u1100-\u11ff]")
_LATIN = re.compile(r"[A-Za-z]")
_WORD = re.compile(r"[A-Za-z][A-Za-z'\-]+|\d+")
_NAME = re.compile(r"(?<![.!?]\s)(?<!^)\b[A-Z][a-z]{2,}\b")
_CODE_NAME = re.compile(r"\b(?:[A-Z][A-Za-z]*\d[\w\-]*|[A-Z]{2,}-\w+)\b")
_NEG_EN = re.compile(r"\b(?:not|no|never|none|nobody|nothing|neither|nor|cannot|without)\b|n't\b", re.IGNORECASE)
_NEG_ZH = re.compile(r"[不没無无未别非]")
_EMAIL = re.compile(r"[\w.+\-]+@[\w\-]+(?:\.[\w\-]+)+")
_DIGITS = re.compile(r"\d(?:[\d \-]{5,}\d)")
_CN_ID = re.compile(r"(?<!\d)\d{17}[\dXx](?!\d)")
_MASKED = re.compile(r"\d{2,}[xX*]{3,}|[xX*]{4,}")
_URL = re.compile(r"https?://\S+|www\.\S+|\S+@\S+")
_IDENTIFIER = re.compile(r"\b\w*(?:[a-z][A-Z]|_)\w*\b|\b\w+\(\)|\b[A-Z]{2,}s?\b")
_PINYIN = re.compile(r"^(?:zh|ch|sh|[bpmfdtnlgkhjqxrzcsyw])?(?:iang|iong|uang|ang|eng|ing|ong|uai|uan|ian|iao|ai|ei"
                     r"|ao|ou|an|en|in|un|ia|ie|iu|ua|uo|ue|ui|er|a|o|e|i|u|v)$")
_CODE_LINE = re.compile(r"[(){};=<>\[\]]|^\s*(?:#|//|--|def |function |SELECT |for |if |return )", re.IGNORECASE)
_EN_FUNCTION = frozenset(("the", "a", "an", "is", "are", "was", "be", "to", "of", "and", "in", "on", "it", "i",
                          "you", "we", "this", "that", "for", "with", "but", "so", "my", "your", "can", "will",
                          "do", "does", "have", "has", "not", "at", "by", "from", "what", "how", "please", "let's"))
_STOP = frozenset(("the", "a", "an", "of", "to", "in", "on", "for", "and", "or", "is", "are", "was", "were", "be",
                   "by", "with", "at", "as", "it", "this", "that", "from"))
_WEEKDAYS = (("monday", "周一", "星期一", "礼拜一", "禮拜一"), ("tuesday", "周二", "星期二", "礼拜二", "禮拜二"),
             ("wednesday", "周三", "星期三", "礼拜三", "禮拜三"), ("thursday", "周四", "星期四", "礼拜四", "禮拜四"),
             ("friday", "周五", "星期五", "礼拜五", "禮拜五"), ("saturday", "周六", "星期六", "礼拜六", "禮拜六"),
             ("sunday", "周日", "周天", "星期日", "星期天", "礼拜天", "禮拜日"))
_CN_DIGIT = {"零": 0, "〇": 0, "一": 1, "二": 2, "两": 2, "三": 3, "四": 4, "五": 5, "六": 6, "七": 7, "八": 8, "九": 9}
_CN_SCALE = {"十": 10, "百": 100, "千": 1000}

LANGUAGES = ("ENGLISH", "CHINESE", "JAPANESE", "KOREAN", "FRENCH", "GERMAN", "SPANISH", "RUSSIAN", "PORTUGUESE",
             "ITALIAN", "ARABIC", "VIETNAMESE")  # lingua is restricted to these (the languages in play)


def _bigrams(text: str) -> set[str]:
    cjk = "".join(_CJK.findall(text))
    return {cjk[i:i + 2] for i in range(len(cjk) - 1)}


def _words(text: str) -> set[str]:
    return {w.lower() for w in _WORD.findall(text) if w.lower() not in _STOP}


def _missing(have: set[Any], source: set[Any]) -> float:
    return len(have - source) / len(have) if have else 0.0


PII_ENTITIES = ("EMAIL_ADDRESS", "PHONE_NUMBER", "CN_RESIDENT_ID", "BANK_CARD", "PERSON", "ADDRESS")
PHONE_REGIONS = ("US", "GB", "CN")
PII_SCAN_CHARS = 4096
_IBAN = re.compile(r"\b[A-Z]{2}\d{2}(?:\s?[A-Z0-9]{4}){2,7}\s?[A-Z0-9]{1,4}\b")


def pii_signals(text: str) -> list[float]:
    import phonenumbers
    from stdnum import iban

    from .. import pii_zh

    text = text[:PII_SCAN_CHARS]
    digits = [re.sub(r"\D", "", m) for m in _DIGITS.findall(text)]
    found = {f.entity for f in pii_zh.find(text)}
    phone = any(True for region in PHONE_REGIONS
                for _ in phonenumbers.PhoneNumberMatcher(text, region, leniency=phonenumbers.Leniency.VALID))
    return [float(bool(_EMAIL.search(text))), float(any(len(d) >= 7 for d in digits)),
            float(bool(_CN_ID.search(text))), float(bool(_MASKED.search(text))),
            *(float(e in found) for e in PII_ENTITIES), float(phone),
            float(any(iban.is_valid(m) for m in _IBAN.findall(text)))]


_SPOKEN_PLACE = {"百": 10, "千": 100, "万": 1000}  # the place of a digit said right after 百, 千 or 万


def chinese_numeral(run: str) -> float | None:
    """The value of a run of Chinese numerals (`三`, `十五`, `两千零八`; `二〇二六` is read digit by digit); None if
    the run is not a well-formed number. A last digit right after 百, 千 or 万 counts in the next lower place, as
    it is spoken: 一百五 is 150, 四千五 is 4,500, 三万五 is 35,000 (一百零五 is 105)."""
    if all(ch in _CN_DIGIT for ch in run):
        if len(run) > 1 and run[-1] == "两":  # 三两: three liang (a weight), not 32
            return chinese_numeral(run[:-1])
        return float("".join(str(_CN_DIGIT[ch]) for ch in run)) if len(run) > 1 else float(_CN_DIGIT[run])
    total, section, digit = 0, 0, None
    for ch in run:
        if ch in _CN_DIGIT:
            digit = _CN_DIGIT[ch]
        elif ch in _CN_SCALE:
            section += (1 if digit is None else digit) * _CN_SCALE[ch]
            digit = None
        elif ch == "万":
            total += (section + (digit or 0)) * 10000
            section, digit = 0, None
        else:  # pragma: no cover - the pattern admits nothing else
            return None
    place = _SPOKEN_PLACE.get(run[-2], 1) if len(run) > 1 and run[-1] in _CN_DIGIT else 1
    return float(total + section + (digit or 0) * place)


def numbers(text: str) -> set[float]:
    """Every number's value: Arabic numerals (thousands separators ignored), and Chinese numeral runs that are
    longer than one character or followed by a unit or measure word (so 一起, 一般 are not read as 1)."""
    values = {float(m.replace(",", "")) for m in _ARABIC.findall(text)}
    for m in _CN_NUMERAL.finditer(text):
        after = text[m.end():m.end() + 1]
        if len(m.group()) > 1 or (after and after in _CN_UNIT_AFTER):
            value = chinese_numeral(m.group())
            if value is not None:
                values.add(value)
    return values


def _weekdays(text: str) -> set[int]:
    low = text.lower()
    return {i for i, names in enumerate(_WEEKDAYS) if any(n in low for n in names)}


def grounded_signals(context: str, answer: str) -> list[float]:
    """Where the answer disagrees with its context on things an embedding hardly sees: numbers, days, names,
    negation, and how much of the answer is new."""
    have, source = numbers(answer), numbers(context)
    new_numbers = have - source
    days_a, days_c = _weekdays(answer), _weekdays(context)
    names = set(_NAME.findall(answer)) | set(_CODE_NAME.findall(answer))
    neg_a = bool(_NEG_EN.search(answer) or _NEG_ZH.search(answer))
    neg_c = bool(_NEG_EN.search(context) or _NEG_ZH.search(context))
    return [float(bool(new_numbers)), _missing(have, source), float(bool(days_a - days_c)),
            float(any(n not in context for n in names)), float(neg_a != neg_c), float(neg_a and not neg_c),
            _missing(_words(answer), _words(context)), _missing(_bigrams(answer), _bigrams(context)),
            math.log1p(len(answer) / max(1, len(context)))]


def _cjk_share(text: str) -> float:
    letters = [ch for ch in text if ch.isalpha()]
    return len(_CJK.findall("".join(letters))) / len(letters) if letters else 0.0


def script_gap(first: str, second: str) -> float:
    """How far apart two texts' scripts are: 1 for a Chinese text beside an English one, 0 for the same mix."""
    return abs(_cjk_share(first) - _cjk_share(second))


def relevance_signals(request: str, candidate: str) -> list[float]:
    """The share of the request's words and CJK pairs the candidate has, and how far apart the two parts' scripts
    are (1 for a Chinese request beside an English passage): overlap says nothing across languages."""
    return [1.0 - _missing(_words(request), _words(candidate)),
            1.0 - _missing(_bigrams(request), _bigrams(candidate)),
            script_gap(request, candidate)]


@lru_cache(maxsize=1)
def _detector() -> Any:
    from lingua import Language, LanguageDetectorBuilder

    return LanguageDetectorBuilder.from_languages(*(getattr(Language, n) for n in LANGUAGES)).build()


def language_features(text: str) -> np.ndarray:
    """lingua's confidence per language in play, script shares, and the counts that tell a borrowed token or an
    identifier inside Chinese from real English beside it."""
    values = {c.language.name: c.value for c in _detector().compute_language_confidence_values(text)}
    letters = max(1, sum(ch.isalpha() for ch in text))
    cjk, latin = len(_CJK.findall(text)) / letters, len(_LATIN.findall(text)) / letters
    kana, hangul = len(_KANA.findall(text)) / letters, len(_HANGUL.findall(text)) / letters
    prose_lines = [line for line in text.splitlines() if not _CODE_LINE.search(line)]
    prose = _IDENTIFIER.sub(" ", _URL.sub(" ", "\n".join(prose_lines)))
    words = [w.lower() for w in re.findall(r"[A-Za-z]+(?:'[a-z]+)?", prose)]
    han = len(_CJK.findall(text))
    function = sum(w in _EN_FUNCTION for w in words)
    plain = [unicodedata.normalize("NFKD", w).encode("ascii", "ignore").decode().lower()
             for w in re.findall(r"[^\W\d_]+", text) if not _CJK.match(w)]
    pinyin = sum(bool(_PINYIN.match(w)) for w in plain) / len(plain) if plain else 0.0
    return np.asarray([values.get(n, 0.0) for n in LANGUAGES]
                      + [cjk, latin, min(cjk, latin), kana, hangul, math.log1p(len(words)), math.log1p(han),
                         math.log1p(function), len(words) / (len(words) + han / 2 + 1e-9) if words or han else 0.0,
                         pinyin],
                      dtype=np.float64)
