"""Logs for machines and for people: `--log-format json` writes one JSON object per line (a log shipper needs no
parser), and every HTTP request gets one line with its id, surface, model, status and Server-Timing total.

The request line is written by a middleware; the model is noted by whoever resolves it (`note`), through a context
variable, so surfaces need not pass it around.
"""

from __future__ import annotations

import json
import logging
import re
import sys
import time
import uuid
from collections.abc import Awaitable, Callable
from contextvars import ContextVar
from typing import Any

from aiohttp import web

log = logging.getLogger("sr_gateway.request")

_FIELDS: ContextVar[dict[str, Any] | None] = ContextVar("sr_gateway_request_fields", default=None)
_TOTAL = re.compile(r"(?:^|,\s*)total;dur=([0-9.]+)")
_STANDARD = frozenset(vars(logging.LogRecord("", 0, "", 0, "", None, None))) | {"message", "asctime"}
REQUEST_ID = "X-Request-Id"


class JsonFormatter(logging.Formatter):
    """One JSON object per record: time, level, logger, message, any `extra` fields, and the exception if any."""

    def format(self, record: logging.LogRecord) -> str:
        out: dict[str, Any] = {
            "time": time.strftime("%Y-%m-%dT%H:%M:%S", time.gmtime(record.created)) + f".{int(record.msecs):03d}Z",
            "level": record.levelname.lower(), "logger": record.name, "message": record.getMessage(),
        }
        out.update({k: v for k, v in vars(record).items() if k not in _STANDARD and not k.startswith("_")})
        if record.exc_info:
            out["exception"] = self.formatException(record.exc_info)
        return json.dumps(out, default=str)


def configure(level: str, fmt: str) -> None:
    handler = logging.StreamHandler(sys.stderr)
    if fmt == "json":
        handler.setFormatter(JsonFormatter())
    else:
        handler.setFormatter(logging.Formatter("%(asctime)s %(levelname)s %(name)s: %(message)s"))
    root = logging.getLogger()
    root.handlers[:] = [handler]
    root.setLevel(level.upper())


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
