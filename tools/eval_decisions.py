"""Accuracy of the served decisions families on the labelled sets, by the served rule, beside trivial baselines.

    python -m tools.eval_decisions --all [--url http://127.0.0.1:8080] [--split heldout] [--markdown FILE]
    python -m tools.eval_decisions --all --split heldout2 [--sets adhoc|presets]   (held-out v2 of either or both)
    python -m tools.eval_decisions --all --split heldout3 --sets presets   (held-out v3: pii, relevance, grounded)
    python -m tools.eval_decisions --all --split heldout6 --sets adhoc   (Chinese span held-out v6, per label; v5, v4)
    python -m tools.eval_decisions --all --split heldout7   (held-out v7: Chinese spans and the relevance preset)
    python -m tools.eval_decisions --all --split heldout8 --sets adhoc   (Chinese span held-out v8)
    python -m tools.eval_decisions --all --split heldout9 --sets adhoc   (Chinese span held-out v9)
    python -m tools.eval_decisions --all --split heldout10 --sets presets   (held-out v10: relevance and grounded)
    python -m tools.eval_decisions --all --split heldout11 --sets presets   (held-out v11: relevance and grounded)
    python -m tools.eval_decisions --all --split heldout12 --sets presets   (held-out v12: relevance and grounded)
    python -m tools.eval_decisions --all --split heldout13 --sets presets   (held-out v13: relevance and grounded)
    python -m tools.eval_decisions --all --split heldout14 --sets presets   (held-out v14: relevance and grounded)
    python -m tools.eval_decisions --all --split heldout15 --sets presets   (held-out v15: relevance and grounded)
    python -m tools.eval_decisions --all --split heldout16 --sets presets   (held-out v16: relevance and grounded)
    python -m tools.eval_decisions --all --split heldout17 --sets presets   (held-out v17: relevance and grounded)
    python -m tools.eval_decisions --all --split heldout18 --sets presets   (held-out v18: grounded; relevance sealed)
    python -m tools.eval_decisions --all --split adhoc3 --sets adhoc   (ad-hoc held-out v3: choice, noul, set, score)
    python -m tools.eval_decisions --url URL --model decision-zeroshot [--split heldout]      (one model, items only)

Sets (`tools/decisions_eval/`): `items.jsonl` (English ad-hoc items), `items_zh.jsonl` (bilingual ad-hoc items),
`spans_zh.jsonl` (Chinese span items), `items_heldout2.jsonl` (ad-hoc held-out v2: new questions and states,
written after the `heldout` items were seen; scored once, then moved to `fit` with v1's ad-hoc items, 2026-12-07),
`items_heldout3.jsonl` (ad-hoc held-out v3, split `adhoc3`; `fit_decisions` never reads it) — all in the item
format — and
`presets/<preset>.jsonl` (the trained presets' data; the `heldout2` lines are scored — held-out v2, written after
the v1 `heldout` lines were seen and moved to `train` — and `train` lines give the majority baseline). Without
`--url`, `--all` starts `sr-gateway serve` for the models it needs (the two decisions models, pii-rampart, which
decision-zeroshot reads through, and qwen-coder-state, which decision-multilingual's relevance and grounded heads
read) and stops it afterwards.

Families side by side (FAMILIES): MiniLM zero-shot (`decision-zeroshot`, the preset's definition asked as an ad-hoc
question), multilingual zero-shot (`decision-multilingual`, the same ad-hoc question) and trained presets
(`decision-multilingual`, the bare `{"type", "preset"}` question; preset data only).

Scoring is the served rule:
- choice: the answered `choice` equals the expected key; noul: `noul ≥ 0.5` equals the expected boolean;
- score: the served score (the expected level Σ p_i·i) rounded half up equals the expected level;
- set: the selected labels equal the expected set exactly;
- span: a found span is right only when its label, its text AND its offsets are the expected span's (offsets in code
  points of the part read; an expected span without offsets accepts any occurrence of its text there); an item is
  right when every expected span is found and nothing else is.
A question answered with an error counts as wrong. Every proportion has a Wilson 95 % interval. Baselines need no
model: majority (the fit/train split's most frequent answer), first option, middle level, empty set — per type and
per language. Each run appends a line to `tools/decisions_eval/RUNS.md` (when, split, models, data checksums).
"""

from __future__ import annotations

import argparse
import datetime as dt
import hashlib
import json
import math
import socket
import subprocess
import sys
import time
from collections import Counter
from collections.abc import Iterable, Iterator, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import httpx
import yaml

HERE = Path(__file__).resolve().parent / "decisions_eval"
ROOT = HERE.parents[1]
ITEMS = HERE / "items.jsonl"
# ad-hoc held-out v2, written as `heldout2`; scored 2026-12-01, then moved to `fit` (2026-12-07, `moved_from`)
ITEMS_V2 = HERE / "items_heldout2.jsonl"
ITEMS_V3 = HERE / "items_heldout3.jsonl"  # ad-hoc held-out v3: only `adhoc3` items, never read by the fit
SPANS_V4 = HERE / "spans_zh_v4.jsonl"  # Chinese span held-out v4: only `heldout4` items, written after v1's were seen
SPANS_V5 = HERE / "spans_zh_v5.jsonl"  # Chinese span held-out v5: only `heldout5` items, written after v4 was seen
SPANS_V6 = HERE / "spans_zh_v6.jsonl"  # Chinese span held-out v6: only `heldout6` items, written after v5 was seen
SPANS_V7 = HERE / "spans_zh_v7.jsonl"  # Chinese span held-out v7: only `heldout7` items, written after v6 was seen
SPANS_V8 = HERE / "spans_zh_v8.jsonl"  # Chinese span held-out v8: only `heldout8` items, written after v7 was seen
SPANS_V9 = HERE / "spans_zh_v9.jsonl"  # Chinese span held-out v9: only `heldout9` items, written after v8 was seen
ITEM_FILES = (HERE / "items.jsonl", HERE / "items_zh.jsonl", HERE / "spans_zh.jsonl", ITEMS_V2, ITEMS_V3, SPANS_V4,
              SPANS_V5, SPANS_V6, SPANS_V7, SPANS_V8, SPANS_V9)
PRESETS = HERE / "presets"
RUNS = HERE / "RUNS.md"
MULTILINGUAL = "decision-multilingual"
DEFAULT_MODEL = "decision-zeroshot"
BATCH = 16
QUESTION_ID = "q"
TYPES = ("choice", "noul", "score", "set", "span")
SPLITS = ("fit", "heldout", "heldout2", "heldout3", "heldout4", "heldout5", "heldout6", "heldout7",
          "heldout8", "heldout9", "heldout10", "heldout11", "heldout12",
          "heldout13", "heldout14", "heldout15", "heldout16", "heldout17", "heldout18", "adhoc3")  # v2 written
#   after `heldout` was seen; v3 (pii, relevance, grounded presets) after v2 was; v4 (Chinese spans, per label) after
#   v3 was; v5 and v6 (Chinese spans again) each after the one before was scored and became the recognisers' dev
#   set; v7 (Chinese spans and the relevance preset) after v6 and relevance's v3 were; v8 (Chinese spans) after v7
SETS = ("all", "adhoc", "presets")  # which sets a `--all` run scores
REQUIRED = {"id", "split", "state", "question", "expected"}
OPTIONAL = {"lang", "question_id", "source", "why", "hard", "moved_from"}  # moved_from: a seen held-out's split
FIT_SHARE = 0.4
# (column, model, how a preset line is asked): the families compared side by side
FAMILIES = (("MiniLM zero-shot", DEFAULT_MODEL, "adhoc"), ("multilingual zero-shot", MULTILINGUAL, "adhoc"),
            ("trained presets", MULTILINGUAL, "preset"))
SERVED = f"{DEFAULT_MODEL},{MULTILINGUAL},pii-rampart,qwen-coder-state"

Item = dict[str, Any]
Entry = dict[str, Any]  # one `states.<name>` of a decisions response


# ---------------------------------------------------------------- items


def load_items(path: Path = ITEMS) -> list[Item]:
    items = [json.loads(line) for line in path.read_text(encoding="utf-8").splitlines() if line.strip()]
    for item in items:
        validate_item(item)
    ids = Counter(item["id"] for item in items)
    duplicated = [i for i, n in ids.items() if n > 1]
    if duplicated:
        raise ValueError(f"duplicate item ids: {duplicated}")
    return items


def load_all(paths: Iterable[Path] = ITEM_FILES) -> list[Item]:
    """Every item file that exists, English items defaulting to lang `en`; ids unique across files."""
    items = [{"lang": "en", **i} for p in paths if p.is_file() for i in load_items(p)]
    ids = Counter(item["id"] for item in items)
    if any(n > 1 for n in ids.values()):
        raise ValueError(f"duplicate item ids across files: {[i for i, n in ids.items() if n > 1]}")
    return items


def question_type(item: Item) -> str:
    return str(item["question"]["type"])


def options(question: Mapping[str, Any]) -> list[str]:
    """The option keys (choice), level indices (score) or labels (set/span) in the question's order."""
    kind = question["type"]
    if kind == "noul":
        return ["false", "true"]
    if kind == "score":
        return [str(i) for i in range(len(question.get("levels") or question.get("criteria") or []))]
    if "criteria" in question and isinstance(question["criteria"], dict):
        return [str(k) for k in question["criteria"]]
    listed = question.get("choices") or question.get("labels") or []
    return [str(o["key"]) for o in listed]


def validate_item(item: Item) -> None:
    """Catch a mistyped item before it costs a request: expected must be answerable by the question."""
    where = f"item {item.get('id')!r}"
    if not set(item) >= REQUIRED or set(item) - REQUIRED - OPTIONAL:
        raise ValueError(f"{where}: fields must be {sorted(REQUIRED)} (optionally {sorted(OPTIONAL)}); got "
                         f"{sorted(item)}")
    if item["split"] not in SPLITS:
        raise ValueError(f"{where}: split must be one of {SPLITS}")
    if not isinstance(item["state"], str | dict) or not item["state"]:
        raise ValueError(f"{where}: state must be a non-empty string or object")
    question, expected = item["question"], item["expected"]
    kind = question.get("type")
    if kind not in TYPES:
        raise ValueError(f"{where}: question type must be one of {TYPES}")
    keys = options(question)
    if kind == "choice" and expected not in keys:
        raise ValueError(f"{where}: expected {expected!r} is not one of {keys}")
    if kind == "noul" and not isinstance(expected, bool):
        raise ValueError(f"{where}: a noul expects true or false")
    if kind == "score" and not (isinstance(expected, int) and 0 <= expected < len(keys)):
        raise ValueError(f"{where}: a score expects a level index below {len(keys)}")
    if kind == "set" and not (isinstance(expected, list) and set(expected) <= set(keys)):
        raise ValueError(f"{where}: a set expects a list of its labels {keys}")
    if kind == "span":
        # a bare preset question's labels are the card's (e.g. decision-zeroshot's pii preset)
        if not isinstance(expected, list) or any(not {"label", "text"} <= set(s) <= {"label", "text", "start", "end"}
                                                 or (keys and s["label"] not in keys) for s in expected):
            raise ValueError(f"{where}: a span expects a list of {{label, text[, start, end]}} with labels among "
                             f"{keys}")
        source = span_source(item)
        for span in expected:
            if span["text"] not in source:
                raise ValueError(f"{where}: expected span text {span['text']!r} is not in the part it reads")
            if "start" in span and source[span["start"]:span["end"]] != span["text"]:
                raise ValueError(f"{where}: expected span offsets {span['start']}..{span['end']} do not hold "
                                 f"{span['text']!r} in the part it reads")


def span_source(item: Item) -> str:
    """The text a span question reads (its offsets index it): the gateway's own rule (gateway.decisions.state)."""
    from gateway.decisions.state import parse_state

    over = item["question"].get("over")
    names = (over,) if isinstance(over, str) else tuple(over) if over else None
    return parse_state(item["state"]).span_view(names).text


def select(items: Iterable[Item], split: str) -> list[Item]:
    return [item for item in items if split == "all" or item["split"] == split]


# ---------------------------------------------------------------- splits by question (run once, before any model)


def question_key(item: Item) -> str:
    """Items ask the same question when type and instructions agree (case and spacing aside)."""
    q = item["question"]
    return f"{q['type']}\n" + " ".join(str(q.get("instructions", "")).split()).lower()


def assign_question_splits(items: list[Item], share: float = FIT_SHARE) -> list[Item]:
    """The rule in tools/decisions_eval/README.md: `question_id` = `q-` + 10 hex of sha256(question key); per type,
    questions in the order of that hash go to `fit` while the type's fit items stay within `share` of its items;
    the rest are `heldout`. Every item of one question lands in one split. Mechanical: no model is consulted."""
    out = [dict(i) for i in items]
    for item in out:
        item["question_id"] = "q-" + hashlib.sha256(question_key(item).encode()).hexdigest()[:10]
    for kind in TYPES:
        of_type = [i for i in out if question_type(i) == kind]
        groups: dict[str, list[Item]] = {}
        for item in of_type:
            groups.setdefault(item["question_id"], []).append(item)
        budget, used = share * len(of_type), 0
        for qid in sorted(groups):
            split = "fit" if used + len(groups[qid]) <= budget else "heldout"
            used += len(groups[qid]) if split == "fit" else 0
            for item in groups[qid]:
                item["split"] = split
    return out


# ---------------------------------------------------------------- preset data as items


def load_presets(folder: Path = PRESETS, card: Path | None = None) -> dict[str, list[Item]]:
    """Preset name → its lines as items (question asked in the `preset` form; `adhoc` holds the card's definition)."""
    definitions = _preset_definitions(card)
    out: dict[str, list[Item]] = {}
    for path in sorted(folder.glob("*.jsonl")) if folder.is_dir() else []:
        name = path.stem
        if name not in definitions:
            continue
        definition = definitions[name]
        adhoc = {k: v for k, v in definition.items() if k not in ("description", "preset")}
        rows = []
        for line in path.read_text(encoding="utf-8").splitlines():
            if not line.strip():
                continue
            raw = json.loads(line)
            rows.append({"id": raw["id"], "split": "fit" if raw["split"] == "train" else raw["split"],
                         "state": raw["state"], "expected": raw["expected"], "lang": raw.get("lang", "en"),
                         "question": adhoc, "preset": {"type": definition["type"], "preset": name}})
        out[name] = rows
    return out


def _preset_definitions(card: Path | None) -> dict[str, dict[str, Any]]:
    path = card or ROOT / "model_repository" / MULTILINGUAL / "card.yaml"
    raw = yaml.safe_load(path.read_text())
    return {n: d for n, d in raw["decisions"]["presets"].items() if d.get("type") != "span"}


# ---------------------------------------------------------------- requests


def batches(items: Sequence[Item], model: str, size: int = BATCH, mode: str = "adhoc",
            ) -> Iterator[tuple[dict[str, Any], list[Item]]]:
    """Batch requests of at most `size` entries, one entry (named by item id) and one question per item."""
    for start in range(0, len(items), size):
        chunk = list(items[start : start + size])
        body = {"model": model, "states": {item["id"]: {"state": item["state"], "questions": {
            QUESTION_ID: item["preset"] if mode == "preset" and "preset" in item else item["question"]}}
            for item in chunk}}
        yield body, chunk


def _failed_entry(message: str) -> Entry:
    return {"answers": {QUESTION_ID: {"type": None, "error": "request_failed", "message": message}}}


def collect(url: str, model: str, items: Sequence[Item], client: httpx.Client | None = None,
            mode: str = "adhoc") -> dict[str, Entry]:
    """Item id → its entry of the batch response; a whole batch that failed gives each item an error answer."""
    own = client is None
    http = client or httpx.Client(base_url=url, timeout=300.0)
    responses: dict[str, Entry] = {}
    try:
        for body, chunk in batches(items, model, mode=mode):
            r = http.post("/v1/decisions", json=body)
            states = r.json().get("states", {}) if r.status_code == 200 else {}
            for item in chunk:
                responses[item["id"]] = states.get(item["id"]) or _failed_entry(f"HTTP {r.status_code}: {r.text[:200]}")
    finally:
        if own:
            http.close()
    return responses


# ---------------------------------------------------------------- predictions and the served rule


def served_level(score: float) -> int:
    """The score a router acts on: the served expected level rounded half up (2.5 → 3, never banker's 2)."""
    return math.floor(score + 0.5)


def _error(entry: Entry) -> str | None:
    """The question's error code, if it failed (a set answers under `q.<label>`, so look at every answer)."""
    answers = entry.get("answers") or {}
    for key, answer in answers.items():
        if (key == QUESTION_ID or key.startswith(QUESTION_ID + ".")) and answer.get("error"):
            return str(answer["error"])
    return None if answers else "no_answer"


def predicted(item: Item, entry: Entry) -> Any:
    """The model's answer in the item's `expected` form, or None when the question failed."""
    if _error(entry):
        return None
    kind, answers = question_type(item), entry["answers"]
    if kind == "choice":
        return answers[QUESTION_ID]["choice"]
    if kind in ("noul", "score"):
        return float(answers[QUESTION_ID][kind])
    if kind == "set":
        return list(entry["sets"][QUESTION_ID]["selected"])
    return [dict(s) for s in (entry.get("spans") or {}).get(QUESTION_ID, [])]


def span_exact(found: Mapping[str, Any], expected: Mapping[str, Any], source: str) -> bool:
    """Label, text and offsets: the found text must be the expected text and sit at its offsets in the part read."""
    if found.get("label") != expected["label"] or found.get("text") != expected["text"]:
        return False
    start, end = int(found.get("start", -1)), int(found.get("end", -1))
    if start < 0 or source[start:end] != expected["text"]:
        return False
    return "start" not in expected or (start, end) == (expected["start"], expected["end"])


# ---------------------------------------------------------------- tallies


def wilson(right: float, n: int, z: float = 1.959964) -> tuple[float, float]:
    """The Wilson score interval of a proportion (95 % by default); (0, 1) when nothing was counted."""
    if n == 0:
        return 0.0, 1.0
    p = right / n
    centre = (p + z * z / (2 * n)) / (1 + z * z / n)
    half = z * math.sqrt(p * (1 - p) / n + z * z / (4 * n * n)) / (1 + z * z / n)
    return max(0.0, centre - half), min(1.0, centre + half)


@dataclass
class Tally:
    """Right/total counters for one metric."""

    right: float = 0.0
    total: int = 0

    def add(self, right: bool | float) -> None:
        self.right += float(right)
        self.total += 1

    @property
    def value(self) -> float | None:
        return self.right / self.total if self.total else None

    @property
    def interval(self) -> tuple[float, float]:
        return wilson(self.right, self.total)


@dataclass
class TypeReport:
    kind: str
    items: int = 0
    errors: int = 0
    metrics: dict[str, dict[str, Tally]] = field(default_factory=dict)  # metric → system → tally

    def add(self, metric: str, system: str, right: bool | float) -> None:
        self.metrics.setdefault(metric, {}).setdefault(system, Tally()).add(right)


@dataclass
class Report:
    types: dict[str, TypeReport]
    baselines: dict[str, list[str]]  # type → baseline names, in column order

    def value(self, kind: str, metric: str, system: str = "model") -> float | None:
        return self.types[kind].metrics[metric][system].value


BASELINES = {
    "choice": ["first option", "majority"],
    "noul": ["majority"],
    "score": ["middle level", "majority"],
    "set": ["empty set", "majority per label"],
    "span": ["empty set"],
}
MAIN_METRIC = {"choice": "accuracy", "noul": "accuracy", "score": "accuracy", "set": "exact set",
               "span": "item exact"}


def _majorities(items: Sequence[Item]) -> tuple[str | None, bool, Counter[int], dict[str, bool]]:
    """From the fit (or train) split: the most frequent choice key, noul answer, score level and set labels."""
    fit = [item for item in items if item["split"] == "fit"]
    keys = Counter(item["expected"] for item in fit if question_type(item) == "choice")
    nouls = Counter(item["expected"] for item in fit if question_type(item) == "noul")
    levels = Counter(int(item["expected"]) for item in fit if question_type(item) == "score")
    label_seen: Counter[str] = Counter()
    label_on: Counter[str] = Counter()
    for item in fit:
        if question_type(item) == "set":
            for label in options(item["question"]):
                label_seen[label] += 1
                label_on[label] += label in item["expected"]
    key = keys.most_common(1)[0][0] if keys else None
    noul = nouls[True] > nouls[False]
    per_label = {label: label_on[label] * 2 > n for label, n in label_seen.items()}
    return key, noul, levels, per_label


def evaluate(responses: Mapping[str, Entry], items: Sequence[Item], fit_items: Sequence[Item] | None = None) -> Report:
    """Score `responses` (item id → its `states` entry) on `items`; majorities come from `fit_items` (default
    `items`)."""
    majority_key, majority_noul, levels, label_majority = _majorities(fit_items if fit_items is not None else items)
    types = {kind: TypeReport(kind) for kind in TYPES}
    for item in items:
        kind, question, expected = question_type(item), item["question"], item["expected"]
        entry = responses.get(item["id"]) or _failed_entry("no response")
        report = types[kind]
        report.items += 1
        report.errors += _error(entry) is not None
        got = predicted(item, entry)
        keys = options(question)
        if kind == "choice":
            report.add("accuracy", "model", got == expected)
            report.add("accuracy", "first option", keys[0] == expected)
            report.add("accuracy", "majority", (majority_key if majority_key in keys else keys[0]) == expected)
        elif kind == "noul":
            report.add("accuracy", "model", got is not None and (got >= 0.5) == expected)
            report.add("accuracy", "majority", majority_noul == expected)
        elif kind == "score":
            middle = (len(keys) - 1) // 2
            common = next((lv for lv, _ in levels.most_common() if lv < len(keys)), middle)
            report.add("accuracy", "model", got is not None and served_level(got) == expected)
            report.add("accuracy", "middle level", middle == expected)
            report.add("accuracy", "majority", common == expected)
            # A failed score counts as the farthest level from the expected one.
            worst = max(expected, len(keys) - 1 - expected)
            report.add("mean abs error", "model", abs(got - expected) if got is not None else worst)
            report.add("mean abs error", "middle level", abs(middle - expected))
        elif kind == "set":
            chosen = set(got) if got is not None else None
            majority = {label for label in keys if label_majority.get(label, False)}
            report.add("exact set", "model", chosen == set(expected))
            report.add("exact set", "empty set", not expected)
            report.add("exact set", "majority per label", majority == set(expected))
            for label in keys:
                want = label in expected
                report.add("per-label accuracy", "model", chosen is not None and (label in chosen) == want)
                report.add("per-label accuracy", "empty set", not want)
                report.add("per-label accuracy", "majority per label", (label in majority) == want)
        else:
            source = span_source(item)
            found = got if got is not None else []
            hits = [any(span_exact(f, e, source) for f in found) for e in expected]
            right = [any(span_exact(f, e, source) for e in expected) for f in found]
            report.add("item exact", "model", got is not None and all(hits) and all(right))
            report.add("item exact", "empty set", not expected)
            for hit, want in zip(hits, expected, strict=True):
                report.add("recall", "model", hit)
                report.add("recall", "empty set", False)
                report.add(f"recall {want['label']}", "model", hit)
            for ok, span in zip(right, found, strict=True):
                report.add("precision", "model", ok)
                report.add(f"precision {span.get('label')}", "model", ok)
    return Report(types, BASELINES)


# ---------------------------------------------------------------- output


def _cell(tally: Tally | None, interval: bool = False) -> str:
    if tally is None or tally.value is None:
        return "—"
    if not interval:
        return f"{tally.value:.3f}"
    lo, hi = tally.interval
    return f"{tally.value:.2f} [{lo:.2f}, {hi:.2f}]"


def markdown(report: Report, title: str = "") -> str:
    """One row per (type, metric); n counts what the metric averages over (items, labels or spans)."""
    lines = [title, ""] if title else []
    lines += ["| type | metric | n | model | baseline | baseline | errors |", "|---|---|---:|---:|---|---|---:|"]
    for kind in TYPES:
        t = report.types[kind]
        if not t.items:
            continue
        for metric, systems in t.metrics.items():
            base = [f"{_cell(systems.get(name))} ({name})" for name in report.baselines[kind]] + [""]
            n = f"{systems['model'].total}" + {"per-label accuracy": " labels", "recall": " spans",
                                                "precision": " spans found"}.get(metric.split()[0], "")
            lines.append(f"| {kind} | {metric} | {n} | {_cell(systems.get('model'), True)} | {base[0]} | {base[1]} | "
                         f"{t.errors} |")
    return "\n".join(lines) + "\n"


@dataclass
class Row:
    """One line of the side-by-side table: a set and language, a type, each family's report on it."""

    dataset: str
    kind: str
    lang: str
    reports: dict[str, Report]


def side_by_side(rows: Sequence[Row], families: Sequence[str]) -> str:
    head = ["set", "type", "lang", "n", *families, "baselines"]
    lines = ["| " + " | ".join(head) + " |", "|" + "---|" * len(head)]
    for row in rows:
        if not row.reports:
            continue
        first = next(iter(row.reports.values()))
        t = first.types[row.kind]
        if not t.items:
            continue
        metric = MAIN_METRIC[row.kind]
        cells = [_cell(row.reports[f].types[row.kind].metrics[metric].get("model"), True) if f in row.reports
                 else "—" for f in families]
        base = ", ".join(f"{name} {_cell(t.metrics[metric].get(name))}" for name in first.baselines[row.kind]
                         if name in t.metrics[metric])
        lines.append(f"| {row.dataset} | {row.kind} ({metric}) | {row.lang} | {t.items} | " + " | ".join(cells)
                     + f" | {base} |")
    return "\n".join(lines) + "\n"


def span_labels(rows: Sequence[Row], families: Sequence[str]) -> str:
    """Spans per label: recall (expected spans found exactly) and exact-match precision (found spans that are
    expected, text and offsets), each family side by side; the issue's goals are stated per label."""
    head = ["set", "lang", "label", *(f"{f} recall" for f in families), *(f"{f} precision" for f in families)]
    lines = ["| " + " | ".join(head) + " |", "|" + "---|" * len(head)]
    for row in rows:
        if row.kind != "span" or not row.reports:
            continue
        metrics = {m for r in row.reports.values() for m in r.types["span"].metrics}
        for label in sorted({m.split(" ", 1)[1] for m in metrics if m.startswith(("recall ", "precision "))}):
            tallies = [row.reports[f].types["span"].metrics.get(f"{metric} {label}", {}).get("model")
                       if f in row.reports else None for metric in ("recall", "precision") for f in families]
            cells = [f"{_cell(t, True)} (n {t.total})" if t else "—" for t in tallies]
            lines.append(f"| {row.dataset} | {row.lang} | {label} | " + " | ".join(cells) + " |")
    return "\n".join(lines) + "\n" if len(lines) > 2 else ""


def _langs(items: Sequence[Item]) -> list[str]:
    seen = Counter(str(i.get("lang", "en")) for i in items)
    return [*sorted(seen), "all"] if len(seen) > 1 else ["all"]


def run_all(url: str, split: str, sets: str = "all") -> tuple[str, list[Row]]:
    """Every set (or only the ad-hoc items, or only the presets), every family, grouped by type and language; the
    markdown table and its rows."""
    families = [f for f, _, _ in FAMILIES]
    rows: list[Row] = []
    items = load_all()
    chosen = select(items, split) if sets != "presets" else []
    served = {m["id"]: m for m in httpx.get(url + "/v1/models", timeout=30).json()["data"]}
    answers = {m: set((served[m].get("decisions") or {}).get("question_types") or []) for _, m, _ in FAMILIES}
    answered: dict[str, dict[str, Entry]] = {}
    for name, model, mode in FAMILIES if chosen else ():  # a preset-only split has no ad-hoc items
        if mode == "adhoc":  # a type the model does not answer is left out of its column (shown as —)
            answered[name] = collect(url, model, [i for i in chosen if question_type(i) in answers[model]])
    for kind in TYPES if chosen else ():
        of_type = [i for i in chosen if question_type(i) == kind]
        for lang in _langs(of_type):
            group = [i for i in of_type if lang == "all" or i.get("lang", "en") == lang]
            reports = {n: evaluate(answered[n], group, fit_items=items) for n, m, mode in FAMILIES
                       if n in answered and kind in answers[m]}
            rows.append(Row("ad-hoc items", kind, lang, reports))
    for preset, lines in (load_presets() if sets != "adhoc" else {}).items():
        picked = select(lines, split)
        reports_by: dict[str, dict[str, Entry]] = {n: collect(url, m, picked, mode=mode) for n, m, mode in FAMILIES}
        for lang in _langs(picked):
            group = [i for i in picked if lang == "all" or i.get("lang") == lang]
            kind = question_type(group[0]) if group else "noul"
            reports = {n: evaluate(reports_by[n], group, fit_items=lines) for n in reports_by}
            rows.append(Row(f"preset {preset}", kind, lang, reports))
    per_label = span_labels(rows, families)
    return side_by_side(rows, families) + (f"\nSpans per label (exact text and offsets):\n\n{per_label}"
                                           if per_label else ""), rows


# ---------------------------------------------------------------- serving and the record of runs


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def serve(models: str = SERVED, timeout: float = 600.0) -> tuple[subprocess.Popen[bytes], str]:
    """`sr-gateway serve` (Triton as its child) for the compared models, once /health says ready."""
    port = _free_port()
    binary = Path(sys.executable).parent / "sr-gateway"
    proc = subprocess.Popen([str(binary), "serve", "--port", str(port), "--models", models,
                             "--result-cache", "off"], cwd=ROOT, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    url = f"http://127.0.0.1:{port}"
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if proc.poll() is not None:
            raise RuntimeError(f"sr-gateway serve exited with {proc.returncode}")
        try:
            status = httpx.get(url + "/health", timeout=2).json().get("status")
            if status == "ready":
                return proc, url
            if status == "failed":
                break
        except httpx.HTTPError:
            pass
        time.sleep(1)
    proc.terminate()
    proc.wait(60)
    raise RuntimeError("the gateway did not become ready")


def data_checksum() -> str:
    files = [p for p in (*ITEM_FILES, *sorted(PRESETS.glob("*.jsonl"))) if p.is_file()]
    digest = hashlib.sha256()
    for p in files:
        digest.update(p.name.encode() + p.read_bytes())
    return digest.hexdigest()[:12]


def record_run(what: str, split: str, note: str = "") -> None:
    """One line per run in RUNS.md, in order, so no parameter is chosen after a held-out number was seen."""
    stamp = dt.datetime.now(dt.UTC).strftime("%Y-%m-%d %H:%M UTC")
    with RUNS.open("a", encoding="utf-8") as f:
        f.write(f"- {stamp} — eval_decisions {what}, split {split}, data {data_checksum()}"
                + (f" — {note}" if note else "") + "\n")


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--url", help="a served gateway's base URL (default with --all: start one)")
    parser.add_argument("--all", action="store_true", help="every set, every family, by type and language")
    parser.add_argument("--model", default=DEFAULT_MODEL)
    parser.add_argument("--split", choices=[*SPLITS, "all"], default="heldout")
    parser.add_argument("--sets", choices=SETS, default="all",
                        help="with --all: the ad-hoc items only, the preset lines only, or both")
    parser.add_argument("--items", type=Path, default=ITEMS)
    parser.add_argument("--markdown", type=Path, help="also write the table to this file")
    parser.add_argument("--note", default="", help="said in RUNS.md beside this run")
    args = parser.parse_args(argv)
    if args.all:
        proc, url = (None, args.url) if args.url else serve()
        try:
            table, _ = run_all(url, args.split, args.sets)
        finally:
            if proc is not None:
                proc.terminate()
                proc.wait(120)
        sets = "" if args.sets == "all" else f" --sets {args.sets}"
        record_run(f"--all{sets} (" + ", ".join(f"{n}={m}" for n, m, _ in FAMILIES) + ")", args.split, args.note)
        title = f"Decisions accuracy, split {args.split}{sets}, {dt.date.today()} (Wilson 95 % intervals)"
        table = f"{title}\n\n{table}"
    else:
        if not args.url:
            parser.error("--url is needed without --all")
        items = load_items(args.items)
        chosen = select(items, args.split)
        report = evaluate(collect(args.url, args.model, chosen), chosen, fit_items=items)
        record_run(f"--model {args.model} --items {args.items.name}", args.split, args.note)
        table = markdown(report, f"Decisions accuracy: {args.model}, split {args.split}, {len(chosen)} items")
    print(table)
    if args.markdown:
        args.markdown.write_text(table)
    return 0


if __name__ == "__main__":
    sys.exit(main())
