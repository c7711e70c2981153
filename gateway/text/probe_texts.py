"""Hostile texts the probe cuts at every boundary, once per tokenizer.

Each kind stresses one way a prefix's tokenization can differ from the whole text's near a
cut: whitespace a regex attaches to the next word, CRLF and ideographic spaces, composing and
folding normalizers, scripts without spaces, emoji sequences joined by ZWJ, literal special
tokens, code indentation, URLs, long runs. The tests draw their hostile texts from the same
fragments, so the probe and the proof cover the same ground.
"""

from __future__ import annotations

ENGLISH = (
    "The quick brown fox jumps over the lazy dog. It's a well-known pangram; isn't it? "
    "Mr. O'Neil (aged 42) said: \"Don't panic!\" -- then left... at 3:15 p.m. "
    "Co-operation, re-entry & e-mail: they're all hyphenated words, aren't they?"
)

WHITESPACE = (
    "line one\r\nline two\r\n\r\n\tindented\t\ttabs  two  spaces   three   "
    "\u3000ideographic\u3000space\u3000\u3000twice \u00a0nbsp\u00a0\u00a0 thin\u2009space "
    "em\u2003space\n\n\n   \n trailing   \r\n\x0bvertical\x0cform feed \u2028line sep\u2029para "
    "end.    \t \r\n  "
)

ACCENTS = (
    "café naïve résumé Ångström façade coöperate ﬁnance ﬂuffy ǆ Ⅻ ① ² ½ "
    "Ｆｕｌｌｗｉｄｔｈ ＡＢＣ１２３ ｶﾀｶﾅ ﾊﾟﾋﾟ e\u0301 a\u0300\u0301 o\u0308\u0304 "
    "n\u0303\u0323 A\u030a Zalgo z\u0351\u0352\u0357a\u0350\u0351l\u0352g\u0353o "
    "Ǆ İstanbul ß ẞ ﬀ Ω Å K"
)

MIXED_SCRIPTS = (
    "Привет, мир! Γειά σου κόσμε. مرحبا بالعالم، كيف حالك؟ שלום עולם! "
    "नमस्ते दुनिया। สวัสดีชาวโลก ภาษาไทยไม่มีช่องว่าง 안녕하세요 세계 "
    "こんにちは世界 カタカナ ひらがな English mixed with 中文 and русский текст."
)

CJK = (
    "我们今天讨论长输入的处理方法,这是一个很重要的问题。"
    "模型读一个输入,最多读到它的token预算:options.max_tokens。"
    "「日本語の文章」は、句読点を含みます。東京都渋谷区1-2-3。"
    "한국어 문장도 포함합니다. 가나다라마바사 아자차카타파하! "
    "全角数字１２３と半角数字456が混在する。𠀀𠀁𠀂 丽 兀 "
)

EMOJI = (
    "family 👨\u200d👩\u200d👧\u200d👦 couple 👩\u200d❤\ufe0f\u200d👨 "
    "thumbs 👍🏻👍🏼👍🏽👍🏾👍🏿 flags 🇺🇸🇨🇳🇯🇵🇩🇪 keycap 1\ufe0f\u20e3#\ufe0f\u20e3 "
    "heart ❤\ufe0f star ⭐ rainbow 🏳\ufe0f\u200d🌈 text☺︎ ok👌end 😀😃😄😁😆 "
    "🧑\u200d💻 coder, 🤷\u200d♀\ufe0f shrug."
)

SPECIAL_TOKENS = (
    "[CLS] text [SEP] more[SEP]text [MASK]ed [UNK] [PAD] <s>start</s> <pad><unk><mask> "
    "<|endoftext|>after<|im_start|>user\n<|im_end|> </s></s>pairs <s> <eos><bos>"
)

CODE = (
    "def read(text: str, need: int) -> list[int]:\n"
    "    if not text:\n        return []  # nothing\n"
    "\tfor i in range(10):\n\t\tprint(f\"{i:>4}\", end='')\n"
    "const x = {\"a\": [1, 2.5e-3, null], 'b': true};\n"
    "if (a && b || !c) { x->y = *p++; } // C++ style\n"
    "    $ grep -rn 'TODO' src/ | wc -l\n"
    '<div class="card">&amp; &lt;b&gt;</div>\n'
    "SELECT id, name FROM users WHERE age >= 18 ORDER BY name;\n"
)

URLS = (
    "Visit https://example.com/path/to/page?query=1&other=two#section or "
    "http://sub.domain.co.uk:8080/a_b-c.d/~user/index.html?x=%20y. "
    "Mail john.doe+tag@example-mail.com, call +1 (555) 010-9999 or 555.010.9999. "
    "IP 192.168.0.1, IPv6 [2001:db8::1]:443, file:///C:/Users/x/file.txt, "
    "git@github.com:org/repo.git, @handle #hashtag $TICKER 50% off!"
)

SYMBOLS = (
    "∑∫√∞≈≠≤≥±×÷ ©®™ $€£¥₹₿ →←↑↓⇒⇔ ★☆♠♣♥♦ ♪♫ °C °F µm "
    "1,000,000.50 3.14159 -42 +7 1e10 0x1F 0b1010 12:30:45 2024-01-31 "
    "**bold** __under__ ~~strike~~ `code` > quote | table | --- ||| ^^^ === ... "
    "(((nested))) [[[x]]] {{{y}}} <<<z>>> «guillemets» „quotes“ ‘single’ — – ‐ ‒ ―"
)

NUMBERS = (
    "123 4567 89012 345678 9012345 67890123 456789012 3456789012 "
    "000000000000 1 22 333 4444 55555 666666 7777777 "
    "١٢٣٤٥ ०१२३४५ ๑๒๓ 一二三 Ⅰ Ⅱ Ⅲ ½¼¾ 1/2 3.0 .5 5. 1,2,3"
)

# Whitespace a tokenizer may drop or fold, plus unknown characters a model may fuse into one
# token: any of these reading to fewer tokens than their length over characters-per-token means
# no early reject and no cut inside a run.
FOLD_TEXTS = (
    " " * 600,
    "\u00a0" * 200,
    "\u3000" * 200,
    "\t" * 200,
    "\n" * 200,
    "\r\n" * 200,
    "\u200b" * 200,
    "\ufeff" * 200,
    "\u200d" * 200,
    "\u00ad" * 200,
    "".join(chr(c) for c in range(1, 32) if chr(c) not in "\t\n\r\x0b\x0c") * 8,
    "\u0301" * 200,
    "e" + "\u0301\u0302\u0303" * 60,
    "\u03a9\u0314\u0342\u0345" * 50,
    "😀" * 200,
    "👨\u200d👩\u200d👧" * 60,
    "\ue000\ue001\ue002" * 60,
    "𐀀𐀁𐀂𐀃" * 50,
    "ᚠᚡᚢᚣ" * 50,
    "a" * 300,
    "x" * 101,
    "ab" * 150,
    "한국어" * 60,
    "\u1100\u1161\u11a8" * 60,
)

# Runs a tokenizer does not split at a class boundary; cut every RUN_STEP characters.
RUN_STEP = 397


def _repeat(unit: str, length: int) -> str:
    return (unit * (length // len(unit) + 1))[:length]


def run_texts(length: int = 3000) -> dict[str, str]:
    """Seven kinds of run, each ``length`` characters, framed by ordinary words."""
    base64 = _repeat("QmFzZTY0IGVuY29kZWQgdGV4dCB3aXRoIHNvbWUgcGFkZGluZw+/9aZ", length)
    hexdigits = _repeat("3f9a0c7be12d45f68a9b0c1d2e3f4a5b6c7d8e9f00ff", length)
    digits = _repeat("31415926535897932384626433832795028841971693993751", length)
    chinese = _repeat("长输入按预算读取所以内存和时间跟着预算走而不是长度", length)
    letters = _repeat("pneumonoultramicroscopicsilicovolcanoconiosis", length)
    thai = _repeat("ภาษาไทยเขียนติดกันโดยไม่มีช่องว่าง", length)
    repeated = _repeat("a", length)
    kinds = {
        "base64": base64,
        "hex": hexdigits,
        "digits": digits,
        "chinese": chinese,
        "letters": letters,
        "thai": thai,
        "repeated": repeated,
    }
    return {name: f"start {run} end" for name, run in kinds.items()}


# Runs of boundary characters: a sub-word model reading one long word of dashes or emoji may
# segment it differently when its length changes, far from the cut.
CLASS_RUN_UNITS = (
    "-",
    "=",
    ".",
    "!",
    "_",
    "*",
    "~",
    "#",
    "/",
    "😀",
    "。",
    "中",
    "ー",
    "  ",
    "\t",
    "\u3000",
    "\r\n",
    " \n",
    "-=",
    ". ",
)
CLASS_RUN_LENGTH = 120


def class_run_texts(extra_units: tuple[str, ...] = ()) -> dict[str, str]:
    """One text per unit: a word, the unit repeated to CLASS_RUN_LENGTH characters, a word.

    ``extra_units`` are boundary characters the tokenizer has in its vocabulary: a run of
    known characters is split into pieces when short but may become one unknown token when
    long (WordPiece over 100 characters), which a run of unknown characters never shows.
    """
    return {
        f"class_run_{index}": f"word {_repeat(unit, CLASS_RUN_LENGTH)} x{_repeat(unit, 40)}y end"
        for index, unit in enumerate((*CLASS_RUN_UNITS, *extra_units))
    }


BOUNDARY_TEXTS: dict[str, str] = {
    "english": ENGLISH,
    "whitespace": WHITESPACE,
    "accents": ACCENTS,
    "mixed_scripts": MIXED_SCRIPTS,
    "cjk": CJK,
    "emoji": EMOJI,
    "special_tokens": SPECIAL_TOKENS,
    "code": CODE,
    "urls": URLS,
    "symbols": SYMBOLS,
    "numbers": NUMBERS,
}
