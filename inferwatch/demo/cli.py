"""``inferwatch demo``: the whole stack on one machine, with load, faults and a live view."""

from __future__ import annotations

import asyncio
import shutil
import sys
from collections.abc import Callable
from pathlib import Path

import click
import httpx

from inferwatch.clikit import BadInput, CannotRun, F, FiniteFloat, PortTaken, option_group
from inferwatch.demo import alerting, routing, sharedstate, topology, victoria
from inferwatch.demo import engines as external
from inferwatch.demo import scenario as scenarios
from inferwatch.demo.processes import PortInUse
from inferwatch.demo.run import Demo, Options
from inferwatch.mixin.config import ConfigError


def tsdb_option(help: str) -> Callable[[F], F]:
    """``--tsdb``, the demo's and the drill's: where the series go and the rules run."""
    return click.option(
        "--tsdb",
        type=click.Choice(topology.TSDBS),
        default="prometheus",
        show_default=True,
        show_envvar=True,
        help=help,
    )


def load_options(
    *, speed: float, min_speed: float, rate: float, min_rate: float
) -> Callable[[F], F]:
    """``--speed`` and ``--rate``, the demo's and the drill's: the simulated replicas' clock
    and the tenants' load (both go into :class:`~inferwatch.demo.run.Options`)."""
    return option_group(
        click.option(
            "--speed",
            type=FiniteFloat(min=min_speed),
            default=speed,
            show_envvar=True,
            help="Simulated seconds per wall-clock second in every simulated replica.",
        ),
        click.option(
            "--rate",
            type=FiniteFloat(min=min_rate),
            default=rate,
            show_envvar=True,
            help="Load: requests per second over all tenants, through HAProxy.",
        ),
    )


#: ``--alert-config``, the demo's and the drill's (:func:`alerting.demo_config` reads it)
alert_config_option = click.option(
    "--alert-config",
    type=click.Path(dir_okay=False, path_type=Path),
    show_envvar=True,
    help="Alert config the rules and Alertmanager's routing are generated from, read on top "
    "of the defaults (inferwatch/mixin/config.yaml).  [default: alerts/demo.yaml, short "
    "windows and for: durations]",
)


@click.command()
@click.option(
    "--engine-url",
    multiple=True,
    show_envvar=True,
    help="An OpenAI-compatible engine you run (vLLM, llama.cpp's server), e.g. "
    "http://127.0.0.1:8000, which takes a simulated replica's place: the demo puts a sidecar "
    "(--gpu none) and a tenancy proxy in front of it and sends load for the model its "
    "/v1/models names. Repeat it for more replicas; no simulator runs.",
)
@click.option(
    "--duration",
    type=FiniteFloat(min=0, min_open=True),
    show_envvar=True,
    help="Seconds to run once everything is up.  [default: until Ctrl-C]",
)
@click.option(
    "--scenario",
    default=scenarios.DEFAULT,
    show_envvar=True,
    help="Fault timeline: a shipped name ("
    + ", ".join(scenarios.shipped())
    + "), a YAML file, or none for a quiet run.",
)
@load_options(speed=1.0, min_speed=0.01, rate=3.0, min_rate=0)
@click.option(
    "--base-port",
    type=click.IntRange(1024, 65536 - topology.Ports.count()),
    show_envvar=True,
    help="Use consecutive ports from here (sims, sidecars, proxies, proxies' tenant metrics, "
    "Redis, Prometheus (or VictoriaMetrics), Alertmanager, runbook receiver, HAProxy, HAProxy's "
    "metrics; with --tsdb victoriametrics then each cluster's vmagent and vmalert).  "
    "[default: free ports]",
)
@tsdb_option(
    help="Where the series go and the rules run: one Prometheus scraping the fleet, or "
    "VictoriaMetrics as at scale: the replicas split into two clusters (east: the primary "
    "model, the gateway and the runbook receiver; west: the fallback model), each scraped by "
    "its own vmagent with its cluster as external label, remote-writing to one single-node "
    "VictoriaMetrics, and vmalert evaluating the generated rules there and sending to "
    "Alertmanager (needs victoria-metrics, vmagent, vmalert: scripts/install-victoriametrics; "
    "and Alertmanager).",
)
@click.option(
    "--prometheus/--no-prometheus",
    default=True,
    show_envvar=True,
    help="Run a Prometheus scraping the sidecars and proxies and evaluating the generated "
    "alert rules (when the binary is on PATH).",
)
@click.option(
    "--alertmanager/--no-alertmanager",
    default=True,
    show_envvar=True,
    help="Run an Alertmanager with the generated routing and inhibition, which Prometheus "
    "sends its alerts to (when the binary is on PATH; needs --prometheus).",
)
@alert_config_option
@click.option(
    "--execute-runbooks/--dry-run-runbooks",
    default=False,
    show_envvar=True,
    help="Let the runbook receiver (inferwatch runbooks serve, fed by Alertmanager) isolate "
    "replicas through their sidecars and shift traffic in HAProxy; by default it only audits "
    "what it would do.",
)
@click.option(
    "--probe-cycle",
    type=FiniteFloat(min=1),
    default=10.0,
    show_envvar=True,
    help="Seconds for one pass of the quality probes' golden set, per replica.",
)
@click.option(
    "--refresh",
    type=FiniteFloat(min=0.5),
    default=10.0,
    show_envvar=True,
    help="Seconds between plain summaries when stdout is not a terminal (one short line "
    "each for the load, every replica, every tenant and the alerts; events are printed as "
    "they happen). A terminal's live view refreshes every second.",
)
def demo(
    engine_url: tuple[str, ...],
    duration: float | None,
    scenario: str,
    speed: float,
    rate: float,
    base_port: int | None,
    tsdb: topology.Tsdb,
    prometheus: bool,
    alertmanager: bool,
    alert_config: Path | None,
    execute_runbooks: bool,
    probe_cycle: float,
    refresh: float,
) -> None:
    """Run simulated replicas with sidecars, tenancy proxies, probes, Prometheus and
    Alertmanager, under load.

    Three replicas (the primary model at v1 and at an fp8 v2 canary, and a fallback model) each
    get a sidecar with quality probes and a tenancy proxy; a load generator sends three tenants'
    traffic through HAProxy (the config inferwatch generate gateway writes), which routes
    around replicas whose /readyz fails. The view shows
    each replica's throughput, latency, queue, KV cache, GPU and probe verdict, and each tenant's
    tokens and cost, computed from the components' own /metrics, the alerts that reach
    Alertmanager from the generated rules, and what the runbook receiver Alertmanager feeds
    decides about them (dry-run unless --execute-runbooks). Without --scenario it plays
    xid-and-repair (a healthy start, one GPU fault and its repair); --scenario none runs
    quietly. With --engine-url the replicas are your engines and the run is quiet unless a
    scenario of load steps is given. With --tsdb victoriametrics, VictoriaMetrics (two
    vmagents, one per simulated cluster, and vmalert) takes Prometheus's place. Stop with
    Ctrl-C.
    """
    context = click.get_current_context()
    if tsdb == "victoriametrics":
        _check_victoriametrics(context, base_port)
    urls = [external.base_url(url) for url in engine_url]
    if urls and context.get_parameter_source("speed") != click.core.ParameterSource.DEFAULT:
        raise BadInput(
            "--speed sets the simulators' clock; engines given by --engine-url run in real time"
        )
    source = context.get_parameter_source("scenario")
    if urls and source == click.core.ParameterSource.DEFAULT:
        scenario = scenarios.NONE  # the default one injects faults
    timeline = None
    if scenario != scenarios.NONE:
        try:
            timeline = scenarios.load(
                scenario,
                [r.name for r in topology.REPLICAS],
                [r.name for r in topology.SPARES],
            )
        except scenarios.ScenarioError as exc:
            raise BadInput(str(exc)) from None
        if urls:
            external.check_scenario(timeline)
    try:
        alerts = alerting.demo_config(alert_config)
    except ConfigError as exc:
        raise BadInput(str(exc)) from None
    if timeline is not None and source == click.core.ParameterSource.DEFAULT:
        steps = "; ".join(f"{step.at:g}s {step.describe()}" for step in timeline.steps)
        click.echo(
            f"no --scenario given: playing {timeline.name}, healthy until "
            f"{timeline.steps[0].at:g}s, then one fault and its repair ({steps}); "
            f"--scenario none for a quiet run"
        )
    with httpx.Client() as http:
        engines = tuple(external.discover(url, http) for url in urls)
    haproxy_bin = routing.binary()
    redis_bin = sharedstate.binary()
    victoria_bins = None
    if tsdb == "victoriametrics":
        victoria_bins = victoria.binaries()
        prometheus = False  # VictoriaMetrics takes its place
    prometheus_bin = shutil.which("prometheus") if prometheus else None
    if prometheus and prometheus_bin is None:
        click.echo("prometheus is not on PATH; running without it (Debian package: prometheus)")
    alertmanager_bin = None
    if alertmanager and (prometheus_bin or victoria_bins):
        alertmanager_bin = shutil.which("alertmanager") or shutil.which("prometheus-alertmanager")
        if alertmanager_bin is None and victoria_bins:
            raise CannotRun(
                "alertmanager is not on PATH: --tsdb victoriametrics needs it, vmalert does not "
                "evaluate alerting rules without one (Debian package: prometheus-alertmanager)"
            )
        if alertmanager_bin is None:
            click.echo(
                "alertmanager is not on PATH; running without alerts "
                "(Debian package: prometheus-alertmanager)"
            )
    options = Options(
        engines=engines,
        duration=duration,
        scenario=timeline,
        speed=speed,
        rate=rate,
        base_port=base_port,
        prometheus=prometheus_bin,
        alertmanager=alertmanager_bin,
        alerts=alerts,
        probe_cycle=probe_cycle,
        refresh=refresh,
        haproxy=haproxy_bin,
        redis=redis_bin,
        execute_runbooks=execute_runbooks,
        victoria=victoria_bins,
    )
    try:
        error = asyncio.run(Demo(options, sys.stdout, live=sys.stdout.isatty()).run())
    except PortInUse as exc:
        raise PortTaken(str(exc)) from None
    if error:
        raise CannotRun(error)


def _check_victoriametrics(context: click.Context, base_port: int | None) -> None:
    """The flags that cannot go with --tsdb victoriametrics, and its ports past 65535."""
    for flag, name in (("--no-prometheus", "prometheus"), ("--no-alertmanager", "alertmanager")):
        if not context.params[name]:
            raise BadInput(
                f"{flag} cannot go with --tsdb victoriametrics, which runs VictoriaMetrics in "
                f"Prometheus's place and needs Alertmanager (vmalert sends its alerts there)"
            )
    if base_port is not None:
        last = base_port + topology.Ports.count(clusters=topology.CLUSTERS.values()) - 1
        if last > 65535:
            raise BadInput(f"--base-port {base_port}: the fleet's ports would run to {last}")
