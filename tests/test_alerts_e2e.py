"""End to end: the demo's real Prometheus loads the generated rules, and each fault scenario
makes the alerts it should fire reach the demo's real Alertmanager; a healthy run fires none.

Each scenario runs in its own demo (``inferwatch demo`` as a user runs it), because alert
windows outlast a repair: an XID counted in the last minutes keeps its alert firing whatever
happens next, so one fleet cannot show several scenarios apart. The shipped timelines are
moved earlier so that their first fault lands :data:`FIRST_FAULT` seconds after the fleet is
up (the spacing of their steps is kept). Every wait polls Alertmanager's ``/api/v2/alerts``
against a deadline; the time from the first fault to each alert reaching Alertmanager is
printed (``pytest -s``) with the intervals and ``for:`` durations in use.
"""

from __future__ import annotations

import os
import re
import signal
import subprocess
import sys
import threading
import time
from collections.abc import Iterator, Mapping, Sequence
from dataclasses import dataclass, field
from importlib import resources
from pathlib import Path
from typing import Any

import httpx
import pytest
import yaml

from inferwatch.demo import scenario, topology

pytestmark = pytest.mark.e2e

DEMO = [sys.executable, "-P", "-m", "inferwatch", "demo", "--probe-cycle", "3", "--refresh", "5"]
REPLICAS = [r.name for r in topology.REPLICAS]
#: seconds after the fleet is up when a scenario's first step runs: long enough for the probes'
#: baseline (three cycles) and for every counter to have been scraped before it moves
FIRST_FAULT = 12.0
#: how long a fault may take to reach Alertmanager on a busy 2-core machine
ALERT_DEADLINE = 90.0


@dataclass(frozen=True)
class Expect:
    """Alerts a scenario must make reach Alertmanager: one of each group, about ``subject``."""

    groups: Sequence[frozenset[str]]
    #: labels that name the faulty part (any one matching is enough: per-replica alerts carry
    #: the replica, per-model ones the model version)
    subject: Mapping[str, str]

    def met_by(self, alert: Mapping[str, Any]) -> str | None:
        """The alert name if this alert satisfies one of the groups, else None."""
        labels = alert["labels"]
        name = labels.get("alertname", "")
        if not any(name in group for group in self.groups):
            return None
        if not any(labels.get(key) == value for key, value in self.subject.items()):
            return None
        return str(name)


def _about(name: str) -> dict[str, str]:
    replica = topology.replica(name)
    return {"replica": replica.name, "pod": replica.name, "model_version": replica.version}


EXPECTED = {
    "bad-rollout": Expect(
        [frozenset({"InferwatchProbeFailing", "InferwatchDegenerateOutputRising"})],
        _about("primary-v2"),
    ),
    "gpu-failure": Expect(
        [frozenset({"InferwatchGPUXidErrors"}), frozenset({"InferwatchGPUUnhealthy"}),
         frozenset({"InferwatchReplicaNotReady"})],
        _about("primary-v1"),
    ),
    "overload": Expect(
        [frozenset({"InferwatchKVCacheSaturated", "InferwatchTTFTHigh",
                    "InferwatchPreemptionStorm"})],
        _about("primary-v1"),
    ),
}  # fmt: skip


def shifted(name: str, folder: Path) -> Path:
    """The shipped scenario with its steps moved so that the first runs at FIRST_FAULT."""
    text = (resources.files("inferwatch.demo") / "scenarios" / f"{name}.yaml").read_text()
    document = yaml.safe_load(text)
    steps = scenario.parse(document, name, REPLICAS).steps
    offset = steps[0].at - FIRST_FAULT
    for raw in document["steps"]:
        at = scenario.parse({"steps": [raw]}, name, REPLICAS).steps[0].at
        raw["at"] = round(at - offset, 3)
    path = folder / f"{name}.yaml"
    path.write_text(yaml.safe_dump(document, sort_keys=False))
    return path


@dataclass
class Demo:
    """A running ``inferwatch demo``: its lines as they arrive, and the URLs it announced."""

    process: subprocess.Popen[str]
    lines: list[tuple[float, str]] = field(default_factory=list)
    ended: threading.Event = field(default_factory=threading.Event)

    def read(self) -> None:
        assert self.process.stdout is not None
        with self.process.stdout:
            for line in self.process.stdout:
                self.lines.append((time.monotonic(), line.rstrip("\n")))
        self.ended.set()

    def wait_line(self, pattern: str, timeout: float) -> tuple[float, re.Match[str]]:
        deadline = time.monotonic() + timeout
        seen = 0
        while time.monotonic() < deadline:
            for at, line in self.lines[seen:]:
                match = re.search(pattern, line)
                if match:
                    return at, match
            seen = len(self.lines)
            if self.ended.is_set() and seen == len(self.lines):
                break
            time.sleep(0.05)
        pytest.fail(f"the demo never printed {pattern!r}:\n{self.output}")

    @property
    def output(self) -> str:
        return "\n".join(line for _, line in self.lines)

    def url(self, kind: str) -> str:
        return self.wait_line(rf"^  {kind} +(http://127\.0\.0\.1:\d+) ", 30)[1][1]

    def alerts(self) -> list[dict[str, Any]]:
        response = httpx.get(self.url("alertmanager") + "/api/v2/alerts", timeout=5)
        response.raise_for_status()
        alerts: list[dict[str, Any]] = response.json()
        return alerts


@pytest.fixture
def start_demo(tmp_path: Path) -> Iterator[Any]:
    """Starts demos; each is stopped with SIGINT (as Ctrl-C) and must exit cleanly."""
    started: list[Demo] = []

    def start(*args: str) -> Demo:
        process = subprocess.Popen(
            [*DEMO, *args],
            stdout=subprocess.PIPE,
            stderr=subprocess.STDOUT,
            text=True,
            cwd=tmp_path,
            env={**os.environ, "COLUMNS": "200"},
        )
        demo = Demo(process)
        threading.Thread(target=demo.read, daemon=True).start()
        started.append(demo)
        demo.wait_line(r"^all \d+ processes answering", 60)
        return demo

    yield start
    for demo in started:
        if demo.process.poll() is None:
            demo.process.send_signal(signal.SIGINT)
        try:
            demo.process.wait(30)
        except subprocess.TimeoutExpired:
            demo.process.kill()
            demo.process.wait()
        demo.ended.wait(10)
        assert demo.process.returncode == 0, demo.output
        stopped = demo.wait_line(r"^stopped (\d+) processes", 5)[1]
        assert int(stopped[1]) >= 11, demo.output


def rules_loaded(prometheus_url: str) -> int:
    """The number of alerting rules Prometheus evaluates; every rule must be healthy."""
    response = httpx.get(prometheus_url + "/api/v1/rules", timeout=5)
    response.raise_for_status()
    rules = [rule for group in response.json()["data"]["groups"] for rule in group["rules"]]
    broken = [(r["name"], r.get("lastError")) for r in rules if r.get("health") == "err"]
    assert not broken, broken
    return sum(rule["type"] == "alerting" for rule in rules)


def intervals(prometheus_url: str) -> str:
    response = httpx.get(prometheus_url + "/api/v1/status/config", timeout=5)
    config = yaml.safe_load(response.json()["data"]["yaml"])["global"]
    return f"scrape {config['scrape_interval']}, evaluation {config['evaluation_interval']}"


REPORT: list[str] = []
#: seconds from the fleet being up to the last expected alert, per scenario run so far
RUN_LENGTHS: dict[str, float] = {}


@pytest.mark.parametrize("name", sorted(EXPECTED))
def test_a_fault_scenario_makes_its_alerts_reach_alertmanager(
    name: str, tmp_path: Path, start_demo: Any
) -> None:
    expect = EXPECTED[name]
    demo = start_demo("--scenario", str(shifted(name, tmp_path)))
    up_at = demo.wait_line(r"^all \d+ processes answering", 1)[0]
    assert rules_loaded(demo.url("prometheus")) > 0
    assert demo.alerts() == [], "alerts before any fault"
    fault_at = demo.wait_line(r"^\[\s*[\d.]+s\] scenario: ", FIRST_FAULT + 60)[0]
    reached: dict[str, float] = {}
    deadline = fault_at + ALERT_DEADLINE
    while len(reached) < len(expect.groups) and time.monotonic() < deadline:
        for alert in demo.alerts():
            alertname = expect.met_by(alert)
            group = next(g for g in expect.groups if alertname in g) if alertname else None
            if group is not None and not any(n in group for n in reached):
                reached[str(alertname)] = time.monotonic() - fault_at
        time.sleep(0.2)
    missing = [sorted(g) for g in expect.groups if not any(n in g for n in reached)]
    assert not missing, f"never reached Alertmanager: {missing}\n{demo.alerts()}\n{demo.output}"
    RUN_LENGTHS[name] = time.monotonic() - up_at
    setting = intervals(demo.url("prometheus"))
    for alertname, seconds in sorted(reached.items(), key=lambda item: item[1]):
        REPORT.append(f"{name}: {alertname} in Alertmanager {seconds:.1f}s after the first fault")
    print(f"\n{name} ({setting}):\n  " + "\n  ".join(r for r in REPORT if r.startswith(name)))


def test_a_healthy_run_as_long_as_the_slowest_fault_run_fires_no_alert(start_demo: Any) -> None:
    length = max(RUN_LENGTHS.values(), default=FIRST_FAULT + 30.0)
    demo = start_demo()
    up_at = demo.wait_line(r"^all \d+ processes answering", 1)[0]
    assert rules_loaded(demo.url("prometheus")) > 0
    while time.monotonic() < up_at + length:
        assert demo.alerts() == [], demo.output
        time.sleep(0.5)
    pending = httpx.get(demo.url("prometheus") + "/api/v1/alerts", timeout=5).json()
    assert pending["data"]["alerts"] == [], "alerts pending in Prometheus at the end"
    print(f"\nhealthy: {length:.0f}s without an alert ({intervals(demo.url('prometheus'))})")
