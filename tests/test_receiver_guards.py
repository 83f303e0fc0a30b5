"""Each of the receiver's guards on its own: what it lets pass, and the reason it gives when it
holds an alert back."""

from __future__ import annotations

import pytest

from inferwatch.runbooks.actions.base import Alert, Step
from inferwatch.runbooks.config import Breaker, Config, Rule
from inferwatch.runbooks.episodes import Attempt
from inferwatch.runbooks.guards import (
    Capacity,
    CircuitBreaker,
    Cooldown,
    DryRun,
    Idempotency,
    Namespace,
    Reason,
    first_reason,
    pipeline,
)
from inferwatch.runbooks.state import MAX_EPISODES, Episode, State

pytestmark = pytest.mark.unit

NOW = 1_000_000.0
RULE = Rule("isolate", "InferwatchEngineStalled", (), "isolate_replica", {}, 300.0, None)
ALERT = Alert(
    "firing", {"alertname": "InferwatchEngineStalled"}, {}, "2026-12-01T00:00:00Z", "", "ab"
)


def step(target: str) -> Step:
    return Step("isolate_replica", target, "replica", "llama", {"isolated": True}, "test")


def attempt(*targets: str, population: int = 10) -> Attempt:
    steps = [step(t) for t in targets or ("sidecar a",)]
    return Attempt(ALERT, RULE, steps, {"llama": population}, NOW)


def config(namespaces: frozenset[str] = frozenset({"inference"})) -> Config:
    return Config(rules=(RULE,), namespaces=namespaces, breaker=Breaker(0.25, 600.0))


def test_the_namespace_guard_passes_an_allowed_namespace_and_names_any_other() -> None:
    guard = Namespace(config())
    assert guard.check({"namespace": "inference"}) is None
    assert guard.check({"namespace": "kube-system"}) == Reason(
        "namespace", "namespace 'kube-system' is not allowed"
    )
    assert guard.check({}) == Reason("namespace", "namespace '' is not allowed")
    assert Namespace(config(frozenset({"*"}))).check({"namespace": "kube-system"}) is None


def test_idempotency_passes_a_new_episode_and_reads_back_only_a_settled_one() -> None:
    tried = attempt()
    state = State()
    assert Idempotency().check(tried, state) is None
    state.seen[tried.idempotency_key] = NOW - 1
    acting = Reason("duplicate", "this episode was acted on already", read_back=False)
    assert Idempotency().check(tried, state) == acting  # another receiver applies it now
    episode = Episode(ALERT.fingerprint, ALERT.starts_at, RULE.name, RULE.action, [], [])
    state.episodes[episode.id] = episode
    assert Idempotency().check(tried, state) == acting
    episode.settled = True
    assert Idempotency().check(tried, state) == Reason(
        "duplicate", "this episode was acted on already", read_back=True
    )


def test_dry_run_passes_only_an_executing_receiver() -> None:
    assert DryRun(execute=True).check(attempt(), State()) is None
    assert DryRun(execute=False).check(attempt(), State()) == Reason(
        "dry_run", "dry-run: plan recorded, nothing changed", decision="dry_run"
    )


def test_the_cooldown_holds_back_a_target_changed_within_it() -> None:
    state = State()
    assert Cooldown().check(attempt("sidecar a", "sidecar b"), state) is None
    state.applied["isolate_replica sidecar b"] = NOW - 120
    assert Cooldown().check(attempt("sidecar a", "sidecar b"), state) == Reason(
        "cooldown", "sidecar b was acted on 120s ago (cooldown 300s)"
    )
    assert Cooldown().check(attempt("sidecar a"), state) is None  # another target
    state.applied["isolate_replica sidecar b"] = NOW - 300
    assert Cooldown().check(attempt("sidecar b"), state) is None  # the cooldown has passed


def test_the_circuit_breaker_trips_past_its_share_and_then_stays_open() -> None:
    guard = CircuitBreaker(Breaker(0.25, 600.0))
    state = State()
    assert guard.check(attempt("sidecar a", "sidecar b"), state) is None  # 2 of 10: 0.2
    reason = guard.check(attempt("sidecar a", "sidecar b", "sidecar c"), state)
    assert reason == Reason(
        "breaker",
        "breaker tripped: 3 of 10 in replica llama within 600s would exceed 0.25",
    )
    assert guard.check(attempt("sidecar a"), state) == Reason(
        "breaker", "breaker open for replica llama"
    )


def test_capacity_refuses_only_a_new_episode_once_the_state_is_full() -> None:
    state = State()
    assert Capacity().check(attempt(), state) is None
    for i in range(MAX_EPISODES):
        held = Episode(f"fp{i}", ALERT.starts_at, RULE.name, RULE.action, [], [])
        state.episodes[held.id] = held
    assert Capacity().check(attempt(), state) == Reason(
        "state_full", f"{MAX_EPISODES} episodes are held already"
    )
    own = Episode(ALERT.fingerprint, ALERT.starts_at, RULE.name, RULE.action, [], [])
    state.episodes[own.id] = own  # an episode taken over from its pending rollback
    assert Capacity().check(attempt(), state) is None


def test_the_state_guards_run_in_order_and_the_first_reason_wins() -> None:
    guards = pipeline(config(), execute=False)
    assert [type(g) for g in guards] == [Idempotency, DryRun, Cooldown, CircuitBreaker, Capacity]
    tried = attempt()
    state = State()
    state.applied["isolate_replica sidecar a"] = NOW - 1
    reason = first_reason(guards, tried, state)
    assert reason is not None and reason.outcome == "dry_run"  # before the cooldown
    state.seen[tried.idempotency_key] = NOW - 1
    reason = first_reason(guards, tried, state)
    assert reason is not None and reason.outcome == "duplicate"  # before the dry run
    assert first_reason(pipeline(config(), execute=True), attempt("sidecar b"), State()) is None
