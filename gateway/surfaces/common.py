"""What every POST surface shares: body reading, validation errors, Server-Timing, metrics, serialization."""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from typing import Any, Literal, TypeVar

import orjson
from aiohttp import web
from pydantic import BaseModel, ConfigDict, Field, StrictBool, StrictInt, ValidationError

from ..assets import inline_input_assets
from ..body import read_body
from ..errors import ApiError
from ..runtime import Runtime, ServedModel, served_dtype, served_engine
from ..text import Encoded
from ..timing import Timing

log = logging.getLogger("sr_gateway.http")

RUNTIME_KEY = web.AppKey("runtime", Runtime)
M = TypeVar("M", bound=BaseModel)
R = TypeVar("R")
JSON = "application/json"
DUMPS_OPTIONS = orjson.OPT_SERIALIZE_NUMPY  # float32 vectors serialise as shortest float32 text


class Strict(BaseModel):
    """Request objects: unknown members are errors, and no type coercion ("5" is not 5, 1 is not true)."""

    model_config = ConfigDict(extra="forbid", strict=True, frozen=True)


# The smallest deadline_ms taken: one microsecond. A smaller positive number in JSON can round to 0.0 (1e-400) or
# to a deadline no input can meet; one stated bound keeps the document and the server in step (schemathesis).
MIN_DEADLINE_MS = 0.001


class TextOptions(Strict):
    """Options of surfaces that read each text up to a token budget (embeddings, rerank)."""

    overflow: Literal["reject", "truncate"] = "reject"
    max_tokens: StrictInt | None = Field(default=None, ge=1)
    deadline_ms: float | StrictInt | None = Field(default=None, ge=MIN_DEADLINE_MS)
    return_meta: StrictBool = False


def check_inputs(model: ServedModel, count: int, what: str = "input") -> None:
    """The card's per-request input limit, enforced before any tokenization."""
    if count > model.card.limits.max_inputs:
        raise ApiError("invalid_request", f"{what} has {count} items; model {model.id} takes at most "
                                          f"{model.card.limits.max_inputs} per request")


def token_budget(model: ServedModel, max_tokens: int | None, ceiling: int | None = None,
                 ceiling_name: str = "max_input_tokens") -> int:
    """options.max_tokens, capped by the card's limit (max_input_tokens unless a scan ceiling is given). A budget
    that cannot hold the tokenizer's special tokens answers no input at all, so it is the request's error (the
    served document states the smallest such bound as max_tokens' minimum)."""
    limit = ceiling if ceiling is not None else model.card.limits.max_input_tokens
    if max_tokens is None:
        return limit
    if max_tokens > limit:
        raise ApiError("invalid_request", f"options.max_tokens {max_tokens} exceeds model {model.id}'s "
                                          f"{ceiling_name} {limit}")
    special = model.text_encoder().layout.size if "text" in model.card.modalities else 0
    if max_tokens < special:
        raise ApiError("invalid_request", f"options.max_tokens {max_tokens} is smaller than the {special} special "
                                          f"tokens every input needs (model {model.id})")
    return max_tokens


def _location(loc: tuple[Any, ...]) -> str:
    out = ""
    for part in loc:
        out += f"[{part}]" if isinstance(part, int) else (f".{part}" if out else str(part))
    return out or "body"


def validation_message(exc: ValidationError) -> str:
    unknown = [_location(e["loc"]) for e in exc.errors() if e["type"] == "extra_forbidden"]
    if unknown:
        return f"unknown member{'s' if len(unknown) > 1 else ''}: {', '.join(unknown)}"
    parts = []
    for e in exc.errors()[:5]:
        # union errors name each branch; the last element of loc is then a type name, which helps no one
        loc = tuple(p for p in e["loc"] if not (isinstance(p, str) and ("[" in p or p in {"str", "list"})))
        parts.append(f"{_location(loc)}: {e['msg']}")
    return "; ".join(parts)


def parse(model: type[M], body: Any) -> M:
    if not isinstance(body, dict):
        raise ApiError("invalid_request", "the request body must be a JSON object")
    try:
        return model.model_validate(body)
    except ValidationError as exc:
        raise ApiError("invalid_request", validation_message(exc)) from exc


@dataclass
class Call:
    request: web.Request
    runtime: Runtime
    timing: Timing
    body: Any = None
    parts: dict[str, bytes] | None = None  # image parts of a multipart body, by name (None: a JSON body)


Handler = Callable[[Call], Awaitable[dict[str, Any]]]


def json_response(payload: Any, status: int = 200, headers: dict[str, str] | None = None) -> web.Response:
    return web.Response(body=orjson.dumps(payload), status=status, content_type=JSON, headers=headers)


def error_response(error: ApiError) -> web.Response:
    return json_response(error.body(), error.status, error.headers())


def surface(endpoint: str, render: Callable[[ApiError], ApiError] | None = None,
            ) -> Callable[[Handler], Callable[[web.Request], Awaitable[web.Response]]]:
    """Wrap a surface: every response, errors included, carries Server-Timing and is counted. `render` turns
    every error of the surface (body errors included) into its own shape (System One's schemas)."""

    def decorate(fn: Handler) -> Callable[[web.Request], Awaitable[web.Response]]:
        async def handler(request: web.Request) -> web.Response:
            runtime = request.app[RUNTIME_KEY]
            call = Call(request, runtime, Timing())
            status = 200
            try:
                mark = time.perf_counter()
                call.timing.begin("parse")
                body = await read_body(request, runtime.settings.max_request_bytes)
                call.body, call.parts = body.json, body.parts
                call.timing.add("parse", mark)
                result = await fn(call)
                mark = time.perf_counter()
                payload = orjson.dumps(result, option=DUMPS_OPTIONS)
                call.timing.add("serialize", mark)
                error: ApiError | None = None
            except ApiError as exc:
                call.timing.settle()  # a body or validation error's time shows in parse / tokenize
                error = render(exc) if render is not None else exc
                status = error.status
            except asyncio.CancelledError:
                call.timing.finish()
                log.info("%s: the client went away after %.1f ms; its work was cancelled (499)", endpoint,
                         call.timing.total_ms or 0.0)
                runtime.metrics.observe_request(endpoint, 499, call.timing)  # client went away (nginx's 499)
                raise
            except Exception:
                log.exception("unhandled error on %s", endpoint)
                error = ApiError("internal_error", "internal error; see the gateway log")
                error = render(error) if render is not None else error
                status = error.status
            if error is not None:
                mark = time.perf_counter()
                payload = orjson.dumps(error.body())
                call.timing.add("serialize", mark)
            call.timing.finish()
            runtime.metrics.observe_request(endpoint, status, call.timing)
            headers = {"Server-Timing": call.timing.header(), **(error.headers() if error is not None else {})}
            return web.Response(body=payload, status=status, content_type=JSON, headers=headers)

        handler.__name__ = fn.__name__
        handler.__doc__ = fn.__doc__
        return handler

    return decorate


def response_meta(model: ServedModel, queue_ms: float, forward_ms: float) -> dict[str, Any]:
    """`meta` of a response (with options.return_meta): what answered, on what, and how long the model took."""
    card = model.card
    return {"model_id": model.id, "revision": card.revision, "model_sha256": card.model_sha256,
            "dtype": served_dtype(model), "numerics": card.numerics, "engine": served_engine(model),
            "accelerator": model.device,
            "device": model.device,
            "queue_ms": round(queue_ms, 3), "compute_ms": round(forward_ms, 3)}


def input_usage(encoded: Encoded) -> dict[str, Any]:
    """Per-input usage: tokens counted (a lower bound when read only in part), tokens run, and truncation."""
    out: dict[str, Any] = {"tokens": encoded.tokens, "processed_tokens": len(encoded.ids),
                           "truncated": encoded.truncated}
    if encoded.tokens_lower_bound:
        out["tokens_lower_bound"] = True
    return out


INLINE_CHARS = 16 * 1024  # requests with more text than this are tokenized on a worker thread


async def off_loop_if_large(chars: int, fn: Callable[..., R], *args: Any) -> R:
    """Tokenize small requests inline (a thread hop costs more than they do) and large ones on a worker thread,
    so one long input never stalls every other request on the event loop."""
    if chars <= INLINE_CHARS:
        return fn(*args)
    return await asyncio.to_thread(fn, *args)


Work = Callable[[Runtime, ServedModel, Any, "Call | None"], Awaitable[dict[str, Any]]]


def surface_route(path: str, endpoint: str, request: type[BaseModel], work: Work) -> web.RouteDef:
    """POST route of a surface: parse the request, resolve its model for this surface, then do the work (which
    the readiness check and future bundles call directly, without HTTP)."""

    @surface(endpoint)
    async def handler(call: Call) -> dict[str, Any]:
        mark = time.perf_counter()
        call.timing.begin("tokenize")
        if call.parts and endpoint not in ("embeddings", "classify"):
            raise ApiError("invalid_request", f"{request.__name__} reads no images: send a JSON body")
        body = await inline_input_assets(call.body, call.parts) if endpoint in ("embeddings", "classify") \
            else call.body
        req = parse(request, body)
        model = call.runtime.resolve(getattr(req, "model", None), endpoint)
        call.timing.add("tokenize", mark)
        return await work(call.runtime, model, req, call)

    handler.__name__ = f"create_{endpoint}"
    return web.post(path, handler)
