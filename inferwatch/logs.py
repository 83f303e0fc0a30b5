"""Structured logging: one event per line, JSON when stderr is not a terminal, for our
loggers and uvicorn's alike.

Call sites log a short, stable message plus fields::

    log_event(logger, logging.WARNING, "engine scrape failed", reason="timeout", url=url)

so that a person at a terminal reads ``engine scrape failed reason=timeout url=...`` and a log
pipeline receives ``{"msg": "engine scrape failed", "reason": "timeout", ...}``.
"""

from __future__ import annotations

import json
import logging
import sys
import time
from typing import Any

__all__ = [
    "UVICORN_LEAST_LEVEL",
    "JsonFormatter",
    "TextFormatter",
    "configure",
    "log_event",
]

_FIELDS = "inferwatch_fields"


def log_event(logger: logging.Logger, level: int, msg: str, **fields: Any) -> None:
    logger.log(level, msg, extra={_FIELDS: fields})


class JsonFormatter(logging.Formatter):
    def format(self, record: logging.LogRecord) -> str:
        event: dict[str, Any] = {
            "ts": time.strftime("%Y-%m-%dT%H:%M:%S", time.gmtime(record.created))
            + f".{int(record.msecs):03d}Z",
            "level": record.levelname.lower(),
            "logger": record.name,
            "msg": record.getMessage(),
        }
        event.update(getattr(record, _FIELDS, {}))
        if record.exc_info:
            event["exc"] = self.formatException(record.exc_info)
        return json.dumps(event, default=str)


class TextFormatter(logging.Formatter):
    def format(self, record: logging.LogRecord) -> str:
        fields = getattr(record, _FIELDS, {})
        tail = "".join(f" {k}={v}" for k, v in fields.items())
        stamp = time.strftime("%H:%M:%S", time.localtime(record.created))
        line = f"{stamp} {record.levelname.lower():7} {record.name}: {record.getMessage()}{tail}"
        if record.exc_info:
            line += "\n" + self.formatException(record.exc_info)
        return line


#: uvicorn's start and stop lines at info repeat our own "... starting" events
UVICORN_LEAST_LEVEL = logging.WARNING


def configure(level: str = "info", json_lines: bool | None = None) -> None:
    """Route inferwatch's and uvicorn's loggers to stderr, in one format; ``json_lines=None``
    picks by terminal."""
    if json_lines is None:
        json_lines = not sys.stderr.isatty()
    handler = logging.StreamHandler(sys.stderr)
    handler.setFormatter(JsonFormatter() if json_lines else TextFormatter())
    least = logging.getLevelName(level.upper())
    for name, floor in (("inferwatch", least), ("uvicorn", max(least, UVICORN_LEAST_LEVEL))):
        logger = logging.getLogger(name)
        logger.handlers[:] = [handler]
        logger.setLevel(floor)
        logger.propagate = False
