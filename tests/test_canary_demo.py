"""``inferwatch canary`` against the live demo: the real stack, its real Prometheus.

One ``inferwatch demo`` plays the shipped ``canary-regression`` scenario: the fp8 canary
primary-v2 is healthy, then its engine steps run four times as long. The real canary CLI is
asked three questions about the demo's Prometheus, each with ``--at`` at the end of a window
placed by the scenario's events as the demo printed them: the last 30 s before the slowdown
promote, 30 s of slowdown roll back on TTFT and TPOT, and 10 s of the same healthy canary are
too little traffic to judge (inconclusive). Before each question the test polls Prometheus
until every target has been scraped past the window's end and both sides hold the minimum
sample, each wait with a deadline.

The demo's traffic is small (the canary takes a third of the primary model's share of
:data:`RATE` requests per second, plus its probes), so the minimum samples are lowered to
what 30 s of it holds; the defaults are sized for production windows of tens of minutes.
"""

from __future__ import annotations

import re
import subprocess
import sys
import time
from pathlib import Path

import httpx
import pytest

from inferwatch.canary import checks, selector
from inferwatch.demo import scenario, topology
from inferwatch.mixin import config as alert_config
from support.demo import running_demo
from support.wait import wait_for

pytestmark = [pytest.mark.e2e, pytest.mark.long]

SCENARIO = "canary-regression"
#: the load generator's requests per second: twice the demo's default, so that the canary's
#: customer traffic (the degeneracy and cost checks' sample) fills a 30 s window
RATE = 6
BASELINE = f'model="{topology.PRIMARY_MODEL}",model_version="v1"'  # the fallback is a v1 too
CANDIDATE = f'model="{topology.PRIMARY_MODEL}",model_version="v2-fp8"'
WINDOW_S = 30
#: a window this short holds less of the canary's traffic than the minimums below ask for
SHORT_WINDOW_S = 10
#: seconds after the slowdown is announced before its window starts: the injection lands and
#: requests that began before it finish
SETTLE_S = 3
#: the minimum sample per side of each kind (``--min-KIND``). 30 s of the canary hold ~125
#: engine requests (its probes included; 10 s: ~45), ~85 probe runs, the screened
#: customer outputs (the demo's proxies screen each one; the count varies from window to
#: window, 5 is met by every one) and 10k to 20k billed tokens
MINIMUMS = {"requests": 60, "probes": 30, "screened": 5, "tokens": 3000}
THRESHOLDS = [f"--min-{kind}={count}" for kind, count in MINIMUMS.items()]
#: how long a window may take to be scraped and filled on a busy 2-core machine
DATA_DEADLINE = 60.0


def wall(monotonic: float) -> float:
    """Unix time of a ``time.monotonic()`` reading (the demo's lines are stamped with it)."""
    return time.time() - (time.monotonic() - monotonic)


def query(prometheus: str, expr: str, at: float | None = None) -> float | None:
    data = {"query": expr} if at is None else {"query": expr, "time": f"{at:.3f}"}
    reply = httpx.post(f"{prometheus}/api/v1/query", data=data, timeout=10)
    reply.raise_for_status()
    result = reply.json()["data"]["result"]
    return float(result[0]["value"][1]) if result else None


def samples(prometheus: str, end: float, window_s: int) -> dict[str, dict[str, float]]:
    """What each side holds over the window, of each kind in :data:`MINIMUMS`, through the
    canary's own queries."""
    config, window = alert_config.load(), f"{window_s}s"
    named = {c.name: c for c in checks.CHECKS}
    counts = {}
    for side, text in (("baseline", BASELINE), ("candidate", CANDIDATE)):
        promql = selector.parse(text).promql()
        exprs = {
            "requests": checks.observed(config, named["ttft_p99"], promql, window),
            "probes": checks.events_and_total(config, named["probe_failures"], promql, window)[1],
            "screened": checks.events_and_total(config, named["degeneracy"], promql, window)[1],
            "tokens": checks.billed_tokens(config, promql, window),
        }
        counts[side] = {kind: query(prometheus, expr, end) or 0.0 for kind, expr in exprs.items()}
    return counts


def wait_for_window(prometheus: str, end: float, window_s: int) -> dict[str, dict[str, float]]:
    """Poll until every target was scraped after ``end`` and both sides hold the minimums."""
    counts: dict[str, dict[str, float]] = {}
    scraped: float | None = None

    def filled() -> dict[str, dict[str, float]] | None:
        nonlocal counts, scraped
        scraped = query(prometheus, "min(timestamp(up))")
        if scraped is None or scraped <= end:
            return None
        counts = samples(prometheus, end, window_s)
        full = all(
            side[kind] >= minimum for side in counts.values() for kind, minimum in MINIMUMS.items()
        )
        return counts if full else None

    return wait_for(
        filled,
        lambda: f"the window ending at {end:.0f} to fill: scraped to {scraped}, {counts}",
        DATA_DEADLINE,
        interval=0.5,
    )


#: labels that name the canary on an alert (per-replica alerts carry the replica and pod,
#: per-version ones the model version)
CANARY_LABELS = {"replica": "primary-v2", "pod": "primary-v2", "model_version": "v2-fp8"}


def firing(prometheus: str) -> list[dict[str, str]]:
    """The labels of every alert Prometheus has firing now."""
    reply = httpx.get(f"{prometheus}/api/v1/alerts", timeout=10)
    reply.raise_for_status()
    alerts = reply.json()["data"]["alerts"]
    return [a["labels"] for a in alerts if a["state"] == "firing"]


def canary(prometheus: str, end: float, window_s: int) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-P", "-m", "inferwatch", "canary", f"--prometheus={prometheus}",
         f"--baseline={BASELINE}", f"--candidate={CANDIDATE}", f"--window={window_s}s",
         f"--at={end:.3f}", *THRESHOLDS],
        capture_output=True, text=True, timeout=60,
    )  # fmt: skip


def rows(result: subprocess.CompletedProcess[str]) -> dict[str, str]:
    """Each check's row of the verdict table, by its title."""
    titles = [c.title for c in checks.CHECKS]
    table = {}
    for line in result.stdout.splitlines():
        for title in titles:
            if line.lstrip("│ ").startswith(title):
                table[title] = line
    assert set(table) == set(titles), result.stdout + result.stderr
    return table


def outcome(row: str) -> str:
    match = re.search(r"│ (pass|fail|no data|n/a) +│", row)
    assert match, row
    return match[1]


def test_the_canary_promotes_healthy_v2_rolls_back_slow_v2_and_finds_10s_too_little(
    tmp_path: Path, prometheus_bin: str, haproxy_bin: str
) -> None:
    timeline = scenario.load(SCENARIO, [r.name for r in topology.REPLICAS])
    slowdown = timeline.steps[0]
    assert slowdown.replicas == ("primary-v2",) and slowdown.faults == {"slow_factor": 4}
    # the demo's default probe cycle (the alert test's 3 s would triple the probes' CPU);
    # no Alertmanager: the canary reads Prometheus only
    args = ["--scenario", SCENARIO, "--rate", str(RATE), "--probe-cycle", "10",
            "--no-alertmanager"]  # fmt: skip
    with running_demo(tmp_path, *args) as demo:
        prometheus = demo.url("prometheus")
        started = time.monotonic()
        fault = demo.wait_line(
            rf"^\[\s*[\d.]+s\] scenario: {re.escape(slowdown.describe())}$",
            slowdown.at + DATA_DEADLINE,
        )[0]
        healthy_end = wall(fault) - 1  # the injection is sent after the line is printed
        assert healthy_end - WINDOW_S > wall(demo.up_at), "the healthy period is too short"
        report("healthy", wait_for_window(prometheus, healthy_end, WINDOW_S))
        healthy = canary(prometheus, healthy_end, WINDOW_S)
        print(healthy.stdout)
        assert healthy.returncode == 0, healthy.stdout + healthy.stderr
        assert "verdict: promote" in healthy.stdout
        assert {outcome(row) for row in rows(healthy).values()} == {"pass"}

        short = canary(prometheus, healthy_end, SHORT_WINDOW_S)
        print(short.stdout)
        assert short.returncode == 2, short.stdout + short.stderr
        assert "verdict: inconclusive" in short.stdout
        ttft = rows(short)["TTFT p99"]
        assert outcome(ttft) == "no data", ttft
        few = re.search(r"(\d+) and (\d+) requests, (\d+) needed", ttft)
        assert few and int(few[2]) < MINIMUMS["requests"], (
            ttft
        )  # the canary's own count is too small
        assert "fail" not in {outcome(row) for row in rows(short).values()}

        slow_end = wall(fault) + SETTLE_S + WINDOW_S
        report("slow", wait_for_window(prometheus, slow_end, WINDOW_S))
        slow = canary(prometheus, slow_end, WINDOW_S)
        print(slow.stdout)
        assert slow.returncode == 1, slow.stdout + slow.stderr
        assert "verdict: roll back" in slow.stdout
        table = rows(slow)
        # TTFT carries the slowdown at this sample (p ~ 1e-7); TPOT's tail holds a few
        # requests in 30 s and is not always significant, so it must only not contradict it
        assert outcome(table["TTFT p99"]) == "fail", table["TTFT p99"]
        assert outcome(table["TPOT p99"]) in {"fail", "pass"}, table["TPOT p99"]
        # slower, not wrong: the checks that do not measure time still pass
        for title in (
            "error ratio",
            "probe pass rate",
            "live degeneracy rate",
            "cost per 1k tokens",
        ):
            assert outcome(table[title]) == "pass", table[title]
        # inside every SLO: of the demo's generated alert rules, none fires about the canary
        # but the TPOT p99 threshold: four times its 10 ms steps puts the canary's p99 at
        # 40-105 ms on a busy machine, across the 100 ms warning (the canary's own TPOT row
        # above is not always significant either)
        about_v2 = [a for a in firing(prometheus)
                    if CANARY_LABELS.items() & a.items()
                    and a["alertname"] != "InferwatchTPOTHigh"]  # fmt: skip
        assert about_v2 == [], about_v2
        print(f"demo up to last verdict: {time.monotonic() - started:.0f}s")


def report(what: str, counts: dict[str, dict[str, float]]) -> None:
    print(
        f"\n{what} window: "
        + "; ".join(
            f"{side} " + ", ".join(f"{n:.0f} {kind}" for kind, n in kinds.items())
            for side, kinds in counts.items()
        )
    )
