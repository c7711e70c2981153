"""The served models of this process: their cards, tokenizers, readiness and admission.

Statuses move starting → loading → warming → ready, or to failed with a reason; a ready model that lost one of
its Triton instances is degraded (not served) until its reload passes the golden check again. /health and every
surface read them from here.
"""

from __future__ import annotations

import time
from dataclasses import dataclass, field
from typing import Any

import numpy as np
from tokenizers import Tokenizer

from .cards import Card
from .errors import ApiError
from .inference import Inference
from .logs import note
from .metrics import Metrics
from .settings import Settings
from .text import TextEncoder
from .triton import Engine

STATUSES = ("starting", "loading", "warming", "ready", "degraded", "failed")
_EARLY = ("starting", "loading", "warming")

ENGINE = "triton/onnxruntime"
DEVICE = "cpu"


@dataclass
class ServedModel:
    card: Card
    # engine, precision, threads from the Triton config (`sr-gateway models tune` writes them; instances: Triton's)
    engine: dict[str, Any] = field(default_factory=lambda: {"engine": "onnxruntime", "precision": "fp32"})
    status: str = "starting"
    reason: str | None = None
    tokenizer: Tokenizer | None = None
    engine_args: dict[str, Any] = field(default_factory=dict)
    output: str = "EMBEDDING"  # the Triton model's result tensor, read from its config at load
    label_vectors: dict[str, np.ndarray] = field(default_factory=dict)  # zero-shot heads: [labels, dim] per head
    _encoder: TextEncoder | None = None
    golden: dict[str, Any] = field(default_factory=lambda: {"status": "pending", "checked": 0, "matched": 0,
                                                            "reference": "cpu"})
    family: Any = None  # decisions models: their decision family, built on first use
    written: Card | None = None  # the card as its file says; `card` carries the served precision's tolerance
    accelerator: str = "unknown"  # the hardware that runs it (gateway.accelerator), named once per load

    @property
    def id(self) -> str:
        return self.card.id

    @property
    def ready(self) -> bool:
        return self.status == "ready"

    @property
    def device(self) -> str:
        """Where the model runs, read from its Triton config (the instance groups' kind): cuda for GPU instances,
        else cpu. Before the config is read (not loaded yet) it is unknown."""
        groups = self.engine_args.get("instance_group")
        if not groups:
            return "unknown"
        return "cuda" if any(str(g.get("kind", "")) == "KIND_GPU" for g in groups) else "cpu"

    def load_tokenizer(self) -> Tokenizer | None:
        """The card's tokenizer with any padding/truncation baked into tokenizer.json switched off:
        budgets are the gateway's job, and must be visible in usage. Models that read no text have none."""
        if "text" not in self.card.modalities:
            return None
        tokenizer = Tokenizer.from_file(str(self.card.tokenizer_path))
        tokenizer.no_padding()
        tokenizer.no_truncation()
        self.tokenizer = tokenizer
        self._encoder = TextEncoder(tokenizer)
        return tokenizer

    def text_encoder(self) -> TextEncoder:
        """Budget-bounded tokenization for this model (its probe facts are computed once, on first use)."""
        if self._encoder is None:
            self.load_tokenizer()
        assert self._encoder is not None
        return self._encoder


def served_precision(card: Card, choice: dict[str, str] | None = None) -> tuple[Card, dict[str, Any]]:
    """The engine choice a model is served with, and the card as served at its precision: a faster precision the
    card allows has its own golden tolerance (the fp32 tolerance would reject its rounding). `choice`: what Triton
    reports it loaded (configs.choice_of_loaded); before the load, the config Triton will load (the generated
    configs/tuned.pbtxt, else config.pbtxt) from the local repository."""
    from sr_common.tuned_config import DEFAULTS, choice_of, served_config

    if choice is None:
        path = served_config(card.directory.parent / card.triton_name)
        choice = choice_of(path.read_text()) if path.is_file() else dict(DEFAULTS)
    spec = card.precisions.get(choice["precision"])  # type: ignore[call-overload]
    if card.golden is not None and spec is not None and spec.golden_tolerance is not None:
        card = card.model_copy(update={"golden": card.golden.model_copy(update={"tolerance": spec.golden_tolerance})})
    engine: dict[str, Any] = {"engine": choice["engine"], "precision": choice["precision"],
                              "threads": int(choice["threads"])}
    if choice["precision"] == "int8":  # which quantised copy runs (ort_engine.RECIPES)
        engine["int8_recipe"] = choice["int8_recipe"]
    return card, engine


def apply_loaded_config(model: ServedModel, config: dict[str, Any]) -> None:
    """Serve what Triton actually loaded (its model config over gRPC), not what a local file says: an external
    Triton has its own repository, and a child one may have loaded configs/tuned.pbtxt or config.pbtxt."""
    from sr_common.engine_choice import choice_of_loaded

    model.card, model.engine = served_precision(model.written or model.card, choice_of_loaded(config))


def served_engine(model: ServedModel) -> str:
    """`triton/<engine>`: the engine inside Triton that runs this model (ENGINE for the default)."""
    return f"triton/{model.engine.get('engine', 'onnxruntime')}"


def served_dtype(model: ServedModel) -> str:
    """The card's dtype with its fp32 activations replaced by the served precision (int4-weights/fp32 → /bf16)."""
    precision = model.engine.get("precision", "fp32")
    if precision == "fp32":
        return model.card.dtype
    return model.card.dtype.replace("fp32", precision) if "fp32" in model.card.dtype else precision


class Runtime:
    def __init__(self, settings: Settings, cards: list[Card], metrics: Metrics, engine: Engine | None = None) -> None:
        self.settings = settings
        self.metrics = metrics
        self.models: dict[str, ServedModel] = {c.id: ServedModel(*served_precision(c), written=c) for c in cards}
        # every model call goes through it; over Triton (built by the lifecycle) or the engine given here
        self.inference: Inference | None = Inference(engine) if engine is not None else None
        self.draining = False
        self.inflight: dict[str, int] = {}  # inputs submitted to Triton and not yet answered, per Triton model
        # what /health reports about Triton: child or external, restarts and the last exit
        # (an engine given here is never restarted by the gateway either: external)
        self.triton_health: dict[str, Any] = {"mode": "external" if settings.triton_url or engine else "child",
                                              "live": False, "restarts": 0, "last_exit": None}
        self.failed_since: float | None = None  # monotonic time since when every model has been failed
        for model in self.models.values():
            self.set_status(model, "starting")

    # -- status -----------------------------------------------------------------------------------------------
    def set_status(self, model: ServedModel, status: str, reason: str | None = None) -> None:
        assert status in STATUSES
        model.status, model.reason = status, reason
        for served in self.models.values():  # the models riding on this one change with it
            self.metrics.child(self.metrics.model_ready, served.id).set(1 if self.is_ready(served) else 0)
        self.metrics.ready.set(1 if self.all_ready() else 0)
        every_failed = all(m.status == "failed" for m in self.models.values())
        if not every_failed:
            self.failed_since = None
        elif self.failed_since is None:
            self.failed_since = time.monotonic()

    def rides_on(self, model: ServedModel) -> list[ServedModel]:
        """The served models this one answers through: the one that owns the Triton model it runs on (a zero-shot
        head or a decisions card over an embedder) and its decision family's required components."""
        out = [m for m in self.models.values() if m is not model and m.card.triton_model is None
               and m.card.triton_name == model.card.triton_name]
        components = model.family.components() if model.family is not None else []
        out += [self.models[name] for name in components if name in self.models and self.models[name] is not model]
        return list({id(m): m for m in out}.values())

    def status_of(self, model: ServedModel, seen: frozenset[str] = frozenset()) -> tuple[str, str | None]:
        """A model's status as served: its own, unless a model it rides on is not ready (Triton's model frozen,
        reloading, failed), in which case it cannot answer either: then degraded (or that model's early status,
        loading/warming) with the reason naming what it rides on."""
        if model.status != "ready":
            return model.status, model.reason
        for base in self.rides_on(model):
            if base.id in seen:
                continue
            status, reason = self.status_of(base, seen | {model.id})
            if status != "ready":
                shown = status if status in _EARLY else "degraded"
                return shown, f"it runs on model {base.id}, which is {status}" + (f": {reason}" if reason else "")
        return "ready", None

    def is_ready(self, model: ServedModel) -> bool:
        return self.status_of(model)[0] == "ready"

    def liveness(self) -> tuple[bool, str | None]:
        """Alive unless every model has been failed for longer than --liveness-failed-s: such a process
        serves nothing and heals nothing by itself (a hit restart limit, a Triton that never came up, models that
        keep failing their retries), so /health/live hands it to the orchestrator instead of staying 200 forever."""
        limit = self.settings.liveness_failed_s
        if limit <= 0 or self.failed_since is None or self.draining:
            return True, None
        if time.monotonic() - self.failed_since < limit:
            return True, None
        _, reason = self.process_status()
        return False, f"every model has been failed for more than {limit:g} s: {reason}"

    def fail_all(self, reason: str) -> None:
        for model in self.models.values():
            if model.status != "failed":
                self.set_status(model, "failed", reason)

    def all_ready(self) -> bool:
        return bool(self.models) and all(self.is_ready(m) for m in self.models.values()) and not self.draining

    def process_status(self) -> tuple[str, str | None]:
        models = list(self.models.values())
        if self.draining:
            return "degraded", "the process is shutting down"
        if not models:
            return "failed", "no model is configured"
        statuses = {m.id: self.status_of(m) for m in models}
        if all(s == "ready" for s, _ in statuses.values()):
            return "ready", None
        for early in _EARLY:
            if any(statuses[m.id][0] == early for m in models):
                first = next(m for m in models if statuses[m.id][0] == early)
                return early, self._reason(first, statuses[first.id], len(models) > 1)
        if all(s == "failed" for s, _ in statuses.values()):
            first = models[0]
            return "failed", self._reason(first, statuses[first.id], len(models) > 1)
        first = next(m for m in models if statuses[m.id][0] != "ready")
        return "degraded", self._reason(first, statuses[first.id], True)

    @staticmethod
    def _reason(model: ServedModel, status: tuple[str, str | None], prefix: bool) -> str | None:
        reason = status[1] or f"model {model.id} is {status[0]}"
        return f"{model.id}: {reason}" if prefix else reason

    # -- resolution -------------------------------------------------------------------------------------------
    def resolve(self, name: str | None, surface: str) -> ServedModel:
        """The model a request names (or the only one); checks surface before readiness, like the reference."""
        if name is None:
            if len(self.models) != 1:
                raise ApiError("invalid_request",
                               f"model is required: this runtime serves {', '.join(sorted(self.models))}")
            model = next(iter(self.models.values()))
        else:
            model = self.models.get(name) or next(
                (m for m in self.models.values() if name == m.card.triton_name), None)  # type: ignore[assignment]
            if model is None:
                raise ApiError("model_not_found",
                               f"this runtime serves {', '.join(sorted(self.models))}, not {name}")
        note(model=model.id)
        if surface not in model.card.surfaces:
            raise ApiError("unsupported_surface",
                           f"model {model.id} serves {', '.join(model.card.surfaces)}, not {surface}")
        status, reason = self.status_of(model)
        if status != "ready" or self.draining:
            why = "the process is shutting down" if self.draining else (reason or f"model {model.id} is {status}")
            raise ApiError("not_ready", why)
        return model

    def admit(self, model: ServedModel, inputs: int) -> None:
        """All-or-nothing admission: a request whose inputs would overfill the model's queue gets 429 (try again);
        one that could never fit gets 413. Served models that share a Triton model (a zero-shot head or a
        decisions card over the embedder) share its queue: the bound is on what Triton holds."""
        if inputs > self.settings.max_queue:
            raise ApiError("request_too_large", f"the request has {inputs} inputs; --max-queue "
                                                f"{self.settings.max_queue} admits at most that many at once")
        name = model.card.triton_name
        held = self.inflight.get(name, 0)
        if held + inputs > self.settings.max_queue:
            raise ApiError("overloaded",
                           f"model {model.id} has {held} inputs in flight on {name}; "
                           f"{inputs} more would exceed --max-queue {self.settings.max_queue}")
        self.inflight[name] = held + inputs
        self.metrics.child(self.metrics.queue_depth, name).set(held + inputs)

    def release(self, model: ServedModel, inputs: int) -> None:
        name = model.card.triton_name
        self.inflight[name] = self.inflight.get(name, 0) - inputs
        self.metrics.child(self.metrics.queue_depth, name).set(self.inflight[name])
