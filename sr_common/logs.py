"""The log format both services write with `--log-format json`: one JSON object per line, so a log shipper needs
no parser, with the same keys in both (`time`, `level`, `logger`, `message`, then the record's own fields: a
request id, an audit line's who and what)."""

from __future__ import annotations

import json
import logging
import sys
import time
from collections.abc import Sequence
from typing import Any

# what every LogRecord carries; anything else on a record came from `extra=` or a filter and is written out
_STANDARD = frozenset(vars(logging.LogRecord("", 0, "", 0, "", None, None))) | {"message", "asctime"}


class JsonFormatter(logging.Formatter):
    """One JSON object per record: time (UTC, milliseconds), level, logger, message, any `extra` fields, and the
    exception if any."""

    def format(self, record: logging.LogRecord) -> str:
        out: dict[str, Any] = {
            "time": time.strftime("%Y-%m-%dT%H:%M:%S", time.gmtime(record.created)) + f".{int(record.msecs):03d}Z",
            "level": record.levelname.lower(), "logger": record.name, "message": record.getMessage(),
        }
        out.update({k: v for k, v in vars(record).items() if k not in _STANDARD and not k.startswith("_")})
        if record.exc_info:
            out["exception"] = self.formatException(record.exc_info)
        return json.dumps(out, default=str)


def configure(level: str, log_format: str, text: str = "%(asctime)s %(levelname)s %(name)s: %(message)s",
              filters: Sequence[logging.Filter] = ()) -> None:
    """The root logger writes to stderr: JSON lines for log pipelines, else `text` (a %-format) for people;
    `filters` stamp every record (the control plane's request id)."""
    handler = logging.StreamHandler(sys.stderr)
    for found in filters:
        handler.addFilter(found)
    handler.setFormatter(JsonFormatter() if log_format == "json" else logging.Formatter(text))
    root = logging.getLogger()
    root.handlers[:] = [handler]
    root.setLevel(level.upper())
