"""The circuit breaker: automation never takes out more than a set share of a population.

A population is the inventory's (a model's replicas, a pool's nodes), never an alert label's,
and its size is what the inventory lists now. Within a sliding window, the distinct targets
taken out of a population may not exceed ``max_fraction`` of it. An action that would cross it
trips the breaker for that population: it stays open, refusing every further action on it,
until a person resets it (``POST /admin/breaker/reset`` or ``inferwatch runbooks
reset-breaker``), as NVSentinel's does; a mass fault is a page, not a reason to isolate more.
Traffic shifts (unit ``traffic``) are not counted. The window and the open breakers live in
the shared :class:`~inferwatch.runbooks.state.State`, so every receiver sharing a store
enforces one breaker per population.
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass

from inferwatch.runbooks.actions.base import Step
from inferwatch.runbooks.config import Breaker
from inferwatch.runbooks.state import State


@dataclass(frozen=True)
class Verdict:
    allowed: bool
    reason: str


def group(unit: str, population: str) -> str:
    """The state's key of one breaker: what is taken out, of which population."""
    return f"{unit} {population}"


def parts(key: str) -> tuple[str, str]:
    """(unit, population) of a breaker's key."""
    unit, _, population = key.partition(" ")
    return unit, population


def check(
    state: State,
    config: Breaker,
    steps: Sequence[Step],
    populations: Mapping[str, int],
    now: float,
) -> Verdict:
    """Whether these steps may run now; trips the breaker when they would cross the limit.

    ``populations`` is the inventory's size of each step's group."""
    for key, targets in _by_group(steps).items():
        if key in state.open:
            return Verdict(False, f"breaker open for {key}")
        population = populations.get(parts(key)[1], 0)
        recent = {t for t, at in state.taken.get(key, {}).items() if now - at < config.window}
        limit = math.floor(config.max_fraction * population)
        if len(recent | targets) > limit:
            reason = (
                f"{len(recent | targets)} of {population} in {key} within "
                f"{config.window:g}s would exceed {config.max_fraction:g}"
            )
            state.open[key] = reason
            return Verdict(False, "breaker tripped: " + reason)
    return Verdict(True, "")


def record(state: State, config: Breaker, steps: Sequence[Step], now: float) -> None:
    """Count the steps' targets as taken out now, and forget those past the window."""
    for key, targets in _by_group(steps).items():
        taken = state.taken.setdefault(key, {})
        for target in targets:
            taken.setdefault(target, now)
        for target, at in list(taken.items()):
            if now - at >= config.window:
                del taken[target]


def forget(state: State, steps: Sequence[Step], since: float) -> None:
    """Uncount targets these steps took at ``since`` (their apply failed: nothing went out)."""
    for key, targets in _by_group(steps).items():
        taken = state.taken.get(key, {})
        for target in targets:
            if taken.get(target) == since:
                del taken[target]


def reset(state: State) -> list[str]:
    """Close every open breaker and forget the window (a person has looked)."""
    closed = sorted(state.open)
    state.open.clear()
    state.taken.clear()
    return closed


def _by_group(steps: Sequence[Step]) -> dict[str, set[str]]:
    groups: dict[str, set[str]] = {}
    for step in steps:
        if step.unit != "traffic":
            groups.setdefault(group(step.unit, step.group), set()).add(step.target)
    return groups
