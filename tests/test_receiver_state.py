"""Guard state that must outlive a restart: the seen-set and an open breaker; the window."""

from __future__ import annotations

from pathlib import Path

import pytest

from inferwatch.runbooks import dedup
from inferwatch.runbooks.actions.base import Step, Unit
from inferwatch.runbooks.breaker import CircuitBreaker
from inferwatch.runbooks.config import Breaker
from inferwatch.runbooks.dedup import SeenSet

pytestmark = pytest.mark.unit


def step(target: str, group: str = "llama", unit: Unit = "replica") -> Step:
    return Step("isolate_replica", target, unit, group, {"isolated": True}, "test")


def test_the_seen_set_survives_a_restart_and_stays_bounded(tmp_path: Path) -> None:
    path = tmp_path / "seen.txt"
    first = SeenSet(path, max_keys=3)
    keys = [dedup.key("ab", "2026-11-30T00:00:00Z", f"action{i}") for i in range(5)]
    for item in keys:
        first.add(item)
    again = SeenSet(path, max_keys=3)
    assert [k in again for k in keys] == [False, False, True, True, True]
    assert len(path.read_text().split()) == 3  # compacted on load


def test_the_key_is_per_episode_and_action() -> None:
    base = dedup.key("ab", "2026-11-30T00:00:00Z", "isolate_replica")
    assert base != dedup.key("ab", "2026-11-30T01:00:00Z", "isolate_replica")  # a re-fire
    assert base != dedup.key("ab", "2026-11-30T00:00:00Z", "haproxy_weights")


def test_an_open_breaker_stays_open_across_a_restart(tmp_path: Path) -> None:
    config = Breaker(max_fraction=0.5, window=3600, populations={"llama": 2})
    path = tmp_path / "breaker.json"
    breaker = CircuitBreaker(config, path)
    assert breaker.check([step("a")]).allowed
    breaker.record([step("a")])
    assert not breaker.check([step("b")]).allowed
    restarted = CircuitBreaker(config, path)
    verdict = restarted.check([step("a")])
    assert not verdict.allowed and "open" in verdict.reason
    assert restarted.reset() == [("replica", "llama")]
    assert CircuitBreaker(config, path).check([step("b")]).allowed


def test_the_window_forgets_old_isolations_and_counts_each_target_once() -> None:
    now = [1000.0]
    config = Breaker(max_fraction=0.5, window=60, populations={"llama": 4, "pool": 1})
    breaker = CircuitBreaker(config, clock=lambda: now[0])
    breaker.record([step("a"), step("b")])
    assert breaker.check([step("a")]).allowed  # already counted: no new unit out
    now[0] += 61
    assert breaker.check([step("c"), step("d")]).allowed
    assert not breaker.check([step("x", group="unknown")]).allowed  # no population: refused
    assert breaker.check([step("t", group="pool", unit="traffic")]).allowed  # not counted
