"""Would one yes/no probe on the instruction LM's state answer ad-hoc questions better than zero-shot? (issue 22)

Issue 22's item 5 allows an instruction-LM family for a question type where it beats the encoder families on
held-out items. Qwen2.5-Coder-0.5B-Instruct's own yes/no answer is near chance (models.md §(h); set K), but its
layer-16 state carried relevance and grounded from 0.75/0.68 to 0.83/0.72 in cross-validation (sets L, M). A
preset's head is fitted to one question; an ad-hoc question has no training lines of its own. So this asks whether
ONE head, fitted on many different questions asked in one ChatML frame, answers questions it has never seen:

- **Prompt**, one per (question, option): the system line of `lm_reading`; the user turn is the text, the
  question's instructions, the options (choice, set, score) and "Is this right: <key>: <description>?" (noul: the
  question itself, with its criteria when it has them); the state is read at the assistant header's last token by
  the served graph (`qwen-coder-state`, ONNX Runtime fp32, `sr_build.presets.InProcessEncoder`).
- **Head**: `sr_build.presets.fit_softmax`, two classes over the standardised 896 columns; the penalty is chosen
  from the build's grid by grouped cross-validation on the training prompts alone (groups: questions).
- **Rules** (the served ones): noul P(yes) > 0.5; choice arg-max P(yes); set every label with P(yes) > 0.5;
  score the levels' P(yes) normalised, expected level rounded half up.
- **Training**: every ad-hoc item outside the evaluated split (`items.jsonl`, `items_zh.jsonl`: fit and held-out
  v1) plus preset `train` lines recast as questions in the card's own words (jailbreak, pii, relevance, grounded:
  noul; domain, language: the right option and one other), at most PRESET_LINES per preset.
- **Evaluation**: the items of `--split` (default `heldout2`, ad-hoc held-out v2, whose questions no training item
  asks), per type and language, Wilson 95 %, beside the zero-shot families' recorded figures on the same items.

Run: `python -m tools.lm_probe_cv [--split heldout2]` (the LM's states are cached on disk by prompt; ~15 minutes of
two cores the first time). Needs `model_repository/qwen-coder-state` built (`sr-gateway models build`).
"""

from __future__ import annotations

import argparse
import hashlib
import json
from collections import defaultdict
from pathlib import Path
from typing import Any

import numpy as np
import yaml

from gateway.decisions.families.lm_reading import frame
from gateway.decisions.questions import Question, validate
from gateway.decisions.state import parse_state
from sr_build.presets import PENALTIES, InProcessEncoder, fit_softmax, folds, level, standardise
from sr_common.cache import cache_dir
from sr_common.cards import load_card
from tools.eval_decisions import ITEM_FILES, PRESETS, load_all, wilson

ROOT = Path(__file__).resolve().parents[1]
READER = ROOT / "model_repository" / "qwen-coder-state" / "card.yaml"
CARD = ROOT / "model_repository" / "decision-multilingual" / "card.yaml"
PRESET_LINES = 150  # per preset: the LM reads ~0.35 s a prompt on two cores
TYPES = ("choice", "noul", "set", "score")
NOUL_PRESETS = ("jailbreak", "pii", "relevance", "grounded")
CHOICE_PRESETS = ("domain", "language")


def user_turn(text: str, q: Question, option: int | None) -> str:
    """The question in one frame for every type: a noul asks itself; the others ask about one option."""
    if q.type == "noul":
        said = {o.key: o.description for o in q.options if o.description}
        hint = (f"\n(yes: {said['true']}; no: {said['false']})" if "true" in said and "false" in said else "")
        return f"Text: {text}\nQuestion: {q.instructions}{hint}\nAnswer yes or no."
    listed = "\n".join(f"- {o.key}: {o.description}" if o.description else f"- {o.key}" for o in q.options)
    pick = q.options[option or 0]
    named = f"{pick.key}: {pick.description}" if pick.description else pick.key
    return f"Text: {text}\nQuestion: {q.instructions}\nOptions:\n{listed}\nIs this right: {named}?\nAnswer yes or no."


class Reader:
    """The served graph in process, its states cached on disk by the prompt's sha256."""

    def __init__(self) -> None:
        self.encoder = InProcessEncoder(load_card(READER))
        graph = yaml.safe_load(READER.read_text())["artifacts"]["model.onnx"]["sha256"]
        self.path = cache_dir("lm-features") / f"probe-{graph[:12]}.npz"
        self.path.parent.mkdir(parents=True, exist_ok=True)
        self.cache: dict[str, np.ndarray] = dict(np.load(self.path)) if self.path.exists() else {}

    def __call__(self, prompts: list[str]) -> np.ndarray:
        keys = [hashlib.sha256(p.encode()).hexdigest() for p in prompts]
        todo = [p for p, k in zip(prompts, keys, strict=True) if k not in self.cache]
        if todo:
            for start in range(0, len(todo), 256):  # saved as it goes: an interrupted run keeps what it read
                chunk = todo[start:start + 256]
                for p, v in zip(chunk, self.encoder(chunk), strict=True):
                    self.cache[hashlib.sha256(p.encode()).hexdigest()] = v.astype(np.float32)
                np.savez(self.path, **self.cache)
                print(f"  read {min(start + 256, len(todo))}/{len(todo)} new prompts", flush=True)
        return np.stack([self.cache[k] for k in keys]).astype(np.float64)


def expected_index(item: dict[str, Any], q: Question) -> Any:
    want = item["expected"]
    if q.type == "noul":
        return bool(want)
    if q.type == "score":
        return int(want)
    if q.type == "choice":
        return q.keys.index(str(want))
    return {q.keys.index(str(k)) for k in want}


def prompts_of(item: dict[str, Any], q: Question) -> tuple[list[str], list[int]]:
    """The item's prompts and each prompt's yes/no label."""
    view = parse_state(item["state"]).view(q.over)
    want = expected_index(item, q)
    if q.type == "noul":
        return [frame(user_turn(view.text, q, None))], [int(want)]
    labels = [int(i in want) if q.type == "set" else int(i == want) for i in range(len(q.options))]
    return [frame(user_turn(view.text, q, i)) for i in range(len(q.options))], labels


def preset_items(spec: Any) -> list[dict[str, Any]]:
    """Preset train lines as ad-hoc items in the card's words; choice presets keep the right option and one other."""
    out: list[dict[str, Any]] = []
    for name in NOUL_PRESETS + CHOICE_PRESETS:
        raw = {k: v for k, v in spec.presets[name].items() if k in ("type", "instructions", "choices", "over")}
        lines = [json.loads(s) for s in (PRESETS / f"{name}.jsonl").read_text().splitlines() if s.strip()]
        lines = sorted((x for x in lines if x["split"] == "train"),
                       key=lambda x: hashlib.sha256(x["id"].encode()).hexdigest())[:PRESET_LINES]
        for x in lines:
            question = dict(raw)
            if name in CHOICE_PRESETS:
                keys = [c["key"] for c in raw["choices"]]
                other = keys[(keys.index(x["expected"]) + 1 + int(hashlib.sha256(x["id"].encode()).hexdigest(), 16)
                              % (len(keys) - 1)) % len(keys)]
                question["choices"] = [c for c in raw["choices"] if c["key"] in (x["expected"], other)]
            out.append({"id": f"preset-{x['id']}", "split": "train", "question_id": f"preset-{name}",
                        "lang": x.get("lang", "en"), "state": x["state"], "question": question,
                        "expected": x["expected"]})
    return out


def decide(q: Question, p_yes: np.ndarray) -> Any:
    """The served rules over the options' P(yes)."""
    if q.type == "noul":
        return bool(p_yes[0] > 0.5)
    if q.type == "choice":
        return int(np.argmax(p_yes))
    if q.type == "set":
        return {i for i, v in enumerate(p_yes) if v > 0.5}
    return level(p_yes / max(float(p_yes.sum()), 1e-12))


def probe_penalty(x: np.ndarray, y: np.ndarray, groups: list[str]) -> tuple[float, dict[str, float]]:
    """The penalty with the best grouped-CV log-loss on the training prompts (groups: questions)."""
    fold = folds(groups)
    losses = dict.fromkeys(PENALTIES, 0.0)
    for f in range(int(fold.max()) + 1):
        tr, te = fold != f, fold == f
        mean, scale = standardise(x[tr])
        xtr, xte = (x[tr] - mean) / scale, (x[te] - mean) / scale
        start = None
        for alpha in sorted(PENALTIES, reverse=True):
            start = fit_softmax(xtr, y[tr], 2, alpha, start)
            z = xte @ start[0] + start[1]
            z -= z.max(axis=1, keepdims=True)
            logp = z - np.log(np.exp(z).sum(axis=1, keepdims=True))
            losses[alpha] -= float(logp[np.arange(int(te.sum())), y[te]].sum())
    best = min(PENALTIES, key=lambda a: (losses[a], -a))
    return best, {f"{a:g}": round(v / len(y), 4) for a, v in losses.items()}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--split", default="heldout2", help="the ad-hoc split evaluated (never trained on)")
    args = parser.parse_args()
    card = load_card(CARD)
    spec = card.decisions
    assert spec is not None
    items = [i for i in load_all(ITEM_FILES) if i["question"]["type"] in TYPES] + preset_items(spec)
    questions: dict[str, Question] = {}
    for item in items:
        q = validate(item["id"], item["question"], spec, card.id)
        assert isinstance(q, Question), q
        questions[item["id"]] = q
    train = [i for i in items if i["split"] != args.split]
    test = [i for i in items if i["split"] == args.split]
    test_questions = {i["question_id"] for i in test}
    assert not test_questions & {i["question_id"] for i in train}, "a tested question is also trained on"
    reader = Reader()
    rows: list[tuple[str, int]] = []  # (item id, option index) per prompt
    prompts: list[str] = []
    labels: list[int] = []
    for item in train + test:
        ps, ls = prompts_of(item, questions[item["id"]])
        rows += [(item["id"], k) for k in range(len(ps))]
        prompts += ps
        labels += ls
    print(f"{len(train)} training items ({len({i['question_id'] for i in train})} questions), {len(test)} "
          f"{args.split} items ({len(test_questions)} questions), {len(prompts)} prompts", flush=True)
    x = reader(prompts)
    y = np.asarray(labels)
    by_item = {i["id"]: i for i in items}
    is_train = np.asarray([by_item[r[0]]["split"] != args.split for r in rows])
    groups = [by_item[r[0]]["question_id"] for r in rows]
    alpha, losses = probe_penalty(x[is_train], y[is_train], [g for g, t in zip(groups, is_train, strict=True) if t])
    print(f"penalty {alpha:g} (grouped-CV log-loss on training prompts: {losses})", flush=True)
    mean, scale = standardise(x[is_train])
    w, b = fit_softmax((x[is_train] - mean) / scale, y[is_train], 2, alpha)
    z = ((x - mean) / scale) @ w + b
    p_yes = 1.0 / (1.0 + np.exp(z[:, 0] - z[:, 1]))
    per_item: dict[str, list[float]] = defaultdict(list)
    for (item_id, _), p in zip(rows, p_yes, strict=True):
        per_item[item_id].append(float(p))
    tally: dict[tuple[str, str], list[int]] = defaultdict(lambda: [0, 0])
    for item in test:
        q = questions[item["id"]]
        hit = decide(q, np.asarray(per_item[item["id"]])) == expected_index(item, q)
        for key in ((q.type, item.get("lang", "en")), (q.type, "all")):
            tally[key][0] += int(hit)
            tally[key][1] += 1
    print(f"\n| type | lang | n | LM probe ({args.split}) |\n|---|---|---|---|")
    for qtype in TYPES:
        for lang in ("en", "zh", "mixed", "all"):
            if (qtype, lang) in tally:
                right, n = tally[qtype, lang]
                lo, hi = wilson(right, n)
                print(f"| {qtype} | {lang} | {n} | {right / n:.2f} [{lo:.2f}, {hi:.2f}] |")


if __name__ == "__main__":
    main()
