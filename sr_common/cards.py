"""Model cards (`card.yaml`): what a model is, which surfaces it serves, its limits and its golden answer.

A model author drops a directory with a card into the repository and it is served with no code change; the card
is validated here so a typo fails at load with a reason instead of at the first request. The gateway serves by it
and the build (sr_build) builds and tunes by it, so the schema lives here, in neither.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any, Literal

import yaml
from pydantic import BaseModel, ConfigDict, Field, ValidationError

Surface = Literal["embeddings", "classify", "rerank", "decisions"]


class _Strict(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)


class Limits(_Strict):
    max_input_tokens: int = Field(gt=1)
    max_inputs: int = Field(default=2048, ge=1)
    max_scan_tokens: int | None = Field(default=None, gt=1)  # most tokens of one input read in windows
    truncate_tokens: int | None = Field(default=None, gt=1)  # decisions: tokens an `overflow: truncate` part reads
    validated_input_tokens: int | None = Field(default=None, gt=1)  # decisions: per question without long context
    max_request_tokens: int | None = Field(default=None, gt=1)  # state-once decision models: state once + questions
    video_max_seconds: float | None = Field(default=None, gt=0)  # decisions: longest video other questions read
    box_video_max_seconds: float | None = Field(default=None, gt=0)  # box with `at` and track: longest video


class EmbeddingSpec(_Strict):
    dimensions: list[int]
    layers: list[int]
    pooling: Literal["mean", "cls", "last_token"]
    normalized: bool
    modalities: list[str] = ["text"]
    input_types: list[str] = []
    # Text an instructed embedder reads before each input of a type (E5: "query: " / "passage: "); a request
    # without `input_type` is embedded as `default_input_type`. Applied by `prefixed`, on every surface.
    prefixes: dict[str, str] = {}
    default_input_type: str | None = None

    def prefixed(self, text: str, input_type: str | None) -> str:
        """`text` as the model reads it for this input type (an empty text stays empty: it fails as empty)."""
        prefix = self.prefixes.get(input_type or self.default_input_type or "", "")
        return prefix + text if text else text


class WindowSpec(_Strict):
    tokens: int = Field(ge=2)  # window size including the tokenizer's special tokens
    overlap: int = Field(ge=0)  # content tokens shared by neighbouring windows


class ZeroShot(_Strict):
    """A label head with no trained weights: softmax over scaled cosine between the input's embedding and each
    label description's embedding (embedded once at load by the same model)."""

    descriptions: dict[str, str]
    temperature: float = Field(gt=0)


class HeadSpec(_Strict):
    name: str
    kind: Literal["sequence", "scores", "token"]
    labels: list[str] = Field(min_length=1)  # the model's output order
    inputs: list[Literal["text", "pair", "grounded", "image"]] = ["text"]
    overflow: Literal["reject", "truncate", "window"] = "reject"
    window: WindowSpec | None = None
    default_threshold: float | None = Field(default=None, ge=0, le=1)
    zero_shot: ZeroShot | None = None
    preset: str | None = None  # a trained decisions preset's head (the card's `presets` family) serves it


class RerankSpec(_Strict):
    kind: Literal["bi-encoder", "cross-encoder"]
    description: str | None = None
    # bi-encoder: the embedding input types the query and the documents are embedded as (E5: query / passage)
    query_input_type: str | None = None
    document_input_type: str | None = None


class AbstainSpec(_Strict):
    """The model has an abstain option: one more answer beside a question's own options, which wins when none of
    them fits. Questions of `types` then answer `abstain_probability`, its probability (not calibrated), while their
    `probabilities` stay over their own options (renormalised without it); no other question, and no model without
    this section, ever answers it. How the option is scored is the family's (zeroshot: `parameters.abstain`), and a
    family that has no such option for a listed type fails the model at load."""

    types: list[Literal["choice", "noul"]] = Field(min_length=1)
    description: str | None = None


class DecisionSpec(_Strict):
    """How a card answers /v1/decisions: the family module that turns questions into model inputs and answers,
    the question types it answers, its presets, thresholds and confidence formulas (shown in /v1/models), and
    the family's own parameters (checked by the family when the model loads)."""

    family: str
    question_types: list[Literal["choice", "noul", "score", "set", "span", "box", "track"]] = Field(min_length=1)
    usage: Literal["state_once", "per_question"] = "per_question"
    confidence: dict[str, str] = {}
    thresholds: dict[str, float] = {}
    presets: dict[str, dict[str, Any]] = {}
    window: WindowSpec | None = None
    abstain: AbstainSpec | None = None
    parameters: dict[str, Any] = {}
    description: str | None = None


class ImageSpec(_Strict):
    """How an image model reads pictures: its preprocessing (gateway/images/preprocess.py) and Triton tensors."""

    preprocess: Literal["efficientnet-lite", "ppocr"]
    tokens: int = Field(default=1, ge=0)  # usage tokens one image use counts where it stands


class Golden(_Strict):
    surface: Surface | Literal["ocr"]
    tolerance: float = Field(default=1e-3, gt=0)
    request: dict[str, Any]
    expected: dict[str, Any]


class PrecisionSpec(_Strict):
    """A faster precision the card allows, and the check it must pass against the fp32 reference before it is
    served (`sr-gateway models tune`): embeddings by cosine, classifiers by argmax and probability difference
    (token heads per token, so the same spans)."""

    min_cosine: float | None = Field(default=None, gt=0, le=1)
    max_prob_diff: float | None = Field(default=None, ge=0, le=1)
    same_argmax: bool = True
    golden_tolerance: float | None = Field(default=None, gt=0)  # the served golden check's tolerance at it


class Card(BaseModel):
    """The served part of a card; build-only sections (`build`, `artifacts`) are kept but not interpreted here."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    id: str
    version: int = 1
    family: str
    owned_by: str = "sr-gateway"
    repo: str | None = None
    revision: str | None = None
    licence: str | None = None
    attribution: str | None = None
    surfaces: list[Surface]
    dtype: str = "fp32"
    precisions: dict[Literal["bf16", "int8"], PrecisionSpec] = {}  # allowed beyond fp32, with their checks
    engines: list[Literal["onnxruntime", "openvino", "torch"]] = ["onnxruntime", "openvino", "torch"]  # tuner may try
    # most Triton instances the tuner may lay out (each holds its own copy of the weights: a cap for large models)
    max_instances: int | None = Field(default=None, ge=1)
    numerics: Literal["exact", "approximate"] = "approximate"
    tokenizer: str = "tokenizer.json"
    limits: Limits
    embedding: EmbeddingSpec | None = None
    heads: list[HeadSpec] | None = None
    rerank: RerankSpec | None = None
    decisions: DecisionSpec | None = None
    golden: Golden | None = None
    modalities: list[Literal["text", "image", "audio", "video"]] = ["text"]
    image_max_pixels: int | None = Field(default=None, ge=65_536, le=16_000_000)  # read at most this many (scaled)
    image_placements: list[Literal["state", "instructions", "criteria"]] = []
    question_types: list[str] = []
    image: ImageSpec | None = None
    build: dict[str, Any] | None = None
    artifacts: dict[str, dict[str, str]] | None = None
    triton_model: str | None = None  # defaults to the directory name

    directory: Path = Field(default=Path("."), exclude=True)

    @property
    def triton_name(self) -> str:
        return self.triton_model or self.directory.name

    @property
    def version_dir(self) -> Path:
        return self.directory / str(self.version)

    @property
    def tokenizer_path(self) -> Path:
        """A card that reuses another directory's Triton model (`triton_model`) reads that model's tokenizer."""
        return self.directory.parent / self.triton_name / str(self.version) / self.tokenizer

    @property
    def model_sha256(self) -> str:
        return ((self.artifacts or {}).get("model.onnx") or {}).get("sha256", "")


class CardError(ValueError):
    pass


def load_card(path: Path) -> Card:
    try:
        raw = yaml.safe_load(path.read_text(encoding="utf-8"))
        card = Card.model_validate({**raw, "directory": path.parent})
    except (OSError, yaml.YAMLError, ValidationError, TypeError) as exc:
        raise CardError(f"{path}: {exc}") from exc
    if "embeddings" in card.surfaces and card.embedding is None:
        raise CardError(f"{path}: serves embeddings but has no `embedding` section")
    if card.embedding is not None and (not card.embedding.layers
                                       or card.embedding.layers != sorted(set(card.embedding.layers))):
        raise CardError(f"{path}: embedding.layers must ascend without repeats (the last is the default)")
    if card.embedding is not None:
        declared = set(card.embedding.input_types)
        named = [*card.embedding.prefixes, card.embedding.default_input_type,
                 *((card.rerank.query_input_type, card.rerank.document_input_type) if card.rerank else ())]
        if undeclared := sorted({n for n in named if n is not None} - declared):
            raise CardError(f"{path}: input types {undeclared} are not in embedding.input_types {sorted(declared)}")
    if "classify" in card.surfaces and not card.heads:
        raise CardError(f"{path}: serves classify but declares no `heads`")
    if "decisions" in card.surfaces and card.decisions is None:
        raise CardError(f"{path}: serves decisions but has no `decisions` section")
    if card.decisions is not None and card.decisions.abstain is not None and (
            unanswered := sorted(set(card.decisions.abstain.types) - set(card.decisions.question_types))):
        raise CardError(f"{path}: decisions.abstain lists {unanswered}, which decisions.question_types does not")
    if "image" in card.modalities and card.image_max_pixels is None:
        raise CardError(f"{path}: has the image modality but no `image_max_pixels`")
    if "image" in card.modalities and card.decisions is None and card.image is None:  # decisions read via OCR
        raise CardError(f"{path}: has the image modality but no `image` section or `image_max_pixels`")
    if "rerank" in card.surfaces and card.rerank is None:
        raise CardError(f"{path}: serves rerank but has no `rerank` section")
    for head in card.heads or []:
        if head.overflow == "window" and head.window is None:
            raise CardError(f"{path}: head {head.name} defaults to window overflow but declares no window")
        if head.zero_shot is not None and list(head.zero_shot.descriptions) != head.labels:
            raise CardError(f"{path}: head {head.name}: zero_shot.descriptions must describe exactly its labels")
    return card


def discover(repository: Path, only: list[str] | None = None) -> list[Card]:
    """Every card in the repository (or the named ones), in directory order."""
    cards = [load_card(p) for p in sorted(repository.glob("*/card.yaml"))]
    if only:
        known = {c.id for c in cards}
        missing = [m for m in only if m not in known]
        if missing:
            raise CardError(f"no card for {missing} in {repository} (found {sorted(known)})")
        cards = [c for c in cards if c.id in only]
    return cards
