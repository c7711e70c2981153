"""Check the trained presets' labelled data (issue 22) against the shared line format, with no model.

The heads fitted on these files are only as good as the files, and seven presets are written by different people, so
one pure-Python check keeps every file to the same contract: the fields and their types, answers that are valid for
the preset, unique ids, enough lines per split, enough Chinese per split, balanced answers, enough hard cases, and no
state that appears twice (above all, never in both `train` and the held-out split, which would leak the held-out
part).

Run: `python tools/decisions_eval/check_presets.py [folder]` — prints one table row per preset and split, then the
problems; exits 1 when there is any problem.

Thresholds (from the lead's format note for issue 22):
- per preset ≥ 160 `train` and ≥ 60 lines in its current held-out split, the newest it has: `heldout15`
  (relevance, grounded: held-out v14), `heldout3` (pii: held-out v3), else `heldout2`. A seen held-out part becomes
  `train` lines marked `moved_from` with its split's name (v1 `heldout`, seen 2026-12-01 16:22 UTC; v2 `heldout2`
  of the presets that have a v3; v3 `heldout3` of relevance, once v7 was written; v7 `heldout7` of relevance and
  v3 `heldout3` of grounded, once v10 was written; v10 `heldout10` of both, once v11 was written; v11 `heldout11`
  of both, once v12 was written; v12 `heldout12` of both, once v13 was written; v13 `heldout13` of both, once v14
  was written), and a preset holds lines of one held-out split only;
- per split, Chinese share ≥ 45 %, where a `zh` line counts 1 and a `mixed` line counts ½;
- balance: in each split, every answer (noul: true/false; choice: every key; score: every level) has a share within
  ±15 percentage points of the even share 1/k, and appears at least once;
- no state in both splits (compared case- and whitespace-insensitively), and for two-part presets no single part
  (request, candidate, context, answer, question) in both splits either;
- no state or part that is also the state (or a part) of a zero-shot evaluation item in `../items.jsonl`,
  `../items_zh.jsonl`, `../items_heldout2.jsonl` or `../items_heldout3.jsonl`, since training data, fit items and
  held-out items must be disjoint;
- ≥ 25 % of a preset's lines carry a non-empty `hard` tag.
"""

from __future__ import annotations

import hashlib
import json
import re
import sys
from collections import Counter
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

PRESETS_DIR = Path(__file__).resolve().parent / "presets"

# newest first; v1 `heldout` lines were seen (16:22 UTC run) and moved to train
HELDOUT = ("heldout18", "heldout17", "heldout16", "heldout15", "heldout14", "heldout13", "heldout12", "heldout11",
           "heldout10", "heldout7", "heldout3", "heldout2")
SPLITS = ("train", *HELDOUT)
LANGS = ("en", "zh", "mixed")
MIN_LINES = {"train": 160, "heldout2": 60, "heldout3": 60, "heldout7": 60, "heldout10": 60, "heldout11": 60,
             "heldout12": 60, "heldout13": 60, "heldout14": 60, "heldout15": 60, "heldout16": 60, "heldout17": 60,
             "heldout18": 60}
MIN_CHINESE_SHARE = 0.45
BALANCE_TOLERANCE = 0.15
MIN_HARD_SHARE = 0.25

DOMAIN_KEYS = ("code", "math", "science", "health", "legal", "finance", "travel", "other")
LANGUAGE_KEYS = ("en", "zh", "mixed", "other")


@dataclass(frozen=True)
class PresetSpec:
    """What one preset's lines must look like: its type, the parts of an object state, and its valid answers."""

    name: str
    type: str  # noul | choice | score
    parts: tuple[str, ...] = ()  # required parts of an object state; () means a single text
    optional_parts: tuple[str, ...] = ()
    answers: tuple[Any, ...] = ()


PRESETS: dict[str, PresetSpec] = {
    "jailbreak": PresetSpec("jailbreak", "noul", answers=(True, False)),
    "pii": PresetSpec("pii", "noul", answers=(True, False)),
    "domain": PresetSpec("domain", "choice", answers=DOMAIN_KEYS),
    "language": PresetSpec("language", "choice", answers=LANGUAGE_KEYS),
    "relevance": PresetSpec("relevance", "noul", parts=("request", "candidate"), answers=(True, False)),
    "grounded": PresetSpec(
        "grounded", "noul", parts=("context", "answer"), optional_parts=("question",), answers=(True, False)
    ),
    "difficulty": PresetSpec("difficulty", "score", answers=(0, 1, 2)),
}

REQUIRED_KEYS = ("id", "preset", "lang", "split", "state", "expected", "source", "why")
OPTIONAL_KEYS = ("hard", "moved_from")
# a train line that was a (seen) held-out line says which
MOVED_FROM = ("heldout", "heldout2", "heldout3", "heldout7", "heldout10", "heldout11",
              "heldout12", "heldout13", "heldout14", "heldout15", "heldout16", "heldout17")
SOURCE_RE = re.compile(r"^written for sr-gateway by .+, \d{4}-\d{2}-\d{2}$")
SLUG_RE = re.compile(r"^[a-z0-9]+(?:-[a-z0-9]+)*$")


@dataclass
class Report:
    """The outcome for one preset file: per-split counts for the table and the problems found."""

    preset: str
    lines: list[dict[str, Any]] = field(default_factory=list)
    problems: list[str] = field(default_factory=list)

    def split_lines(self, split: str) -> list[dict[str, Any]]:
        return [row for row in self.lines if row.get("split") == split]


def chinese_share(rows: list[dict[str, Any]]) -> float:
    """Share of Chinese in `rows`: `zh` counts 1, `mixed` ½ (the format note's rule)."""
    if not rows:
        return 0.0
    weight = sum(1.0 if r.get("lang") == "zh" else 0.5 if r.get("lang") == "mixed" else 0.0 for r in rows)
    return weight / len(rows)


def state_key(state: Any) -> str:
    """A comparable form of a state, so that whitespace or key order cannot hide a duplicate."""
    if isinstance(state, str):
        return " ".join(state.split()).casefold()
    if isinstance(state, dict):
        return json.dumps(
            {k: " ".join(str(v).split()).casefold() for k, v in sorted(state.items())}, ensure_ascii=False
        )
    return json.dumps(state, ensure_ascii=False)


def _check_state(spec: PresetSpec, state: Any, where: str) -> list[str]:
    if not spec.parts:
        if not isinstance(state, str) or not state.strip():
            return [f"{where}: state must be a non-empty string for preset {spec.name}"]
        return []
    if not isinstance(state, dict):
        return [f"{where}: state must be an object with parts {list(spec.parts)}"]
    problems = []
    missing = [p for p in spec.parts if p not in state]
    extra = [p for p in state if p not in spec.parts + spec.optional_parts]
    if missing:
        problems.append(f"{where}: state lacks parts {missing}")
    if extra:
        problems.append(f"{where}: state has unknown parts {extra}")
    bad = [k for k, v in state.items() if not isinstance(v, str) or not v.strip()]
    if bad:
        problems.append(f"{where}: state parts {bad} must be non-empty strings")
    return problems


def _check_expected(spec: PresetSpec, expected: Any, where: str) -> list[str]:
    if spec.type == "noul":
        ok = isinstance(expected, bool)
    elif spec.type == "score":
        ok = isinstance(expected, int) and not isinstance(expected, bool) and expected in spec.answers
    else:
        ok = isinstance(expected, str) and expected in spec.answers
    return [] if ok else [f"{where}: expected {expected!r} is not valid for {spec.name} ({list(spec.answers)})"]


def check_line(spec: PresetSpec, row: Any, where: str) -> list[str]:
    """Every problem with one parsed line, as readable messages."""
    if not isinstance(row, dict):
        return [f"{where}: a line must be a JSON object"]
    problems = [f"{where}: missing field {k!r}" for k in REQUIRED_KEYS if k not in row]
    problems += [f"{where}: unknown field {k!r}" for k in row if k not in REQUIRED_KEYS + OPTIONAL_KEYS]
    if problems:
        return problems
    if row["preset"] != spec.name:
        problems.append(f"{where}: preset {row['preset']!r} in the file of {spec.name!r}")
    if row["lang"] not in LANGS:
        problems.append(f"{where}: lang {row['lang']!r} is not one of {list(LANGS)}")
    if row["split"] not in SPLITS:
        problems.append(f"{where}: split {row['split']!r} is not one of {list(SPLITS)}")
    ident = row["id"]
    prefix = f"{spec.name}-{row['lang']}-"
    if not isinstance(ident, str) or not ident.startswith(prefix) or not SLUG_RE.match(ident[len(prefix) :]):
        problems.append(f"{where}: id {ident!r} is not '{prefix}<short-slug>' (lower-case letters, digits, hyphens)")
    problems += _check_state(spec, row["state"], where)
    problems += _check_expected(spec, row["expected"], where)
    if not isinstance(row["source"], str) or not SOURCE_RE.match(row["source"]):
        problems.append(f"{where}: source must read 'written for sr-gateway by <who>, <YYYY-MM-DD>'")
    if not isinstance(row["why"], str) or not row["why"].strip():
        problems.append(f"{where}: why must be a non-empty sentence")
    if "hard" in row and (not isinstance(row["hard"], str) or not row["hard"].strip()):
        problems.append(f"{where}: hard, when present, must be a non-empty tag")
    if "moved_from" in row and (row["moved_from"] not in MOVED_FROM or row["split"] != "train"):
        problems.append(f"{where}: moved_from is only for train lines that were {list(MOVED_FROM)} lines")
    return problems


ITEM_FILES = ("items.jsonl", "items_zh.jsonl", "items_heldout2.jsonl", "items_heldout3.jsonl")


def item_texts(folder: Path) -> dict[str, str]:
    """Every state text and state part of the zero-shot evaluation items in `folder`, mapped to an item id.

    Preset training data, zero-shot fit items and held-out items must be disjoint (issue 22), so a preset line that
    reuses an item's text would let a trained head see part of the evaluation.
    """
    texts: dict[str, str] = {}
    for name in ITEM_FILES:
        path = folder / name
        if not path.exists():
            continue
        for text in path.read_text(encoding="utf-8").splitlines():
            if not text.strip():
                continue
            item = json.loads(text)
            state = item.get("state")
            values = state.values() if isinstance(state, dict) else [state]
            for value in values:
                if isinstance(value, str) and value.strip():
                    texts.setdefault(state_key(value), str(item.get("id")))
    return texts


def check_file(path: Path, spec: PresetSpec, items: dict[str, str] | None = None) -> Report:
    """Check one preset file: each line, then the file-level rules (ids, counts, shares, balance, duplicates).

    `items` (from `item_texts`) adds the check that no state or part is also an evaluation item's text.
    """
    report = Report(spec.name)
    if not path.exists():
        report.problems.append(f"{path.name}: missing (every preset in the format note needs its file)")
        return report
    for number, text in enumerate(path.read_text(encoding="utf-8").splitlines(), start=1):
        where = f"{path.name}:{number}"
        if not text.strip():
            report.problems.append(f"{where}: empty line")
            continue
        try:
            row = json.loads(text)
        except json.JSONDecodeError as exc:
            report.problems.append(f"{where}: not JSON ({exc.msg})")
            continue
        line_problems = check_line(spec, row, where)
        report.problems += line_problems
        if not line_problems:
            report.lines.append(row)

    ids = Counter(row["id"] for row in report.lines)
    report.problems += [f"{path.name}: id {i!r} appears {n} times" for i, n in ids.items() if n > 1]

    seen: dict[str, dict[str, Any]] = {}
    for row in report.lines:
        key = state_key(row["state"])
        if key in seen:
            first = seen[key]
            kind = f"in both {first['split']} and {row['split']}" if first["split"] != row["split"] else "twice"
            report.problems.append(f"{path.name}: the same state appears {kind}: {first['id']} and {row['id']}")
        else:
            seen[key] = row

    for row in report.lines:
        state = row["state"]
        for value in state.values() if isinstance(state, dict) else [state]:
            if items and state_key(value) in items:
                report.problems.append(
                    f"{path.name}: {row['id']} reuses the text of evaluation item {items[state_key(value)]}"
                )

    if spec.parts:  # a held-out pair that reuses a training part (context, candidate…) leaks it too
        part_splits: dict[tuple[str, str], dict[str, str]] = {}
        for row in report.lines:
            for part, value in row["state"].items():
                part_splits.setdefault((part, state_key(value)), {}).setdefault(row["split"], row["id"])
        for (part, _), by_split in part_splits.items():
            if len(by_split) > 1:
                held = next(by_split[s] for s in HELDOUT if s in by_split)
                others = ", ".join(f"{s} ({i})" for s, i in by_split.items() if i != held)
                report.problems.append(f"{path.name}: part {part!r} of {held} also appears in {others}")

    present = [split for split in HELDOUT if report.split_lines(split)]
    if len(present) > 1:
        report.problems.append(f"{path.name}: lines in {' and '.join(present)}: only the newest held-out split may "
                               f"hold lines; move the seen one's lines to train with moved_from")
    current = present[0] if present else HELDOUT[-1]
    for split in ("train", current):
        rows = report.split_lines(split)
        if len(rows) < MIN_LINES[split]:
            report.problems.append(f"{path.name}: {split} has {len(rows)} lines, needs ≥ {MIN_LINES[split]}")
        if not rows:
            continue
        share = chinese_share(rows)
        if share < MIN_CHINESE_SHARE:
            report.problems.append(f"{path.name}: {split} is {share:.0%} Chinese, needs ≥ {MIN_CHINESE_SHARE:.0%}")
        answers = Counter(json.dumps(r["expected"]) for r in rows)
        even = 1 / len(spec.answers)
        for answer in spec.answers:
            got = answers[json.dumps(answer)] / len(rows)
            if got == 0 or abs(got - even) > BALANCE_TOLERANCE:
                report.problems.append(
                    f"{path.name}: {split} answer {answer!r} is {got:.0%} of lines, "
                    f"needs {max(even - BALANCE_TOLERANCE, 0):.0%}–{even + BALANCE_TOLERANCE:.0%} and at least one"
                )

    if report.lines:
        hard = sum(1 for r in report.lines if r.get("hard")) / len(report.lines)
        if hard < MIN_HARD_SHARE:
            report.problems.append(f"{path.name}: {hard:.0%} of lines are tagged hard, needs ≥ {MIN_HARD_SHARE:.0%}")
    return report


def split_sha256(folder: Path = PRESETS_DIR, split: str = "heldout2") -> dict[str, str]:
    """sha256 of each preset's `split` lines (as written, in file order): RUNS.md records the held-out part's checksum
    before any model reads it, so a later edit to it shows."""
    out = {}
    for name in PRESETS:
        path = folder / f"{name}.jsonl"
        text = path.read_text(encoding="utf-8").splitlines()
        lines = [t for t in text if t.strip() and json.loads(t)["split"] == split]
        out[name] = hashlib.sha256(("\n".join(lines) + "\n").encode()).hexdigest()
    return out


def check_folder(folder: Path = PRESETS_DIR) -> list[Report]:
    """Check the file of every preset in the format note; a missing file is a problem, not a skip.

    The evaluation items are read from the folder above (`tools/decisions_eval/items*.jsonl` for the real folder).
    """
    items = item_texts(folder.parent)
    return [check_file(folder / f"{name}.jsonl", spec, items) for name, spec in PRESETS.items()]


def table(reports: list[Report]) -> str:
    """One row per preset and split: lines, languages, Chinese share, hard share and the answer counts."""
    head = f"{'preset':<11} {'split':<8} {'lines':>5} {'en':>4} {'zh':>4} {'mixed':>5} {'zh%':>5} {'hard%':>6}  answers"
    out = [head, "-" * len(head)]
    for report in reports:
        for split in SPLITS:
            rows = report.split_lines(split)
            if not rows:
                out.append(f"{report.preset:<11} {split:<8} {0:>5}  (no lines)")
                continue
            langs = Counter(r["lang"] for r in rows)
            hard = sum(1 for r in rows if r.get("hard")) / len(rows)
            answers = Counter(r["expected"] for r in rows)
            shown = " ".join(f"{json.dumps(k)}={answers[k]}" for k in PRESETS[report.preset].answers)
            out.append(
                f"{report.preset:<11} {split:<8} {len(rows):>5} {langs['en']:>4} {langs['zh']:>4} "
                f"{langs['mixed']:>5} {chinese_share(rows):>5.0%} {hard:>6.0%}  {shown}"
            )
    return "\n".join(out)


def main(argv: list[str]) -> int:
    folder = Path(argv[1]) if len(argv) > 1 else PRESETS_DIR
    reports = check_folder(folder)
    print(table(reports))
    problems = [p for r in reports for p in r.problems]
    for problem in problems:
        print("PROBLEM", problem)
    print(f"{len(problems)} problem(s) in {folder}")
    return 1 if problems else 0


if __name__ == "__main__":
    sys.exit(main(sys.argv))
