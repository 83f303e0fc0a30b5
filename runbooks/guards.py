"""The guards between a firing alert's plan and its action: each says pass, or why not.

The namespace allow-list reads only the alert, before there is a plan. The others read the
shared state, in :func:`pipeline`'s order, inside the one transaction that begins the episode
when all of them pass, so no two receivers sharing a store both pass them for one episode. A
new guard is one class here and one entry in :func:`pipeline`.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Protocol

from inferwatch.runbooks import breaker
from inferwatch.runbooks.config import Breaker, Config
from inferwatch.runbooks.episodes import Attempt
from inferwatch.runbooks.state import MAX_EPISODES, State


@dataclass(frozen=True)
class Reason:
    """Why a guard holds an alert back, as its audit line says it."""

    outcome: str
    text: str
    decision: str = "skipped"
    #: a redelivery of an episode whose apply finished: its targets are read back first, and
    #: one that lost its state is applied again instead of skipped
    read_back: bool = False


class Guard(Protocol):
    def check(self, attempt: Attempt, state: State) -> Reason | None:
        """None to pass; else why the attempt does not act."""
        ...


class Namespace:
    """Only targets in the allowed namespaces (the inventory's, never an alert label's)."""

    def __init__(self, config: Config) -> None:
        self.config = config

    def check(self, labels: Mapping[str, str]) -> Reason | None:
        if self.config.namespace_allowed(labels):
            return None
        namespace = labels.get("namespace", "")
        return Reason("namespace", f"namespace {namespace!r} is not allowed")


class Idempotency:
    """Each episode starts each action once, however often Alertmanager sends it."""

    def check(self, attempt: Attempt, state: State) -> Reason | None:
        if attempt.idempotency_key not in state.seen:
            return None
        episode = state.episodes.get(attempt.episode_id)
        settled = episode is not None and episode.settled  # else: being applied right now
        return Reason("duplicate", "this episode was acted on already", read_back=settled)


class DryRun:
    """Unless the receiver executes, the plan is recorded and nothing changes."""

    def __init__(self, execute: bool) -> None:
        self.execute = execute

    def check(self, attempt: Attempt, state: State) -> Reason | None:
        if self.execute:
            return None
        return Reason("dry_run", "dry-run: plan recorded, nothing changed", decision="dry_run")


class Cooldown:
    """A target the action changed within the rule's cooldown is left alone."""

    def check(self, attempt: Attempt, state: State) -> Reason | None:
        cooldown = attempt.rule.cooldown
        for step in attempt.steps:
            last = state.applied.get(f"{attempt.rule.action} {step.target}")
            if last is not None and attempt.now - last < cooldown:
                ago = f"{attempt.now - last:.0f}s ago (cooldown {cooldown:g}s)"
                return Reason("cooldown", f"{step.target} was acted on {ago}")
        return None


class CircuitBreaker:
    """Never more than a set share of a population out; crossing it trips the breaker, which
    stays open until a person resets it (see :mod:`~inferwatch.runbooks.breaker`)."""

    def __init__(self, limits: Breaker) -> None:
        self.limits = limits

    def check(self, attempt: Attempt, state: State) -> Reason | None:
        verdict = breaker.check(state, self.limits, attempt.steps, attempt.populations, attempt.now)
        return None if verdict.allowed else Reason("breaker", verdict.reason)


class Capacity:
    """A new episode only while the state holds fewer than :data:`MAX_EPISODES`."""

    def check(self, attempt: Attempt, state: State) -> Reason | None:
        if attempt.episode_id in state.episodes or len(state.episodes) < MAX_EPISODES:
            return None
        return Reason("state_full", f"{MAX_EPISODES} episodes are held already")


def pipeline(config: Config, execute: bool) -> list[Guard]:
    """The state's guards, in the order they are checked."""
    return [Idempotency(), DryRun(execute), Cooldown(), CircuitBreaker(config.breaker), Capacity()]


def first_reason(guards: Sequence[Guard], attempt: Attempt, state: State) -> Reason | None:
    """The first guard's reason to hold ``attempt`` back; None when every guard passes."""
    for guard in guards:
        if (reason := guard.check(attempt, state)) is not None:
            return reason
    return None
