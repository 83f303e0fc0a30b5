"""``inferwatch drill``: run the fault drill, print its timeline, write its report."""

from __future__ import annotations

import asyncio
import json
import shutil
import sys
import time
from pathlib import Path

import click
from rich.console import Console
from rich.table import Table

from inferwatch.clikit import BadInput, CannotRun, Failed, PortTaken, cannot_write
from inferwatch.demo import alerting, routing, sharedstate, topology, victoria
from inferwatch.demo.cli import alert_config_option, load_options, tsdb_option
from inferwatch.demo.processes import PortInUse
from inferwatch.demo.run import Options
from inferwatch.drill.run import SCENARIOS, Drill, Timeline
from inferwatch.mixin.config import ConfigError

#: ``inferwatch drill --help``, its scenarios listed from :data:`SCENARIOS` (the README and
#: docs/drill.md list the same ones, tests/test_docs.py checks)
HELP = (
    "Start the whole stack on loopback with the runbook receiver acting, inject faults one "
    "after another and time fault -> alert -> action -> traffic moved -> recovery.\n\n"
    "\b\nScenarios, in order:\n"  # \b: click keeps this paragraph's lines as they are
    + "".join(f"  {s.name}: {s.about}\n" for s in SCENARIOS)
    + "\n"
    "Exits non-zero when a check fails (an alert that did not fire, an action not taken "
    "exactly once, the breaker not stopping a mass fault, client requests lost, anything "
    "firing or acting in the healthy control period)."
)


@click.command(help=HELP)
@click.option(
    "--report",
    type=click.Path(dir_okay=False, path_type=Path),
    show_envvar=True,
    help="Write the timeline and the checks as JSON here.",
)
@load_options(speed=20.0, min_speed=1, rate=4.0, min_rate=1)
@alert_config_option
@tsdb_option(
    help="As for the demo: Prometheus, or VictoriaMetrics with a vmagent per cluster and "
    "vmalert doing the alerting.",
)
@click.option(
    "--scenario",
    multiple=True,
    type=click.Choice([s.name for s in SCENARIOS]),
    show_envvar=True,
    help="Play only this scenario, after the control period; repeat it for more (played in "
    "the drill's order).  [default: every one]",
)
def drill(
    report: Path | None,
    speed: float,
    rate: float,
    alert_config: Path | None,
    tsdb: topology.Tsdb,
    scenario: tuple[str, ...],
) -> None:
    # the help is HELP, whose list of scenarios is made from the drill's own
    try:
        alerts = alerting.demo_config(alert_config)
    except ConfigError as exc:
        raise BadInput(str(exc)) from None
    binaries = victoria.binaries() if tsdb == "victoriametrics" else None
    prometheus = None if binaries else shutil.which("prometheus")
    alertmanager = shutil.which("alertmanager") or shutil.which("prometheus-alertmanager")
    if (prometheus is None and binaries is None) or alertmanager is None:
        needs = "alertmanager" if binaries else "prometheus and alertmanager"
        raise CannotRun(
            f"the drill needs {needs} on PATH "
            "(Debian: prometheus prometheus-alertmanager; scripts/install-prometheus)"
        )
    options = Options(
        duration=None,
        scenario=None,
        speed=speed,
        rate=rate,
        base_port=None,
        prometheus=prometheus,
        alertmanager=alertmanager,
        alerts=alerts,
        probe_cycle=5.0,
        refresh=5.0,
        haproxy=routing.binary(),
        redis=sharedstate.binary(),
        execute_runbooks=True,
        victoria=binaries,
    )
    began = time.monotonic()

    def progress(line: str) -> None:
        click.echo(f"[{time.monotonic() - began:6.1f}s] {line}")
        sys.stdout.flush()  # progress shows as it happens, also on a pipe

    played = [s for s in SCENARIOS if not scenario or s.name in scenario]
    run = Drill(options, sys.stdout, live=False, progress=progress, scenarios=played)
    try:
        error = asyncio.run(run.run())
    except PortInUse as exc:
        raise PortTaken(str(exc)) from None
    console = Console(file=sys.stdout, highlight=False, width=140)
    console.print(table(run.timelines))
    result = run.report()
    if report is not None:
        try:
            report.write_text(json.dumps(result, indent=2) + "\n", encoding="utf-8")
        except OSError as exc:
            raise cannot_write(exc) from None
    if error:
        raise CannotRun(error)
    if not run.passed:
        broken = [f"control: {k}" for k, ok in run.control_ok.items() if not ok]
        broken += [
            f"{t.scenario}: {k}" for t in run.timelines for k, ok in t.checks.items() if not ok
        ]
        raise Failed("drill failed: " + "; ".join(broken or ["incomplete"]))
    click.echo(f"drill passed in {time.monotonic() - began:.0f}s")


def _after(at: float | None, since: float | None) -> str:
    return "-" if at is None or since is None else f"+{at - since:.1f}s"


def table(timelines: list[Timeline]) -> Table:
    """The timeline: each event's seconds after the fault, and the checks."""
    out = Table(title="inferwatch drill: fault -> alert -> action -> traffic moved -> recovery")
    for column in ("scenario", "alert", "action", "moved", "recovered", "acted", "lost", "checks"):
        out.add_column(column)
    for line in timelines:
        acted = ", ".join(f"{name} x{count}" for name, count in sorted(line.acted.items()))
        if line.refused_by_breaker:
            acted += f" (breaker refused {line.refused_by_breaker})"
        checks = ", ".join(name if ok else f"FAILED {name}" for name, ok in line.checks.items())
        out.add_row(
            line.scenario,
            _after(line.alert, line.fault),
            _after(line.action, line.fault),
            _after(line.moved, line.fault),
            _after(line.recovered, line.fault),
            acted or "none",
            f"{line.lost} (+{line.in_flight_failed} in flight)",
            checks,
            style=None if line.ok else "red",
        )
    return out
