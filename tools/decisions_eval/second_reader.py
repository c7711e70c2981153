"""A second, blind reader of the presets' held-out v2 lines, and its agreement with the first labels.

Accuracy against one author's labels cannot be read more precisely than those labels are right: a preset whose
labels two readers agree on only 85 % of the time cannot be measured at 0.90 with confidence. So a second reader
labels every `heldout2` line without seeing the first labels, and `compare` reports how far the two agree.

    python tools/decisions_eval/second_reader.py export [--out /tmp/heldout2_blind.jsonl]
    python tools/decisions_eval/second_reader.py compare LABELS.jsonl [--markdown FILE]

`export` writes, per `heldout2` line, only an opaque key, the preset and the state's text parts: no `expected`, no
`why`, no `hard` tag, no `lang` (it is the answer of the `language` preset) and not the line's `id` either, because
ids carry slugs that name the answer (`language-en-v2-ot-…` is an `other` line). The key is the first 12 hex digits
of sha256(id), so `compare` can find the line again; lines are listed per preset in key order, not file order (the
file groups lines by answer). The file goes to /tmp, outside the repository, so that it is never mistaken for data.

`compare` reads a labels file (one JSON object per line: `key` — or `id` — and `label`, optional `note`) and prints,
per preset and per language (`lang` of the first labels' file), raw agreement and Cohen's kappa with a 95 % bootstrap
interval, then every disagreement with both labels. It changes no label: disagreements are for a later adjudication.
"""

from __future__ import annotations

import argparse
import hashlib
import json
import sys
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

PRESETS = Path(__file__).resolve().parent / "presets"
SPLIT = "heldout2"
EXPORT = Path("/tmp/heldout2_blind.jsonl")
BOOTSTRAP = 2000
SEED = 22


def key_of(line_id: str) -> str:
    """An opaque handle for a line: ids name their answer, keys do not."""
    return hashlib.sha256(line_id.encode()).hexdigest()[:12]


def heldout_lines(folder: Path = PRESETS) -> list[dict[str, Any]]:
    """Every `heldout2` line of every preset file, as written (the first reader's labels included)."""
    rows = []
    for path in sorted(folder.glob("*.jsonl")):
        for text in path.read_text(encoding="utf-8").splitlines():
            if text.strip():
                row = json.loads(text)
                if row.get("split") == SPLIT:
                    rows.append(row)
    return rows


def blind(rows: Sequence[Mapping[str, Any]]) -> list[dict[str, Any]]:
    """What the second reader may see: key, preset and the text parts; per preset in key order."""
    out = [{"key": key_of(str(r["id"])), "preset": r["preset"], "state": r["state"]} for r in rows]
    return sorted(out, key=lambda r: (r["preset"], r["key"]))


def export(out: Path, folder: Path = PRESETS) -> int:
    lines = blind(heldout_lines(folder))
    out.write_text("".join(json.dumps(r, ensure_ascii=False) + "\n" for r in lines), encoding="utf-8")
    return len(lines)


# ---------------------------------------------------------------- agreement


def cohen_kappa(a: Sequence[Any], b: Sequence[Any]) -> float:
    """(p_o - p_e) / (1 - p_e) over the labels either reader used; 1.0 when both used one and the same label."""
    labels = sorted({*map(str, a), *map(str, b)})
    index = {label: i for i, label in enumerate(labels)}
    table = np.zeros((len(labels), len(labels)))
    for x, y in zip(a, b, strict=True):
        table[index[str(x)], index[str(y)]] += 1
    n = table.sum()
    observed = np.trace(table) / n
    expected = float((table.sum(0) * table.sum(1)).sum() / (n * n))
    return 1.0 if expected == 1.0 else float((observed - expected) / (1 - expected))


@dataclass
class Agreement:
    """Agreement of two readers on one group of lines."""

    n: int
    agree: int
    kappa: float
    kappa_low: float
    kappa_high: float

    @property
    def raw(self) -> float:
        return self.agree / self.n if self.n else float("nan")


def agreement(first: Sequence[Any], second: Sequence[Any], rounds: int = BOOTSTRAP, seed: int = SEED) -> Agreement:
    """Raw agreement and kappa, the kappa's 95 % interval by a percentile bootstrap over lines."""
    n = len(first)
    agree = sum(str(x) == str(y) for x, y in zip(first, second, strict=True))
    kappa = cohen_kappa(first, second)
    rng = np.random.default_rng(seed)
    draws = [cohen_kappa([first[i] for i in pick], [second[i] for i in pick])
             for pick in rng.integers(0, n, size=(rounds, n))]
    low, high = np.percentile(draws, [2.5, 97.5])
    return Agreement(n, agree, kappa, float(low), float(high))


def read_labels(path: Path) -> dict[str, dict[str, Any]]:
    """Key → the second reader's line; a line may name the first file's `id` instead of its key."""
    out: dict[str, dict[str, Any]] = {}
    for number, text in enumerate(path.read_text(encoding="utf-8").splitlines(), 1):
        if not text.strip():
            continue
        row = json.loads(text)
        key = row.get("key") or key_of(str(row["id"]))
        if key in out:
            raise ValueError(f"{path}:{number}: key {key} labelled twice")
        out[key] = row
    return out


def compare(labels: Mapping[str, Mapping[str, Any]], rows: Sequence[Mapping[str, Any]]) -> str:
    """The agreement table (per preset and language, then all) and the list of disagreements, as markdown."""
    by_key = {key_of(str(r["id"])): r for r in rows}
    missing = sorted(set(by_key) - set(labels))
    unknown = sorted(set(labels) - set(by_key))
    if missing or unknown:
        raise ValueError(f"labels do not cover the heldout2 lines: {len(missing)} missing, {len(unknown)} unknown")
    out = ["| preset | lang | n | raw agreement | Cohen's kappa [95 % bootstrap] |", "|---|---|---:|---:|---|"]
    presets = sorted({str(r["preset"]) for r in rows})
    for preset in presets:
        mine = [r for r in rows if r["preset"] == preset]
        for lang in [*sorted({str(r.get("lang", "en")) for r in mine}), "all"]:
            group = [r for r in mine if lang == "all" or r.get("lang", "en") == lang]
            a = agreement([r["expected"] for r in group], [labels[key_of(str(r["id"]))]["label"] for r in group])
            out.append(f"| {preset} | {lang} | {a.n} | {a.agree}/{a.n} = {a.raw:.3f} | {a.kappa:.3f} "
                       f"[{a.kappa_low:.2f}, {a.kappa_high:.2f}] |")
    out += ["", "Disagreements (first label → second label):", "",
            "| preset | id | lang | first | second | second reader's note |", "|---|---|---|---|---|---|"]
    for r in sorted(rows, key=lambda r: (r["preset"], r["id"])):
        second = labels[key_of(str(r["id"]))]
        if str(second["label"]) != str(r["expected"]):
            note = str(second.get("note", "")).replace("|", "/")
            out.append(f"| {r['preset']} | `{r['id']}` | {r.get('lang', 'en')} | {json.dumps(r['expected'])} | "
                       f"{json.dumps(second['label'])} | {note} |")
    return "\n".join(out) + "\n"


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    sub = parser.add_subparsers(dest="command", required=True)
    ex = sub.add_parser("export", help="the blind file the second reader labels")
    ex.add_argument("--out", type=Path, default=EXPORT)
    cmp = sub.add_parser("compare", help="agreement of a labels file with the first labels")
    cmp.add_argument("labels", type=Path)
    cmp.add_argument("--markdown", type=Path, help="also write the report to this file")
    args = parser.parse_args(argv)
    if args.command == "export":
        print(f"{export(args.out)} heldout2 lines → {args.out}")
        return 0
    report = compare(read_labels(args.labels), heldout_lines())
    print(report)
    if args.markdown:
        args.markdown.write_text(report, encoding="utf-8")
    return 0


if __name__ == "__main__":
    sys.exit(main())
