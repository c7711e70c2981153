"""Chinese (and language-independent) PII spans: the library recognisers in gateway/decisions/pii_zh.py, and span
questions through the real served gateway, where they merge with the English tagger's (pii-rampart) spans.

All personal data here is invented: names, numbers and addresses are made up; resident ids carry a valid check
digit only where the test says so; e-mail domains are example.cn / example.com."""

from __future__ import annotations

from typing import Any

import httpx
import pytest
from stdnum import luhn
from stdnum.cn import ric

from gateway.decisions import pii_zh
from gateway.decisions.state import parse_state

from .contract import check

MODEL = "decision-zeroshot"
VALID_ID = "11010519850214003" + ric.calc_check_digit("11010519850214003?")  # 北京朝阳, born 1985-02-14 (the
# library's calc_check_digit takes the number with a check-digit placeholder)
BAD_ID = VALID_ID[:-1] + ("0" if VALID_ID[-1] != "0" else "1")  # same 18 digits, wrong check digit
CARD = "622848001234567890" + luhn.calc_check_digit("622848001234567890")  # 19 digits, Luhn-valid


def found(text: str) -> dict[str, list[str]]:
    out: dict[str, list[str]] = {}
    for f in pii_zh.find(text):
        out.setdefault(f.entity, []).append(text[f.start:f.end])
    return out


# -- the module ---------------------------------------------------------------------------------------------------
def test_a_chinese_email_is_found_whole_without_the_han_characters_around_it() -> None:
    assert found("有问题请发邮件到wang.wei@example.cn谢谢")["EMAIL_ADDRESS"] == ["wang.wei@example.cn"]


def test_a_chinese_mobile_and_a_landline_are_phone_numbers() -> None:
    got = found("我的手机号是13812345678，办公室座机010-62345678。")
    assert got["PHONE_NUMBER"] == ["13812345678", "010-62345678"]


def test_a_number_outside_the_chinese_plan_in_e164_form_is_a_phone_number() -> None:
    assert found("他在伦敦的号码是+44 20 7946 0958。")["PHONE_NUMBER"] == ["+44 20 7946 0958"]


def test_a_resident_id_with_a_valid_check_digit_is_found_and_one_with_a_bad_check_digit_is_not() -> None:
    assert ric.is_valid(VALID_ID) and not ric.is_valid(BAD_ID)
    assert found(f"身份证号：{VALID_ID}。")["CN_RESIDENT_ID"] == [VALID_ID]
    assert "CN_RESIDENT_ID" not in found(f"身份证号：{BAD_ID}。")


def test_a_resident_id_issued_where_a_newer_county_is_found_and_an_unknown_area_or_date_is_not() -> None:
    later = "44030519790903108X"  # Nanshan (a county since 1990) for someone born in 1979: real, refused by is_valid
    assert not ric.is_valid(later) and ric.calc_check_digit(later) == "X"
    assert found(f"身份证号{later}，请核对。")["CN_RESIDENT_ID"] == [later]
    nowhere, month13 = "999999197909031088", "440305197913031082"  # right check digits, no such area / month
    assert all(ric.calc_check_digit(n) == n[-1] for n in (nowhere, month13))
    assert "CN_RESIDENT_ID" not in found(f"证件号 {nowhere}，编号 {month13}。")


def test_a_luhn_valid_bank_card_is_found_in_groups_of_four_and_a_bad_one_is_not() -> None:
    grouped = " ".join(CARD[i:i + 4] for i in range(0, len(CARD), 4))
    assert found(f"工资卡卡号{grouped}，开户行招商银行。")["BANK_CARD"] == [grouped]
    wrong = CARD[:-1] + str((int(CARD[-1]) + 1) % 10)
    assert "BANK_CARD" not in found(f"卡号{wrong}")


def test_a_chinese_name_is_a_person_and_a_full_address_is_one_address_span() -> None:
    text = "收件人：赵一鸣，地址：广东省深圳市南山区粤海街道高新南七道18号，电话13912345678"
    got = found(text)
    assert got["PERSON"] == ["赵一鸣"]
    assert got["ADDRESS"] == ["广东省深圳市南山区粤海街道高新南七道18号"]
    assert got["PHONE_NUMBER"] == ["13912345678"]


def test_a_name_before_a_line_break_is_found_without_the_line_break() -> None:
    names = found("监护人：许嘉禾\n联系电话见下")["PERSON"]  # LAC's word was "许嘉禾\n"
    assert names == ["许嘉禾"], names


def test_a_lone_city_name_is_not_an_address() -> None:
    assert "ADDRESS" not in found("我在北京工作，周末常去天津。")


def test_text_without_personal_data_gives_nothing() -> None:
    assert found("请问这个季度的退货政策有什么变化？订单满99元包邮。") == {}


def test_offsets_are_code_points_even_after_characters_outside_the_basic_plane() -> None:
    text = "😀😀 邮箱 li.na@example.com"
    [f] = pii_zh.find(text)
    assert (f.start, f.end) == (6, 23) and text[f.start:f.end] == "li.na@example.com"


def persons(text: str) -> list[str]:
    return found(text).get("PERSON", [])


def test_parts_of_a_transliterated_name_joined_by_an_interpunct_are_one_person() -> None:
    assert persons("客人叫热娜·买买提。") == ["热娜·买买提"]  # LAC: 热娜 PER, · , 买买提 a verb
    assert persons("欢迎约翰·史密斯先生光临。") == ["约翰·史密斯"]


def test_an_interpunct_in_a_book_title_or_a_date_makes_no_name() -> None:
    assert persons("《红楼梦·第一回》讲了什么？") == []
    assert persons("一二·九运动是学生运动。") == []


def test_a_surname_with_a_title_or_with_lao_is_not_a_name() -> None:
    for text in ("刘局长和陈处长明天到。", "张总和李总都到了。", "给王老师打电话", "老王说今天不加班。"):
        assert persons(text) == [], text


def test_a_title_at_the_end_of_a_name_word_is_trimmed_and_a_one_character_title_only_after_a_lone_surname() -> None:
    assert pii_zh._untitled("葛建国经理", 0, 5) == 3
    assert pii_zh._untitled("王总", 0, 2) == 1
    assert pii_zh._untitled("李建总", 0, 3) == 3  # 总 inside a three-character name is part of it
    assert persons("收件人陈梓涵先生") == ["陈梓涵"]


def test_a_name_with_a_compound_surname_is_found_whole_where_lac_cuts_or_mistags_it() -> None:
    assert persons("负责人上官子墨已签字。") == ["上官子墨"]  # LAC: 上 (f) / 官子墨 (n)
    assert persons("本案由上官雨晴律师代理。") == ["上官雨晴"]  # LAC: one word, tagged f
    assert persons("请转交给东方雨桐同学。") == ["东方雨桐"]  # LAC: ORG


def test_a_compound_surname_word_outside_a_name_slot_is_no_name() -> None:
    assert persons("我是东方人。") == []
    assert persons("东方明珠塔下，我遇见了他。") == []


def test_a_name_that_is_also_a_word_is_found_next_to_other_names_in_a_list() -> None:
    assert persons("值班：周一钱帅、周二孙悦。") == ["钱帅", "孙悦"]  # LAC: 钱帅 n in this sentence


def test_a_direction_word_at_a_sentence_start_is_no_name_but_after_a_naming_word_it_is() -> None:
    assert persons("向东走两百米就到。") == []  # LAC tagged 向东 PER; read alone it is a preposition
    assert persons("我弟弟叫向东。") == ["向东"]


def test_names_found_by_extra_readings_stop_at_the_reread_and_lattice_bounds(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(pii_zh, "REREADS", 0)
    monkeypatch.setattr(pii_zh, "MARGINS", 0)
    assert persons("负责人上官子墨已签字。") == []


def test_a_resident_id_in_6_8_4_or_6_4_4_4_groups_is_found_and_a_bad_one_is_not() -> None:
    for sep in (" ", "-"):
        grouped = sep.join((VALID_ID[:6], VALID_ID[6:14], VALID_ID[14:]))
        assert found(f"证件号码：{grouped}。")["CN_RESIDENT_ID"] == [grouped]
    year_apart = " ".join((VALID_ID[:6], VALID_ID[6:10], VALID_ID[10:14], VALID_ID[14:]))
    assert found(f"身份证 {year_apart} 已核验")["CN_RESIDENT_ID"] == [year_apart]
    bad = " ".join((BAD_ID[:6], BAD_ID[6:14], BAD_ID[14:]))
    assert "CN_RESIDENT_ID" not in found(f"证件号码：{bad}。")


def test_a_resident_id_in_4_4_4_4_2_groups_is_found_whole_before_a_bank_card_and_a_bad_one_is_not() -> None:
    x_id = "11010519900307195X"  # valid check digit X; its first 16 digits pass Luhn, as a card number's would
    assert ric.calc_check_digit(x_id) == "X" and luhn.is_valid(x_id[:16])
    for number in (VALID_ID, x_id):
        for sep in (" ", "-"):
            grouped = sep.join((number[:4], number[4:8], number[8:12], number[12:16], number[16:]))
            got = found(f"身份证号：{grouped}，请核对。")
            assert got == {"CN_RESIDENT_ID": [grouped]}, got
    bad = " ".join((BAD_ID[:4], BAD_ID[4:8], BAD_ID[8:12], BAD_ID[12:16], BAD_ID[16:]))
    assert "CN_RESIDENT_ID" not in found(f"证件号码：{bad}。")
    assert found(f"身份证号{VALID_ID}")["CN_RESIDENT_ID"] == [VALID_ID]  # the whole form still reads


def test_a_sentence_with_han_characters_is_told_apart_from_an_english_one_in_the_same_text() -> None:
    text = "请回电。Call 555 0134 today"
    assert pii_zh.in_han_sentence(text, 0, 3)
    assert not pii_zh.in_han_sentence(text, text.index("555"), text.index("555") + 8)


def test_the_taggers_phone_and_id_spans_in_a_chinese_sentence_give_way_to_the_libraries() -> None:
    """The family's merge (gateway/decisions/families/zeroshot.py), with the tagger's output made up: a PHONE span
    over the extension of a Chinese landline and a TAX_ID over an invoice code are dropped; the same in an English
    sentence of the same text is kept."""
    from pathlib import Path
    from types import SimpleNamespace

    import numpy as np

    from gateway.cards import load_card
    from gateway.decisions.families.zeroshot import ZeroShot
    from gateway.decisions.questions import Question, validate
    from gateway.runtime import ServedModel

    root = Path(__file__).resolve().parents[2] / "model_repository"
    family = ZeroShot(ServedModel(load_card(root / "decision-zeroshot" / "card.yaml")))
    heads = load_card(root / "pii-rampart" / "card.yaml").heads
    assert heads
    labels = heads[0].labels
    text = "请拨0571-86001234转6021找前台，发票代码144032209110。Or call 555 0134 today."
    tagged = {"6021": "PHONE", "144032209110": "TAX_ID", "555 0134": "PHONE"}
    offsets = [(text.index(t), text.index(t) + len(t)) for t in tagged]
    probs = np.zeros((len(offsets), len(labels)))
    for row, kind in enumerate(tagged.values()):
        probs[row, labels.index(f"B-{kind}")] = 1.0
    question = validate("q", {"type": "span", "instructions": "找号码",
                              "labels": [{"key": "PHONE_NUMBER"}, {"key": "GOVERNMENT_ID"}]},
                        family.spec, "decision-zeroshot")
    assert isinstance(question, Question)
    ask = SimpleNamespace(question=question, view=SimpleNamespace(text=text))
    got = family._spans(ask, labels, probs, offsets, pii_zh.find(text))  # type: ignore[arg-type]
    assert [(s["label"], s["text"]) for s in got.spans] == [("PHONE_NUMBER", "0571-86001234"),
                                                           ("PHONE_NUMBER", "555 0134")]


def test_a_name_cut_before_its_interpunct_or_at_the_end_of_a_han_run_in_latin_text_is_one_person() -> None:
    assert persons("来访者阿不都瓦依提·艾山，男。") == ["阿不都瓦依提·艾山"]  # LAC: 阿不都 PER / 瓦依提·艾山
    assert persons("Guest: 努尔艾力·阿布都拉 (Nurali Abdulla)") == ["努尔艾力·阿布都拉"]  # LAC: … / 阿布都 / 拉


def test_a_given_name_glued_to_a_compound_surname_is_one_person_with_it() -> None:
    assert persons("房东呼延晓峰今天来收租。") == ["呼延晓峰"]  # LAC: 呼 v / 延 LOC / 晓峰 PER
    assert persons("欧阳修是文学家。") == ["欧阳修"]


def test_a_compound_surname_before_a_one_character_verb_stays_a_lone_surname() -> None:
    assert persons("欧阳来了。") == ["欧阳"]  # 来 is no given name; the surname alone was LAC's PER before too


def test_a_masked_name_is_no_person() -> None:
    for text in ("快递员刘*已经送达。", "姓名：陈*明", "收件人：孙**，电话已隐藏。"):
        assert persons(text) == [], text


def test_a_compound_surname_is_found_where_lac_cuts_inside_it_but_not_where_a_title_ends_on_its_first_character(
) -> None:
    assert persons("讣告：复姓传人司空云峰先生昨日到访。") == ["司空云峰"]
    assert persons("对接人：淳于晓东，电话见附件。") == ["淳于晓东"]  # 淳于: from the 百家姓 list, not a word
    assert persons("校长孙明来了。") == ["孙明"]  # 校长 + 孙明, not 长孙明
    assert persons("家长孙丽丽来接孩子。") == ["孙丽丽"]
    assert persons("这届第五名是谁？") == []  # 第五 is a compound surname and an ordinal: no name reading here
    assert persons("第五条 甲方应按时付款。") == []  # nor a given name that is a measure word


def test_a_compound_surname_name_standing_after_latin_text_is_one_person() -> None:
    assert persons("Reviewer 濮阳子涵，please check.") == ["濮阳子涵"]  # LAC: 濮阳 a city, 子涵 a place


def test_a_long_name_lac_cuts_in_pieces_is_one_person_but_a_following_verb_or_adverb_stays_out() -> None:
    assert persons("我们家斯琴毕力格明天到。") == ["斯琴毕力格"]  # LAC: 斯琴 / 毕力格
    assert persons("张伟明天来。") == ["张伟"]
    assert persons("刘芳芳来店里退货。") == ["刘芳芳"]
    assert persons("李明妈妈来接孩子了。") == ["李明"]  # a kinship word is never a piece of the name
    assert persons("乾隆皇帝一生写了很多诗。") == ["乾隆"]  # 皇帝, read alone, is a common word


def test_long_names_are_rebuilt_only_within_the_lattice_scoring_bound(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(pii_zh, "MARGINS", 0)
    assert persons("我们家斯琴毕力格明天到。") == ["斯琴", "毕力格"]


def test_the_lattice_cost_is_zero_for_lacs_own_reading_small_for_a_name_that_is_a_word_and_large_for_a_word() -> None:
    text = "护士严冬明早到。今天天气很好。"
    lattices: list[pii_zh._Lattice] = []
    pii_zh.load().words(text, lattices)
    [name_cost] = [x.cost(2, 4) for x in lattices if x.holds(2, 4)]  # 严冬 "severe winter", a name after 护士
    [word_cost] = [x.cost(10, 12) for x in lattices if x.holds(10, 12)]  # 天气 "weather"
    assert 0.0 <= name_cost < pii_zh.NAME_COST < word_cost


def test_a_name_that_is_also_a_word_is_found_right_after_a_role_or_kinship_word() -> None:
    assert persons("翻译齐心陪同客户参观。") == ["齐心"]  # 齐心 "of one mind"
    assert persons("房东安静说可以。") == ["安静"]  # 安静 "quiet"
    assert persons("今天天气很好，我们去公园散步吧。") == []


def test_a_name_that_is_a_word_or_a_place_is_found_in_a_list_with_a_name_or_after_a_word_that_takes_a_person() -> None:
    assert persons("带队老师是冷静和白露。") == ["冷静", "白露"]  # 白露 joins 冷静, itself found by the lattice
    assert persons("护士周敏和宁远今晚值班。") == ["周敏", "宁远"]  # 宁远: LAC's place word
    assert persons("此事由安宁负责。") == ["安宁"]


def test_a_word_right_before_a_title_needs_a_name_reading_not_only_the_lattice() -> None:
    assert persons("12楼王阿姨的车。") == []  # LAC: 楼王 / 阿姨; the name is the lone surname 王 with a title


def test_nicknames_and_familiar_forms_are_no_names() -> None:
    for text in ("小胖和大刘明天来。", "阿强说他不来了。", "请把材料交给小王。"):
        assert persons(text) == [], text


def test_a_name_inside_an_at_handle_is_no_person_but_after_an_email_it_is() -> None:
    assert persons("@王小明 你好") == []
    assert persons("发邮件给 wang@example.com 的王小明") == ["王小明"]


def test_a_founders_name_glued_to_a_product_noun_is_a_brand_but_one_after_a_role_or_before_a_detail_is_a_name(
) -> None:
    assert persons("买了一双李宁跑鞋和一把张小泉菜刀。") == []
    assert persons("楼下开了家张亮麻辣烫。") == []
    assert persons("经理秦浩态度很差。") == ["秦浩"]
    assert persons("鲁迅原名周树人。") == ["鲁迅", "周树人"]  # an attribute the sentence goes on about, no brand
    assert persons("联系人张伟电话13800138000") == ["张伟"]


def test_a_name_with_a_compound_surname_inside_an_at_handle_is_no_person() -> None:
    assert persons("@欧阳飞雪 明天开会吗？") == []  # the compound-surname rule found it before the handle rule ran


def test_xiao_or_lao_before_a_name_or_nickname_of_any_length_is_a_familiar_form_not_a_name() -> None:
    for text in ("小李刚说他不来了。", "小豆儿：收到，马上到", "老李头说要下雨。"):
        assert persons(text) == [], text


def test_a_surname_with_jia_is_a_household_not_a_person() -> None:
    assert persons("楼上欧阳家和对门司马家都停电了。") == []
    assert persons("慕容家的院子很大。") == []


def test_a_kinship_word_in_a_list_of_names_is_no_name() -> None:
    assert persons("叔叔夏侯明和堂妹夏侯雨晴明天到。") == ["夏侯明", "夏侯雨晴"]  # 堂妹: in the 和 list, before a name


def test_the_word_before_a_role_and_a_name_says_whose_role_it_is_and_is_no_name() -> None:
    assert persons("日方代表山田太郎和韩方代表金敏智明天上午抵达。") == ["山田太郎", "金敏智"]  # 韩方: the Korean side


def test_a_compound_surname_lac_reads_as_a_word_before_a_given_name_in_a_list_of_names_is_one_person() -> None:
    got = persons("获奖名单：张晓东（学号2023001）、闻人雅婷，如有异议请联系教务处。")
    assert got == ["张晓东", "闻人雅婷"]  # LAC: 闻人 v / 雅婷 PER; never 闻人 alone


def test_a_compound_surname_whose_first_character_lac_glues_to_a_role_word_before_it_is_one_person() -> None:
    assert persons("受益人：其母公孙秀兰，电话 139 9510 4486。") == ["公孙秀兰"]  # LAC: 其 / 母公 / 孙秀兰
    assert persons("我老公孙浩明天回来。") == ["孙浩"]  # 老公 is the role word itself: no 公孙 here


def test_an_interpunct_lac_glues_to_the_second_part_of_a_name_still_joins_the_name() -> None:
    got = persons("产妇 热依拉·托合提，丈夫 艾山·吾买尔，电话 199 0992 6613。")
    assert got == ["热依拉·托合提", "艾山·吾买尔"]  # LAC: 艾山 PER / ·吾买尔 w


def test_a_name_lac_glues_to_the_role_or_verb_before_it_is_found_from_where_that_word_ends() -> None:
    assert persons("请转告许文博，明天的面试改到下午。") == ["许文博"]  # LAC: 转 / 告许文博
    assert persons("护士长说今天不加班。") == []


def test_a_name_that_is_a_word_is_found_as_who_says_something_at_a_clause_start_or_after_de() -> None:
    assert persons("值班的高山说，今天人太多。") == ["高山"]  # 高山 "high mountain"
    assert persons("新闻说明天下雨。") == []


def test_a_lone_surname_with_punctuation_glued_to_it_is_no_name() -> None:
    assert persons("我姓张。") == []  # LAC's word was "张。"


def test_a_phone_number_leaves_out_its_extension_and_an_unmatched_bracket() -> None:
    assert found("值班医生是周文涛（139 2345 6781），请联系。")["PHONE_NUMBER"] == ["139 2345 6781"]
    assert found("座机 0571-8800 1234 ext. 305，工作日可打。")["PHONE_NUMBER"] == ["0571-8800 1234"]
    assert found("前台电话021-64001234-606，或者发邮件。")["PHONE_NUMBER"] == ["021-64001234"]
    assert found("请拨0571-86001234转6021找前台")["PHONE_NUMBER"] == ["0571-86001234"]
    assert found("总机(0755)26610338")["PHONE_NUMBER"] == ["(0755)26610338"]  # a matched pair stays


def _merged(text: str, tagged: dict[str, str], labels_asked: list[str]) -> list[tuple[str, str]]:
    """The family's merge (gateway/decisions/families/zeroshot.py) with the tagger's output made up: each key of
    `tagged` a span of that tagger type, probability 1."""
    from pathlib import Path
    from types import SimpleNamespace

    import numpy as np

    from gateway.cards import load_card
    from gateway.decisions.families.zeroshot import ZeroShot
    from gateway.decisions.questions import Question, validate
    from gateway.runtime import ServedModel

    root = Path(__file__).resolve().parents[2] / "model_repository"
    family = ZeroShot(ServedModel(load_card(root / "decision-zeroshot" / "card.yaml")))
    heads = load_card(root / "pii-rampart" / "card.yaml").heads
    assert heads
    labels = heads[0].labels
    offsets = [(text.index(t), text.index(t) + len(t)) for t in tagged]
    probs = np.zeros((len(offsets), len(labels)))
    for row, kind in enumerate(tagged.values()):
        probs[row, labels.index(f"B-{kind}")] = 1.0
    question = validate("q", {"type": "span", "instructions": "find personal data",
                              "labels": [{"key": k} for k in labels_asked]}, family.spec, "decision-zeroshot")
    assert isinstance(question, Question)
    ask = SimpleNamespace(question=question, view=SimpleNamespace(text=text))
    got = family._spans(ask, labels, probs, offsets, pii_zh.find(text))  # type: ignore[arg-type]
    return [(s["label"], s["text"]) for s in got.spans]


def test_the_taggers_passport_and_licence_spans_under_a_checked_id_label_give_way_in_a_chinese_sentence() -> None:
    text = "快递单号ZT5512098833，车牌苏A9K27。Passport K12345678 expires soon."
    tagged = {"ZT5512098833": "PASSPORT", "A9K27": "DRIVERS_LICENSE", "K12345678": "PASSPORT"}
    assert _merged(text, tagged, ["GOVERNMENT_ID"]) == [("GOVERNMENT_ID", "K12345678")]
    # a question that asks for passports themselves has no library check behind its label: the span stays
    assert _merged(text, tagged, ["PASSPORT"]) == [("PASSPORT", "ZT5512098833"), ("PASSPORT", "K12345678")]


def test_the_taggers_handles_and_an_honorifics_lone_surname_are_no_person_but_full_names_are() -> None:
    text = "Ask Mr. Grant or Jean-Luc Moreau; commits by li-wei_dev and qa2 go to https://example.com/mwong today."
    tagged = {"Grant": "SURNAME", "Jean-Luc": "GIVEN_NAME", "Moreau": "SURNAME", "li-wei_dev": "GIVEN_NAME",
              "qa2": "GIVEN_NAME", "mwong": "GIVEN_NAME"}
    assert _merged(text, tagged, ["PERSON"]) == [("PERSON", "Jean-Luc Moreau")]
    assert _merged("Please call Dr. Helen Price.", {"Helen": "GIVEN_NAME", "Price": "SURNAME"},
                   ["PERSON"]) == [("PERSON", "Helen Price")]


def test_resolve_keeps_the_first_of_two_overlapping_candidates_and_both_of_two_apart() -> None:
    a, b, c = pii_zh.Found("CN_RESIDENT_ID", 0, 18, 1.0), pii_zh.Found("PHONE_NUMBER", 3, 14, 1.0), \
        pii_zh.Found("PERSON", 20, 22, 0.85)
    assert pii_zh.resolve([a, b, c]) == [a, c]


def test_a_span_question_over_a_one_part_object_reads_the_part_itself_not_its_rendered_block() -> None:
    state = parse_state({"ticket": "Mail me at jane.doe@example.com"})
    assert state.span_view(None).text == "Mail me at jane.doe@example.com"
    two = parse_state({"request": "hello", "answer": "bye"})
    assert two.span_view(("request",)).text == "hello"


# -- through the served gateway -------------------------------------------------------------------------------------
def spans(http: httpx.Client, state: Any, question: dict[str, Any]) -> tuple[list[dict[str, Any]], dict[str, Any]]:
    r = http.post("/v1/decisions", json={"model": MODEL, "state": state, "questions": {"p": question}})
    assert r.status_code == 200, r.text
    check("/v1/decisions", "post", r.status_code, r.json(), r.headers)
    body = r.json()
    return body.get("spans", {}).get("p", []), body["answers"]["p"]


PII = {"type": "span", "preset": "pii"}


def test_a_chinese_email_comes_back_whole_through_the_api(http: httpx.Client) -> None:
    text = "您好，我是客户王伟，邮箱wang.wei@example.cn，麻烦尽快回复。"
    got, answer = spans(http, text, {"type": "span", "instructions": "找出邮箱",
                                     "labels": [{"key": "EMAIL_ADDRESS", "description": "电子邮箱"}]})
    assert [(s["label"], s["text"]) for s in got] == [("EMAIL_ADDRESS", "wang.wei@example.cn")]
    assert text[got[0]["start"]:got[0]["end"]] == "wang.wei@example.cn" and answer["noul"] > 0.5


def test_a_chinese_mobile_number_is_a_phone_number_and_not_a_tax_id(http: httpx.Client) -> None:
    text = "快递到了请打我手机15267891234，谢谢。"
    got, _ = spans(http, text, PII)
    assert [(s["label"], s["text"]) for s in got] == [("PHONE_NUMBER", "15267891234")]


def test_a_valid_resident_id_is_a_government_id_and_a_bad_checksum_is_not(http: httpx.Client) -> None:
    good, _ = spans(http, f"我的身份证号码是{VALID_ID}，请核对。", PII)
    assert ("GOVERNMENT_ID", VALID_ID) in [(s["label"], s["text"]) for s in good]
    bad, _ = spans(http, f"我的身份证号码是{BAD_ID}，请核对。", PII)
    assert "GOVERNMENT_ID" not in [s["label"] for s in bad]


def test_a_chinese_name_is_a_person(http: httpx.Client) -> None:
    got, _ = spans(http, "昨天下午刘芳芳来店里退了一件外套。", PII)
    assert [(s["label"], s["text"]) for s in got] == [("PERSON", "刘芳芳")]


def test_offsets_of_a_one_part_object_state_index_that_part(http: httpx.Client) -> None:
    state = {"ticket": "退款请联系 zhou.min@example.cn 或 13698765432"}
    got, _ = spans(http, state, PII)
    assert [(s["label"], s["text"]) for s in got] == [("EMAIL_ADDRESS", "zhou.min@example.cn"),
                                                      ("PHONE_NUMBER", "13698765432")]
    for s in got:
        assert state["ticket"][s["start"]:s["end"]] == s["text"]


def test_offsets_of_a_part_named_by_over_index_that_part(http: httpx.Client) -> None:
    state = {"request": "帮我改一下收货地址", "answer": "好的，已改为上海市徐汇区漕溪北路88号，联系人孙立"}
    got, _ = spans(http, state, {**PII, "over": "answer"})
    assert ("ADDRESS", "上海市徐汇区漕溪北路88号") in [(s["label"], s["text"]) for s in got]
    for s in got:
        assert state["answer"][s["start"]:s["end"]] == s["text"]


def test_english_names_still_come_from_the_tagger_next_to_library_numbers(http: httpx.Client) -> None:
    text = "My name is John Smith, call me on +1 415 555 0132 or mail john.smith@example.com."
    got, _ = spans(http, text, PII)
    labels = {(s["label"], s["text"]) for s in got}
    assert {("PERSON", "John Smith"), ("EMAIL_ADDRESS", "john.smith@example.com")} <= labels
    assert ("PHONE_NUMBER", "+1 415 555 0132") in labels


@pytest.mark.parametrize("threshold", [0.9])
def test_a_threshold_above_the_lexical_score_drops_names_but_keeps_validated_numbers(
        http: httpx.Client, threshold: float) -> None:
    got, _ = spans(http, "联系人刘芳芳，手机15267891234", {**PII, "threshold": threshold})
    assert [(s["label"], s["text"]) for s in got] == [("PHONE_NUMBER", "15267891234")]


def test_a_name_ends_where_a_time_word_starts() -> None:
    assert persons("外公孙立明天生日") == ["孙立"]  # LAC: 孙立明天生 / 日; 明天 is "tomorrow"
    assert persons("让范建波明早带过去。") == ["范建波"]  # LAC: 范建波明 / 早
    assert persons("原件让冯建波明早带到公司。") == ["冯建波"]  # LAC: 冯建波 / 明 / 早: 明 is no name piece


def test_a_surname_lac_reads_apart_from_its_given_name_joins_it() -> None:
    assert persons("原告：晁志刚，被告：管立群。") == ["晁志刚", "管立群"]  # 管立 / 群 after a role and a colon
    assert persons("丈夫仝建军，身份证见附件。") == ["仝建军"]  # LAC: 仝 d / 建军 v; "我叫仝建军。": 仝 PER
    assert persons("户主查宇轩由监护人代签。") == ["查宇轩"]  # LAC: 查 v / 宇轩 n
    assert persons("名单：王芳、向晓东、李强。") == ["王芳", "向晓东", "李强"]  # LAC: 向 p / 晓东 PER
    assert persons("请二班房佳慧同学到办公室。") == ["房佳慧"]  # LAC: 二 / 班房 / 佳慧
    assert persons("证明黎曼猜想。") == ["黎曼"]  # 明 ends the verb 证明, not a surname


def test_a_season_lac_cuts_off_a_given_name_joins_it() -> None:
    assert persons("请转告叶知秋下午来。") == ["叶知秋"]  # LAC: 叶知 PER / 秋 TIME


def test_a_name_after_a_quantity_or_before_a_shops_place_word_is_a_brand() -> None:
    assert persons("给爷爷带了一盒王守义十三香。") == []  # 十三香 read as a numeral
    assert persons("最后选了杨国福麻辣烫楼上那套。") == []


def test_nicknames_places_named_after_a_family_titles_and_latin_names_with_a_han_title_are_no_chinese_names(
) -> None:
    for text in ("胖虎：今晚开黑吗", "二狗子：我带零食", "本案由王法官主持调解。", "Nolan哥说周六聚餐。"):
        assert persons(text) == [], text
    assert persons("周末逛了徐家汇和曹家渡，下个月去看老同学阚永亮。") == ["阚永亮"]


def test_a_transliterated_name_standing_in_latin_text_runs_to_the_end_of_its_han_run() -> None:
    assert persons("收货人 阿卜杜萨拉木·吐尔地 +86 189 9912 4076") == ["阿卜杜萨拉木·吐尔地"]  # LAC: ·吐尔 / 地 u


def test_a_compound_surname_name_glued_to_the_role_word_before_it_is_found() -> None:
    assert persons("申请人宗政言，身份证见附件。") == ["宗政言"]  # LAC: 申请人宗 / 政言
