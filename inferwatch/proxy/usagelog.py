"""The usage log: one JSON line per settled request, the ledger chargeback is totalled from.

Lines carry the prices in force when the request settled, so a price change mid-window is
billed at the price of the time. Lines are buffered (:class:`Buffered`) and appended in
small batches (at most ``max_lines`` late, and on every flush), never one write per request
on the event loop, to one of two sinks: this module's files, or a Redis stream under
``shared_state`` (:mod:`.usagestream`).

Each process writes its own files, named by its start time and a sequence, so a restart
continues the log in a new file and nothing is rewritten; a file past ``rotate_bytes``
is closed and a new one started, and only the newest ``retain_files`` are kept.

A sink that refuses a write (a volume full, read-only or gone; Redis down) never fails a
request or the flush loop: the lines stay buffered and the next flush tries again; past
``MAX_BUFFERED`` lines the oldest are dropped. Both are counted in ``errors`` (``write``,
``dropped``) and logged once per outage.
"""

from __future__ import annotations

import logging
import os
import time
import uuid
from abc import ABC, abstractmethod
from pathlib import Path
from typing import Any

from inferwatch.logs import log_event
from inferwatch.proxy.jsoncodec import dumps_line

PREFIX = "usage-"
SUFFIX = ".jsonl"
#: lines held while the volume refuses writes (a few MiB), past which the oldest are dropped
MAX_BUFFERED = 65536

logger = logging.getLogger(__name__)


class Buffered(ABC):
    """The lines waiting for a sink, and the rule for a sink that refuses them (see the
    module docstring). A line's sequence number (from 1, in order of writing, never reused)
    lets a sink that may have taken a batch whose reply was lost take it again only once."""

    def __init__(self, where: str, max_lines: int, errors: dict[str, int] | None) -> None:
        #: the sink, as its outage is logged
        self.where = where
        self.max_lines = max_lines
        #: reason -> failed writes and lines dropped (the proxy's metrics read it)
        self.errors = {} if errors is None else errors
        self._lines: list[str] = []
        #: the sequence number of ``_lines[0]``
        self._first = 1
        self._failing = False

    def write(self, fields: dict[str, Any]) -> None:
        self._lines.append(dumps_line(fields))
        if len(self._lines) >= self.max_lines:
            self._full()

    @abstractmethod
    def _full(self) -> None:
        """``max_lines`` are waiting: have them flushed soon."""

    def _landed(self, count: int) -> None:
        """The oldest ``count`` lines are in the sink: forget them."""
        del self._lines[:count]
        self._first += count
        if self._failing:
            self._failing = False
            log_event(logger, logging.INFO, "usage log writable again", sink=self.where)

    def _refused(self, exc: Exception) -> None:
        """Keep the lines for the next flush, the newest ``MAX_BUFFERED`` of them."""
        self.errors["write"] = self.errors.get("write", 0) + 1
        excess = len(self._lines) - MAX_BUFFERED
        if excess > 0:
            self._drop(excess)
        if not self._failing:
            self._failing = True
            log_event(
                logger,
                logging.ERROR,
                "cannot append to the usage log; its lines are kept and retried",
                sink=self.where,
                error=str(exc) or type(exc).__name__,
            )

    def _drop(self, count: int) -> None:
        del self._lines[:count]
        self._first += count
        self.errors["dropped"] = self.errors.get("dropped", 0) + count

    def _abandon(self) -> None:
        """At shutdown, with the sink still refusing: what is left is lost, and counted."""
        if self._lines:
            log_event(logger, logging.ERROR, "usage lines lost at shutdown: the usage log "
                      "refused them", sink=self.where, lines=len(self._lines))  # fmt: skip
            self._drop(len(self._lines))


class UsageLog(Buffered):
    """The usage log's files (see the module docstring)."""

    def __init__(
        self,
        directory: str,
        rotate_bytes: int = 64 << 20,
        retain_files: int = 100,
        max_lines: int = 256,
        errors: dict[str, int] | None = None,
    ) -> None:
        super().__init__(directory, max_lines, errors)
        self.directory = Path(directory)
        self.rotate_bytes = rotate_bytes
        self.retain_files = retain_files
        self._run = f"{time.time_ns():020d}-{uuid.uuid4().hex[:8]}"
        self._sequence = 0
        self._size = 0
        self._path = self._next_path()

    def _next_path(self) -> Path:
        self._sequence += 1
        self._size = 0
        return self.directory / f"{PREFIX}{self._run}-{self._sequence:06d}{SUFFIX}"

    def _full(self) -> None:
        self.flush()

    def flush(self) -> None:
        """Append the buffered lines; rotate, then drop files beyond retention."""
        if not self._lines:
            return
        data = ("\n".join(self._lines) + "\n").encode()
        try:
            self.directory.mkdir(parents=True, exist_ok=True)
            with self._path.open("ab") as out:
                out.write(data)
        except OSError as exc:
            self._refused(exc)
            return
        self._landed(len(self._lines))
        self._size += len(data)
        if self._size >= self.rotate_bytes:
            self._path = self._next_path()
            self._retain()

    def close(self) -> None:
        """The last flush, at shutdown."""
        self.flush()
        self._abandon()

    def _retain(self) -> None:
        files = sorted(self.directory.glob(f"{PREFIX}*{SUFFIX}"))
        for old in files[: max(len(files) - self.retain_files, 0)]:
            try:
                os.unlink(old)
            except OSError as exc:  # another proxy on the volume removed it first, or cannot
                self.errors["retention"] = self.errors.get("retention", 0) + 1
                log_event(logger, logging.WARNING, "cannot remove an old usage log",
                          path=str(old), error=str(exc))  # fmt: skip


def files(directory: str | Path) -> list[Path]:
    """The usage-log files of ``directory``, oldest first."""
    return sorted(Path(directory).glob(f"{PREFIX}*{SUFFIX}"))
