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


_DECISION_LIMITS = ("truncate_tokens", "validated_input_tokens", "max_request_tokens")  # shown where declared


def model_card(model: ServedModel) -> dict[str, Any]:
    card = model.card
    out: dict[str, Any] = {
        "id": card.id, "object": "model", "owned_by": card.owned_by, "family": card.family,
        "ready": model.ready, "status": model.status, "reason": model.reason, "golden": model.golden,
        "surfaces": list(card.surfaces) if model.status != "failed" else [],
    }
    if model.status == "failed":  # what it would have been: its limits, where it was to run and how
        out.update({"limits": card.limits.model_dump(exclude={k for k in _DECISION_LIMITS
                                                             if getattr(card.limits, k) is None}),
                    "device": model.device, "accelerator": model.device, "engine_args": model.engine_args})
        return out
    out.update({
        "repo": card.repo, "revision": card.revision, "model_sha256": card.model_sha256,
        "question_types": list(card.decisions.question_types) if card.decisions else list(card.question_types),
        "modalities": list(card.modalities), "image_placements": list(card.image_placements),
        "limits": card.limits.model_dump(exclude={k for k in _DECISION_LIMITS
                                                  if getattr(card.limits, k) is None}), "licence": card.licence,
        "attribution": card.attribution, "engine": served_engine(model),
        "engine_args": {**model.engine, **model.engine_args},
        "accelerator": model.device, "device": model.device, "dtype": served_dtype(model),
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
    if card.heads:
        out["heads"] = [{**h.model_dump(exclude={"zero_shot"}), "zero_shot": h.zero_shot is not None}
                        for h in card.heads]
    return out


async def list_models(request: web.Request) -> web.Response:
    runtime = request.app[RUNTIME_KEY]
    return json_response({
        "object": "list", "api_version": API_VERSION, "systemone_schema": runtime.settings.systemone_schema,
        "models": [m.id for m in runtime.models.values()],
        "data": [model_card(m) for m in runtime.models.values()],
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
        body["models"] = {m.id: {"status": m.status, "reason": m.reason} for m in runtime.models.values()}
    body["triton"] = dict(runtime.triton_health)
    return (200 if status == "ready" else 503), body


async def health(request: web.Request) -> web.Response:
    code, body = health_body(request.app[RUNTIME_KEY])
    return json_response(body, code)


async def live(request: web.Request) -> web.Response:
    return json_response({"api_version": API_VERSION, "status": "alive"})


async def metrics(request: web.Request) -> web.Response:
    data, ctype = request.app[RUNTIME_KEY].metrics.render()
    return web.Response(body=data, headers={"Content-Type": ctype})


# Request schemas whose `model` this process requires when it serves several models.
MODEL_REQUESTS = ("DecisionRequest", "ClassifyRequest", "EmbeddingsRequest", "RerankRequest")
_SERVED: dict[int, bytes] = {}


def served_document(runtime: Runtime) -> bytes:
    """The contract as this process enforces it: the file verbatim when one model is served; with several, `model`
    is required in every request (the server answers 400 without it), so the document is exactly as strict."""
    if len(runtime.models) <= 1:
        return OPENAPI_BYTES
    found = _SERVED.get(id(runtime))
    if found is None:
        doc = yaml.safe_load(OPENAPI_BYTES)
        for name in MODEL_REQUESTS:
            schema = doc["components"]["schemas"][name]
            schema["required"] = ["model", *[r for r in schema.get("required", []) if r != "model"]]
        found = _SERVED[id(runtime)] = yaml.safe_dump(doc, sort_keys=False, allow_unicode=True, width=120).encode()
    return found


async def openapi(request: web.Request) -> web.Response:
    return web.Response(body=served_document(request.app[RUNTIME_KEY]), content_type="application/yaml")


def routes() -> list[web.RouteDef]:
    return [
        web.get("/v1/models", list_models), web.get("/health", health), web.get("/health/live", live),
        web.get("/metrics", metrics), web.get("/openapi.yaml", openapi),
    ]
