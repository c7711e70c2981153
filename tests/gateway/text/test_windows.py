"""Window plans cover the content with the given overlap; scan budgets fail before reading."""

from __future__ import annotations

import itertools

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from tokenizers import Tokenizer

from gateway.text import InputTooLong, TextEncoder, plan_windows
from gateway.text.probe import tokenize_with
from tests.gateway.text.test_bounds import plain
from tests.gateway.text.test_encoder import Spy, envelope_size


@settings(max_examples=300, deadline=None)
@given(content=st.integers(0, 5000), width=st.integers(1, 600), data=st.data())
def test_windows_cover_the_content_with_the_given_overlap(content: int, width: int, data: st.DataObject) -> None:
    overlap = data.draw(st.integers(0, width - 1))
    spans = plan_windows(content, width, overlap)
    assert spans[0][0] == 0
    assert spans[-1][1] == content
    for start, end in spans:
        assert 0 <= start <= end <= content
        assert end - start <= width
    for (start, end), (next_start, next_end) in itertools.pairwise(spans):
        assert end - start == width
        assert end - next_start == overlap
        assert next_end > end


@pytest.mark.parametrize(("width", "overlap"), [(0, 0), (4, 4), (4, -1), (4, 9)])
def test_a_window_plan_refuses_an_overlap_that_makes_no_progress(width: int, overlap: int) -> None:
    with pytest.raises(ValueError):
        plan_windows(10, width, overlap)


def test_windows_frame_each_window_and_map_it_back_to_the_text(tokenizer: Tokenizer, encoder: TextEncoder) -> None:
    text = "Hi, I'm Tom Baker (tom.baker@example.com). 我住在北京。 " * 40
    whole = tokenize_with(plain(tokenizer))(text)
    prefix, suffix = encoder.envelope
    windows = encoder.windows(text, window_tokens=64, overlap=8, scan_budget=4096)
    width = 64 - envelope_size(encoder)
    assert [(w.content_start, w.content_end) for w in windows] == plan_windows(len(whole.ids), width, 8)
    for window in windows:
        content = whole.ids[window.content_start : window.content_end]
        assert window.ids == [*prefix, *content, *suffix]
        assert len(window.ids) <= 64
        offsets = whole.offsets[window.content_start : window.content_end]
        assert window.offsets == [(0, 0)] * len(prefix) + offsets + [(0, 0)] * len(suffix)
        assert window.start == min(start for start, _ in offsets)
        assert window.end == max(end for _, end in offsets)
    assert windows[-1].content_end == len(whole.ids)


def test_an_empty_text_is_one_window_of_special_tokens(encoder: TextEncoder) -> None:
    (window,) = encoder.windows("", window_tokens=16, overlap=0, scan_budget=16)
    assert window.ids == [*encoder.envelope[0], *encoder.envelope[1]]
    assert (window.content_start, window.content_end, window.start, window.end) == (0, 0, 0, 0)


def test_an_input_over_its_scan_budget_fails_and_yields_no_window(encoder: TextEncoder) -> None:
    text = "word " * 3000
    with pytest.raises(InputTooLong) as failure:
        encoder.windows(text, window_tokens=128, overlap=16, scan_budget=512)
    assert failure.value.code == "scan_budget_exceeded"
    assert failure.value.tokens > 512


def test_an_input_surely_over_its_scan_budget_is_not_read_at_all(
    kind: str, encoder: TextEncoder, monkeypatch: pytest.MonkeyPatch
) -> None:
    if encoder.chars_per_token is None:
        pytest.skip(f"{kind} folds characters, so length alone never proves a text too long")
    spy = Spy(encoder, monkeypatch)
    text = "x" * (5 * 1024 * 1024)
    with pytest.raises(InputTooLong) as failure:
        encoder.windows(text, window_tokens=512, overlap=64, scan_budget=8192)
    assert failure.value.code == "scan_budget_exceeded"
    assert spy.calls == []


def test_an_input_within_its_scan_budget_is_read_whole(encoder: TextEncoder) -> None:
    text = "All work and no play makes Jack a dull boy. " * 200
    windows = encoder.windows(text, window_tokens=128, overlap=32, scan_budget=100_000)
    tokens = windows[-1].content_end + envelope_size(encoder)
    assert tokens == encoder.encode(text, max_tokens=100_000).tokens
