"""Encoding within a budget: reject, truncate, pairs, and honest usage."""

from __future__ import annotations

import os

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from tokenizers import Tokenizer

from gateway.text import InputTooLong, TextEncoder
from gateway.text.probe import Tokens, tokenize_with
from tests.gateway.text.hostile import hostile_texts
from tests.gateway.text.test_bounds import plain, specials

PROPERTY = settings(
    max_examples=int(os.environ.get("TEXT_PROPERTY_EXAMPLES", "15")),
    deadline=None,
    suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large, HealthCheck.large_base_example],
)


def framed(encoder: TextEncoder, content: list[int]) -> list[int]:
    prefix, suffix = encoder.envelope
    return [*prefix, *content, *suffix]


def envelope_size(encoder: TextEncoder) -> int:
    prefix, suffix = encoder.envelope
    return len(prefix) + len(suffix)


class Spy:
    """Counts what an encoder tokenizes."""

    def __init__(self, encoder: TextEncoder, monkeypatch: pytest.MonkeyPatch) -> None:
        self.calls: list[int] = []
        inner = encoder._tokenize

        def tokenize(text: str) -> Tokens:
            self.calls.append(len(text))
            return inner(text)

        monkeypatch.setattr(encoder, "_tokenize", tokenize)


@PROPERTY
@given(data=st.data())
def test_truncate_keeps_exactly_the_first_tokens_of_the_whole_text(
    tokenizer: Tokenizer, encoder: TextEncoder, data: st.DataObject
) -> None:
    text = data.draw(hostile_texts(specials(tokenizer), max_size=8000), label="text")
    whole = tokenize_with(plain(tokenizer))(text)
    size = envelope_size(encoder)
    for budget in data.draw(st.lists(st.integers(max(1, size), 600), min_size=1, max_size=4), label="budgets"):
        room = budget - size
        result = encoder.encode(text, max_tokens=budget, overflow="truncate")
        assert result.ids == framed(encoder, whole.ids[:room])
        assert len(result.ids) <= budget
        content = [offset for offset, seq in zip(result.offsets, result.sequence_ids, strict=True) if seq == 0]
        assert content == whole.offsets[:room]
        assert result.truncated == (len(whole.ids) > room)
        if result.tokens_lower_bound:
            assert budget < result.tokens <= len(whole.ids) + size
        else:
            assert result.tokens == len(whole.ids) + size


@PROPERTY
@given(data=st.data())
def test_reject_fails_exactly_the_texts_over_their_budget(
    tokenizer: Tokenizer, encoder: TextEncoder, data: st.DataObject
) -> None:
    text = data.draw(hostile_texts(specials(tokenizer), max_size=8000), label="text")
    whole = tokenize_with(plain(tokenizer))(text)
    size = envelope_size(encoder)
    count = len(whole.ids) + size
    drawn = data.draw(st.lists(st.integers(max(1, size), 600), max_size=3), label="budgets")
    for budget in sorted({count - 1, count, *drawn} - {-1, 0}):
        if count > budget:
            with pytest.raises(InputTooLong) as failure:
                encoder.encode(text, max_tokens=budget, overflow="reject")
            assert failure.value.code == "max_length_exceeded"
            assert budget < failure.value.tokens <= count
            assert str(budget) in failure.value.message
        else:
            result = encoder.encode(text, max_tokens=budget, overflow="reject")
            assert result.ids == framed(encoder, whole.ids)
            assert (result.tokens, result.truncated, result.tokens_lower_bound) == (count, False, False)


def test_a_short_text_reports_its_exact_token_count(encoder: TextEncoder) -> None:
    result = encoder.encode("How do I reset my password?", max_tokens=128)
    assert result.tokens == len(result.ids)
    assert not result.truncated
    assert not result.tokens_lower_bound
    assert result.offsets[len(encoder.envelope[0])][0] == 0


def test_a_text_read_in_part_reports_tokens_read_as_a_lower_bound(encoder: TextEncoder) -> None:
    text = "All work and no play makes Jack a dull boy. " * 20000
    result = encoder.encode(text, max_tokens=64, overflow="truncate")
    assert result.truncated
    assert result.tokens_lower_bound
    assert result.tokens > 64
    assert len(result.ids) == 64


def test_a_text_surely_over_its_budget_is_rejected_without_tokenizing(
    kind: str, encoder: TextEncoder, monkeypatch: pytest.MonkeyPatch
) -> None:
    chars = encoder.chars_per_token
    text = "All work and no play makes Jack a dull boy. " * 100000
    spy = Spy(encoder, monkeypatch)
    with pytest.raises(InputTooLong) as failure:
        encoder.encode(text, max_tokens=256, overflow="reject")
    assert failure.value.code == "max_length_exceeded"
    if chars is None:
        assert kind in {"minilm", "unigram"}
        assert spy.calls and max(spy.calls) < 20000
    else:
        assert spy.calls == []
        assert failure.value.lower_bound


def test_a_budget_smaller_than_the_special_tokens_is_rejected(encoder: TextEncoder) -> None:
    size = envelope_size(encoder)
    if size < 2:
        pytest.skip("a budget of one token still holds this tokenizer's frame")
    with pytest.raises(InputTooLong) as failure:
        encoder.encode("", max_tokens=size - 1, overflow="truncate")
    assert failure.value.code == "max_length_exceeded"


def test_truncation_and_padding_of_the_callers_tokenizer_are_ignored(tokenizer: Tokenizer) -> None:
    copy = Tokenizer.from_str(tokenizer.to_str())
    copy.enable_truncation(max_length=5)
    copy.enable_padding(length=40)
    encoder = TextEncoder(copy)
    result = encoder.encode("one two three four five six seven eight nine ten", max_tokens=512)
    assert result.tokens == len(result.ids) > 5
    assert copy.truncation is not None and copy.truncation["max_length"] == 5


@PROPERTY
@given(data=st.data())
def test_pair_truncation_cuts_the_longer_side_first_like_the_tokenizer(
    tokenizer: Tokenizer, encoder: TextEncoder, data: st.DataObject
) -> None:
    # The reference also builds every overflowing piece of both sides (their product), so
    # texts stay short and budgets not tiny.
    first = data.draw(hostile_texts(specials(tokenizer), max_size=500), label="first")
    second = data.draw(hostile_texts(specials(tokenizer), max_size=500), label="second")
    reference = plain(tokenizer)
    budget = data.draw(st.integers(48, 300), label="budget")
    reference.enable_truncation(max_length=budget, strategy="longest_first")
    expected = reference.encode(first, second)
    result = encoder.encode_pair(first, second, max_tokens=budget, overflow="truncate")
    assert result.ids == expected.ids
    assert result.type_ids == expected.type_ids
    assert result.sequence_ids == expected.sequence_ids


def test_pair_truncation_of_long_texts_keeps_the_first_tokens_of_each_side(
    tokenizer: Tokenizer, encoder: TextEncoder
) -> None:
    first = "The first text talks about cats and dogs. " * 5000
    second = "Short question?"
    result = encoder.encode_pair(first, second, max_tokens=64, overflow="truncate")
    assert len(result.ids) == 64
    assert result.truncated and result.tokens_lower_bound and result.tokens > 64
    tokenize = tokenize_with(plain(tokenizer))
    sides = [[i for i, s in zip(result.ids, result.sequence_ids, strict=True) if s == side] for side in (0, 1)]
    assert sides[1] == tokenize(second).ids
    assert sides[0] == tokenize(first[:2000]).ids[: len(sides[0])]
    with pytest.raises(InputTooLong):
        encoder.encode_pair(first, second, max_tokens=64, overflow="reject")
