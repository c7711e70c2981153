"""Turning text into model inputs within a token budget, for every surface.

Budgets include the tokenizer's special tokens. Long texts are read only as far as the budget
needs (``bounds.py``); what is cut is reported, never silent: ``truncated`` says tokens were
dropped, and an input read only in part counts the tokens read (more than the budget) with
``tokens_lower_bound`` set.
"""

from __future__ import annotations

import math
import threading
from dataclasses import dataclass
from typing import Literal

from tokenizers import Tokenizer

from .bounds import Reading, reach, read, surely_over
from .envelope import Layout, pair_layout, single_layout
from .errors import InputTooLong, UnsupportedTokenizer
from .probe import Facts, Tokenize, facts_for, tokenize_with
from .windows import Window, plan_windows

Overflow = Literal["reject", "truncate"]
SPECIAL_OFFSET = (0, 0)


@dataclass(frozen=True)
class Encoded:
    """Model input for one text or pair, and what reading it cost."""

    ids: list[int]
    """Input ids with the special-token frame; never more than the budget."""
    offsets: list[tuple[int, int]]
    """Code-point offsets per id in its own text (end exclusive); (0, 0) for special tokens."""
    type_ids: list[int]
    sequence_ids: list[int | None]
    """Which text each id came from (0 or 1); None for special tokens."""
    tokens: int
    """Tokens counted, special tokens included: all of them, or those read when a lower bound."""
    truncated: bool
    tokens_lower_bound: bool


def share(first: int, second: int, room: int, exact: tuple[bool, bool] = (True, True)) -> tuple[int, int]:
    """Content tokens each side of a pair keeps: the longer side is cut first.

    Follows the ``tokenizers`` library's ``longest_first``: a side within half the room is
    kept whole; otherwise the shorter gets half and the longer the rest (the second counts as
    longer on ties). A length that is not ``exact`` is a lower bound above ``room``; when both
    are, which one is longer is unknown and the second gets the odd token.
    """
    if first + second <= room:
        return first, second
    half = room // 2
    if first <= half:
        return first, room - first
    if second <= half:
        return room - second, second
    first_longer = first > second and exact[1]
    return (room - half, half) if first_longer else (half, room - half)


class TextEncoder:
    """Encodes texts for one tokenizer; safe to share between threads."""

    def __init__(self, tokenizer: Tokenizer) -> None:
        # An own copy: the caller's truncation and padding settings must not cut or pad here.
        self._tokenizer = Tokenizer.from_str(tokenizer.to_str())
        self._tokenizer.no_truncation()
        self._tokenizer.no_padding()
        self._tokenize: Tokenize = tokenize_with(self._tokenizer)
        self._layout = single_layout(self._tokenizer)
        self._pair_layout = pair_layout(self._tokenizer)
        self._facts: Facts | None = None
        self._facts_lock = threading.Lock()

    @property
    def facts(self) -> Facts:
        """The tokenizer's probe facts, probed on first use and shared per tokenizer."""
        if self._facts is None:
            with self._facts_lock:
                if self._facts is None:
                    self._facts = facts_for(self._tokenizer)
        return self._facts

    @property
    def envelope(self) -> tuple[list[int], list[int]]:
        """Special-token ids before and after one text's content."""
        return [s.id for s in self._layout.prefix], [s.id for s in self._layout.suffix]

    @property
    def layout(self) -> Layout:
        """The special-token frame of one text."""
        return self._layout

    @property
    def pair_layout(self) -> Layout | None:
        """The special-token frame of a text pair; None when the tokenizer does not frame pairs."""
        return self._pair_layout

    @property
    def chars_per_token(self) -> float | None:
        """Most characters one token covers; None when the tokenizer drops or folds characters."""
        return self.facts.chars_per_token

    def _read(self, text: str, need: int) -> Reading:
        return read(text, need, self._tokenize, lambda: self.facts)

    def _surely_over(self, texts: list[str], room: int) -> bool:
        # Texts this short are read anyway; only longer ones pay for the probe.
        return sum(map(len, texts)) > reach(room + 1) and surely_over(texts, room, self.facts)

    def _length_bound(self, texts: list[str]) -> int:
        chars = self.facts.chars_per_token
        assert chars is not None
        return math.ceil(sum(map(len, texts)) / chars)

    def encode(self, text: str, *, max_tokens: int, overflow: Overflow = "reject") -> Encoded:
        """Input ids for ``text`` within ``max_tokens`` (special tokens included)."""
        layout = self._layout
        room = _room(max_tokens, layout, overflow)
        if overflow == "reject" and self._surely_over([text], room):
            tokens = self._length_bound([text]) + layout.size
            raise _too_long("max_length_exceeded", tokens, max_tokens, lower_bound=True)
        reading = self._read(text, room + 1)
        tokens = len(reading.ids) + layout.size
        over = not reading.complete or len(reading.ids) > room
        if over and overflow == "reject":
            raise _too_long("max_length_exceeded", tokens, max_tokens, lower_bound=not reading.complete)
        kept = min(len(reading.ids), room)
        ids, type_ids, sequence_ids = layout.frame([reading.ids[:kept]])
        offsets = _framed_offsets(layout, [reading.offsets[:kept]])
        return Encoded(ids, offsets, type_ids, sequence_ids, tokens, over, not reading.complete)

    def encode_pair(self, first: str, second: str, *, max_tokens: int, overflow: Overflow = "reject") -> Encoded:
        """Input ids for a text pair within ``max_tokens``; truncation cuts the longer side first."""
        layout = self._pair_layout
        if layout is None:
            raise UnsupportedTokenizer("this tokenizer does not frame text pairs")
        room = _room(max_tokens, layout, overflow)
        if overflow == "reject" and self._surely_over([first, second], room):
            tokens = self._length_bound([first, second]) + layout.size
            raise _too_long("max_length_exceeded", tokens, max_tokens, lower_bound=True)
        texts = (first, second)
        readings = [self._read(text, room + 1) for text in texts]
        lengths = [len(reading.ids) for reading in readings]
        partial = [index for index, reading in enumerate(readings) if not reading.complete]
        if room % 2 and min(lengths) > room // 2 and len(partial) == 1:
            # Which side is longer decides who gets the odd token: read the partial side as far
            # as the other side's length, which costs no more than reading that side did.
            index = partial[0]
            readings[index] = self._read(texts[index], lengths[1 - index] + 1)
            lengths[index] = len(readings[index].ids)
        complete = all(reading.complete for reading in readings)
        tokens = sum(lengths) + layout.size
        over = not complete or sum(lengths) > room
        if over and overflow == "reject":
            raise _too_long("max_length_exceeded", tokens, max_tokens, lower_bound=not complete)
        exact = (readings[0].complete, readings[1].complete)
        kept = share(lengths[0], lengths[1], room, exact)
        contents = [reading.ids[:n] for reading, n in zip(readings, kept, strict=True)]
        ids, type_ids, sequence_ids = layout.frame(contents)
        offsets = _framed_offsets(layout, [r.offsets[:n] for r, n in zip(readings, kept, strict=True)])
        return Encoded(ids, offsets, type_ids, sequence_ids, tokens, over, not complete)

    def encode_grounded(self, context: str, question: str, answer: str, *, max_tokens: int,
                        overflow: Overflow = "reject") -> Encoded:
        """A grounded item framed as the pair ``(context [SEP] question, answer)``: the tokenizer's pair frame, with
        its separator between context and question too (so ``[CLS] context [SEP] question [SEP] answer [SEP]`` for
        BERT). The question and the answer are never cut; under truncate the context is (the grounding is
        clipped, and reported); under reject an item over budget fails. Sequence ids: 0 for context and question,
        1 for the answer — the part a grounded token head judges."""
        layout = self._pair_layout
        if layout is None:
            raise UnsupportedTokenizer("this tokenizer does not frame text pairs")
        middle = [special.id for special in layout.middle]
        room = _room(max_tokens, layout, overflow) - len(middle)
        fixed = [self._read(text, max(room, 0) + 1) for text in (question, answer)]
        if any(not r.complete for r in fixed) or sum(len(r.ids) for r in fixed) > room:
            tokens = sum(len(r.ids) for r in fixed) + layout.size + len(middle)
            raise _too_long("max_length_exceeded", tokens, max_tokens, lower_bound=True)
        left = room - sum(len(r.ids) for r in fixed)
        grounding = self._read(context, left + 1)
        tokens = len(grounding.ids) + sum(len(r.ids) for r in fixed) + layout.size + len(middle)
        over = not grounding.complete or len(grounding.ids) > left
        if over and overflow == "reject":
            raise _too_long("max_length_exceeded", tokens, max_tokens, lower_bound=not grounding.complete)
        kept = grounding.ids[:left]
        first = [*kept, *middle, *fixed[0].ids]
        ids, type_ids, sequence_ids = layout.frame([first, fixed[1].ids])
        first_offsets = [*grounding.offsets[:left], *[SPECIAL_OFFSET] * len(middle), *fixed[0].offsets]
        offsets = _framed_offsets(layout, [first_offsets, fixed[1].offsets])
        return Encoded(ids, offsets, type_ids, sequence_ids, tokens, over, not grounding.complete)

    def windows(self, text: str, *, window_tokens: int, overlap: int, scan_budget: int | None = None) -> list[Window]:
        """Framed windows covering all of ``text``, read only if it fits ``scan_budget`` tokens.

        ``window_tokens`` and ``scan_budget`` include the special tokens; ``overlap`` counts
        content tokens. An input over its scan budget fails with ``scan_budget_exceeded`` and
        yields no window; when its length alone proves it, it is not tokenized at all.
        """
        layout = self._layout
        width = window_tokens - layout.size
        if width < 1:
            raise ValueError(f"a window of {window_tokens} tokens leaves no room past {layout.size} special tokens")
        plan_windows(0, width, overlap)  # validates overlap before any reading
        if scan_budget is None:
            whole = self._tokenize(text)
            reading = Reading(whole.ids, whole.offsets, True, len(text))
        else:
            room = scan_budget - layout.size
            if room < 0 or self._surely_over([text], room):
                tokens = (self._length_bound([text]) if room >= 0 else 0) + layout.size
                raise _too_long("scan_budget_exceeded", tokens, scan_budget, lower_bound=True)
            reading = self._read(text, room + 1)
            if not reading.complete or len(reading.ids) > room:
                tokens = len(reading.ids) + layout.size
                raise _too_long("scan_budget_exceeded", tokens, scan_budget, lower_bound=not reading.complete)
        out: list[Window] = []
        for start, end in plan_windows(len(reading.ids), width, overlap):
            content_offsets = reading.offsets[start:end]
            ids, type_ids, _ = layout.frame([reading.ids[start:end]])
            first = min((s for s, _ in content_offsets), default=0)
            last = max((e for _, e in content_offsets), default=0)
            offsets = _framed_offsets(layout, [content_offsets])
            out.append(Window(ids, offsets, type_ids, start, end, first, last))
        return out


def _room(max_tokens: int, layout: Layout, overflow: str) -> int:
    """Content tokens a budget leaves after the special tokens."""
    if overflow not in ("reject", "truncate"):
        raise ValueError(f"overflow must be 'reject' or 'truncate' here, not {overflow!r}")
    if max_tokens < 1:
        raise ValueError("max_tokens must be at least 1")
    room = max_tokens - layout.size
    if room < 0:
        raise InputTooLong(
            "max_length_exceeded",
            f"the budget of {max_tokens} tokens is smaller than the {layout.size} special tokens every input needs",
            tokens=layout.size,
            budget=max_tokens,
            lower_bound=True,
        )
    return room


def _too_long(
    code: Literal["max_length_exceeded", "scan_budget_exceeded"],
    tokens: int,
    budget: int,
    *,
    lower_bound: bool,
) -> InputTooLong:
    counted = f"at least {tokens}" if lower_bound else str(tokens)
    kind = "max_length" if code == "max_length_exceeded" else "scan budget"
    message = f"input has {counted} tokens, which exceeds its {kind} of {budget} tokens"
    return InputTooLong(code, message, tokens=tokens, budget=budget, lower_bound=lower_bound)


def _framed_offsets(layout: Layout, contents: list[list[tuple[int, int]]]) -> list[tuple[int, int]]:
    offsets: list[tuple[int, int]] = [SPECIAL_OFFSET] * len(layout.prefix)
    for index, content in enumerate(contents):
        if index:
            offsets.extend([SPECIAL_OFFSET] * len(layout.middle))
        offsets.extend(content)
    offsets.extend([SPECIAL_OFFSET] * len(layout.suffix))
    return offsets
