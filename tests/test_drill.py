"""``inferwatch drill`` end to end: the whole stack, the receiver acting, every check passing."""

from __future__ import annotations

import json
import re
import shutil
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

from inferwatch.demo import scenario as timelines
from inferwatch.demo import topology
from inferwatch.drill.run import LONG_GENERATION, SCENARIOS
from inferwatch.probes import golden
from support.demo import alive, pids

pytestmark = [
    pytest.mark.e2e,
    pytest.mark.long,
    pytest.mark.skipif(
        not (shutil.which("prometheus") and shutil.which("haproxy", path="/usr/sbin:/usr/bin")),
        reason="needs prometheus, alertmanager and haproxy (scripts/install-*)",
    ),
]


def test_the_mass_gpu_fault_kills_the_primary_and_leaves_the_fallback_model_to_serve() -> None:
    """Its fault hits every GPU of the primary model and none of the fallback model's, whose
    node is another, and the traffic must leave the primary's replicas and come back: the
    check that nothing is lost beyond what they held in flight then has somewhere to go."""
    (mass,) = [s for s in SCENARIOS if s.name == "mass-gpu-fault"]
    faulted = {name for step in mass.fault for name in step.replicas}
    primary = {r.name for r in topology.REPLICAS if r.role == "primary"}
    assert faulted == primary == set(mass.moved_from)
    nodes = {r.node for r in topology.REPLICAS if r.name in faulted}
    assert all(r.node not in nodes for r in topology.REPLICAS if r.role == "fallback")
    assert {name for step in mass.repair for name in step.replicas} == primary


def _degenerate_faults() -> dict[str, dict[str, Any]]:
    """The degenerate fault of the drill's degenerate-version and of the demo's bad-rollout."""
    (degenerate,) = [s for s in SCENARIOS if s.name == "degenerate-version"]
    (drill,) = degenerate.fault
    demo = timelines.load("bad-rollout", [r.name for r in topology.REPLICAS]).steps[0]
    return {"drill": drill.faults["degenerate"], "demo": demo.faults["degenerate"]}


@pytest.mark.parametrize("where", ["drill", "demo"])
def test_the_degenerate_version_spares_every_golden_probe_and_not_the_long_live_answers(
    where: str,
) -> None:
    """Only the live screening can see it: the quality gate does not race the alert."""
    least = _degenerate_faults()[where]["min_tokens"]
    assert least == LONG_GENERATION > max(g.max_tokens for g in golden.load().probes)
    primary = [t for t in topology.TENANTS if t.role == "primary" and t.share > 0]
    assert any(t.max_tokens[1] >= least for t in primary)


@pytest.mark.timeout(900)
def test_the_drill_times_every_scenario_passes_its_checks_and_leaves_nothing(
    tmp_path: Path,
) -> None:
    report = tmp_path / "drill.json"
    done = subprocess.run(
        [sys.executable, "-P", "-m", "inferwatch", "drill", "--report", str(report)],
        capture_output=True, text=True, timeout=840, cwd=tmp_path,
    )  # fmt: skip
    output = done.stdout + done.stderr
    assert done.returncode == 0, output
    result = json.loads(report.read_text())
    assert result["ok"] and all(result["control"].values()), result
    assert [s["scenario"] for s in result["scenarios"]] == [s.name for s in SCENARIOS]
    for line, scenario in zip(result["scenarios"], SCENARIOS, strict=True):
        assert line["ok"] and line["alert"] is not None and line["alert"] >= line["fault"], line
        if scenario.action and not scenario.breaker:
            assert line["acted"][scenario.action] == 1, line
            assert line["fault"] <= line["action"] <= line["recovered"], line
        if scenario.moved_from:
            assert line["moved"] is not None and line["recovered"] is not None, line
    (redis,) = [line for line in result["scenarios"] if line["scenario"] == "redis-dies"]
    # fail_open while Redis was down: budget x (1 + 1/N) per window, and the journal replayed
    assert redis["spent_while_down"] <= redis["allowed_while_down"], redis
    assert redis["replayed"] is not None and redis["drift_tokens"] is not None, redis
    mass = result["scenarios"][-1]
    assert mass["refused_by_breaker"] >= 1 and mass["acted"].get("isolate_replica", 0) <= 1
    assert "inferwatch drill: fault -> alert" in done.stdout
    started = pids(output)
    assert len(started) >= 13 and [pid for pid in started if alive(pid)] == []
    assert re.search(r"removed (\S+)", output)
