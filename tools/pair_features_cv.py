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

Each is scored exactly as the build scores a head (`sr_build.presets.cross_validate`: the same grouped folds,
penalty and signal-weight grid and served rule) over `train` lines only; held-out lines are never read. The
encoder is the one Triton serves (the ONNX file and tokenizer of the decision-multilingual card's encoder), in
process.
"""

from __future__ import annotations

import argparse
import re
import time
from collections.abc import Callable
from pathlib import Path

import numpy as np

from sr_build.presets import DATA, ROOT, InProcessEncoder, cross_validate, load_lines, texts_of

PRESETS = ("relevance", "grounded")
PREFIXES = ("query: ", "passage: ")
SETS = ("A", "B", "C", "D", "E")
# a sentence or clause ends at CJK or Latin end punctuation (a Latin full stop only before a space: not 3.5 or v1.2)
SENTENCE_END = re.compile(r"(?<=[。！？；!?;])|(?<=[.])\s+|\n+")
Embed = Callable[[list[str]], list[np.ndarray]]


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


def feature_rows(kind: str, texts: list[list[str]], embed: Embed, which: str) -> tuple[np.ndarray, int]:
    """One feature set's rows and its count of trailing signal columns."""
    from gateway.decisions.families.presets import features, signal_count

    signals = signal_count(kind)
    rows: list[np.ndarray] = []
    for first, second in texts:
        raw = embed([first, second])
        prefixed = embed([PREFIXES[0] + first, PREFIXES[1] + second])
        base = features(kind, [first, second], raw)
        head, tail = base[: len(base) - signals], base[len(base) - signals:]
        if which == "A":
            rows.append(base)
        elif which == "B":
            rows.append(features(kind, [first, second], prefixed))
        elif which == "C":
            rows.append(np.concatenate([head, [_cos(*prefixed)], tail]))
        elif which == "D":
            rows.append(np.concatenate([head, embed([first + "\n" + second])[0], tail]))
        else:  # E
            rows.append(np.concatenate([head, alignment(kind, first, second, embed), tail]))
    return np.stack(rows), signals + {"C": 1, "E": 2}.get(which, 0)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--presets", default=",".join(PRESETS))
    parser.add_argument("--sets", default=",".join(SETS))
    parser.add_argument("--model-repository", type=Path, default=ROOT / "model_repository")
    args = parser.parse_args()
    from gateway.cards import load_card

    card = load_card(args.model_repository / "decision-multilingual" / "card.yaml")
    assert card.decisions is not None, "decision-multilingual is a decisions card"
    embed = InProcessEncoder(card)
    for preset in args.presets.split(","):
        lines = [line for line in load_lines(DATA / f"{preset}.jsonl") if line["split"] == "train"]
        texts = [texts_of(line, list(card.decisions.presets[preset]["over"])) for line in lines]  # the card's parts
        y = np.asarray([int(bool(line["expected"])) for line in lines])
        langs = [str(line.get("lang")) for line in lines]
        embed([t for pair in texts for t in (*pair, *(p + t for p, t in zip(PREFIXES, pair, strict=True)))])
        for which in args.sets.split(","):
            started = time.monotonic()
            x, signals = feature_rows(preset, texts, embed, which)
            choice = cross_validate(x, y, 2, "noul", [t[0] for t in texts], signals, langs)
            setting = f"k={choice.weight:g} a={choice.alpha:g}" if signals else f"a={choice.alpha:g}"
            print(f"{preset} set {which}: n {len(y)}, features {x.shape[1]}, CV {choice.accuracy:.4f} "
                  f"({setting}), by language {choice.by_lang}, {time.monotonic() - started:.0f} s", flush=True)


if __name__ == "__main__":
    main()
