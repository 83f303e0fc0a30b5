"""The append-only audit log: one JSON line per decision, on disk before the decision counts.

Every record is written with ``O_APPEND`` and ``fsync``'d, so a crash right after an action
never loses the line that says why it happened. Writes run in a worker thread so that the
fsync never stalls the event loop that acknowledges Alertmanager.
"""

from __future__ import annotations

import asyncio
import os
import threading
import time
from pathlib import Path
from typing import Any

import orjson


class AuditLog:
    def __init__(self, path: Path) -> None:
        self.path = path
        path.parent.mkdir(parents=True, exist_ok=True)
        self._fd = os.open(path, os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o640)
        self._lock = threading.Lock()

    def write_sync(self, record: dict[str, Any]) -> None:
        line = orjson.dumps({"ts": round(time.time(), 6), **record}, default=str) + b"\n"
        with self._lock:
            os.write(self._fd, line)
            os.fsync(self._fd)

    async def write(self, record: dict[str, Any]) -> None:
        await asyncio.to_thread(self.write_sync, record)

    def close(self) -> None:
        os.close(self._fd)
