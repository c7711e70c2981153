"""The special tokens a tokenizer puts around one text or a pair of texts.

Budgets count special tokens, and a cut text is framed again after cutting, so the frame must
not depend on the text. It is read off the post-processor's output for tiny texts and checked
on probe texts; a tokenizer whose frame changes with the text is refused.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

from tokenizers import Encoding, Tokenizer

from . import probe_texts
from .errors import UnsupportedTokenizer


@dataclass(frozen=True)
class Special:
    """One special token of the frame."""

    id: int
    type_id: int


@dataclass(frozen=True)
class Layout:
    """Special tokens before, between and after the texts, and each text's type id."""

    prefix: tuple[Special, ...]
    middle: tuple[Special, ...]
    suffix: tuple[Special, ...]
    type_ids: tuple[int, ...]

    @property
    def size(self) -> int:
        """Special tokens in the frame: budgets pay for these first."""
        return len(self.prefix) + len(self.middle) + len(self.suffix)

    def frame(self, contents: Sequence[Sequence[int]]) -> tuple[list[int], list[int], list[int | None]]:
        """Ids, type ids and sequence ids of ``contents`` framed by the special tokens."""
        ids: list[int] = []
        type_ids: list[int] = []
        sequence_ids: list[int | None] = []

        def specials(group: tuple[Special, ...]) -> None:
            ids.extend(special.id for special in group)
            type_ids.extend(special.type_id for special in group)
            sequence_ids.extend([None] * len(group))

        specials(self.prefix)
        for index, content in enumerate(contents):
            if index:
                specials(self.middle)
            ids.extend(content)
            type_ids.extend([self.type_ids[index]] * len(content))
            sequence_ids.extend([index] * len(content))
        specials(self.suffix)
        return ids, type_ids, sequence_ids


def _layout_of(encoding: Encoding, texts: int) -> Layout:
    """Split one framed encoding into its special groups and per-text type ids."""
    groups: list[list[Special]] = [[]]
    type_ids: list[int] = []
    previous: int | None = None
    for token_id, type_id, sequence in zip(encoding.ids, encoding.type_ids, encoding.sequence_ids, strict=True):
        if sequence is None:
            groups[-1].append(Special(token_id, type_id))
        elif sequence != previous:
            if sequence != len(type_ids):
                raise UnsupportedTokenizer("the post-processor interleaves or reorders the texts")
            type_ids.append(type_id)
            groups.append([])
        elif type_id != type_ids[sequence]:
            raise UnsupportedTokenizer("type ids change inside one text")
        if sequence is not None:
            previous = sequence
    if len(type_ids) != texts:
        raise UnsupportedTokenizer("the post-processor does not keep every text")
    middle: tuple[Special, ...] = tuple(groups[1]) if texts == 2 else ()
    return Layout(tuple(groups[0]), middle, tuple(groups[-1]), tuple(type_ids))


def _content(tokenizer: Tokenizer, text: str) -> list[int]:
    return tokenizer.encode(text, add_special_tokens=False).ids


def _sample(tokenizer: Tokenizer) -> str:
    """A short text the tokenizer reads to at least one content token (a vocabulary may lack "a")."""
    for text in ("a", "hello", "0", "x", "中", "."):
        if _content(tokenizer, text):
            return text
    raise UnsupportedTokenizer("the tokenizer reads no sample text to any token")


_CHECKS = ("", " ", probe_texts.ENGLISH, probe_texts.SPECIAL_TOKENS, probe_texts.CJK, probe_texts.EMOJI)


def _unpadded(tokenizer: Tokenizer) -> Tokenizer:
    """``tokenizer`` itself, or a copy without truncation and padding (which would distort the frame)."""
    if tokenizer.truncation is None and tokenizer.padding is None:
        return tokenizer
    copy = Tokenizer.from_str(tokenizer.to_str())
    copy.no_truncation()
    copy.no_padding()
    return copy


def single_layout(tokenizer: Tokenizer) -> Layout:
    """The frame of one text, checked on probe texts."""
    tokenizer = _unpadded(tokenizer)
    layout = _layout_of(tokenizer.encode(_sample(tokenizer), add_special_tokens=True), 1)
    for text in _CHECKS:
        framed = tokenizer.encode(text, add_special_tokens=True)
        ids, type_ids, _ = layout.frame([_content(tokenizer, text)])
        if framed.ids != ids or framed.type_ids != type_ids:
            raise UnsupportedTokenizer(f"the special tokens around a text depend on the text ({text[:20]!r})")
    return layout


def pair_layout(tokenizer: Tokenizer) -> Layout | None:
    """The frame of a text pair, checked on probe pairs; None when pairs are not framed alike."""
    tokenizer = _unpadded(tokenizer)
    try:
        sample = _sample(tokenizer)
        layout = _layout_of(tokenizer.encode(sample, sample, add_special_tokens=True), 2)
        for first, second in zip(_CHECKS, reversed(_CHECKS), strict=True):
            framed = tokenizer.encode(first, second, add_special_tokens=True)
            ids, type_ids, _ = layout.frame([_content(tokenizer, first), _content(tokenizer, second)])
            if framed.ids != ids or framed.type_ids != type_ids:
                return None
    except Exception:  # a post-processor without a pair template raises
        return None
    return layout
