"""The NLI adapter: any sequence classifier whose labels are entailment / (not_entailment | contradiction,
neutral) answers choice, noul and set questions (reference §3.6).

The state read is the premise; each option is a hypothesis:
- choice: the instructions hold exactly one `{label}` placeholder, filled with each option's description (or key);
  probabilities are the softmax across options of the entailment logit, confidence 1 − H/ln K;
- noul: the hypothesis is `criteria.true` or the instructions; P(true) is the pair's softmax at entailment (the
  other labels summed into false); a `false` description is refused (NLI has nothing to compare it with);
- set: one noul per label, the hypothesis being the instructions with `{label}` filled, or the label's text.
Inputs over the model's max_input_tokens fail with max_length_exceeded: nothing is cut.
"""

from __future__ import annotations

import numpy as np

from ...cards import HeadSpec
from ...errors import ItemError, no_answer, too_long
from ...execution.jobs import Job, run_jobs
from ...heads import softmax
from ...runtime import ServedModel
from ...text import InputTooLong
from ...timing import Timing
from ..answers import Outcome
from ..questions import Question, QuestionError
from .base import Ask, Context, Family, FamilyError, Params, Phases

PLACEHOLDER = "{label}"


class NliParams(Params):
    head: str | None = None
    entailment: str = "entailment"
    max_hypotheses: int = 2048  # per request, like the reference


class Nli(Family):
    name = "nli"
    params_type = NliParams

    def __init__(self, model: ServedModel) -> None:
        super().__init__(model)
        heads = model.card.heads or []
        self.head: HeadSpec = next((h for h in heads if h.name == self.params.head), heads[0]) if heads else None  # type: ignore[assignment]
        if self.head is None or self.head.kind != "sequence":
            raise FamilyError("the NLI adapter needs a sequence head")
        labels = set(self.head.labels)
        if self.params.entailment not in labels or labels - {self.params.entailment} not in (
                {"not_entailment"}, {"contradiction", "neutral"}):
            raise FamilyError(f"head {self.head.name} labels {self.head.labels} are not an NLI label set")
        if "pair" not in self.head.inputs:
            raise FamilyError(f"head {self.head.name} does not read text pairs")
        self.entailment = self.head.labels.index(self.params.entailment)
        unsupported = set(self.spec.question_types) - {"choice", "noul", "set"}
        if unsupported:
            raise FamilyError(f"the NLI adapter answers choice, noul and set, not {sorted(unsupported)}")

    def check(self, question: Question) -> None:
        count = question.instructions.count(PLACEHOLDER)
        if question.type == "choice" and count != 1:
            raise QuestionError("NLI choice instructions must hold exactly one {label} placeholder")
        if question.type == "noul" and question.options[0].description is not None:
            raise QuestionError("NLI noul questions do not take a false description")
        if question.type == "set" and count > 1:
            raise QuestionError("NLI set instructions may hold at most one {label} placeholder")

    def hypotheses(self, q: Question) -> list[str]:
        if q.type == "noul":
            return [q.options[1].description or q.instructions]
        if PLACEHOLDER in q.instructions:
            return [q.instructions.replace(PLACEHOLDER, o.description or o.key) for o in q.options]
        return [o.description or o.key for o in q.options]

    async def answer(self, ctx: Context, asks: list[Ask]) -> list[Phases]:
        encoder = self.model.text_encoder()
        limits = self.model.card.limits
        limit = limits.max_input_tokens if ctx.long_context else (limits.validated_input_tokens
                                                                    or limits.max_input_tokens)
        jobs: dict[tuple[str, str], Job] = {}
        premises: dict[str, tuple[int, bool]] = {}
        wanted = sum(len(self.hypotheses(a.question)) for a in asks)
        if wanted > self.params.max_hypotheses:
            for ask in asks:
                ask.fail(ItemError("invalid_input", f"the request holds {wanted} hypotheses; model {self.model.id} "
                                                    f"takes at most {self.params.max_hypotheses}"))
            return []
        for ask in asks:
            if ask.view.text not in premises:
                read = encoder.encode(ask.view.text, max_tokens=limit, overflow="truncate")
                premises[ask.view.text] = read.tokens, read.tokens_lower_bound
            ask.view_tokens, ask.tokens_lower_bound = premises[ask.view.text]
            for hypothesis in self.hypotheses(ask.question):
                key = (ask.view.text, hypothesis)
                if key in jobs:
                    continue
                try:
                    enc = encoder.encode_pair(ask.view.text, hypothesis, max_tokens=limit, overflow="reject")
                except InputTooLong as exc:
                    ask.fail(too_long(exc))
                    continue
                jobs[key] = Job(enc.ids, enc.type_ids)
                ask.question_tokens += len(enc.ids) - ask.view_tokens
        queue_ms, forward_ms = await run_jobs(ctx.runtime, self.model, list(jobs.values()),
                                             deadline_ms=ctx.deadline_ms, timing=Timing(started=ctx.started))
        for ask in asks:
            if ask.error is not None:
                continue
            pairs = [jobs[(ask.view.text, h)] for h in self.hypotheses(ask.question)]
            failed = next((j.error for j in pairs if j.error is not None), None)
            if failed is not None or any(j.result is None for j in pairs):
                ask.fail(no_answer(failed))
                continue
            logits = np.stack([np.asarray(j.result.values, dtype=np.float64) for j in pairs if j.result is not None])
            ask.outcome = Outcome(self._probabilities(ask.question, logits))
        return [Phases.of(queue_ms, forward_ms)]

    def _probabilities(self, q: Question, logits: np.ndarray) -> np.ndarray:
        if q.type == "choice":  # options compete: a softmax over their entailment logits
            return softmax(logits[:, self.entailment])
        entail = softmax(logits)[:, self.entailment]  # each hypothesis alone: P(entailment) of its pair
        if q.type == "noul":
            return np.asarray([1.0 - entail[0], entail[0]])
        return np.asarray(entail)
