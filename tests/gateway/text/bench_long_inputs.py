"""Time and memory of reading 5 MiB inputs with a 256-token budget (not a test).

Run: ``.venv/bin/python -m tests.gateway.text.bench_long_inputs``. Each case runs in a fresh
process after a warm-up (tokenizer loaded, probe done, text built) and reports wall time and
peak resident memory growth over that warm state (VmHWM - VmRSS), so Rust allocations count.
"""

from __future__ import annotations

import base64
import json
import random
import subprocess
import sys
import time

BUDGET = 256
SIZE = 5 * 1024 * 1024
WORDS = [
    "the",
    "of",
    "and",
    "to",
    "in",
    "is",
    "was",
    "for",
    "that",
    "with",
    "as",
    "on",
    "by",
    "at",
    "from",
    "his",
    "her",
    "an",
    "which",
    "be",
    "this",
    "are",
    "had",
    "not",
    "but",
    "were",
    "have",
    "it",
    "they",
    "one",
    "all",
    "their",
    "been",
    "has",
    "more",
    "when",
    "who",
    "will",
    "would",
    "there",
    "can",
    "if",
    "out",
    "so",
    "model",
    "budget",
    "token",
    "input",
    "memory",
    "time",
    "long",
    "text",
    "reads",
    "only",
    "as",
    "far",
    "as",
    "needed",
]


def english() -> str:
    rng = random.Random(1)
    parts: list[str] = []
    length = 0
    while length < SIZE:
        sentence = " ".join(rng.choice(WORDS) for _ in range(rng.randint(6, 18))).capitalize() + ". "
        parts.append(sentence)
        length += len(sentence)
    return "".join(parts)[:SIZE]


def base64_text() -> str:
    return base64.b64encode(random.Random(2).randbytes(SIZE * 3 // 4)).decode()[:SIZE]


def hex_text() -> str:
    """A boundary-free run: a folding tokenizer (MiniLM) must read it whole."""
    return random.Random(3).randbytes(SIZE // 2).hex()[:SIZE]


TEXTS = {"english": english, "base64": base64_text, "hex": hex_text}


def _rss_kb(field: str) -> int:
    with open("/proc/self/status") as status:
        for line in status:
            if line.startswith(field):
                return int(line.split()[1])
    return 0


def run_case(tokenizer_kind: str, text_kind: str, mode: str) -> dict[str, object]:
    from gateway.text import InputTooLong, TextEncoder
    from tests.gateway.text import tokenizers_for_tests

    tokenizer = tokenizers_for_tests.BUILDERS[tokenizer_kind]()
    encoder = TextEncoder(tokenizer)
    encoder.encode("warm " * 2000, max_tokens=BUDGET, overflow="truncate")  # probe once
    text = TEXTS[text_kind]()
    plain = encoder._tokenizer
    with open("/proc/self/clear_refs", "w") as clear:
        clear.write("5")  # resets VmHWM, so the peak below is this case's own
    baseline = _rss_kb("VmRSS")
    start = time.perf_counter()
    outcome: str
    if mode == "whole":
        outcome = f"{len(plain.encode(text, add_special_tokens=False).ids)} tokens"
    else:
        try:
            result = encoder.encode(text, max_tokens=BUDGET, overflow="truncate" if mode == "truncate" else "reject")
            outcome = f"{len(result.ids)} ids, tokens={result.tokens}, lower_bound={result.tokens_lower_bound}"
        except InputTooLong as failure:
            outcome = f"{failure.code}: {failure.message}"
    seconds = time.perf_counter() - start
    peak = _rss_kb("VmHWM")
    return {
        "tokenizer": tokenizer_kind,
        "text": text_kind,
        "mode": mode,
        "seconds": round(seconds, 4),
        "peak_growth_mib": round((peak - baseline) / 1024, 1),
        "outcome": outcome,
    }


def main() -> None:
    if len(sys.argv) == 4:
        print(json.dumps(run_case(*sys.argv[1:])))
        return
    for tokenizer_kind in ("minilm", "gpt2_bpe"):
        for text_kind in TEXTS:
            for mode in ("truncate", "reject", "whole"):
                command = [sys.executable, "-m", "tests.gateway.text.bench_long_inputs"]
                out = subprocess.run([*command, tokenizer_kind, text_kind, mode], capture_output=True, text=True)
                print(out.stdout.strip() or out.stderr.strip()[-500:], flush=True)


if __name__ == "__main__":
    main()
