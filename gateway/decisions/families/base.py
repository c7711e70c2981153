"""The interface every decision family implements, so a model author adds a family without touching the surface.

A family is built once per served decisions model from its card (`decisions.family` and `decisions.parameters`).
`check` adds the family's own rules to the shared question validation; `answer` turns the valid questions of a
request (each with the view of the state it reads) into model inputs, runs them through Triton and fills in each
question's `Outcome` or item error. Questions over the same text share one model input.
"""

from __future__ import annotations

import time
from abc import ABC, abstractmethod
from dataclasses import dataclass, field
from typing import Any, ClassVar

from pydantic import BaseModel, ConfigDict, ValidationError

from ...errors import ItemError
from ...runtime import Runtime, ServedModel
from ..answers import Outcome
from ..questions import Question
from ..state import View


@dataclass
class Ask:
    """One valid question of one state entry and the text it reads."""

    entry: str | None
    question: Question
    view: View
    outcome: Outcome | None = None
    error: ItemError | None = None
    question_tokens: int = 0  # tokens of the question's own texts (instructions, options)
    view_tokens: int = 0  # tokens of the state read for it (a lower bound when read in part)
    tokens_lower_bound: bool = False  # the state was read only in part: view_tokens counts what was read
    reason: str | None = None  # which limit failed it, when one did (System One's flat `reason`)
    pictures: list[Any] = field(default_factory=list)  # media.Picture: the images it reads, in "[image k]" order
    own_pictures: list[Any] = field(default_factory=list)  # those in the question itself (instructions, options)
    seen: dict[int, Any] = field(default_factory=dict)  # image number → what the family read in it (OCR lines)

    def fail(self, error: ItemError) -> None:
        if self.error is None:
            self.error = error


@dataclass
class Context:
    runtime: Runtime
    model: ServedModel
    deadline_ms: float | None
    max_tokens: int | None  # options.max_tokens: the scan budget for parts read in windows
    started: float  # perf_counter at the request's arrival (deadlines are measured from it)
    long_context: bool = False  # the request asked for long context (max_input_tokens instead of validated)


@dataclass
class Phases:
    """Triton-side queue/forward time of one model's work for a request, and when it was answered."""

    queue_ms: float = 0.0
    forward_ms: float = 0.0
    done: float = 0.0

    @classmethod
    def of(cls, queue_ms: float, forward_ms: float) -> Phases:
        return cls(queue_ms, forward_ms, time.perf_counter())


class Params(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)


class FamilyError(ValueError):
    """The card's family parameters are wrong: the model fails to load with this reason."""


class Family(ABC):
    name: ClassVar[str]
    params_type: ClassVar[type[Params]]

    def __init__(self, model: ServedModel) -> None:
        spec = model.card.decisions
        assert spec is not None
        self.model = model
        self.spec = spec
        try:
            self.params: Any = self.params_type.model_validate(spec.parameters)
        except ValidationError as exc:
            raise FamilyError(f"decisions.parameters of {model.id}: {exc}") from exc
        # abstain_probability is answered exactly where the card declares it: a family that scores an abstain
        # option the card does not declare, or lacks one the card declares, fails the model at load.
        declared, scored = set(spec.abstain.types if spec.abstain else []), self.abstain_types()
        if declared - scored:
            raise FamilyError(f"decisions.abstain of {model.id} lists {sorted(declared - scored)}; family "
                              f"{self.name} scores an abstain option for {sorted(scored) or 'no question type'} "
                              "with these parameters")
        if scored and not declared:
            raise FamilyError(f"decisions.parameters of {model.id} score an abstain option, but the card declares "
                              "none (decisions.abstain)")

    def abstain_types(self) -> set[str]:
        """The question types this family, with the card's parameters, scores an abstain option for."""
        return set()

    def abstains(self, question: Question) -> bool:
        """Whether this question answers abstain_probability (the card declares it for the question's type)."""
        return self.spec.abstain is not None and question.type in self.spec.abstain.types

    def components(self) -> list[str]:
        """Other served models this family reads through (their ids); the model is ready only when they are."""
        return []

    def optional_components(self) -> list[str]:
        """Models it reads through only when this process serves them (waited for then, skipped otherwise)."""
        return []

    async def warm(self, runtime: Runtime) -> None:  # noqa: B027 - optional hook
        """Anything to do once the model and its components are loaded (e.g. embed fixed texts)."""

    def check(self, question: Question) -> None:  # noqa: B027 - optional hook
        """Raise QuestionError for a question this family cannot answer (on top of the shared rules)."""

    @abstractmethod
    async def answer(self, ctx: Context, asks: list[Ask]) -> list[Phases]:
        """Fill in `outcome` or `error` of every ask; return the phases of each model it ran."""
