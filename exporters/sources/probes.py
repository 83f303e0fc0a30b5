"""The quality source: golden-answer probes sent straight to this replica's engine, each a
span (as the standalone probe runner's) when ``--otlp-endpoint`` names a collector."""

from __future__ import annotations

import click

from inferwatch import tracing
from inferwatch.clikit import FiniteFloat
from inferwatch.exporters.engine.collector import EngineCollector
from inferwatch.exporters.registry import Built, Registration, Setup
from inferwatch.probes import golden
from inferwatch.probes.client import Endpoint
from inferwatch.probes.runner import ProbeRunner, Schedule, Target


def build(setup: Setup) -> Built | None:
    """The probe runner; its loop starts with the start-up tracker (see ``startup``), since
    a replica still loading or warming up says nothing of quality."""
    goldens = setup.options["probes"]
    if not goldens:
        return None
    engine = setup.source("engine", EngineCollector)
    if engine is None:
        raise click.UsageError("--probes needs --engine-url: quality probes go to the engine")
    try:
        golden_set = golden.load(goldens)
    except golden.GoldenError as exc:
        raise click.BadParameter(str(exc), param_hint="--probes") from None
    target = Target(
        name=setup.options["pod"] or "local",
        endpoint=Endpoint(engine.base_url, setup.identity["model"]),
        route="direct",
        model_version=setup.identity["model_version"],
    )
    cycle = setup.options["probe_cycle"]
    trace = tracing.TraceOptions(
        setup.options["otlp_endpoint"], setup.options["otlp_sampling_ratio"]
    )
    runner = ProbeRunner(
        golden_set,
        [target],
        schedule=Schedule(cycle_s=cycle),
        tracer_provider=tracing.provider("inferwatch-sidecar", trace),
    )
    return Built([runner])


REGISTRATION = Registration(
    "probes",
    options=[
        click.option(
            "--probes",
            default="",
            show_envvar=True,
            help="Golden set (a shipped name such as 'default', or a YAML file) to probe the "
            "engine with; its verdict becomes the /readyz quality condition. Empty: no quality "
            "probes.",
        ),
        click.option(
            "--probe-cycle",
            type=FiniteFloat(min=1),
            default=300.0,
            show_envvar=True,
            help="Seconds over which one pass of the golden set is spread.",
        ),
        tracing.options,
    ],
    build=build,
)
