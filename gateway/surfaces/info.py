"""GET /v1/models, /health, /health/live, /metrics and /openapi.yaml (no Server-Timing: not surfaces)."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import yaml
from aiohttp import web

from ..decisions.answers import FORMULAS
from ..runtime import Runtime, ServedModel, served_dtype, served_engine
from .common import RUNTIME_KEY, json_response

OPENAPI_PATH = Path(__file__).resolve().parent.parent / "openapi.yaml"
OPENAPI_BYTES = OPENAPI_PATH.read_bytes()
API_VERSION: str = yaml.safe_load(OPENAPI_BYTES)["info"]["version"]


_DECISION_LIMITS = ("truncate_tokens", "validated_input_tokens", "max_request_tokens", "video_max_seconds",
                    "box_video_max_seconds")  # shown where declared


def model_card(model: ServedModel, runtime: Runtime) -> dict[str, Any]:
    card = model.card
    status, reason = runtime.status_of(model)
    out: dict[str, Any] = {
        "id": card.id, "object": "model", "owned_by": card.owned_by, "family": card.family,
        "ready": status == "ready", "status": status, "reason": reason, "golden": model.golden,
        "surfaces": list(card.surfaces) if model.status != "failed" else [],
    }
    if model.status == "failed":  # what it would have been: its limits, where it was to run and how
        out.update({"limits": card.limits.model_dump(exclude={k for k in _DECISION_LIMITS
                                                             if getattr(card.limits, k) is None}),
                    "device": model.device, "accelerator": model.accelerator,
                    "engine_args": model.engine_args})
        return out
    out.update({
        "repo": card.repo, "revision": card.revision, "model_sha256": card.model_sha256,
        "question_types": list(card.decisions.question_types) if card.decisions else list(card.question_types),
        "modalities": list(card.modalities), "image_placements": list(card.image_placements),
        "limits": card.limits.model_dump(exclude={k for k in _DECISION_LIMITS
                                                  if getattr(card.limits, k) is None}), "licence": card.licence,
        "attribution": card.attribution, "engine": served_engine(model),
        "engine_args": {**model.engine, **model.engine_args},
        "accelerator": model.accelerator, "device": model.device, "dtype": served_dtype(model),
        "numerics": card.numerics,
        "tokenizer": card.tokenizer,
    })
    if card.image_max_pixels is not None:
        out["image_max_pixels"] = card.image_max_pixels
    if card.embedding is not None:
        out["embedding"] = card.embedding.model_dump()
    if card.rerank is not None:
        out["rerank"] = card.rerank.model_dump()
    if card.decisions is not None:
        spec = card.decisions
        out["decisions"] = {
            "family": spec.family, "description": spec.description, "question_types": list(spec.question_types),
            "usage": spec.usage, "confidence": {t: FORMULAS.get(f, f) for t, f in spec.confidence.items()},
            "thresholds": spec.thresholds,
            "presets": {name: {k: v for k, v in p.items()} for name, p in spec.presets.items()},
        }
        if spec.abstain is not None:  # which question types answer abstain_probability, known before asking
            out["decisions"]["abstain"] = spec.abstain.model_dump()
    if card.heads:
        out["heads"] = [{**h.model_dump(exclude={"zero_shot"}), "zero_shot": h.zero_shot is not None}
                        for h in card.heads]
    return out


async def list_models(request: web.Request) -> web.Response:
    runtime = request.app[RUNTIME_KEY]
    return json_response({
        "object": "list", "api_version": API_VERSION, "systemone_schema": runtime.settings.systemone_schema,
        "models": [m.id for m in runtime.models.values()],
        "data": [model_card(m, runtime) for m in runtime.models.values()],
        "limits": {"max_request_bytes": runtime.settings.max_request_bytes,
                   "max_queue": runtime.settings.max_queue,
                   "max_bundle_tasks": runtime.settings.max_bundle_tasks},
    })


def health_body(runtime: Runtime) -> tuple[int, dict[str, Any]]:
    status, reason = runtime.process_status()
    single = len(runtime.models) == 1
    body: dict[str, Any] = {"api_version": API_VERSION, "status": status, "reason": reason,
                            "model": next(iter(runtime.models)) if single else None}
    if not single:
        body["models"] = {m.id: dict(zip(("status", "reason"), runtime.status_of(m), strict=True))
                          for m in runtime.models.values()}
    body["triton"] = dict(runtime.triton_health)
    return (200 if status == "ready" else 503), body


async def health(request: web.Request) -> web.Response:
    code, body = health_body(request.app[RUNTIME_KEY])
    return json_response(body, code)


async def live(request: web.Request) -> web.Response:
    alive, reason = request.app[RUNTIME_KEY].liveness()
    if alive:
        return json_response({"api_version": API_VERSION, "status": "alive"})
    return json_response({"api_version": API_VERSION, "status": "failed", "reason": reason}, status=503)


async def metrics(request: web.Request) -> web.Response:
    data, ctype = request.app[RUNTIME_KEY].metrics.render()
    return web.Response(body=data, headers={"Content-Type": ctype})


# Request schemas by the surface whose models they name.
MODEL_REQUESTS = {"DecisionStandardRequest": "decisions", "DecisionBatchRequest": "decisions",
                  "ClassifyRequest": "classify", "EmbeddingsRequest": "embeddings", "RerankRequest": "rerank",
                  "CohereV2RerankRequest": "rerank"}
_QUESTIONS = {"choice": "ChoiceQuestion", "noul": "NoulQuestion", "score": "ScoreQuestion", "set": "SetQuestion",
              "span": "SpanQuestion", "box": "BoxQuestion", "track": "TrackQuestion"}
_SERVED: dict[int, bytes] = {}


def model_names(runtime: Runtime, surface: str) -> list[str]:
    """The names a request for `surface` may give as `model`: served models whose card lists the surface, and
    Triton names that resolve to one of them (Runtime.resolve)."""
    names = [m.id for m in runtime.models.values() if surface in m.card.surfaces]
    for m in runtime.models.values():
        alias = m.card.triton_name
        if alias in runtime.models or alias in names:
            continue
        first = next(x for x in runtime.models.values() if x.card.triton_name == alias)
        if surface in first.card.surfaces:
            names.append(alias)
    return names


def _decision_cards(schemas: dict[str, Any], cards: list[Any]) -> None:
    """What the served decision models' cards allow, where every such card agrees (the union of their question
    types and modalities): question types no card answers, box `at` and videos without a video model, images
    without an image model. Presets a card lists add bare preset questions ({type, preset, over, threshold})."""
    if not cards:
        return
    types = {t for c in cards for t in c.decisions.question_types}
    modalities = {m for c in cards for m in (c.modalities or ["text"])}
    schemas["Question"]["oneOf"] = [{"$ref": f"#/components/schemas/{name}"} for t, name in _QUESTIONS.items()
                                    if t in types]
    if "video" not in modalities:
        schemas["BoxQuestion"]["properties"].pop("at", None)
        schemas["DecisionVideos"]["maxItems"] = 0  # both request forms refer to it
    if "image" not in modalities:
        schemas["DecisionImages"]["maxItems"] = 0
    presets: dict[str, set[str]] = {}
    for card in cards:
        for name, preset in card.decisions.presets.items():
            if preset.get("type") in types:
                presets.setdefault(preset["type"], set()).add(name)
    for qtype, names in presets.items():
        variant: dict[str, Any] = {
            "type": "object", "additionalProperties": False, "required": ["type", "preset"],
            "properties": {"type": {"type": "string", "enum": [qtype]},
                           "preset": {"type": "string", "enum": sorted(names)},
                           "over": {"$ref": "#/components/schemas/QuestionOver"}}}
        if qtype in ("set", "span"):
            variant["properties"]["threshold"] = {"type": "number", "minimum": 0, "maximum": 1}
        schemas["Question"]["oneOf"].append(variant)


# Options schemas whose max_tokens is a budget that pays for the special tokens first, by surface.
_BUDGETS = {"EmbeddingsOptions": "embeddings", "ClassifyOptions": "classify", "RerankOptions": "rerank"}


def _card_bounds(schemas: dict[str, Any], runtime: Runtime) -> None:
    """Card facts every served model of a surface shares, stated where OpenAPI can: the heads a classify request
    may name (the union of the served cards' heads: one card's head on another model stays a listed rule), and the
    smallest token budget (one that cannot hold the tokenizer's special tokens answers nothing)."""
    heads = sorted({h.name for m in runtime.models.values() if "classify" in m.card.surfaces
                    for h in m.card.heads or []})
    if heads:
        head = schemas["ClassifyRequest"]["properties"]["head"]
        head["enum"] = [*heads, None] if head.get("nullable") else heads
    for name, surface in _BUDGETS.items():
        readers = [m for m in runtime.models.values() if surface in m.card.surfaces and "text" in m.card.modalities]
        if not readers:
            continue
        least = min(m.text_encoder().layout.size for m in readers)
        budget = schemas[name]["properties"]["max_tokens"]
        budget["minimum"] = max(int(budget.get("minimum", 1)), least)


def served_document(runtime: Runtime) -> bytes:
    """The contract as this process enforces it. `model` names one of the served models that serve the
    operation's surface (another served model is 422 unsupported_surface, an unknown one 404): which models a
    process serves is its configuration, so the served document states it. With several models `model` is
    required (400 without it); with one it may be left out."""
    found = _SERVED.get(id(runtime))
    if found is None:
        doc = yaml.safe_load(OPENAPI_BYTES)
        for name, surface in MODEL_REQUESTS.items():
            schema = doc["components"]["schemas"][name]
            names = model_names(runtime, surface)
            if names:  # enum may not be empty; no model for the surface leaves the file's plain string
                schema["properties"]["model"] = {**schema["properties"]["model"], "enum": names}
            if len(runtime.models) > 1:  # null is "not given", which several models do not allow
                schema["required"] = ["model", *[r for r in schema.get("required", []) if r != "model"]]
                schema["properties"]["model"].pop("nullable", None)
            elif names and schema["properties"]["model"].get("nullable"):
                schema["properties"]["model"]["enum"] = [*names, None]
        _decision_cards(doc["components"]["schemas"], [m.card for m in runtime.models.values()
                                                        if "decisions" in m.card.surfaces])
        _card_bounds(doc["components"]["schemas"], runtime)
        found = _SERVED[id(runtime)] = yaml.safe_dump(doc, sort_keys=False, allow_unicode=True, width=120).encode()
    return found


async def openapi(request: web.Request) -> web.Response:
    return web.Response(body=served_document(request.app[RUNTIME_KEY]), content_type="application/yaml")


def routes() -> list[web.RouteDef]:
    return [
        web.get("/v1/models", list_models), web.get("/health", health), web.get("/health/live", live),
        web.get("/metrics", metrics), web.get("/openapi.yaml", openapi),
    ]
