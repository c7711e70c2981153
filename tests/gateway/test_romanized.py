"""Names in Latin letters inside Chinese text (gateway/decisions/romanized.py), and how they reach a span answer:
as library PERSON spans of pii_zh, which beat the English tagger's fragments over them. All names are invented."""

from __future__ import annotations

from pathlib import Path
from types import SimpleNamespace

import numpy as np
import pytest

from gateway.decisions import pii_zh, romanized


def names(text: str) -> list[str]:
    return [text[n.start:n.end] for n in romanized.find(text)]


def test_a_pinyin_name_in_chinese_text_is_one_name_in_either_order() -> None:
    assert names("Daily sync：Hu Yutong 修 bug，Sun Mingze 跟进发版") == ["Hu Yutong", "Sun Mingze"]
    assert names("实习生 Xu Jiayi（徐佳怡）明天入职") == ["Xu Jiayi"]
    assert names("代码由 Ouyang Hao review") == ["Ouyang Hao"]  # a compound surname
    assert names("报销单请交给 Mingze Sun 审批") == ["Mingze Sun"]  # the Western order
    assert names("报到的是 Xu Jia-yi 同学") == ["Xu Jia-yi"]


def test_an_english_given_name_before_a_chinese_surname_is_one_name() -> None:
    assert names("Supplier 联系人 Grace Tan，手机见下") == ["Grace Tan"]
    assert names("Sprint owners：Amy Xu、Tony Huang、钟子涵") == ["Amy Xu", "Tony Huang"]
    assert names("值班经理 Tiffany Wong。") == ["Tiffany Wong"]  # a Cantonese romanisation


def test_no_name_is_read_after_an_honorific_inside_a_longer_proper_name_or_outside_chinese_text() -> None:
    assert names("Mr. Fang 说预算要砍，Dr. Ma Jun 不同意") == []
    assert names("恒生银行 Hang Seng Bank 的分行") == []  # neither a common surname, and a third word follows
    assert names("开会地点在 Long Island 分部") == []  # Island is no pinyin
    assert names("Call Sun Mingze tomorrow.") == []  # English text: the tagger reads it in context
    assert names("会议纪要：Sun Mingze。Call Tina Wu tomorrow.") == ["Sun Mingze"]  # sentence by sentence
    assert names("邮件发到 sun.mingze@example.com 或 @Sun Mingze") == []  # an address or a handle


def test_a_month_is_no_given_name_and_a_word_that_is_not_pinyin_is_no_given_name() -> None:
    assert names("截止日期 May Li 说是周五") == []  # May is a month here as often as a name
    assert romanized.pinyin_syllables("Mingze") == 2
    assert romanized.pinyin_syllables("Jia-yi") == 2
    assert romanized.pinyin_syllables("Island") == 0
    assert romanized.pinyin_syllables("Zhuangzhuangzhuang") == 3


def test_pii_zh_returns_a_latin_name_in_chinese_text_as_a_person() -> None:
    text = "Please 转告 Liu Yang 明天的 call 取消了"
    assert [(f.entity, text[f.start:f.end]) for f in pii_zh.find(text)] == [("PERSON", "Liu Yang")]


@pytest.fixture(scope="module")
def family():  # type: ignore[no-untyped-def]
    from gateway.cards import load_card
    from gateway.decisions.families.zeroshot import ZeroShot
    from gateway.runtime import ServedModel

    root = Path(__file__).resolve().parents[2] / "model_repository"
    heads = load_card(root / "pii-rampart" / "card.yaml").heads
    assert heads
    return ZeroShot(ServedModel(load_card(root / "decision-zeroshot" / "card.yaml"))), heads[0].labels


def _spans(family, text: str, tagged: dict[str, str]) -> list[str]:  # type: ignore[no-untyped-def]
    """The merged PERSON answer of a span question when the English tagger found exactly `tagged`."""
    from gateway.decisions.questions import Question, validate

    fam, labels = family
    offsets = [(text.index(t), text.index(t) + len(t)) for t in tagged]
    probs = np.zeros((len(offsets), len(labels)))
    for row, kind in enumerate(tagged.values()):
        probs[row, labels.index(f"B-{kind}")] = 1.0
    question = validate("q", {"type": "span", "instructions": "find the people", "labels": [{"key": "PERSON"}]},
                        fam.spec, "decision-zeroshot")
    assert isinstance(question, Question)
    ask = SimpleNamespace(question=question, view=SimpleNamespace(text=text))
    return [s["text"] for s in fam._spans(ask, labels, probs, offsets, pii_zh.find(text)).spans]


def test_the_taggers_half_of_a_latin_name_in_chinese_text_gives_way_to_the_whole_name(family) -> None:  # type: ignore[no-untyped-def]
    assert _spans(family, "供应商联系人 Grace Tan，手机见下", {"Tan": "SURNAME"}) == ["Grace Tan"]
    assert _spans(family, "问题找 Ma Jingyu 处理", {"yu": "GIVEN_NAME"}) == ["Ma Jingyu"]


def test_an_english_given_name_the_tagger_left_before_a_surname_it_found_joins_the_name(family) -> None:  # type: ignore[no-untyped-def]
    assert _spans(family, "客户 Maria Gonzalez 的订单已签收", {"Gonzalez": "SURNAME"}) == ["Maria Gonzalez"]
    assert _spans(family, "Please call Maria Gonzalez today.", {"Gonzalez": "SURNAME"}) == ["Maria Gonzalez"]
    # a capitalised word that is no given name stays out
    assert _spans(family, "Ask Supplier Gonzalez today.", {"Gonzalez": "SURNAME"}) == ["Gonzalez"]
