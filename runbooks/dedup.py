"""Idempotency: each firing episode starts each action once, however often it is delivered.

Alertmanager delivers at least once: it retries, re-sends every ``repeat_interval``, and an
HA pair sends everything twice. An episode is ``(fingerprint, startsAt)``; the key adds the
action. The seen-set is bounded and, given a file, appended to and reloaded on start. A
second receiver has its own set: there, the action's apply finds the target already in the
desired state and changes nothing.
"""

from __future__ import annotations

import hashlib
import os
from collections import OrderedDict
from pathlib import Path

MAX_KEYS = 100_000


def key(fingerprint: str, starts_at: str, action: str) -> str:
    return hashlib.sha256(f"{fingerprint}|{starts_at}|{action}".encode()).hexdigest()


class SeenSet:
    def __init__(self, path: Path | None = None, max_keys: int = MAX_KEYS) -> None:
        self.path = path
        self.max_keys = max_keys
        self._keys: OrderedDict[str, None] = OrderedDict()
        if path is not None and path.exists():
            for line in path.read_text(encoding="utf-8").split():
                self._remember(line)
            # rewrite compacted, so the file stays as bounded as the set
            path.write_text("".join(k + "\n" for k in self._keys), encoding="utf-8")

    def __contains__(self, item: str) -> bool:
        return item in self._keys

    def add(self, item: str) -> None:
        self._remember(item)
        if self.path is not None:
            with self.path.open("a", encoding="utf-8") as file:
                file.write(item + "\n")
                file.flush()
                os.fsync(file.fileno())

    def _remember(self, item: str) -> None:
        self._keys[item] = None
        self._keys.move_to_end(item)
        while len(self._keys) > self.max_keys:
            self._keys.popitem(last=False)
