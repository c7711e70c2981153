"""Accuracy of a served decisions model on the hand-written evaluation set, beside trivial baselines.

Items (`tools/decisions_eval/items.jsonl`) are sent to `/v1/decisions` as batch requests (`states`, at most 16
entries, one question each); every entry is scored against its expected answer:

- choice: the answered `choice` equals the expected key;
- noul: `noul ≥ 0.5` equals the expected boolean;
- score: `round(score)` equals the expected level index, and the mean absolute error of `score`;
- set: the selected labels (at the applied threshold) equal the expected set, and per-label accuracy;
- span: returned spans of one label separated only by spaces and commas are joined (an address comes back as
  street, city and postcode pieces); an expected `{label, text}` is found when a span with that label has that text
  or contains it (recall);
  a found span is right when it matches an expected span either way round (precision); an item is right when
  every expected span is found and every found span is right.

A question answered with an error counts as wrong (and is counted under `errors`). Baselines need no model: the
first option and the fit split's majority key (choice), the fit split's majority (noul), the middle level (score),
the empty set and the fit split's majority per label key (set), nothing found (span).

    python tools/eval_decisions.py --url http://127.0.0.1:8080 [--model decision-zeroshot] [--split heldout]
        [--markdown FILE]
"""

from __future__ import annotations

import argparse
import json
import sys
from collections import Counter
from collections.abc import Iterable, Iterator, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import httpx

ITEMS = Path(__file__).resolve().parent / "decisions_eval" / "items.jsonl"
DEFAULT_MODEL = "decision-zeroshot"
BATCH = 16
QUESTION_ID = "q"
TYPES = ("choice", "noul", "score", "set", "span")
SPLITS = ("fit", "heldout")

Item = dict[str, Any]
Entry = dict[str, Any]  # one `states.<name>` of a decisions response


# ---------------------------------------------------------------- items


def load_items(path: Path = ITEMS) -> list[Item]:
    items = [json.loads(line) for line in path.read_text().splitlines() if line.strip()]
    for item in items:
        validate_item(item)
    ids = Counter(item["id"] for item in items)
    duplicated = [i for i, n in ids.items() if n > 1]
    if duplicated:
        raise ValueError(f"duplicate item ids: {duplicated}")
    return items


def question_type(item: Item) -> str:
    return str(item["question"]["type"])


def options(question: Mapping[str, Any]) -> list[str]:
    """The option keys (choice), level indices (score) or labels (set/span) in the question's order."""
    kind = question["type"]
    if kind == "score":
        return [str(i) for i in range(len(question.get("levels") or question.get("criteria") or []))]
    if "criteria" in question and isinstance(question["criteria"], dict):
        return [str(k) for k in question["criteria"]]
    listed = question.get("choices") or question.get("labels") or []
    return [str(o["key"]) for o in listed]


def validate_item(item: Item) -> None:
    """Catch a mistyped item before it costs a request: expected must be answerable by the question."""
    where = f"item {item.get('id')!r}"
    if set(item) != {"id", "split", "state", "question", "expected"}:
        raise ValueError(f"{where}: fields must be id, split, state, question, expected; got {sorted(item)}")
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
        if not isinstance(expected, list) or any(set(s) != {"label", "text"} or s["label"] not in keys
                                                 for s in expected):
            raise ValueError(f"{where}: a span expects a list of {{label, text}} with labels among {keys}")
        for span in expected:
            if span["text"] not in _span_source(item):
                raise ValueError(f"{where}: expected span text {span['text']!r} is not in the part it reads")


def _span_source(item: Item) -> str:
    state, over = item["state"], item["question"].get("over")
    if isinstance(state, str):
        return state
    if isinstance(over, str):
        return str(state[over])
    return " ".join(str(v) for v in state.values())


def select(items: Iterable[Item], split: str) -> list[Item]:
    return [item for item in items if split == "all" or item["split"] == split]


# ---------------------------------------------------------------- requests


def batches(items: Sequence[Item], model: str, size: int = BATCH) -> Iterator[tuple[dict[str, Any], list[Item]]]:
    """Batch requests of at most `size` entries, one entry (named by item id) and one question per item."""
    for start in range(0, len(items), size):
        chunk = list(items[start : start + size])
        body = {"model": model, "states": {item["id"]: {"state": item["state"],
                                                        "questions": {QUESTION_ID: item["question"]}}
                                           for item in chunk}}
        yield body, chunk


def _failed_entry(message: str) -> Entry:
    return {"answers": {QUESTION_ID: {"type": None, "error": "request_failed", "message": message}}}


def collect(url: str, model: str, items: Sequence[Item], client: httpx.Client | None = None) -> dict[str, Entry]:
    """Item id → its entry of the batch response; a whole batch that failed gives each item an error answer."""
    own = client is None
    http = client or httpx.Client(base_url=url, timeout=120.0)
    responses: dict[str, Entry] = {}
    try:
        for body, chunk in batches(items, model):
            r = http.post("/v1/decisions", json=body)
            states = r.json().get("states", {}) if r.status_code == 200 else {}
            for item in chunk:
                responses[item["id"]] = states.get(item["id"]) or _failed_entry(f"HTTP {r.status_code}: {r.text[:200]}")
    finally:
        if own:
            http.close()
    return responses


# ---------------------------------------------------------------- predictions


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
    if kind == "noul":
        return float(answers[QUESTION_ID]["noul"])
    if kind == "score":
        return float(answers[QUESTION_ID]["score"])
    if kind == "set":
        return list(entry["sets"][QUESTION_ID]["selected"])
    return joined_spans(_span_source(item), (entry.get("spans") or {}).get(QUESTION_ID, []))


def joined_spans(source: str, spans: Sequence[Mapping[str, Any]]) -> list[dict[str, str]]:
    """Spans as `{label, text}`, where spans of one label separated only by spaces and commas read as one span:
    a postal address comes back as street, city and postcode pieces, and the whole address is what is expected."""
    out: list[dict[str, Any]] = []
    for span in sorted(spans, key=lambda s: int(s["start"])):
        last = out[-1] if out else None
        if (last is not None and last["label"] == span["label"] and last["end"] <= span["start"]
                and not source[last["end"] : span["start"]].strip(" ,\n\t")):
            last["end"] = span["end"]
            last["text"] = source[last["start"] : span["end"]]
            continue
        out.append({"label": span["label"], "start": int(span["start"]), "end": int(span["end"]),
                    "text": span["text"]})
    return [{"label": s["label"], "text": s["text"]} for s in out]


# ---------------------------------------------------------------- scoring


def span_found(found: Mapping[str, str], expected: Mapping[str, str]) -> bool:
    return found["label"] == expected["label"] and expected["text"] in found["text"]


def span_right(found: Mapping[str, str], expected: Mapping[str, str]) -> bool:
    return found["label"] == expected["label"] and (expected["text"] in found["text"] or found["text"] in
                                                    expected["text"])


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
    "choice": ["first option", "fit majority key"],
    "noul": ["fit majority"],
    "score": ["middle level"],
    "set": ["empty set", "fit majority per label"],
    "span": ["nothing found"],
}


def _majorities(items: Sequence[Item]) -> tuple[str | None, bool, dict[str, bool]]:
    """From the fit split: the most frequent choice key, the noul majority and each set label's majority."""
    fit = [item for item in items if item["split"] == "fit"]
    keys = Counter(item["expected"] for item in fit if question_type(item) == "choice")
    nouls = Counter(item["expected"] for item in fit if question_type(item) == "noul")
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
    return key, noul, per_label


def evaluate(responses: Mapping[str, Entry], items: Sequence[Item], fit_items: Sequence[Item] | None = None) -> Report:
    """Score `responses` (item id → its `states` entry) on `items`; majorities come from `fit_items` (default
    `items`)."""
    majority_key, majority_noul, label_majority = _majorities(fit_items if fit_items is not None else items)
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
            report.add("accuracy", "fit majority key",
                       (majority_key if majority_key in keys else keys[0]) == expected)
        elif kind == "noul":
            report.add("accuracy", "model", got is not None and (got >= 0.5) == expected)
            report.add("accuracy", "fit majority", majority_noul == expected)
        elif kind == "score":
            middle = (len(keys) - 1) // 2
            report.add("accuracy", "model", got is not None and round(got) == expected)
            report.add("accuracy", "middle level", middle == expected)
            # A failed score counts as the farthest level from the expected one.
            worst = max(expected, len(keys) - 1 - expected)
            report.add("mean abs error", "model", abs(got - expected) if got is not None else worst)
            report.add("mean abs error", "middle level", abs(middle - expected))
        elif kind == "set":
            chosen = set(got) if got is not None else None
            majority = {label for label in keys if label_majority.get(label, False)}
            report.add("exact set", "model", chosen == set(expected))
            report.add("exact set", "empty set", not expected)
            report.add("exact set", "fit majority per label", majority == set(expected))
            for label in keys:
                want = label in expected
                report.add("per-label accuracy", "model", chosen is not None and (label in chosen) == want)
                report.add("per-label accuracy", "empty set", not want)
                report.add("per-label accuracy", "fit majority per label", (label in majority) == want)
        else:
            found = got if got is not None else []
            hits = [any(span_found(f, e) for f in found) for e in expected]
            right = [any(span_right(f, e) for e in expected) for f in found]
            report.add("item exact", "model", got is not None and all(hits) and all(right))
            report.add("item exact", "nothing found", not expected)
            for hit in hits:
                report.add("recall", "model", hit)
                report.add("recall", "nothing found", False)
            for ok in right:
                report.add("precision", "model", ok)
    return Report(types, BASELINES)


# ---------------------------------------------------------------- output


def _cell(tally: Tally | None) -> str:
    if tally is None or tally.value is None:
        return "—"
    return f"{tally.value:.3f}"


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
                                                "precision": " spans found"}.get(metric, "")
            lines.append(f"| {kind} | {metric} | {n} | {_cell(systems.get('model'))} | {base[0]} | {base[1]} | "
                         f"{t.errors} |")
    return "\n".join(lines) + "\n"


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--url", required=True, help="gateway base URL, e.g. http://127.0.0.1:8080")
    parser.add_argument("--model", default=DEFAULT_MODEL)
    parser.add_argument("--split", choices=[*SPLITS, "all"], default="heldout")
    parser.add_argument("--items", type=Path, default=ITEMS)
    parser.add_argument("--markdown", type=Path, help="also write the table to this file")
    args = parser.parse_args(argv)
    items = load_items(args.items)
    chosen = select(items, args.split)
    responses = collect(args.url, args.model, chosen)
    report = evaluate(responses, chosen, fit_items=items)
    table = markdown(report, f"Decisions accuracy: {args.model}, split {args.split}, {len(chosen)} items")
    print(table)
    if args.markdown:
        args.markdown.write_text(table)
    return 0


if __name__ == "__main__":
    sys.exit(main())
