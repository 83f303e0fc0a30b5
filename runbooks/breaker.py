"""The circuit breaker: automation never takes out more than a set share of a group at once.

Within a sliding window, the distinct targets taken out of a group (a model's replicas, a
pool's GPUs or nodes) may not exceed ``max_fraction`` of its configured population. An action
that would cross it trips the breaker for that group: it stays open, refusing every further
action on the group, until a person resets it (``POST /admin/breaker/reset`` or
``inferwatch runbooks reset-breaker``), as NVSentinel's does; a mass fault is a page, not a
reason to isolate more. Traffic shifts (unit ``traffic``) are not counted. The state is
saved to a file when one is given, so a restart does not close an open breaker.
"""

from __future__ import annotations

import json
import math
import os
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path

from inferwatch.runbooks.actions.base import Step
from inferwatch.runbooks.config import Breaker as BreakerConfig

GroupKey = tuple[str, str]  # (unit, group)


@dataclass(frozen=True)
class Verdict:
    allowed: bool
    reason: str


class CircuitBreaker:
    def __init__(
        self,
        config: BreakerConfig,
        state_file: Path | None = None,
        clock: Callable[[], float] = time.time,
    ) -> None:
        self.config = config
        self.state_file = state_file
        self.clock = clock
        self.taken: dict[GroupKey, dict[str, float]] = {}  # target -> when it was taken out
        self.open: dict[GroupKey, str] = {}  # why it tripped
        self._load()

    def check(self, steps: Sequence[Step]) -> Verdict:
        """Whether these steps may run now; trips the breaker when they would cross the limit."""
        now = self.clock()
        for key, targets in _by_group(steps).items():
            if key in self.open:
                return Verdict(False, f"breaker open for {key[0]}s of {key[1]!r}")
            population = self.config.populations.get(key[1])
            if population is None:
                return Verdict(False, f"no population configured for group {key[1]!r}")
            recent = {
                t for t, at in self.taken.get(key, {}).items() if now - at < self.config.window
            }
            limit = math.floor(self.config.max_fraction * population)
            if len(recent | targets) > limit:
                reason = (
                    f"{len(recent | targets)} of {population} {key[0]}s of {key[1]!r} within "
                    f"{self.config.window:g}s would exceed {self.config.max_fraction:g}"
                )
                self.open[key] = reason
                self._save()
                return Verdict(False, "breaker tripped: " + reason)
        return Verdict(True, "")

    def record(self, steps: Sequence[Step]) -> None:
        """Count targets that were taken out (or found out already)."""
        now = self.clock()
        for key, targets in _by_group(steps).items():
            group = self.taken.setdefault(key, {})
            for target in targets:
                group.setdefault(target, now)
            for target, at in list(group.items()):
                if now - at >= self.config.window:
                    del group[target]
        self._save()

    def reset(self) -> list[GroupKey]:
        """Close every open breaker and forget the window (a person has looked)."""
        closed = sorted(self.open)
        self.open.clear()
        self.taken.clear()
        self._save()
        return closed

    def _save(self) -> None:
        if self.state_file is None:
            return
        state = {
            "open": [[unit, group, reason] for (unit, group), reason in sorted(self.open.items())],
            "taken": [
                [unit, group, target, at]
                for (unit, group), targets in sorted(self.taken.items())
                for target, at in sorted(targets.items())
            ],
        }
        temporary = self.state_file.with_suffix(".tmp")
        temporary.write_text(json.dumps(state), encoding="utf-8")
        os.replace(temporary, self.state_file)

    def _load(self) -> None:
        if self.state_file is None or not self.state_file.exists():
            return
        state = json.loads(self.state_file.read_text(encoding="utf-8"))
        self.open = {(unit, group): reason for unit, group, reason in state["open"]}
        for unit, group, target, at in state["taken"]:
            self.taken.setdefault((unit, group), {})[target] = at


def _by_group(steps: Sequence[Step]) -> dict[GroupKey, set[str]]:
    groups: dict[GroupKey, set[str]] = {}
    for step in steps:
        if step.unit != "traffic":
            groups.setdefault((step.unit, step.group), set()).add(step.target)
    return groups
