"""End to end: in the ``load-ramp`` demo, the autoscaling signals cross their targets before
the TTFT SLO starts to burn, and the replica the scale-out starts comes up cold, then serves.

The demo runs as a user runs it (``inferwatch demo --scenario load-ramp``). The test waits,
against a deadline, until v1's TTFT SLO burns (its error ratio over the shortest burn-rate
window above the error budget: a burn rate above 1), then reads the whole run back from
Prometheus (``query_range``) and checks, on Prometheus' own timestamps, that each autoscaling
signal started below its target and crossed it before that moment. The scale-out's replica
(``primary-v1b``, started by the scenario's ``start`` step) is checked from the same data: its
sidecar's start-up phases come in order after the step, it turns ready, and its tenancy proxy
counts client requests (which reach it only through HAProxy) only once its warm-up is done.
The timeline, with its cold start, is printed with ``pytest -s``.
"""

from __future__ import annotations

import time
from pathlib import Path
from typing import Any

import httpx
import pytest

from inferwatch.demo import alerting, scenario, topology
from inferwatch.mixin import promql, recording
from support.demo import REPLICAS, rules_loaded, running_demo
from support.wait import wait_for

pytestmark = [pytest.mark.e2e, pytest.mark.long]

#: the replica whose signals and SLO are read: the one taking most of the primary traffic
SUBJECT = topology.replica("primary-v1")
#: the sidecar's start-up phase timestamps
STARTUP = "inferwatch_replica_startup_phase_timestamp_seconds"
#: the replica the scenario's scale-out starts
NEW = topology.replica("primary-v1b")
#: seconds after its last ramp step by which the SLO must have started to burn
BURN_DEADLINE = 60.0
#: seconds after the scale-out by which the new replica must serve clients
JOIN_DEADLINE = 90.0
SERVING = 'phase="serving"'


def _matchers() -> str:
    return f"model={promql.quoted(SUBJECT.model)},model_version={promql.quoted(SUBJECT.version)}"


def _selector(name: str, own: tuple[str, ...] = ()) -> str:
    return f"{name}{{{','.join((*own, _matchers()))}}}"


def _query(url: str, expr: str) -> list[dict[str, Any]]:
    response = httpx.get(url + "/api/v1/query", params={"query": expr}, timeout=5)
    response.raise_for_status()
    result: list[dict[str, Any]] = response.json()["data"]["result"]
    return result


def _series(url: str, expr: str, start: float, end: float) -> list[tuple[float, float]]:
    """The samples of ``expr`` (one series) from ``start`` to ``end``, one a second."""
    response = httpx.get(
        url + "/api/v1/query_range",
        params={"query": expr, "start": start, "end": end, "step": "1s"},
        timeout=10,
    )
    response.raise_for_status()
    result = response.json()["data"]["result"]
    assert len(result) <= 1, result
    return [(float(t), float(v)) for t, v in result[0]["values"]] if result else []


def _first_above(samples: list[tuple[float, float]], target: float) -> float | None:
    return next((t for t, v in samples if v > target), None)


def test_the_scaling_signals_cross_their_targets_before_the_ttft_slo_burns(
    tmp_path: Path, prometheus_bin: str, alertmanager_bin: str
) -> None:
    config = alerting.demo_config()
    budget = 1 - float(config.slo["ttft"]["objective"])
    window = config.slo_windows[0]  # the shortest: the first to show a burn
    burn = _selector(recording.slo_error_ratio(config, "ttft", window))
    signals = {
        signal: (_selector(name, own), float(config.autoscaling["targets"][signal]))
        for signal, (name, own) in recording.autoscaling_signals(config).items()
    }
    ramp = scenario.load("load-ramp", REPLICAS, [r.name for r in topology.SPARES])
    last_step = max(s.at for s in ramp.steps if s.action == "rate" and s.rate > 3)
    scale_out = next(s.at for s in ramp.steps if s.action == "start" and NEW.name in s.replicas)
    new = f'replica="{NEW.name}"'

    with running_demo(tmp_path, "--scenario", "load-ramp") as demo:
        url = demo.url("prometheus")
        assert rules_loaded(url)
        up, up_unix = demo.up_at, time.time() - (time.monotonic() - demo.up_at)

        def burning() -> str:
            now = {s: _query(url, expr) for s, (expr, _) in signals.items()}
            return f"the TTFT SLO to burn; signals now {now}\n{demo.output}"

        def left(after: float) -> float:
            """Seconds until ``after`` seconds past the demo's start."""
            return up + after - time.monotonic()

        slo = f"{burn} > {promql.number(budget)}"
        wait_for(lambda: demo.running() and _query(url, slo), burning,
                 left(last_step + BURN_DEADLINE), interval=1)  # fmt: skip
        # the scale-out's replica serves (after the burn: its cold start is the longer)
        joined = f"sum(inferwatch_tenancy_requests_total{{{new}}}) > 0"
        wait_for(
            lambda: (
                demo.running()
                and _query(url, joined)
                and _query(url, _selector(STARTUP, (new, SERVING)))
            ),
            lambda: f"{NEW.name} to take a client request\n{demo.output}",
            left(scale_out + JOIN_DEADLINE),
            interval=1,
        )
        end = time.time() + 2  # a step past the sample just seen, so the range includes it
        burned = _first_above(_series(url, burn, up_unix, end), budget)
        assert burned is not None
        crossed: dict[str, float] = {}
        for signal, (expr, target) in signals.items():
            samples = _series(url, expr, up_unix, end)
            assert samples, f"no {expr} recorded"
            # it crossed during the ramp: it started below its target
            assert samples[0][1] <= target, (signal, samples[:3])
            at = _first_above(samples, target)
            assert at is not None, f"{signal} never went above {target} before the SLO burned"
            crossed[signal] = at
        # the replica's own cold start, from its sidecar's phase timestamps: how long a new
        # replica takes to be ready, against how far ahead of the burn the signals were
        phases = {
            sample["metric"]["phase"]: float(sample["value"][1])
            for sample in _query(url, _selector(STARTUP, (f'replica="{SUBJECT.name}"',)))
        }
        # the scale-out's replica: its phases, when it was ready, when clients reached it
        started = {
            sample["metric"]["phase"]: float(sample["value"][1])
            for sample in _query(url, _selector(STARTUP, (new,)))
        }
        ready = _first_above(
            _series(url, f"min(inferwatch_replica_ready{{{new}}})", up_unix, end), 0.5
        )
        served = _series(url, f"sum(inferwatch_tenancy_requests_total{{{new}}})", up_unix, end)
    order = ("process_start", "engine_reachable", "engine_healthy", "warmup_done", "serving")
    assert list(started) and all(phase in started for phase in order), started
    stamps = [started[phase] for phase in order]
    assert stamps == sorted(stamps), started
    # started by the step, not before it (the sidecar's clock and Prometheus' are the host's)
    assert started["process_start"] >= up_unix + scale_out - 1, (started, up_unix)
    assert ready is not None, f"{NEW.name} never turned ready"
    assert served and served[-1][1] > 0, f"no client request reached {NEW.name}: {served}"
    first_served = _first_above(served, 0)
    assert first_served is not None and first_served >= started["warmup_done"], (
        f"a client request reached {NEW.name} at {first_served} before its warm-up was done "
        f"at {started['warmup_done']}"
    )
    assert phases["process_start"] <= phases["warmup_done"] <= up_unix + 1, phases
    cold = f"  its cold start: process_start {phases['process_start'] - up_unix:.0f}s"
    cold += "".join(
        f", {phase} {phases[phase] - up_unix:.0f}s"
        for phase in ("engine_reachable", "engine_healthy", "warmup_done", "serving")
        if phase in phases
    )
    lines = [
        f"  {signal} above {signals[signal][1]:g} at {at - up_unix:.0f}s"
        for signal, at in sorted(crossed.items(), key=lambda item: item[1])
    ]
    print(
        f"\nload-ramp on {SUBJECT.name} (seconds after the fleet was up):\n"
        + "\n".join(lines)
        + f"\n  TTFT SLO burn rate above 1 over {window} at {burned - up_unix:.0f}s\n"
        + cold
        + f" (warm-up done {phases['warmup_done'] - phases['process_start']:.1f}s after start)\n"
        + f"  scale-out at {scale_out:g}s: {NEW.name} "
        + ", ".join(f"{phase} {started[phase] - up_unix:.1f}s" for phase in order)
        + f", ready {ready - up_unix:.0f}s, first client request seen {first_served - up_unix:.0f}s"
        + "\n  its cold start (warm-up done - process start): "
        + f"{started['warmup_done'] - started['process_start']:.1f}s"
    )
    late = {s: at for s, at in crossed.items() if at >= burned}
    assert not late, f"signals that crossed only once the SLO burned: {late}; burn at {burned}"
