"""Does the grounded head call an answer copied from its context unsupported?

    python -m tools.extract_probe                                 # cross-validated, train lines only
    python -m tools.extract_probe --split heldout18 --heads A.json [--heads B.json]   # built heads, one split

The grounded train lines were written with faithful answers made by paraphrase and unfaithful ones made by
copying the context and changing one fact, so the unfaithful answers share more of their context's wording than
the faithful ones (character-trigram coverage 0.43 vs 0.31). A head can learn "close to the context, so
unsupported", which is backwards for a retrieval answer quoted from its source. This tool measures that with lines
made by rule from each train context (`sr_build.presets.extracts`): its first sentence of at least 12 characters
copied verbatim (supported by construction) and, where that sentence has an Arabic-digit number, the same sentence
with its first number plus one (unsupported by construction).

Two variants are cross-validated with the build's grouped folds (a context and its probe lines in one fold),
penalty and signal-weight grid and served rule: `served` fits on the original lines only, as the build does;
`augmented` fits on the original lines plus the training folds' probe lines. For each, the setting with the best
CV accuracy on the original lines, that accuracy, and the held-out folds' accuracy on verbatim and on altered
extracts. The plan and its rule are in tools/decisions_eval/RUNS.md (2026-12-07 21:45 UTC). Features are the
served ones (set M: E5 pair features, signals and the LM's state), read as the build reads them. Since REVISION 13
the build itself fits grounded on the extracts too (the decision of 2026-12-07 22:29 UTC).

With `--split`, each given heads artefact (`preset-heads.json`) answers, in process and by the served rule, the
split's written grounded lines and the extracts of their contexts, per language with Wilson 95 % intervals.
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path
from typing import Any

import numpy as np

from sr_build.presets import (
    DATA,
    FOLDS,
    PENALTIES,
    ROOT,
    SIGNAL_WEIGHTS,
    InProcessEncoder,
    extracts,
    fit_softmax,
    folds,
    load_lines,
    standardise,
    weighted_scale,
)
from tools.eval_decisions import wilson


def rows_for(pairs: list[list[str]], embed: InProcessEncoder, lm: InProcessEncoder) -> np.ndarray:
    from gateway.decisions.families import lm_reading
    from gateway.decisions.families.presets import encoder_texts, features

    embed([t for row in pairs for t in encoder_texts("grounded", row)])
    prompts = [lm_reading.prompt(lm.encoder, "grounded", row) for row in pairs]
    states = lm(prompts)
    return np.stack([features("grounded", row, embed(encoder_texts("grounded", row)), state)
                     for row, state in zip(pairs, states, strict=True)])


def evaluate(x: np.ndarray, y: np.ndarray, fold: np.ndarray, px: np.ndarray, py: np.ndarray, pfold: np.ndarray,
             signals: int, augmented: bool) -> dict[str, Any]:
    """Every grid setting's CV on the original lines and held-out-fold accuracy on the probe lines."""
    results: dict[tuple[float, float], dict[str, np.ndarray]] = {}
    for weight in SIGNAL_WEIGHTS:
        for f in range(FOLDS):
            tr, te, pte = fold != f, fold == f, pfold == f
            xtr, ytr = x[tr], y[tr]
            if augmented:
                xtr, ytr = np.vstack([xtr, px[pfold != f]]), np.concatenate([ytr, py[pfold != f]])
            mean, scale = standardise(xtr)
            scale = weighted_scale(scale, signals, weight)
            start = None
            for alpha in sorted(PENALTIES, reverse=True):
                start = fit_softmax((xtr - mean) / scale, ytr, 2, alpha, start)
                slot = results.setdefault((weight, alpha), {"orig": np.zeros(len(y), bool),
                                                            "probe": np.zeros(len(py), bool)})
                for which, rows, want, mask in (("orig", x[te], y[te], te), ("probe", px[pte], py[pte], pte)):
                    z = ((rows - mean) / scale) @ start[0] + start[1]
                    slot[which][mask] = (z[:, 1] >= z[:, 0]).astype(int) == want  # served rule: P(true) ≥ 0.5
    best = max(results, key=lambda k: (results[k]["orig"].mean(), -k[1]))
    hits = results[best]
    true, false = py == 1, py == 0
    return {"setting": f"k={best[0]:g} a={best[1]:g}", "cv": round(float(hits["orig"].mean()), 4),
            "verbatim": round(float(hits["probe"][true].mean()), 4), "verbatim_n": int(true.sum()),
            "altered": round(float(hits["probe"][false].mean()), 4), "altered_n": int(false.sum())}


def cross_validated(embed: InProcessEncoder, lm: InProcessEncoder) -> dict[str, Any]:
    """The run of 2026-12-07 22:28 UTC: served vs augmented, cross-validated on train lines."""
    from gateway.decisions.families.presets import signal_count

    lines = [line for line in load_lines(DATA / "grounded.jsonl") if line["split"] == "train"]
    pairs = [[line["state"]["context"], line["state"]["answer"]] for line in lines]
    y = np.asarray([int(bool(line["expected"])) for line in lines])
    groups = [p[0] for p in pairs]
    contexts = list(dict.fromkeys(groups))
    probe = [(c, answer, ok) for c in contexts for answer, ok in extracts(c)]
    everything = folds(groups + [c for c, _, _ in probe])  # one fold map for both: folds() is per group
    fold, pfold = everything[:len(groups)], everything[len(groups):]
    x = rows_for(pairs, embed, lm)
    px = rows_for([[c, a] for c, a, _ in probe], embed, lm)
    py = np.asarray([int(ok) for _, _, ok in probe])
    signals = signal_count("grounded")
    return {"lines": len(lines), "contexts": len(contexts), "probe_lines": len(probe),
            "served": evaluate(x, y, fold, px, py, pfold, signals, augmented=False),
            "augmented": evaluate(x, y, fold, px, py, pfold, signals, augmented=True)}


def scored(split: str, artefacts: list[Path], embed: InProcessEncoder, lm: InProcessEncoder) -> dict[str, Any]:
    """Each artefact's grounded head on a split's written lines and on the extracts of their contexts."""
    from gateway.decisions.families.presets import load_heads

    lines = [line for line in load_lines(DATA / "grounded.jsonl") if line["split"] == split]
    if not lines:
        raise SystemExit(f"no grounded line has split {split!r}")
    languages: dict[str, str] = {}
    for line in lines:
        languages.setdefault(line["state"]["context"], str(line.get("lang")))
    made = [(c, a, ok, lang) for c, lang in languages.items() for a, ok in extracts(c)]
    sets = {"written": ([[ln["state"]["context"], ln["state"]["answer"]] for ln in lines],
                        [bool(ln["expected"]) for ln in lines], [str(ln.get("lang")) for ln in lines]),
            "verbatim": ([[c, a] for c, a, ok, _ in made if ok], [True for m in made if m[2]],
                         [lang for _, _, ok, lang in made if ok]),
            "altered": ([[c, a] for c, a, ok, _ in made if not ok], [False for m in made if not m[2]],
                        [lang for _, _, ok, lang in made if not ok])}
    rows = {name: rows_for(pairs, embed, lm) for name, (pairs, _, _) in sets.items()}
    out: dict[str, Any] = {}
    for path in artefacts:
        head = load_heads(path)[0]["grounded"]
        true = head.keys.index("true")
        report: dict[str, Any] = {}
        for name, (_, want, langs) in sets.items():
            hits = np.asarray([(head.probabilities(row)[true] >= 0.5) == w for row, w in zip(rows[name], want,
                                                                                              strict=True)])
            for lang in ["all", *sorted(set(langs))]:
                mask = np.ones(len(hits), bool) if lang == "all" else np.asarray([g == lang for g in langs])
                n, right = int(mask.sum()), int(hits[mask].sum())
                low, high = wilson(right, n)
                report[f"{name} {lang}"] = f"{right / n:.2f} [{low:.2f}, {high:.2f}] n={n}"
        out[str(path)] = report
    return out


def main() -> None:  # pragma: no cover - a measurement run
    from gateway.cards import discover, load_card

    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--split", help="score built heads on this split of grounded.jsonl instead")
    parser.add_argument("--heads", type=Path, action="append", default=[], help="a preset-heads.json (repeatable)")
    args = parser.parse_args()
    card = load_card(ROOT / "model_repository" / "decision-multilingual" / "card.yaml")
    assert card.decisions is not None
    reader_id = card.decisions.parameters["presets"]["reader"]
    reader = next(c for c in discover(ROOT / "model_repository") if c.id == reader_id)
    embed, lm = InProcessEncoder(card), InProcessEncoder(reader, served=True)
    out = scored(args.split, args.heads, embed, lm) if args.split else cross_validated(embed, lm)
    print(json.dumps(out, indent=1, ensure_ascii=False))


if __name__ == "__main__":
    main()
