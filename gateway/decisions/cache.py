"""A bounded cache of answered questions: identical (model, revision, text read, question) work is answered once.

On by default only where the model's numerics are `exact` (an answer never depends on what else was in the batch,
so a cached answer is the answer); approximate models would return an answer that a fresh run could differ from
in the last digits, so they are cached only when `--result-cache-approximate` says so. Hits skip the model
entirely (Server-Timing forward 0 for a request answered from the cache).
"""

from __future__ import annotations

from collections import OrderedDict
from dataclasses import dataclass

import orjson

from ..runtime import Runtime, ServedModel
from .answers import Outcome
from .families import Ask, family


@dataclass(frozen=True)
class Cached:
    outcome: Outcome
    view_tokens: int
    question_tokens: int
    tokens_lower_bound: bool = False


def key(model: ServedModel, ask: Ask, max_tokens: int | None) -> bytes:
    """Everything an answer depends on. The view's text alone is not enough: its part names switch the pair term
    (the same text under `request`/`candidate` and under other names is scored differently), and its images are
    read (OCR lines, the box target) after the text is rendered, so each picture enters by number and digest."""
    q = ask.question
    own = {id(p) for p in ask.own_pictures}
    pictures = [(p.number, p.key, id(p) in own) for p in ask.pictures]
    return orjson.dumps([model.id, model.card.revision, model.card.model_sha256, ask.view.text, ask.view.parts,
                         ask.view.keys, pictures, q.type, q.instructions, [(o.key, o.description) for o in q.options],
                         q.threshold, q.overflow, q.over, q.preset, q.require_full_input,
                         sorted(q.extra.items()) if q.extra else None, max_tokens])


class ResultCache:
    def __init__(self, entries: int) -> None:
        self.entries = entries
        self._data: OrderedDict[bytes, Cached] = OrderedDict()

    def __len__(self) -> int:
        return len(self._data)

    def get(self, k: bytes) -> Cached | None:
        found = self._data.get(k)
        if found is not None:
            self._data.move_to_end(k)
        return found

    def put(self, k: bytes, value: Cached) -> None:
        if self.entries <= 0:
            return
        self._data[k] = value
        self._data.move_to_end(k)
        while len(self._data) > self.entries:
            self._data.popitem(last=False)


def result_cache(runtime: Runtime, model: ServedModel) -> ResultCache | None:
    """The model's result cache, or None where the settings leave this model uncached."""
    policy = runtime.settings.result_cache
    if policy == "off" or runtime.settings.result_cache_entries <= 0 or (
            policy == "exact" and model.card.numerics != "exact"):
        return None
    fam = family(model)
    found: ResultCache | None = getattr(fam, "results", None)
    if found is None:
        found = ResultCache(runtime.settings.result_cache_entries)
        fam.results = found  # type: ignore[attr-defined]
    return found
