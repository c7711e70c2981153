"""The probe disables cut rules that disagree, and folding tokenizers never cut inside runs."""

from __future__ import annotations

import string
import threading

import pytest
from tokenizers import Regex, Tokenizer, models, normalizers, pre_tokenizers

from gateway.text import TextEncoder, envelope, probe
from gateway.text.bounds import read
from gateway.text.chars import CutClass, class_of
from gateway.text.probe import Tokens, facts_for, tokenize_with
from tests.gateway.text.test_bounds import plain


def parity_unigram() -> Tokenizer:
    """A Unigram whose reading of ``x`` before a dash run depends on the run's parity.

    With these scores ``x`` + an even run reads ``x``, ``--``…, an odd one ``x-``, ``--``…, so
    a cut inside a dash run changes tokens arbitrarily far back: punctuation is no boundary.
    """
    letters = [(c, -3.0) for c in string.ascii_letters + string.digits + ".,;:!?'\"()"]
    vocab = [("<unk>", 0.0), ("▁", -2.0), *letters, ("-", -10.0), ("--", -2.0), ("---", -4.5), ("x-", -5.0)]
    tokenizer = Tokenizer(models.Unigram(vocab, unk_id=0, byte_fallback=False))
    tokenizer.pre_tokenizer = pre_tokenizers.Metaspace()
    return tokenizer


def test_a_cut_rule_that_disagrees_on_a_probe_is_disabled_and_the_others_stay() -> None:
    facts = facts_for(parity_unigram())
    assert CutClass.PUNCTUATION not in facts.classes
    assert CutClass.SPACE in facts.classes
    assert any(reason.startswith("punctuation:") for reason in facts.disabled)


def test_text_needing_a_disabled_rule_is_read_as_the_whole_text_reads() -> None:
    tokenizer = parity_unigram()
    text = "word x" + "-" * 5001 + " tail"
    whole = tokenize_with(tokenizer)(text)
    reading = read(text, 3, tokenize_with(tokenizer), lambda: facts_for(tokenizer))
    assert reading.ids == whole.ids[: len(reading.ids)]
    assert len(reading.ids) >= 3


def test_folding_tokenizers_never_cut_inside_a_run(tokenizers_by_kind: dict[str, Tokenizer]) -> None:
    if "minilm" not in tokenizers_by_kind:
        pytest.skip("MiniLM's package is not installed")
    tokenizer = plain(tokenizers_by_kind["minilm"])
    facts = facts_for(tokenizer)
    assert facts.chars_per_token is None
    assert not facts.run_cuts
    text = "start " + "3f9a0c7be12d45f6" * 2000 + " middle " + "ab" * 3000 + " end " + "word " * 2000
    ends: list[int] = []

    def tokenize(part: str) -> Tokens:
        ends.append(len(part))
        return tokenize_with(tokenizer)(part)

    for need in (1, 3, 5, 400):
        reading = read(text, need, tokenize, lambda: facts)
        whole = tokenize_with(tokenizer)(text)
        assert reading.ids == whole.ids[: len(reading.ids)]
    assert ends
    for end in ends:
        assert end == len(text) or class_of(text[end]) is not None


def test_fusing_unknown_characters_counts_as_folding(tokenizers_by_kind: dict[str, Tokenizer]) -> None:
    facts = facts_for(plain(tokenizers_by_kind["unigram"]))
    assert facts.chars_per_token is None
    assert not facts.run_cuts
    assert any("fuses unknown" in reason for reason in facts.disabled)


def test_a_normalizer_that_may_look_across_a_cut_forces_whole_reads() -> None:
    tokenizer = Tokenizer(models.WordPiece({"[UNK]": 0, "a": 1, "b": 2}, unk_token="[UNK]"))
    tokenizer.normalizer = normalizers.Replace(Regex("a+b"), "b")
    tokenizer.pre_tokenizer = pre_tokenizers.Whitespace()
    facts = facts_for(tokenizer)
    assert facts.classes == frozenset()
    assert not facts.run_cuts
    text = "a " * 5000 + "b"
    calls: list[int] = []

    def tokenize(part: str) -> Tokens:
        calls.append(len(part))
        return tokenize_with(tokenizer)(part)

    reading = read(text, 1, tokenize, lambda: facts)
    assert reading.complete
    assert calls == [len(text)]


def test_byte_level_chars_per_token_is_the_longest_vocabulary_entry(tokenizers_by_kind: dict[str, Tokenizer]) -> None:
    tokenizer = tokenizers_by_kind["gpt2_bpe"]
    facts = facts_for(plain(tokenizer))
    assert facts.chars_per_token == max(len(entry) for entry in tokenizer.get_vocab())
    composing = facts_for(plain(tokenizers_by_kind["byte_bpe"]))
    longest = max(len(entry) for entry in tokenizers_by_kind["byte_bpe"].get_vocab())
    assert composing.chars_per_token == 4 * longest


def test_facts_are_probed_once_per_tokenizer_even_under_concurrent_first_use(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    tokenizer = parity_unigram()
    tokenizer.add_tokens(["<unique-to-this-test>"])
    calls: list[int] = []
    real = probe.probe

    def counting(t: Tokenizer) -> probe.Facts:
        calls.append(1)
        return real(t)

    monkeypatch.setattr(probe, "probe", counting)
    encoders = [TextEncoder(tokenizer) for _ in range(6)]
    results: list[probe.Facts] = []
    threads = [threading.Thread(target=lambda e=e: results.append(e.facts)) for e in encoders]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    assert len(calls) == 1
    assert all(result is results[0] for result in results)


def test_the_envelope_is_the_tokenizers_special_token_frame(tokenizers_by_kind: dict[str, Tokenizer]) -> None:
    expected = {"byte_bpe": ([], [0]), "gpt2_bpe": ([], [])}
    if "minilm" in tokenizers_by_kind:
        expected["minilm"] = ([101], [102])
    for kind, frame in expected.items():
        assert TextEncoder(tokenizers_by_kind[kind]).envelope == frame


@pytest.mark.parametrize("unit", ["가", "→", "カ", "€"])
def test_wordpiece_keeps_no_piece_of_a_word_that_becomes_unknown_when_long(
    tokenizers_by_kind: dict[str, Tokenizer], unit: str
) -> None:
    # Found by the property test: BERT does not split Hangul, kana or non-ASCII symbols, so a
    # cut inside a long run of them kept pieces of what the whole text reads as one [UNK].
    if "minilm" not in tokenizers_by_kind:
        pytest.skip("MiniLM's package is not installed")
    tokenizer = plain(tokenizers_by_kind["minilm"])
    # The run starts just before the first cut (reach(1) = 1,030) and is over 100 characters.
    text = "word " * 200 + unit * 245 + " end" + " word" * 600
    whole = tokenize_with(tokenizer)(text)
    for need in (1, 2, 3, 4, 5):
        reading = read(text, need, tokenize_with(tokenizer), lambda: facts_for(tokenizer))
        assert reading.ids == whole.ids[: len(reading.ids)]


def test_frames_are_read_without_the_callers_truncation_and_padding(tokenizers_by_kind: dict[str, Tokenizer]) -> None:
    if "minilm" not in tokenizers_by_kind:
        pytest.skip("MiniLM's package is not installed")
    shipped = tokenizers_by_kind["minilm"]  # ships with truncation at 128 and fixed padding
    assert shipped.padding is not None
    pair = envelope.pair_layout(shipped)
    assert pair is not None
    assert [s.id for s in (*pair.prefix, *pair.middle, *pair.suffix)] == [101, 102, 102]
    assert pair.type_ids == (0, 1)
    assert TextEncoder(shipped).pair_layout == pair
