"""Windowed pass-rate verdicts against a per-version baseline."""

from __future__ import annotations

import json
import random
from pathlib import Path

import pytest

from inferwatch.probes.verdict import Policy, SeriesKey, Verdicts

pytestmark = pytest.mark.unit

IDS = frozenset(f"g{i}" for i in range(10))
KEY = SeriesKey("replica-a", "direct", "m", "v1")


def _cycle(verdicts: Verdicts, key: SeriesKey, fail: frozenset[str] = frozenset()) -> None:
    for golden_id in sorted(IDS):
        verdicts.record(key, golden_id, golden_id not in fail)


def test_warming_until_a_cycle_and_a_baseline_then_pass() -> None:
    verdicts = Verdicts(IDS, Policy(window_cycles=3, baseline_cycles=2))
    assert verdicts.verdict(KEY).state == "warming"
    verdicts.record(KEY, "g0", True)
    assert verdicts.verdict(KEY).reason == "first cycle not complete"
    _cycle(verdicts, KEY)
    assert verdicts.verdict(KEY).state == "warming"  # baseline needs two runs of each golden
    _cycle(verdicts, KEY)
    verdict = verdicts.verdict(KEY)
    assert (verdict.state, verdict.pass_ratio, verdict.expected_ratio) == ("pass", 1.0, 1.0)


def test_a_golden_the_model_always_fails_is_not_a_regression() -> None:
    verdicts = Verdicts(IDS, Policy(baseline_cycles=2, max_drop=0.05))
    for _ in range(6):
        _cycle(verdicts, KEY, fail=frozenset({"g3"}))
    verdict = verdicts.verdict(KEY)
    assert verdict.state == "pass" and verdict.pass_ratio == 0.9 and verdict.expected_ratio == 0.9


def test_a_drop_below_the_baseline_fails_within_one_cycle() -> None:
    verdicts = Verdicts(IDS, Policy(window_cycles=3, baseline_cycles=2, max_drop=0.1))
    for _ in range(3):
        _cycle(verdicts, KEY)
    _cycle(verdicts, KEY, fail=IDS)
    verdict = verdicts.verdict(KEY)
    assert verdict.state == "fail" and "below the baseline" in verdict.reason


def test_the_floor_fails_a_version_broken_from_the_start() -> None:
    verdicts = Verdicts(IDS, Policy(min_pass_ratio=0.5))
    _cycle(verdicts, KEY, fail=frozenset(sorted(IDS)[:6]))
    assert verdicts.verdict(KEY).state == "fail"


def test_baseline_is_per_version_and_shared_by_replicas() -> None:
    verdicts = Verdicts(IDS, Policy(baseline_cycles=1))
    other = SeriesKey("replica-b", "direct", "m", "v1")
    _cycle(verdicts, KEY)
    assert verdicts.baseline_complete("m", "v1")
    _cycle(verdicts, other, fail=frozenset({"g1", "g2", "g3"}))
    assert verdicts.verdict(other).state == "fail"
    assert not verdicts.baseline_complete("m", "v2")


def test_random_flips_at_the_baseline_rate_never_fail() -> None:
    """3 % of answers flip at random (greedy nondeterminism) on a set of the default's size."""
    ids = frozenset(f"g{i}" for i in range(32))
    rng = random.Random(3)
    verdicts = Verdicts(ids, Policy())
    states = set()
    for _ in range(300):
        for golden_id in sorted(ids):
            verdicts.record(KEY, golden_id, rng.random() > 0.03)
        states.add(verdicts.verdict(KEY).state)
    assert "fail" not in states


def test_completed_baselines_survive_a_restart(tmp_path: Path) -> None:
    state = tmp_path / "probe-state.json"
    verdicts = Verdicts(IDS, Policy(baseline_cycles=1), state)
    _cycle(verdicts, KEY, fail=frozenset({"g0"}))
    saved = json.loads(state.read_text())
    assert saved["baselines"][0]["runs"]["g0"] == [0, 1]
    restarted = Verdicts(IDS, Policy(baseline_cycles=1), state)
    assert restarted.baseline_complete("m", "v1")
    _cycle(restarted, KEY, fail=IDS)  # a broken cycle cannot become the new baseline
    assert restarted.verdict(KEY).state == "fail"
