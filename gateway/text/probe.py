"""Per-tokenizer facts: which cut rules hold, and how many characters one token can cover.

Cut rules are heuristics about how a tokenizer treats boundaries, so each tokenizer is checked
before any rule is trusted: the first time it is used, every rule is applied at every cut
point of hostile probe texts and the kept tokens are compared with the whole text's. A rule
that ever disagrees is disabled for that tokenizer; texts that would need it are read whole.

Tokenizers that drop or fold characters (WordPiece drops whitespace and reads a word over 100
characters as one unknown token; Unigram fuses unknown characters) give no bound on characters
per token, so they never reject early and never cut inside a run; such runs are read whole,
which is cheap because a folded run is only a few tokens.

Facts depend only on the tokenizer's serialized form, so they are computed once per distinct
tokenizer and shared by every encoder in the process.
"""

from __future__ import annotations

import hashlib
import json
import threading
from collections.abc import Callable, Iterator, Mapping
from dataclasses import dataclass
from typing import Any, NamedTuple

from tokenizers import Tokenizer

from . import probe_texts
from .chars import RUN_CUT, CutClass, class_pattern, search_forward
from .rules import LOOKBACK, RUN_MARGIN, class_cut_boundary, count_kept, run_cut_boundary

# Composing normalizers merge several code points into one. The longest canonical
# decomposition of a composed character is four code points (U+1FAF: Omega, dasia,
# perispomeni, ypogegrammeni; Hangul L+V+T is three), so text shrinks at most fourfold.
COMPOSING = {"NFC": 4, "NFKC": 4, "Precompiled": 4}

# Normalizers that delete characters (controls, accents, stripped whitespace).
DELETING = {"BertNormalizer", "StripAccents", "Strip"}
HARMLESS_NORMALIZERS = {"Sequence", "NFD", "NFKD", "Lowercase", "Prepend", "ByteLevel", "Replace"}
HARMLESS_NORMALIZERS |= set(COMPOSING)

# Pre-tokenizers that drop what they split on.
DROPPING = {"BertPreTokenizer", "Whitespace", "WhitespaceSplit", "CharDelimiterSplit"}


class Tokens(NamedTuple):
    """Content token ids and code-point offsets of one tokenization (no special tokens)."""

    ids: list[int]
    offsets: list[tuple[int, int]]


Tokenize = Callable[[str], Tokens]


@dataclass(frozen=True)
class Facts:
    """What the probe established for one tokenizer."""

    classes: frozenset[CutClass]
    """Cut classes whose rule held on every probe cut."""
    run_cuts: bool
    """Whether a run may be cut before a letter or digit."""
    lookback: int
    """A class cut trusts tokens ending at a boundary at least this far before the cut."""
    chars_per_token: float | None
    """Most characters one token can cover; None when the tokenizer drops or folds characters."""
    strip_tokens: tuple[str, ...]
    """Added tokens that swallow neighbouring whitespace; an early reject needs them absent."""
    disabled: tuple[str, ...]
    """Why each disabled rule is off, for logs and reports."""


def tokenize_with(tokenizer: Tokenizer) -> Tokenize:
    """Content tokens of ``text`` (no special tokens) from a tokenizer without truncation."""

    def tokenize(text: str) -> Tokens:
        encoding = tokenizer.encode(text, add_special_tokens=False)
        return Tokens(encoding.ids, encoding.offsets)

    return tokenize


def _nodes(node: Any) -> Iterator[Mapping[str, Any]]:
    if isinstance(node, Mapping):
        yield node
        for value in node.values():
            yield from _nodes(value)
    elif isinstance(node, list):
        for value in node:
            yield from _nodes(value)


@dataclass(frozen=True)
class _Structure:
    folds: list[str]
    whole_only: list[str]
    factor: float
    lookback: int
    longest_entry: int
    strip_tokens: tuple[str, ...]


def _structure(tokenizer: Tokenizer, config: Mapping[str, Any]) -> _Structure:
    """What the serialized pipeline says about folding, composing and look-across."""
    folds: list[str] = []
    whole_only: list[str] = []
    factor = 1.0
    lookback = LOOKBACK
    for node in _nodes(config.get("normalizer")):
        kind = node.get("type")
        if kind is None:
            continue
        if kind in COMPOSING:
            factor = max(factor, COMPOSING[kind])
        if kind in DELETING:
            folds.append(f"normalizer {kind} deletes characters")
        elif kind == "Replace":
            pattern = node.get("pattern", {})
            content = str(node.get("content", ""))
            if "Regex" in pattern:
                whole_only.append("normalizer Replace uses a regex that may look across a cut")
                continue
            old = str(pattern.get("String", ""))
            lookback = max(lookback, len(old) + 1)
            if not content:
                folds.append(f"normalizer Replace deletes {old!r}")
            else:
                factor = max(factor, len(old) / len(content))
        elif kind not in HARMLESS_NORMALIZERS:
            folds.append(f"normalizer {kind} is not known to keep every character")
    for node in _nodes(config.get("pre_tokenizer")):
        kind = node.get("type")
        if kind in DROPPING or (kind in {"Split", "Punctuation"} and node.get("behavior") == "Removed"):
            folds.append(f"pre-tokenizer {kind} drops characters")
    model = config.get("model", {})
    kind = model.get("type")
    if kind == "WordPiece":
        folds.append("WordPiece reads a long word as one unknown token")
    elif kind == "WordLevel":
        folds.append("WordLevel reads any unknown word as one token")
    elif kind == "BPE" and model.get("fuse_unk") and model.get("unk_token") is not None:
        folds.append("BPE fuses unknown characters")
    elif kind == "Unigram" and model.get("unk_id") is not None and not model.get("byte_fallback"):
        folds.append("Unigram fuses unknown characters")
    strip_tokens: list[str] = []
    longest_added = 0
    for added in config.get("added_tokens", []):
        content = str(added.get("content", ""))
        longest_added = max(longest_added, len(content))
        if added.get("lstrip") or added.get("rstrip"):
            if added.get("normalized"):
                folds.append(f"added token {content!r} swallows whitespace after normalization")
            strip_tokens.append(content)
    lookback = max(lookback, longest_added + 1)
    prefix = str(model.get("continuing_subword_prefix") or "")
    longest_entry = longest_added
    for entry in tokenizer.get_vocab(with_added_tokens=True):
        if prefix and entry.startswith(prefix):
            entry = entry[len(prefix) :]
        longest_entry = max(longest_entry, len(entry))
    return _Structure(folds, whole_only, factor, lookback, longest_entry, tuple(strip_tokens))


def _chars_per_token(tokenize: Tokenize, structure: _Structure) -> tuple[float | None, list[str]]:
    if structure.folds:
        return None, structure.folds
    chars = max(1, structure.longest_entry) * structure.factor
    for text in probe_texts.FOLD_TEXTS:
        tokens = len(tokenize(text).ids)
        if tokens * chars < len(text):
            return None, [f"{tokens} tokens cover the {len(text)}-character fold text {text[:12]!r}…"]
    return chars, []


# The joined probe texts are checked at every JOINED_STRIDE-th cut point: their cost grows with
# the square of their length, and each kind is also checked alone at every cut.
JOINED_STRIDE = 5


def _probe_texts(tokenizer: Tokenizer, unknown: int | None) -> list[tuple[str, int]]:
    """Every boundary kind alone, all joined, and joined backwards without added tokens.

    Each text comes with the stride at which its cut points are checked.
    """
    added = [token.content for token in tokenizer.get_added_tokens_decoder().values()]
    kinds = dict(probe_texts.BOUNDARY_TEXTS)
    if added:
        kinds["own_special_tokens"] = " ".join(f"x{token}y {token}{token} z {token}" for token in added)
    texts = [(text, 1) for text in kinds.values()]
    texts.append(("\n".join(kinds.values()), JOINED_STRIDE))
    plain = [text for name, text in kinds.items() if "special_tokens" not in name]
    texts.append((" ".join(reversed(plain)), JOINED_STRIDE))
    known = _known_boundary_characters(tokenizer, unknown)
    texts.extend((text, 1) for text in probe_texts.class_run_texts(known).values())
    return texts


# Candidates per boundary class for the class-run probes, most common first; the first
# KNOWN_PER_CLASS that the tokenizer reads without its unknown token are used.
CANDIDATES = {
    CutClass.SPACE: " ",
    CutClass.WHITESPACE: "\n\u3000\t\u00a0",
    CutClass.PUNCTUATION: "-、.。,…!?_'\"()[]{}",
    CutClass.SYMBOL: "+→$€=©<°>|~^`😀",
    CutClass.IDEOGRAPH: "的一是中人国大",
    CutClass.KANA: "のあいうカタナ",
    CutClass.HANGUL: "가이다한국어나는",
}
# ASCII and non-ASCII alternate above: BERT splits ASCII symbols but not "→" or "€".
KNOWN_PER_CLASS = 4


def _known_boundary_characters(tokenizer: Tokenizer, unknown: int | None) -> tuple[str, ...]:
    """A few boundary characters of each class that the tokenizer reads as known tokens."""
    picked: list[str] = []
    for candidates in CANDIDATES.values():
        known = [ch for ch in candidates if unknown not in tokenizer.encode(ch, add_special_tokens=False).ids]
        picked.extend(known[:KNOWN_PER_CLASS])
    return tuple(picked)


def _unknown_id(tokenizer: Tokenizer, config: Mapping[str, Any]) -> int | None:
    model = config.get("model", {})
    if model.get("unk_id") is not None:
        return int(model["unk_id"])
    token = model.get("unk_token")
    return None if token is None else tokenizer.token_to_id(str(token))


class _Prober:
    """Applies each rule at every cut point of the probe texts and compares with whole reads."""

    # Prefixes tokenized per batch call: large enough to use both cores, small enough to stop
    # soon after a disagreement.
    BATCH = 64

    def __init__(self, tokenizer: Tokenizer, lookback: int) -> None:
        self.tokenizer = tokenizer
        self.lookback = lookback

    def _tokens(self, texts: list[str]) -> list[Tokens]:
        encodings = self.tokenizer.encode_batch(texts, add_special_tokens=False)
        return [Tokens(encoding.ids, encoding.offsets) for encoding in encodings]

    def first_disagreement(self, text: str, cuts: list[tuple[int, int]]) -> int | None:
        """The first cut ``(end, boundary)`` whose trusted tokens differ from the whole text's."""
        cuts = [(end, boundary) for end, boundary in cuts if boundary >= 0]
        if not cuts:
            return None
        (whole,) = self._tokens([text])
        for start in range(0, len(cuts), self.BATCH):
            chunk = cuts[start : start + self.BATCH]
            parts = self._tokens([text[:end] for end, _ in chunk])
            for (end, boundary), part in zip(chunk, parts, strict=True):
                kept = count_kept(part.offsets, boundary)
                if part.ids[:kept] != whole.ids[:kept] or part.offsets[:kept] != whole.offsets[:kept]:
                    return end
        return None

    def class_failure(self, cls: CutClass, texts: list[tuple[str, int]]) -> str | None:
        pattern = class_pattern(frozenset({cls}))
        assert pattern is not None
        for index, (text, stride) in enumerate(texts):
            ends = [match.start() for match in pattern.finditer(text, 1)][::stride]
            cuts = [(end, class_cut_boundary(text, end, pattern, self.lookback)) for end in ends]
            end = self.first_disagreement(text, cuts)
            if end is not None:
                return f"{cls.value}: disagrees on probe text {index} cut at {end}"
        return None

    def run_failure(self, texts: list[str]) -> str | None:
        for index, text in enumerate(texts):
            cuts: list[tuple[int, int]] = []
            position = RUN_MARGIN + 1
            while (end := search_forward(RUN_CUT, text, position)) is not None:
                cuts.append((end, run_cut_boundary(end)))
                position = end + probe_texts.RUN_STEP
            end = self.first_disagreement(text, cuts)
            if end is not None:
                return f"run: disagrees on run text {index} cut at {end}"
        return None


def probe(tokenizer: Tokenizer) -> Facts:
    """Check every cut rule on the probe texts and bound characters per token (uncached).

    ``tokenizer`` must have truncation and padding off.
    """
    tokenize = tokenize_with(tokenizer)
    config = json.loads(tokenizer.to_str())
    structure = _structure(tokenizer, config)
    chars_per_token, fold_reasons = _chars_per_token(tokenize, structure)
    disabled: list[str] = []
    if structure.whole_only:
        disabled.extend(structure.whole_only)
        return Facts(frozenset(), False, structure.lookback, chars_per_token, structure.strip_tokens, tuple(disabled))
    prober = _Prober(tokenizer, structure.lookback)
    texts = _probe_texts(tokenizer, _unknown_id(tokenizer, config))
    classes: set[CutClass] = set()
    for cls in CutClass:
        failure = prober.class_failure(cls, texts)
        if failure is None:
            classes.add(cls)
        else:
            disabled.append(failure)
    run_cuts = False
    if fold_reasons:
        disabled.extend(f"run: {reason}" for reason in fold_reasons)
    else:
        failure = prober.run_failure([*probe_texts.run_texts().values(), texts[-2][0]])
        run_cuts = failure is None
        if failure is not None:
            disabled.append(failure)
    return Facts(
        frozenset(classes),
        run_cuts,
        structure.lookback,
        chars_per_token,
        structure.strip_tokens,
        tuple(disabled),
    )


_cache_lock = threading.Lock()
_cache: dict[str, Facts] = {}


def facts_for(tokenizer: Tokenizer) -> Facts:
    """Facts of ``tokenizer``, probed once per distinct serialized tokenizer in this process."""
    key = hashlib.sha256(tokenizer.to_str().encode()).hexdigest()
    with _cache_lock:
        cached = _cache.get(key)
        if cached is None:
            cached = probe(tokenizer)
            _cache[key] = cached
        return cached
