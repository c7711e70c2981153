"""The trained presets' cheap signals (issue 22) and the build's signal weighting, with no model.

An embedding barely separates "drivers must be 21" from "drivers must be 25", or Chinese with a code identifier from
code-mixed Chinese, so the grounded and language heads read counted signals too; these tests pin what each signal
says on texts where the answer is known, and that the weight the build chooses for them is what serving applies.
"""

from __future__ import annotations

import numpy as np
import pytest

from gateway.decisions.families import lm_reading
from gateway.decisions.families.preset_signals import (
    chinese_numeral,
    grounded_signals,
    language_features,
    numbers,
    relevance_signals,
)
from gateway.decisions.families.presets import Head, encoder_texts, features, signal_count
from sr_build import presets as build
from tools.pair_features_cv import (
    SURPRISE_COLUMNS,
    answer_type_signals,
    answer_types,
    claim_word_signals,
    feature_rows,
    maxsim_signals,
    number_signals,
    number_values,
    surprise_signals,
)

CONTEXT = "The museum opens at 9:30 on Tuesdays; entry is 1,200 yen, and the guide is Clara Voss (model KT-200)."
NEW_NUMBER, SHARE_NEW, NEW_DAY, NEW_NAME, NEG_MISMATCH = 0, 1, 2, 3, 4


@pytest.mark.parametrize(("run", "value"), [("三", 3), ("十五", 15), ("二十", 20), ("两千零八", 2008),
                                            ("一百二十", 120), ("三万五千", 35000), ("二〇二六", 2026)])
def test_chinese_numerals_read_as_their_value(run: str, value: int) -> None:
    assert chinese_numeral(run) == value


@pytest.mark.parametrize(("run", "value"), [("一百五", 150), ("四千五", 4500), ("三万五", 35000),
                                            ("两万三千五", 23500), ("一百零五", 105), ("一千零五十", 1050)])
def test_a_last_digit_after_a_place_is_read_in_the_next_lower_place_as_spoken(run: str, value: int) -> None:
    assert chinese_numeral(run) == value


def test_liang_after_a_digit_is_the_weight_not_a_second_digit() -> None:
    assert numbers("每十斤肉放三两盐") == {10.0, 3.0}
    assert grounded_signals("每500克肉配15克盐，即每斤肉三钱盐。", "光猫弄丢了得赔一百五。")[NEW_NUMBER] == 1.0
    assert grounded_signals("光猫未归还须赔偿150元。", "光猫弄丢了得赔一百五。")[NEW_NUMBER] == 0.0


def test_numbers_are_compared_by_value_not_by_spelling() -> None:
    assert numbers("1,200 yen and 2.50 euros") == {1200.0, 2.5}
    assert numbers("会员打九折，十五分钟") == {9.0, 15.0}
    assert numbers("我们一起去，一般来说") == set()  # 一 in words is not the number 1


def test_a_supported_answer_raises_no_contradiction_signal() -> None:
    row = grounded_signals(CONTEXT, "Entry costs 1200 yen, and Clara Voss guides visitors on Tuesdays at 9:30.")
    assert row[NEW_NUMBER] == 0 and row[NEW_DAY] == 0 and row[NEW_NAME] == 0 and row[NEG_MISMATCH] == 0


@pytest.mark.parametrize(("answer", "signal"), [
    ("Entry is 1,500 yen.", NEW_NUMBER),
    ("The museum opens at 9:30 on Mondays.", NEW_DAY),
    ("The guide is Martin Voss.", NEW_NAME),
    ("The exhibit shows model KT-300.", NEW_NAME),
    ("The museum does not open on Tuesdays.", NEG_MISMATCH),
])
def test_a_contradicted_number_day_name_or_negation_raises_its_signal(answer: str, signal: int) -> None:
    assert grounded_signals(CONTEXT, answer)[signal] == 1.0


def test_a_number_that_is_only_a_substring_of_a_context_number_counts_as_new() -> None:
    assert grounded_signals("Founded in 2015 with 150 staff.", "It has 15 staff.")[NEW_NUMBER] == 1.0


def test_chinese_numerals_in_the_answer_match_arabic_numerals_in_the_context() -> None:
    row = grounded_signals("会员消费享9折，每位读者最多可借10本书。", "会员打九折，每人最多借十本。")
    assert row[NEW_NUMBER] == 0 and row[SHARE_NEW] == 0
    assert grounded_signals("周三店休。", "周一店休。")[NEW_DAY] == 1.0


@pytest.mark.parametrize(("request_", "candidate", "asked"), [
    ("羽毛球馆周末场地多少钱一小时？", "工作日 40 元一小时，周末 60 元。", {"money"}),
    ("How much does a day pass cost?", "A day pass is £12, or free for members.", {"money", "count"}),
    ("鱼缸多久换一次水？", "一般每周换三分之一的水。", {"duration"}),
    ("When does the pool open on Sundays?", "On Sundays the pool opens at 8:30.", {"when"}),
    ("为什么我的订单一直没发货？", "因为仓库盘点，本周的订单会延迟两天发出。", {"reason"}),
    ("Where is the lost-property desk?", "The lost-property desk is on the second floor, next to gate B.", {"place"}),
])
def test_a_candidate_with_the_kind_of_thing_asked_for_meets_every_asked_type(request_: str, candidate: str,
                                                                             asked: set[str]) -> None:
    assert answer_types(request_, candidate) == (asked, asked)
    assert answer_type_signals(request_, candidate) == [1.0, 0.0, 0.0]


def test_a_same_topic_candidate_without_a_price_leaves_the_asked_price_unmet() -> None:
    asked, met = answer_types("羽毛球馆周末场地多少钱一小时？", "周末场地要提前三天在小程序上抢，每人限订两小时。")
    assert "money" in asked and "money" not in met
    assert answer_type_signals("How much is the parking?", "The car park is behind the library.")[1] > 0


def test_a_request_that_asks_no_typed_question_raises_no_answer_type_signal() -> None:
    assert answer_type_signals("Tell me about the Alder Inn.", "The Alder Inn has twelve rooms.") == [0.0, 0.0, 0.0]


def test_relevance_reads_a_chinese_request_beside_an_english_passage_as_a_script_gap_not_missing_overlap() -> None:
    across = relevance_signals("停车场要收费吗？", "Parking is free for the first two hours.")
    same = relevance_signals("停车场要收费吗？", "停车场前两小时免费。")
    assert across[1] == 0 and across[2] == 1.0  # no CJK pair in common: overlap says nothing here
    assert same[2] == 0.0 and same[1] > 0


COMPARATIVE, QUANTIFIER, CHANGED_UNIT = 0, 1, 2


@pytest.mark.parametrize(("context", "answer", "signal"), [
    ("The trail is 5 miles long.", "The trail is more than 5 miles long.", COMPARATIVE),
    ("今年营收为 300 万元。", "今年营收超过 300 万元。", COMPARATIVE),
    ("Most visitors finish in two hours.", "All visitors finish in two hours.", QUANTIFIER),
    ("大部分门店周日营业。", "所有门店周日都营业。", QUANTIFIER),
    ("The trail is 5 miles long.", "The trail is 5 km long.", CHANGED_UNIT),
    ("手续费为 3 元。", "手续费为 3 美元。", CHANGED_UNIT),
])
def test_an_added_comparative_quantifier_or_changed_unit_raises_its_signal(context: str, answer: str,
                                                                           signal: int) -> None:
    assert claim_word_signals(context, answer)[signal] == 1.0


def test_an_answer_that_keeps_the_contexts_comparatives_quantifiers_and_units_raises_none() -> None:
    context = "Most of the 12 rooms are larger than 20 m², and every room has a desk."
    assert claim_word_signals(context, "Every room has a desk, and most of the 12 rooms are larger than 20 m².") \
        == [0.0, 0.0, 0.0]


UNEXPLAINED, ROUNDED, DERIVED = 0, 1, 2


def test_a_number_with_a_scale_word_after_it_is_read_at_its_scale() -> None:
    assert number_values("总数达到5.8万个，预算1.2亿元") == {58000.0, 1.2e8}
    assert number_values("The hall cost £3.2 million, about 3,200 thousand pounds.") == {3.2e6}
    assert number_values("充一次电能扫两个小时") == {2.0}  # 一次 is "once", not a claim of one


@pytest.mark.parametrize(("context", "answer", "signal"), [
    ("The bridge carries 38,000 vehicles a day.", "It carries 83,000 vehicles a day.", UNEXPLAINED),
    ("每班限额35人，目前已报名29人。", "每班最多收30人，已经报了29人。", UNEXPLAINED),  # 30 for 35, no hedge
    ("全市新增充电桩12600个，总数达到5.8万个。", "新增了一万两千多个，总量接近六万。", ROUNDED),
    ("The exhibition drew 24,600 visitors.", "Close to 25,000 people saw it.", ROUNDED),
    ("充满电需要4小时，可连续清扫120分钟。", "能扫两个小时，充满要四个小时。", DERIVED),  # 120 min = 2 h
    ("The first leg takes 30 days and the second 15 days.", "Both legs take 45 days.", DERIVED),
])
def test_an_answer_number_the_context_lacks_is_explained_by_rounding_arithmetic_or_nothing(
        context: str, answer: str, signal: int) -> None:
    signals = number_signals(context, answer)
    assert signals[signal] == 1.0 and sum(signals) == 1.0


def test_a_bare_round_number_beside_a_precise_one_is_a_change_not_a_rounding() -> None:
    assert number_signals("The county paid 1,940 pounds.", "The county paid 2,000 pounds.")[UNEXPLAINED] == 1.0
    assert number_signals("The county paid 1,940 pounds.", "The county paid about 2,000 pounds.") == [0.0, 1.0, 0.0]


def test_an_answer_that_repeats_the_contexts_numbers_raises_no_number_signal() -> None:
    assert number_signals("票价80元，往返票140元。", "往返要140元，单程80元。") == [0.0, 0.0, 0.0]


def test_maxsim_summarises_each_covering_tokens_best_match_and_an_uncovered_token_lowers_min_and_low_percentiles(
        ) -> None:
    other = np.eye(4)[:3]  # three orthonormal token states
    covered = maxsim_signals(np.eye(4)[:2], other)  # both tokens found exactly
    uncovered = maxsim_signals(np.eye(4)[[0, 1, 3]], other)  # the third token has no counterpart
    assert covered == [1.0, 1.0, 1.0, 1.0]
    assert uncovered[1] == 0.0 and uncovered[0] == pytest.approx(2 / 3) and uncovered[2] < uncovered[3] < 1.0
    assert maxsim_signals(np.zeros((0, 4)), other) == [0.0, 0.0, 0.0, 0.0]


PINYIN, LATIN_WORDS, FUNCTION_WORDS = -1, 17, 19


@pytest.mark.parametrize("kind", ["relevance", "grounded"])
def test_the_lm_state_joins_the_head_block_and_its_log_odds_the_signals_so_m_is_l_without_the_odds(kind: str) -> None:
    rng = np.random.default_rng(0)
    vectors: dict[str, np.ndarray] = {}

    def embed(texts: list[str]) -> list[np.ndarray]:
        return [vectors.setdefault(t, rng.normal(size=8)) for t in texts]

    def judge(preset: str, first: str, second: str) -> np.ndarray:
        # log-odds 7, a 5-wide state, set N's surprise columns
        return np.concatenate([[7.0], np.full(5, 3.0), np.full(SURPRISE_COLUMNS, -1.0)])

    texts = [["How long is the refund?", "Refunds take 5 days."], ["退款要多久？", "五个工作日。"]]
    served = "B" if kind == "grounded" else "G"
    base, base_signals = feature_rows(kind, texts, embed, served)
    with_odds, l_signals = feature_rows(kind, texts, embed, "L", lm=judge)
    without, m_signals = feature_rows(kind, texts, embed, "M", lm=judge)
    head = base.shape[1] - base_signals
    assert (l_signals, m_signals) == (base_signals + 1, base_signals)
    assert np.array_equal(with_odds[:, :head], base[:, :head]) and (with_odds[:, head:head + 5] == 3.0).all()
    assert np.array_equal(with_odds[:, head + 5:-1], base[:, head:]) and (with_odds[:, -1] == 7.0).all()
    assert np.array_equal(without, with_odds[:, :-1])
    if kind == "grounded":  # N is M with the surprise columns as signals after the served ones
        surprised, n_signals = feature_rows(kind, texts, embed, "N", lm=judge)
        assert n_signals == m_signals + SURPRISE_COLUMNS
        assert np.array_equal(surprised[:, :-SURPRISE_COLUMNS], without)
        assert (surprised[:, -SURPRISE_COLUMNS:] == -1.0).all()
    else:
        with pytest.raises(SystemExit, match="grounded only"):
            feature_rows(kind, texts, embed, "N", lm=judge)


@pytest.mark.parametrize("kind", ["relevance", "grounded"])
def test_the_served_features_with_the_lm_state_are_set_m_as_cross_validated(kind: str) -> None:
    """The served row (presets.features with the LM's state) is the row set M was chosen on, column for column."""
    rng = np.random.default_rng(1)
    vectors: dict[str, np.ndarray] = {}
    state = rng.normal(size=6)

    def embed(texts: list[str]) -> list[np.ndarray]:
        return [vectors.setdefault(t, rng.normal(size=8)) for t in texts]

    def judge(preset: str, first: str, second: str) -> np.ndarray:
        return np.concatenate([[7.0], state, np.zeros(SURPRISE_COLUMNS)])

    texts = ["退款要多久？", "Refunds take 5 business days."]
    m_rows, _ = feature_rows(kind, [texts], embed, "M", lm=judge)
    served = features(kind, texts, embed(encoder_texts(kind, texts)), state)
    assert np.array_equal(served, m_rows[0])
    end = len(served) - signal_count(kind)
    without = features(kind, texts, embed(encoder_texts(kind, texts)))
    assert np.array_equal(without, np.delete(served, np.s_[end - 6:end]))


def test_the_surprise_columns_compare_each_answer_tokens_log_probability_with_and_without_its_context() -> None:
    after, alone = np.array([-1.0, -3.0]), np.array([-2.0, -0.5])  # the second token: the context made it unlikely
    got = surprise_signals(after, alone)
    assert len(got) == SURPRISE_COLUMNS
    assert np.allclose(got, [-2.0, -2.8, -3.0, -0.75, -2.15, -2.5, 0.5])  # pmi [1, -2.5]: one of two below -2
    assert surprise_signals(np.array([]), np.array([])) == [0.0] * SURPRISE_COLUMNS


def test_a_part_longer_than_the_lm_reads_is_cut_at_a_token_end_and_a_shorter_one_is_kept_whole() -> None:
    from gateway.text import TextEncoder

    from .text.tokenizers_for_tests import byte_bpe

    encoder = TextEncoder(byte_bpe())
    short = "退款要多久？ How long does a refund take?"
    assert lm_reading.cut(encoder, short) == short
    long = " ".join(f"word{i} 第{i}个词" for i in range(400))
    kept = lm_reading.cut(encoder, long)
    assert long.startswith(kept) and len(kept) < len(long)
    assert len(encoder.encode(kept, max_tokens=4096).ids) == lm_reading.PART_TOKENS + encoder.layout.size
    prompt = lm_reading.prompt(encoder, "grounded", [long, short])
    assert prompt.startswith("<|im_start|>system\n") and prompt.endswith("<|im_start|>assistant\n")
    assert kept in prompt and short in prompt and long not in prompt


def test_pinyin_reads_as_pinyin_and_english_does_not() -> None:
    assert language_features("wo men ming tian jiu dian zai men kou jian")[PINYIN] > 0.9
    assert language_features("I will meet you at the station tomorrow")[PINYIN] < 0.5


def test_code_lines_and_identifiers_in_chinese_text_are_not_counted_as_english_words() -> None:
    commented = language_features("-- 统计每个城市的订单数\nSELECT city, COUNT(*) FROM orders GROUP BY city;")
    identifier = language_features("这里的 useEffect 为什么会执行两次？")
    mixed = language_features("这个 meeting 我们 postpone 到 next week 吧")
    assert commented[LATIN_WORDS] == 0 and identifier[LATIN_WORDS] == 0
    assert mixed[LATIN_WORDS] > 1 and mixed[FUNCTION_WORDS] == 0


def test_the_signal_weight_scales_only_the_trailing_signal_columns() -> None:
    scale = np.ones(6)
    assert build.weighted_scale(scale, 2, 10.0).tolist() == [1, 1, 1, 1, 0.1, 0.1]
    assert build.weighted_scale(scale, 0, 10.0).tolist() == [1] * 6
    assert signal_count("grounded") == len(grounded_signals("a", "b"))
    row = features("grounded", ["ctx 1", "ans 2"], [np.ones(4), np.zeros(4)])
    assert len(row) == 4 * 4 + 1 + signal_count("grounded")


def test_a_weighted_head_serves_the_probabilities_it_was_fitted_with() -> None:
    rng = np.random.default_rng(7)
    x = rng.normal(size=(60, 5))
    y = (x[:, -1] > 0).astype(int)
    mean, scale = build.standardise(x)
    scale = build.weighted_scale(scale, 1, 3.0)
    w, b = build.fit_softmax((x - mean) / scale, y, 2, 0.1)
    head = Head("p", "noul", "text", [], ["false", "true"], mean, scale, w, b)
    z = ((x[0] - mean) / scale) @ w + b
    assert np.allclose(head.probabilities(x[0]), np.exp(z) / np.exp(z).sum())


def test_cross_validation_prefers_a_heavier_signal_when_only_the_signal_carries_the_answer() -> None:
    rng = np.random.default_rng(3)
    noise = rng.normal(size=(80, 40))
    y = rng.integers(0, 2, size=80)
    signal = y + rng.normal(scale=0.6, size=80)
    x = np.column_stack([noise, signal])
    choice = build.cross_validate(x, y, 2, "noul", [str(i) for i in range(80)], signals=1, langs=["en"] * 80)
    assert choice.weight > 1.0
    assert choice.by_lang["en"] == choice.accuracy
    assert choice.hits.shape == (80,) and choice.hits.mean() == pytest.approx(choice.accuracy, abs=5e-5)


@pytest.mark.parametrize(("context", "verbatim", "altered"), [
    ("Hi. You can return any item within 30 days of delivery. Items must be unused.",
     "You can return any item within 30 days of delivery.", "You can return any item within 31 days of delivery."),
    ("营业时间为每天9点到21点。周一闭馆。", "营业时间为每天9点到21点。", "营业时间为每天10点到21点。"),
    ("The museum is closed on public holidays and during the winter break.",
     "The museum is closed on public holidays and during the winter break.", None),
])
def test_an_extract_is_the_contexts_first_full_sentence_verbatim_and_its_copy_with_the_first_number_changed(
        context: str, verbatim: str, altered: str | None) -> None:
    want = [(verbatim, True)] + ([(altered, False)] if altered is not None else [])
    assert build.extracts(context) == want
    assert build.extracts("Too short.") == []


def test_extract_lines_are_one_set_per_context_in_its_first_lines_language_and_marked_as_made() -> None:
    parts = ["context", "answer"]
    context = "Checkout is at 11:00 and late checkout costs 20 euros."
    written = [{"preset": "grounded", "lang": lang, "split": "train", "expected": ok,
                "state": {"context": context, "answer": answer}}
               for lang, ok, answer in (("en", True, "Leave by eleven."), ("mixed", False, "退房时间是12点。"))]
    made = build.extract_lines("grounded", written, parts)
    assert [(m["state"]["answer"], m["expected"], m["lang"], m["made"]) for m in made] == [
        (context, True, "en", "extract"),
        ("Checkout is at 12:00 and late checkout costs 20 euros.", False, "en", "extract")]
    assert all(build.texts_of(m, parts)[0] == context and m["split"] == "train" for m in made)
