"""End to end: the demo's real Prometheus loads the generated rules, and each fault scenario
makes the alerts it should fire reach the demo's real Alertmanager; a healthy run fires none.

Each scenario runs in its own demo (``inferwatch demo`` as a user runs it), because alert
windows outlast a repair: an XID counted in the last minutes keeps its alert firing whatever
happens next, so one fleet cannot show several scenarios apart. The shipped timelines are
moved earlier so that their first step runs :data:`FIRST_STEP` seconds after the fleet is up
(the spacing of their steps is kept). A healthy demo runs alongside the later fault runs
(:data:`ORDER`), watched the whole time, and must last at least as long as the longest one.
Every wait polls Alertmanager's ``/api/v2/alerts`` against a deadline; the time from the fault
to each alert reaching Alertmanager is printed (``pytest -s``) with the intervals and
``for:`` durations. The demo's runbook receiver (dry-run) must audit a plan to isolate the
replica whose GPU failed and change nothing; in the healthy demo it decides nothing, and the
chargeback it announces reconciles with its engines' counters. A fault
one signal owns must not raise the others: the bad rollout degenerates long generations only,
which the live screening sees and the golden probes never ask for, so it must reach
Alertmanager as ``InferwatchDegenerateOutputRising`` (and a dry-run traffic shift) and never as
a failing probe or an unready replica.
"""

from __future__ import annotations

import contextlib
import json
import re
import subprocess
import sys
import threading
import time
from collections.abc import Iterator, Mapping, Sequence
from dataclasses import dataclass, field
from datetime import UTC, datetime
from importlib import resources
from pathlib import Path
from typing import Any

import httpx
import pytest
import yaml

from inferwatch.demo import alerting, automation, scenario, topology
from support.demo import REPLICAS, Demo, rules_loaded, running_demo
from support.wait import wait_for

pytestmark = [pytest.mark.e2e, pytest.mark.long]

#: seconds after the fleet is up when a scenario's first step runs: long enough for the probes'
#: baseline (three cycles) and for every counter to have been scraped before it moves
FIRST_STEP = 12.0
#: the healthy demo's load, requests per second (the demo's default)
HEALTHY_RATE = 3
#: how long a fault may take to reach Alertmanager on a busy 2-core machine
ALERT_DEADLINE = 90.0


@dataclass(frozen=True)
class Expect:
    """Alerts a scenario must make reach Alertmanager: one of each group, about ``subject``."""

    groups: Sequence[frozenset[str]]
    #: labels that name the faulty part (any one matching is enough: per-replica alerts carry
    #: the replica, per-model ones the model version)
    subject: Mapping[str, str]
    #: the step whose fault the alerts report (overload first raises the load, then slows)
    fault_step: int = 0
    #: alerts that must arrive inhibited (by a worse alert about the same replica)
    inhibited: frozenset[str] = frozenset()
    #: alerts that must not reach Alertmanager: another signal owns the fault
    absent: frozenset[str] = frozenset()

    def met_by(self, alert: Mapping[str, Any]) -> frozenset[str] | None:
        """The group this alert satisfies, if any."""
        labels = alert["labels"]
        if not any(labels.get(key) == value for key, value in self.subject.items()):
            return None
        return next((g for g in self.groups if labels.get("alertname") in g), None)


def _about(name: str) -> dict[str, str]:
    replica = topology.replica(name)
    return {"replica": replica.name, "pod": replica.name, "model_version": replica.version}


EXPECTED = {
    # the live screening owns it (long generations only): the probes keep passing
    "bad-rollout": Expect(
        [frozenset({"InferwatchDegenerateOutputRising"})],
        _about("primary-v2"),
        absent=frozenset({"InferwatchProbeFailing", "InferwatchReplicaNotReady"}),
    ),
    "gpu-failure": Expect(
        [frozenset({"InferwatchGPUXidErrors"}), frozenset({"InferwatchGPUUnhealthy"}),
         frozenset({"InferwatchReplicaNotReady"})],
        _about("primary-v1"),
        # the replica is not ready because its GPU is lost: the page is the GPU's, not this
        inhibited=frozenset({"InferwatchReplicaNotReady"}),
    ),
    "overload": Expect(
        [frozenset({"InferwatchKVCacheSaturated", "InferwatchTTFTHigh",
                    "InferwatchPreemptionStorm"})],
        _about("primary-v1"),
        fault_step=1,
    ),
}  # fmt: skip


def shifted(name: str, folder: Path) -> Path:
    """The shipped scenario with its steps moved so that the first runs at FIRST_STEP."""
    text = (resources.files("inferwatch.demo") / "scenarios" / f"{name}.yaml").read_text()
    document = yaml.safe_load(text)
    offset = scenario.parse(document, name, REPLICAS).steps[0].at - FIRST_STEP
    for raw in document["steps"]:
        moved = scenario.parse({"steps": [raw]}, name, REPLICAS).steps[0].at - offset
        raw["at"] = f"{round(moved * 1000)}ms"  # a duration: whole seconds or milliseconds
    path = folder / f"{name}.yaml"
    path.write_text(yaml.safe_dump(document, sort_keys=False))
    return path


def intervals(prometheus_url: str) -> str:
    response = httpx.get(prometheus_url + "/api/v1/status/config", timeout=5)
    config = yaml.safe_load(response.json()["data"]["yaml"])["global"]
    return f"scrape {config['scrape_interval']}, evaluation {config['evaluation_interval']}"


def durations(names: Sequence[str]) -> str:
    """The ``for:`` of each named alert in the demo's alert config."""
    chosen = alerting.demo_config()
    return ", ".join(f"{name} for {chosen.alert(name).for_}" for name in names)


@dataclass
class Watched:
    """The healthy demo and every alert its Alertmanager has held since it started."""

    demo: Demo
    seen: list[dict[str, Any]] = field(default_factory=list)
    polls: int = 0
    stop: threading.Event = field(default_factory=threading.Event)

    def watch(self) -> None:
        while not self.stop.wait(0.5):
            with contextlib.suppress(httpx.HTTPError):
                self.seen += self.demo.alerts()
                self.polls += 1


@pytest.fixture(scope="module")
def healthy(
    prometheus_bin: str, alertmanager_bin: str, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[Watched]:
    """A demo without faults, running while the fault scenarios run (the binaries are asked
    for so that a machine without them skips, or fails under CI, before any demo)."""
    folder = tmp_path_factory.mktemp("healthy")
    calm = folder / "healthy.yaml"  # a timeline of its own, whatever the demo's default story
    calm.write_text(f"name: healthy\nsteps: [{{at: 0s, rate: {HEALTHY_RATE}}}]\n")
    with running_demo(folder, "--rate", str(HEALTHY_RATE), "--scenario", str(calm)) as demo:
        watched = Watched(demo)
        watcher = threading.Thread(target=watched.watch, daemon=True)
        watcher.start()
        try:
            yield watched
        finally:
            watched.stop.set()
            watcher.join(10)


#: seconds from the fleet being up to the last expected alert, per scenario run so far
RUN_LENGTHS: dict[str, float] = {}


#: overload first and alone: its four-fold load on a 2-core machine slows every process, a
#: healthy demo's tokens too (a true TPOT alert); the healthy demo starts with the next run
ORDER = ["overload", "bad-rollout", "gpu-failure"]


@pytest.mark.parametrize("name", ORDER)
def test_a_fault_scenario_makes_its_alerts_reach_alertmanager(
    name: str, tmp_path: Path, request: pytest.FixtureRequest
) -> None:
    expect = EXPECTED[name]
    if name != "overload":
        request.getfixturevalue("healthy")  # running alongside from here on
    with running_demo(tmp_path, "--scenario", str(shifted(name, tmp_path))) as demo:
        assert rules_loaded(demo.url("prometheus"))
        assert demo.alerts() == [], "alerts before any fault"
        fault_at = demo.wait_line(r"^\[\s*[\d.]+s\] scenario: ", FIRST_STEP + 60)[0]
        reached: dict[str, float] = {}
        done: set[frozenset[str]] = set()

        def all_reached() -> bool:
            for alert in demo.alerts():
                assert alert["labels"]["alertname"] not in expect.absent, alert
                group = expect.met_by(alert)
                if group is not None and group not in done:
                    done.add(group)
                    alertname = alert["labels"]["alertname"]
                    reached[alertname] = time.monotonic()
                    if alertname in expect.inhibited:
                        assert alert["status"]["inhibitedBy"], alert
            return len(done) == len(expect.groups)

        left = fault_at + ALERT_DEADLINE - time.monotonic()
        try:
            wait_for(all_reached, "every expected alert in Alertmanager", left, interval=0.2)
        except pytest.fail.Exception as failure:
            missing = [sorted(g) for g in expect.groups if g not in done]
            pytest.fail(f"{failure.msg}; missing: {missing}\n{demo.alerts()}\n{demo.output}")
        RUN_LENGTHS[name] = time.monotonic() - demo.up_at
        steps = [at for at, line in demo.out.lines if re.match(r"^\[\s*[\d.]+s\] scenario: ", line)]
        fault = steps[expect.fault_step]
        lines = [
            f"  {alertname}: {at - fault:.1f}s after the fault"
            for alertname, at in sorted(reached.items(), key=lambda item: item[1])
        ]
        print(
            f"\n{name} ({intervals(demo.url('prometheus'))}; {durations(sorted(reached))}):\n"
            + "\n".join(lines)
        )
        if name == "gpu-failure":
            assert_dry_run_isolation(demo, "primary-v1", fault_at)
        if name == "bad-rollout":
            assert_dry_run_shift(demo, "primary-v2", fault_at)


def assert_dry_run_isolation(demo: Demo, replica: str, fault_at: float) -> None:
    """The receiver got the replica's XID alert from Alertmanager, audited a dry-run plan to
    isolate it through its sidecar, and the sidecar is not isolated."""
    sidecar = demo.wait_line(rf"^  sidecar +{replica} +(http://127\.0\.0\.1:\d+) ", 5)[1][1]
    records: list[dict[str, Any]] = []

    def planned() -> list[dict[str, Any]]:
        records[:] = demo.audit()
        return [
            r for r in records
            if (r.get("decision"), r.get("action"), r.get("alertname"))
            == ("dry_run", "isolate_replica", "InferwatchGPUXidErrors")
            and r["labels"].get("replica") == replica
        ]  # fmt: skip

    left = fault_at + ALERT_DEADLINE - time.monotonic()
    plan = wait_for(planned, f"a dry-run isolation of {replica} audited", left, interval=0.2)[0]
    assert plan["am_receiver"] == "automation" and plan["execute"] is False, plan
    assert [step["target"] for step in plan["steps"]] == [f"sidecar {sidecar}/admin/isolation"]
    assert not [r for r in records if r.get("decision") in ("acted", "failed")], records
    token = (demo.workdir / automation.SIDECAR_TOKEN).read_text().strip()
    state = httpx.get(sidecar + "/admin/isolation", headers={"Authorization": f"Bearer {token}"},
                      timeout=5)  # fmt: skip
    assert state.status_code == 200 and state.json()["isolated"] is False, state.text
    demo.wait_line(rf"runbooks dry-run: isolate_replica {replica} \(InferwatchGPUXidErrors\)", 10)


def assert_dry_run_shift(demo: Demo, replica: str, fault_at: float) -> None:
    """The receiver audited one dry-run plan to shift the degenerate version's traffic and
    nothing else; the replica stayed ready throughout (its probes never failed)."""
    version = topology.replica(replica).version
    records: list[dict[str, Any]] = []

    def planned() -> list[dict[str, Any]]:
        records[:] = demo.audit()
        return [
            r for r in records
            if (r.get("decision"), r.get("action"), r.get("alertname"))
            == ("dry_run", automation.SHIFT, "InferwatchDegenerateOutputRising")
            and r["labels"].get("model_version") == version
        ]  # fmt: skip

    left = fault_at + ALERT_DEADLINE - time.monotonic()
    (plan,) = wait_for(planned, f"one dry-run traffic shift off {version}", left, interval=0.2)
    assert plan["execute"] is False, plan
    assert {r.get("action") for r in records if r.get("action")} == {automation.SHIFT}, records
    assert not [line for _, line in demo.out.lines if f"{replica}: /readyz ready -> NOT" in line]


def test_a_healthy_run_as_long_as_the_fault_runs_fires_no_alert(healthy: Watched) -> None:
    demo = healthy.demo
    assert rules_loaded(demo.url("prometheus"))
    length = max(RUN_LENGTHS.values(), default=FIRST_STEP + 30.0)
    # the healthy run lasting that long is what is tested (when run alone, or outrun by a fault
    # run, it has not yet)
    time.sleep(max(0.0, demo.up_at + length - time.monotonic()))
    polls = healthy.polls
    # one more look at the end
    wait_for(lambda: healthy.polls >= polls + 2, "the watcher to read Alertmanager again", 10)
    assert healthy.seen == [], demo.output
    assert demo.audit() == []  # nothing reached the runbook receiver, nothing was decided
    # none is about to be sent either (a pending one, such as the demo's small budgets being
    # projected to run out, may be on its way: its `for:` outlasts any demo)
    alerts = httpx.get(demo.url("prometheus") + "/api/v1/alerts", timeout=5).json()["data"]
    assert [a for a in alerts["alerts"] if a["state"] == "firing"] == []
    # the receiver is scraped like every other component (its dry-run mode is a series)
    execute = f'inferwatch_runbooks_execute{{job="{topology.RUNBOOKS_JOB}"}}'
    scraped = httpx.get(demo.url("prometheus") + "/api/v1/query", params={"query": execute},
                        timeout=5).json()["data"]["result"]  # fmt: skip
    assert [s["value"][1] for s in scraped] == ["0"], scraped
    lasted = time.monotonic() - demo.up_at
    print(f"\nhealthy: {lasted:.0f}s without an alert ({intervals(demo.url('prometheus'))})")


#: seconds of healthy traffic the chargeback reconciles: the edges' allowance (a scrape interval
#: of traffic at each) is a fraction of it
WINDOW_S = 60


def test_the_healthy_demos_chargeback_reconciles_with_its_engines_counters(
    healthy: Watched,
) -> None:
    """``inferwatch report usage --prometheus`` as the demo announces it, over the healthy
    run (a few scrapes in, to a second ago): every tenant that sends traffic is billed, and
    the billed tokens equal what the engines counted less the direct probes and warm-up,
    within a tolerance well under the traffic (so that a lost or doubled charge shows), and
    the GPUs' idle hours are billed to the rows of their models."""
    demo = healthy.demo
    command = demo.wait_line(r"^  chargeback: inferwatch report usage --log-dir (\S+) ", 5)[1]
    prometheus = demo.url("prometheus")
    interval = float(topology.INTERVAL.removesuffix("s"))
    start = time.time() - (time.monotonic() - demo.up_at) + 5 * interval
    # past its first runs the healthy demo has run that long already (it outlasts them)
    wait_for(lambda: time.time() > start + WINDOW_S, "the window's traffic", 2 * WINDOW_S)
    end = time.time() - 1  # the log is flushed within a second

    def scraped_past_end() -> bool:
        reply = httpx.get(f"{prometheus}/api/v1/query", params={"query": "min(timestamp(up))"},
                          timeout=5).json()["data"]["result"]  # fmt: skip
        return bool(reply) and float(reply[0]["value"][1]) > end

    wait_for(scraped_past_end, "every target scraped past the report's end", 10 * interval)
    iso = [datetime.fromtimestamp(moment, UTC).isoformat() for moment in (start, end)]
    result = subprocess.run(
        [sys.executable, "-P", "-m", "inferwatch", "report", "usage", "--log-dir", command[1],
         "--from", iso[0], "--to", iso[1], "--prometheus", prometheus,
         "--scrape-interval", topology.INTERVAL, "--gpu-hour-price", "2.5", "--format", "json"],
        capture_output=True, text=True, timeout=60,
    )  # fmt: skip
    assert result.returncode == 0, result.stdout[-2000:] + result.stderr
    document = json.loads(result.stdout)
    checked = document["reconciliation"]
    print(f"\nchargeback over {end - start:.0f}s: {checked}")
    assert checked["reconciled"] is True
    assert checked["tolerance_tokens"] < checked["logged_tokens"] / 4, checked
    assert document["totals"]["skipped_lines"] == 0
    sending = {t.name for t in topology.TENANTS if t.share > 0}
    assert sending <= {row["tenant"] for row in document["rows"]}
    # the simulated GPUs idle part of the time, and every model has tenants to bear it
    idle = [row["idle_gpu_cost"] for row in document["rows"]]
    assert all(cost > 0 for cost in idle), document["rows"]
    assert document["totals"]["idle_gpu_cost"] == pytest.approx(sum(idle), abs=1e-6)
    assert document["totals"]["idle_gpu_cost_unbilled"] == 0
