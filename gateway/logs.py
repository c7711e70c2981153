"""Logs for machines and for people: `--log-format json` writes one JSON object per line (a log shipper needs no
parser; sr_common.logs writes it, the same as the control plane's), and every HTTP request gets one line with its
id, surface, model, status and Server-Timing total.

The request line is written by a middleware; the model is noted by whoever resolves it (`note`), through a context
variable, so surfaces need not pass it around.
"""

from __future__ import annotations

import logging
import re
import time
import uuid
from collections.abc import Awaitable, Callable
from contextvars import ContextVar
from typing import Any

from aiohttp import web

from sr_common.logs import configure

__all__ = ["REQUEST_ID", "configure", "note", "request_log"]

log = logging.getLogger("sr_gateway.request")

_FIELDS: ContextVar[dict[str, Any] | None] = ContextVar("sr_gateway_request_fields", default=None)
_TOTAL = re.compile(r"(?:^|,\s*)total;dur=([0-9.]+)")
REQUEST_ID = "X-Request-Id"


def note(**fields: Any) -> None:
    """Add fields (e.g. model) to the current request's log line; a no-op outside a request."""
    current = _FIELDS.get()
    if current is not None:
        current.update(fields)


def _surface(path: str) -> str:
    return path.removeprefix("/v1/").strip("/").replace("/", "_") or "root"


@web.middleware
async def request_log(request: web.Request,
                      handler: Callable[[web.Request], Awaitable[web.StreamResponse]]) -> web.StreamResponse:
    """One line per request (the response carries its id in X-Request-Id: the client's own, or a new one)."""
    request_id = request.headers.get(REQUEST_ID) or uuid.uuid4().hex
    fields: dict[str, Any] = {"request_id": request_id, "method": request.method, "path": request.path,
                              "surface": _surface(request.path), "model": None}
    token = _FIELDS.set(fields)
    started = time.perf_counter()
    status = 500
    response: web.StreamResponse | None = None
    try:
        response = await handler(request)
        status = response.status
        response.headers[REQUEST_ID] = request_id
        return response
    except web.HTTPException as exc:
        status = exc.status
        raise
    finally:
        _FIELDS.reset(token)
        found = _TOTAL.search(response.headers.get("Server-Timing", "")) if response is not None else None
        total = float(found.group(1)) if found else round((time.perf_counter() - started) * 1000.0, 3)
        log.info("%s %s %s", request.method, request.path, status,
                 extra={**fields, "status": status, "total_ms": total})
