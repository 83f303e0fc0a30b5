"""The access log: one structured line per request, cheap enough for the request path.

Going through ``logging`` costs about 40 us a line (a LogRecord, a formatter, a flush and a
write syscall per record), more than the rest of the proxy's work on a small request. When
the ``inferwatch`` logger writes JSON lines (the default off a terminal), lines are formatted
here in the same shape as :class:`inferwatch.logs.JsonFormatter` and written in batches:
at most ``flush_every`` seconds or ``max_lines`` lines late, and on shutdown. On a terminal,
lines go through ``log_event`` like every other event.
"""

from __future__ import annotations

import logging
import time
from typing import Any, TextIO

from inferwatch.logs import JsonFormatter, log_event
from inferwatch.proxy.jsoncodec import dumps_line

LOGGER_NAME = "inferwatch.proxy.access"


class AccessLog:
    def __init__(self, enabled: bool = True, max_lines: int = 256) -> None:
        self.logger = logging.getLogger(LOGGER_NAME)
        self.enabled = enabled and self.logger.isEnabledFor(logging.INFO)
        self.max_lines = max_lines
        self._stream = _json_stream(self.logger)
        self._lines: list[str] = []
        self._stamp_second = -1
        self._stamp = ""

    def write(self, fields: dict[str, Any]) -> None:
        if not self.enabled:
            return
        if self._stream is None:
            log_event(self.logger, logging.INFO, "request", **fields)
            return
        now = time.time()
        second = int(now)
        if second != self._stamp_second:
            self._stamp_second = second
            self._stamp = time.strftime("%Y-%m-%dT%H:%M:%S", time.gmtime(second))
        event = {
            "ts": f"{self._stamp}.{int((now - second) * 1000):03d}Z",
            "level": "info",
            "logger": LOGGER_NAME,
            "msg": "request",
            **fields,
        }
        self._lines.append(dumps_line(event))
        if len(self._lines) >= self.max_lines:
            self.flush()

    def flush(self) -> None:
        if self._lines and self._stream is not None:
            self._lines.append("")
            self._stream.write("\n".join(self._lines))
            self._stream.flush()
            self._lines.clear()


def _json_stream(logger: logging.Logger) -> TextIO | None:
    """The stream of the handler that would write this logger's records as JSON, if any."""
    current: logging.Logger | None = logger
    while current is not None:
        for handler in current.handlers:
            if isinstance(handler, logging.StreamHandler) and isinstance(
                handler.formatter, JsonFormatter
            ):
                stream: TextIO = handler.stream
                return stream
            return None
        current = current.parent if current.propagate else None
    return None
