"""Bounded label values, so that a flood of tenant ids cannot blow up Prometheus.

Allow-listed values (the configured tenants) always keep their own label. Others take one of
``capacity`` slots while there is room and fold into ``other`` once the slots are taken; a
caller that does not yet know whether a value deserves a slot (a model name the engine may
refuse) asks without taking one, and takes it once the engine has served the value. A
slot that has been idle for ``idle_seconds`` is released; the caller folds that value's
series into ``other`` so that totals, and the reconciliation with the engine, stay exact.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Iterable

from inferwatch import wire
from inferwatch.identity import UNKNOWN

OTHER = "other"
_SPLIT_HEADER = wire.SPLIT_HEADER.encode()
_SPLITS = {value.encode(): value for value in wire.SPLITS}


def split_label(headers: Iterable[tuple[bytes, bytes]]) -> str:
    """The gateway's split of a request (``inferwatch.wire``): one of its few values,
    ``other`` for anything else and ``unknown`` when no gateway set one (direct traffic), so
    that the label's values stay a fixed handful whatever a client sends."""
    for name, value in headers:
        if name == _SPLIT_HEADER:
            return _SPLITS.get(value.strip().lower(), OTHER)
    return UNKNOWN


class BoundedLabels:
    def __init__(
        self,
        capacity: int,
        allow: Iterable[str] = (),
        idle_seconds: float = 600.0,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self.capacity = capacity
        self.allow = frozenset(allow) | {OTHER, UNKNOWN}  # fixed spellings need no slot
        self.idle_seconds = idle_seconds
        self._clock = clock
        self._last_seen: dict[str, float] = {}
        self.folded = 0  # values turned into OTHER because no slot was free

    def label(self, value: str, take: bool = True) -> str:
        """The label to record ``value`` under (itself, or ``other``); unless ``take``, a value
        without a slot is ``other`` and takes none."""
        if value in self.allow:
            return value
        last = self._last_seen
        if value in last or (take and len(last) < self.capacity):
            last[value] = self._clock()
            return value
        if take:
            self.folded += 1
        return OTHER

    def evict_idle(self) -> list[str]:
        """Release slots idle for longer than ``idle_seconds``; returns the released values."""
        horizon = self._clock() - self.idle_seconds
        idle = [value for value, seen in self._last_seen.items() if seen < horizon]
        for value in idle:
            del self._last_seen[value]
        return idle

    def __len__(self) -> int:
        """Values currently holding a slot (allow-listed values not counted)."""
        return len(self._last_seen)
