"""Budget-bounded reading keeps exactly the whole text's first tokens, for every tokenizer kind."""

from __future__ import annotations

import os

from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from tokenizers import Tokenizer

from gateway.text.bounds import reach, read, surely_over
from gateway.text.probe import Facts, Tokens, facts_for, tokenize_with
from tests.gateway.text.hostile import hostile_texts

# TEXT_PROPERTY_EXAMPLES raises the example count for a deeper hunt (e.g. 500) outside CI.
PROPERTY = settings(
    max_examples=int(os.environ.get("TEXT_PROPERTY_EXAMPLES", "30")),
    deadline=None,
    suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large, HealthCheck.large_base_example],
)


def plain(tokenizer: Tokenizer) -> Tokenizer:
    """The tokenizer without truncation or padding: the whole-text oracle."""
    copy = Tokenizer.from_str(tokenizer.to_str())
    copy.no_truncation()
    copy.no_padding()
    return copy


def specials(tokenizer: Tokenizer) -> list[str]:
    return [token.content for token in tokenizer.get_added_tokens_decoder().values()]


def check_prefix(text: str, need: int, oracle: Tokenizer, whole: Tokens) -> None:
    reading = read(text, need, tokenize_with(oracle), lambda: facts_for(oracle))
    assert reading.ids == whole.ids[: len(reading.ids)]
    assert reading.offsets == whole.offsets[: len(reading.offsets)]
    if reading.complete:
        assert reading.ids == whole.ids
    else:
        assert len(reading.ids) >= need


@PROPERTY
@given(data=st.data())
def test_kept_tokens_are_exactly_the_first_tokens_of_the_whole_text(tokenizer: Tokenizer, data: st.DataObject) -> None:
    oracle = plain(tokenizer)
    text = data.draw(hostile_texts(specials(tokenizer), min_size=1200), label="text")
    whole = tokenize_with(oracle)(text)
    budgets = data.draw(st.lists(st.integers(1, 500), min_size=1, max_size=5), label="budgets")
    for need in [*budgets, max(1, len(whole.ids) - 1), len(whole.ids) + 1]:
        check_prefix(text, need, oracle, whole)


@PROPERTY
@given(data=st.data())
def test_surely_over_never_rejects_a_text_that_fits(tokenizer: Tokenizer, data: st.DataObject) -> None:
    oracle = plain(tokenizer)
    facts = facts_for(oracle)
    text = data.draw(hostile_texts(specials(tokenizer), max_size=20000), label="text")
    count = len(tokenize_with(oracle)(text).ids)
    limit = data.draw(st.integers(0, count), label="limit")
    assert not surely_over([text], count, facts)
    assert not surely_over([text], limit + count, facts)
    if surely_over([text], limit, facts):
        assert count > limit


def test_texts_within_reach_are_tokenized_whole_without_the_probe(tokenizer: Tokenizer) -> None:
    oracle = plain(tokenizer)
    text = "word " * (reach(10) // 5)
    calls: list[str] = []

    def tokenize(part: str) -> Tokens:
        calls.append(part)
        return tokenize_with(oracle)(part)

    def no_facts() -> Facts:
        raise AssertionError("a short text needs no probe")

    reading = read(text[: reach(10)], 10, tokenize, no_facts)
    assert reading.complete
    assert calls == [text[: reach(10)]]
