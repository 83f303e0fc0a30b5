"""``inferwatch demo``: the whole stack starts, shows its signals, plays faults and stops cleanly.

The end-to-end tests run the real command as a subprocess with stdout on a pipe (the plain
summary-line face) and check what a user relies on: exit code 0, replicas and tenants with
traffic, a scripted fault visible as a readiness flip, and no child process or work directory
left behind (checked by the pids and the directory the demo prints at start).
"""

from __future__ import annotations

import os
import re
import signal
import socket
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from inferwatch.demo import scenario, topology
from inferwatch.demo.signals import History, Scrape, quantiles, rate

DEMO = [sys.executable, "-P", "-m", "inferwatch", "demo"]
REPLICAS = [r.name for r in topology.REPLICAS]
FAULT = """
name: fallback-gpu
steps:
  - {at: 1s, replica: fallback, inject: {gpu: [{index: 0, xid: 79}]}}
  - {at: 3s, replica: fallback, crash: true}
  - {at: 5s, replica: fallback, repair: true}
"""
# The run lasts well past the repair: a restarted engine and sidecar must come back and be
# seen ready again, which takes a few seconds on a loaded 2-core machine.


# --- rates and quantiles from /metrics deltas -------------------------------------------------
def page(count: float, buckets: dict[str, float], series: str = "a") -> str:
    lines = ["# TYPE work_total counter", f'work_total{{s="{series}"}} {count}']
    lines.append("# TYPE latency_seconds histogram")
    lines += [f'latency_seconds_bucket{{s="{series}",le="{le}"}} {n}' for le, n in buckets.items()]
    return "\n".join(lines) + "\n"


def test_rate_is_the_counter_increase_per_second_and_a_reset_counts_from_zero() -> None:
    old = Scrape.parse(10.0, page(100, {"+Inf": 0}))
    assert rate(old, Scrape.parse(12.0, page(130, {"+Inf": 0})), "work_total") == 15.0
    assert rate(old, Scrape.parse(12.0, page(8, {"+Inf": 0})), "work_total") == 4.0


def test_quantiles_describe_only_the_observations_between_the_scrapes() -> None:
    # 100 old observations all in the slowest bucket; the 10 new ones are all fast
    old = Scrape.parse(0.0, page(0, {"0.1": 0, "1.0": 0, "10.0": 100, "+Inf": 100}))
    new = Scrape.parse(5.0, page(0, {"0.1": 10, "1.0": 10, "10.0": 110, "+Inf": 110}))
    p50, p99 = quantiles(old, new, "latency_seconds", (0.5, 0.99))
    assert p50 == pytest.approx(0.05) and p99 is not None and p99 <= 0.1
    assert quantiles(new, new, "latency_seconds", (0.5,)) == (None,)


def test_history_spans_about_one_window() -> None:
    history = History(window=10.0)
    for second in range(30):
        history.add(Scrape.parse(float(second), page(second, {"+Inf": 0})))
    span = history.span()
    assert span is not None and span[1].at - span[0].at == 10.0


# --- scenarios --------------------------------------------------------------------------------
@pytest.mark.parametrize("name", scenario.shipped())
def test_shipped_scenarios_load_and_name_only_demo_replicas(name: str) -> None:
    timeline = scenario.load(name, REPLICAS)
    assert timeline.steps and timeline.description
    assert [s.at for s in timeline.steps] == sorted(s.at for s in timeline.steps)
    assert {"bad-rollout", "gpu-failure", "overload"} <= set(scenario.shipped())


@pytest.mark.parametrize(
    ("document", "message"),
    [
        ("steps: [{at: 5s, replica: v3, clear: true}]", "steps[0]: unknown replica 'v3'"),
        ("steps: [{at: 5s, replica: fallback, inject: {slow: 2}}]", "unknown fault 'slow'"),
        ("steps: [{at: soon, rate: 2}]", "steps[0].at: expected seconds"),
        ("steps: [{at: 1m30s, rate: 2, clear: true}]", "needs exactly one of"),
    ],
)
def test_a_bad_scenario_file_is_one_line_naming_the_step(
    tmp_path: Path, document: str, message: str
) -> None:
    path = tmp_path / "bad.yaml"
    path.write_text(document)
    with pytest.raises(scenario.ScenarioError, match=re.escape(message)):
        scenario.load(str(path), REPLICAS)


# --- the demo as a user runs it ---------------------------------------------------------------
def pids(output: str) -> list[int]:
    return [int(pid) for pid in re.findall(r"\bpid (\d+)", output)]


def workdir(output: str) -> Path:
    match = re.search(r"work dir (\S+)", output)
    assert match, output
    return Path(match[1])


def alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    return True


def assert_clean(output: str, expected_processes: int) -> None:
    started = pids(output)
    assert len(started) >= expected_processes, output
    assert [pid for pid in started if alive(pid)] == []
    assert not workdir(output).exists()


@pytest.fixture
def reaper() -> Iterator[list[int]]:
    """Kills whatever the demo reported if a test fails before the demo cleaned up."""
    reported: list[int] = []
    yield reported
    for pid in reported:
        if alive(pid):
            os.kill(pid, signal.SIGKILL)


def replica_throughput(line: str, name: str) -> str:
    match = re.search(rf"\| {name} .*? (\S+) tok/s", line)
    assert match, line
    return match[1]


def tenant_tokens(line: str, name: str) -> str:
    match = re.search(rf"(?:tenants|,) {name} (\S+) tok ", line)
    assert match, line
    return match[1]


@pytest.mark.e2e
def test_demo_runs_a_scenario_and_stops_cleanly(tmp_path: Path, reaper: list[int]) -> None:
    faults = tmp_path / "fault.yaml"
    faults.write_text(FAULT)
    result = subprocess.run(
        [*DEMO, "--duration", "12", "--speed", "50", "--rate", "5", "--scenario", str(faults)],
        capture_output=True,
        text=True,
        timeout=60,
        cwd=tmp_path,
    )
    output = result.stdout
    reaper += pids(output)
    assert result.returncode == 0, output + result.stderr
    assert "\x1b" not in output  # not a terminal: plain lines only
    for kind in ("sim", "sidecar", "proxy"):
        assert len(re.findall(rf"^  {kind} .* http://127\.0\.0\.1:\d+ ", output, re.M)) == 3
    summaries = [line for line in output.splitlines() if " | primary-v1 " in line]
    assert len(summaries) >= 3
    for name in REPLICAS:
        assert {replica_throughput(line, name) for line in summaries} - {"-", "0"}, name
    for tenant in topology.TENANTS:
        assert tenant_tokens(summaries[-1], tenant.name) not in ("0", "-"), tenant.name
    # the scripted faults are seen where an operator would see them, and the repair undoes them
    assert re.search(r"fallback: /readyz ready -> NOT READY \(gpu: .*XID 79", output), output
    assert "routing: fallback traffic now goes to primary-v1" in output
    assert "fallback: engine_up 1 -> 0" in output
    assert "sim fallback started again" in output and "sidecar fallback restarted" in output
    assert "fallback: /readyz NOT READY -> ready" in output
    assert_clean(output, expected_processes=11)  # 9, the restarted engine and sidecar


@pytest.mark.e2e
@pytest.mark.parametrize("signum", [signal.SIGINT, signal.SIGTERM])
def test_a_signal_mid_run_exits_zero_and_leaves_nothing(
    tmp_path: Path, reaper: list[int], signum: signal.Signals
) -> None:
    process = subprocess.Popen(
        [*DEMO, "--speed", "50", "--no-prometheus", "--refresh", "1"],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        cwd=tmp_path,
    )
    assert process.stdout is not None
    seen: list[str] = []
    deadline = time.monotonic() + 30
    while time.monotonic() < deadline:
        line = process.stdout.readline()
        if not line:
            break
        seen.append(line)
        reaper += pids(line)
        if " | primary-v1 " in line:
            break
    process.send_signal(signum)
    rest, errors = process.communicate(timeout=30)
    output = "".join(seen) + rest
    assert process.returncode == 0, output + errors
    assert f"stopping ({signum.name})" in output
    assert_clean(output, expected_processes=9)


@pytest.mark.e2e
def test_a_component_that_cannot_start_is_named_and_everything_is_cleaned_up(
    tmp_path: Path, reaper: list[int]
) -> None:
    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))  # bound, not listening: connections to it are refused
        base = taken.getsockname()[1]  # the first replica's simulator wants this port
        result = subprocess.run(
            [*DEMO, "--duration", "5", "--no-prometheus", "--base-port", str(base)],
            capture_output=True,
            text=True,
            timeout=60,
            cwd=tmp_path,
        )
    reaper += pids(result.stdout)
    assert result.returncode != 0
    errors = result.stderr.strip().splitlines()
    assert len(errors) == 1, result.stderr
    assert errors[0].startswith("Error: sim primary-v1 failed to start: "), result.stderr
    assert "address already in use" in errors[0].lower()
    assert_clean(result.stdout, expected_processes=9)


@pytest.mark.parametrize(
    ("spec", "message"),
    [
        ("no-such-scenario", "Error: unknown scenario 'no-such-scenario'; shipped: bad-rollout"),
        ("missing.yaml", "Error: scenario missing.yaml: cannot read"),
    ],
)
def test_a_bad_scenario_is_one_error_line_before_anything_starts(
    tmp_path: Path, spec: str, message: str
) -> None:
    result = subprocess.run(
        [*DEMO, "--scenario", spec], capture_output=True, text=True, timeout=30, cwd=tmp_path
    )
    assert result.returncode != 0
    assert result.stdout == ""  # nothing was started
    assert result.stderr.strip().splitlines() == [result.stderr.strip()]
    assert result.stderr.startswith(message)
