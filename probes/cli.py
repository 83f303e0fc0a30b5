"""``inferwatch probe`` (long-running probe runner) and ``inferwatch gate`` (A/B quality gate)."""

from __future__ import annotations

import asyncio
import json
import logging
import re
from collections.abc import Callable
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit

import click
import httpx

from inferwatch import tracing
from inferwatch.clikit import (
    CannotRun,
    F,
    FiniteFloat,
    bind,
    json_option,
    listen_option,
    parse_listen,
)
from inferwatch.exitcodes import ExitCode
from inferwatch.logs import log_event
from inferwatch.probes import client, golden
from inferwatch.probes import gate as gating
from inferwatch.probes.runner import ProbeRunner, Route, Schedule, Target
from inferwatch.probes.scoring import Limits
from inferwatch.probes.server import ProbeServer
from inferwatch.probes.verdict import Policy
from inferwatch.serving import uvicorn_server

logger = logging.getLogger("inferwatch.probes")


def _url(value: str, hint: str) -> str:
    parts = urlsplit(value)
    if parts.scheme not in ("http", "https") or not parts.netloc:
        raise click.BadParameter(f"{value!r} is not an http(s) URL", param_hint=hint)
    return value


def _targets(
    specs: tuple[str, ...], route: Route, model: str, model_version: str, api_key: str
) -> list[Target]:
    """``NAME=URL`` or ``URL`` (named by its host:port) -> targets."""
    hint = "--target" if route == "direct" else "--router"
    targets = []
    for spec in specs:
        name, sep, url = spec.partition("=")
        if not sep:
            name, url = urlsplit(spec).netloc, spec
        targets.append(
            Target(
                name=name,
                endpoint=client.Endpoint(_url(url, hint), model, api_key),
                route=route,
                model_version=model_version,
            )
        )
    return targets


def _load_set(name_or_path: str) -> golden.GoldenSet:
    try:
        return golden.load(name_or_path)
    except golden.GoldenError as exc:
        raise click.BadParameter(str(exc), param_hint="--goldens") from None


#: ``--goldens``, the probe runner's and the gate's
goldens_option = click.option(
    "--goldens",
    default=golden.DEFAULT_SET,
    show_envvar=True,
    help=f"Golden set: a shipped name ({', '.join(golden.builtin_names())}) or a YAML file.",
)


def timeout_option(help: str) -> Callable[[F], F]:
    """``--timeout``: the seconds one request to an endpoint may take."""
    return click.option(
        "--timeout",
        type=FiniteFloat(min=0.1),
        default=30.0,
        show_envvar=True,
        help=help,
    )


@click.command()
@click.option(
    "--target",
    "targets",
    multiple=True,
    show_envvar=True,
    envvar="INFERWATCH_PROBE_TARGET",
    metavar="[NAME=]URL",
    help="A replica to probe directly (OpenAI-compatible base URL); repeatable.",
)
@click.option(
    "--router",
    "routers",
    multiple=True,
    show_envvar=True,
    envvar="INFERWATCH_PROBE_ROUTER",
    metavar="[NAME=]URL",
    help="A router/gateway in front of the replicas to probe as well; repeatable.",
)
@click.option(
    "--model",
    default="",
    show_envvar=True,
    help="Model to request; discovered from /v1/models when empty.",
)
@click.option(
    "--model-version",
    default="",
    show_envvar=True,
    help="model_version label (the deployment's: a rollout name, a checkpoint tag); "
    "unknown when empty.",
)
@click.option(
    "--api-key",
    default="",
    show_envvar=True,
    help="Bearer key for probe requests; map it to the tenant _probe in the proxy.",
)
@goldens_option
@listen_option(":9401")
@click.option(
    "--cycle",
    type=FiniteFloat(min=0),
    default=300.0,
    show_envvar=True,
    help="Seconds for one pass over the golden set, per target.",
)
@click.option(
    "--jitter",
    type=FiniteFloat(0, 1),
    default=0.2,
    show_envvar=True,
    help="Relative random spread of the spacing between probes.",
)
@timeout_option("Seconds allowed for one probe request.")
@click.option(
    "--ttft-limit",
    type=FiniteFloat(min=0),
    default=10.0,
    show_envvar=True,
    help="A probe whose first token takes longer fails (check ttft).",
)
@click.option(
    "--tokens-per-hour",
    type=click.IntRange(min=1),
    default=200_000,
    show_envvar=True,
    help="Token budget for all probes over a rolling hour.",
)
@click.option(
    "--window-cycles",
    type=click.IntRange(min=1),
    default=3,
    show_envvar=True,
    help="Verdict window, in passes over the golden set.",
)
@click.option(
    "--baseline-cycles",
    type=click.IntRange(min=1),
    default=3,
    show_envvar=True,
    help="Passes over the set that make a new model version's baseline.",
)
@click.option(
    "--max-drop",
    type=FiniteFloat(0, 1),
    default=0.10,
    show_envvar=True,
    help="Fail when the window's pass ratio is this far below the baseline's.",
)
@click.option(
    "--min-pass-ratio",
    type=FiniteFloat(0, 1),
    default=0.5,
    show_envvar=True,
    help="Fail below this pass ratio whatever the baseline says.",
)
@click.option(
    "--state-file",
    type=click.Path(dir_okay=False, path_type=Path),
    default=None,
    show_envvar=True,
    help="Keep baselines here across restarts (JSON).",
)
@click.option(
    "--allow-targets",
    default="",
    show_envvar=True,
    metavar="REGEX",
    help="/probe also accepts target URLs fully matching this (besides --target).",
)
@click.option(
    "--readyz-quality/--no-readyz-quality",
    default=True,
    show_envvar=True,
    help="Fail /readyz while a directly probed target fails its quality verdict.",
)
@tracing.options
@uvicorn_server.limit_options
def probe(
    targets: tuple[str, ...],
    routers: tuple[str, ...],
    model: str,
    model_version: str,
    api_key: str,
    goldens: str,
    listen: str,
    cycle: float,
    jitter: float,
    timeout: float,
    ttft_limit: float,
    tokens_per_hour: int,
    window_cycles: int,
    baseline_cycles: int,
    max_drop: float,
    min_pass_ratio: float,
    state_file: Path | None,
    allow_targets: str,
    readyz_quality: bool,
    otlp_endpoint: str,
    otlp_sampling_ratio: float,
    **server_limits: Any,
) -> None:
    """Probe replicas with golden prompts and serve /metrics, /healthz, /readyz and /probe.

    Each target gets one probe at a time, spread over --cycle seconds with jitter, greedy
    and short, sent as the reserved tenant _probe. The verdict per target and model version
    is a windowed pass ratio against a baseline captured when the version is first seen.
    /probe?target=URL&module=SET runs a set once per request, blackbox-exporter style.
    """
    host, port = parse_listen(listen)
    goldens_set = _load_set(goldens)
    try:
        pattern = re.compile(allow_targets) if allow_targets else None
    except re.error as exc:
        raise click.BadParameter(str(exc), param_hint="--allow-targets") from None
    all_targets = [
        *_targets(targets, "direct", model, model_version, api_key),
        *_targets(routers, "router", model, model_version, api_key),
    ]
    limits = Limits(ttft_s=ttft_limit, total_s=timeout)
    runner = None
    if all_targets:
        try:
            runner = ProbeRunner(
                goldens_set,
                all_targets,
                schedule=Schedule(cycle, jitter, timeout, tokens_per_hour),
                policy=Policy(window_cycles, baseline_cycles, max_drop, min_pass_ratio),
                limits=limits,
                state_file=state_file,
                tracer_provider=tracing.provider(
                    "inferwatch-probe", tracing.TraceOptions(otlp_endpoint, otlp_sampling_ratio)
                ),
            )
        except ValueError as exc:
            raise click.UsageError(str(exc)) from None
        except OSError as exc:
            raise CannotRun(f"--state-file {state_file}: {exc.strerror or exc}") from None
    modules = {name: golden.load(name) for name in golden.builtin_names()}
    modules[goldens_set.name] = goldens_set
    server = ProbeServer(
        runner, modules, limits=limits, allow_targets=pattern, readyz_quality=readyz_quality
    )
    sock = bind((host, port))
    log_event(
        logger,
        logging.INFO,
        "probe runner starting",
        listen="{}:{}".format(*sock.getsockname()[:2]),
        targets=len(all_targets),
        goldens=goldens_set.name,
        probes=len(goldens_set),
    )
    uvicorn_server.serve(server.app(), sock, uvicorn_server.limits_from(server_limits))


@click.command()
@click.option(
    "--baseline",
    required=True,
    show_envvar=True,
    metavar="URL",
    help="OpenAI-compatible base URL serving today's model/engine.",
)
@click.option(
    "--candidate",
    required=True,
    show_envvar=True,
    metavar="URL",
    help="OpenAI-compatible base URL of the replacement to judge.",
)
@click.option(
    "--baseline-model",
    default="",
    show_envvar=True,
    help="Model name at the baseline; discovered from /v1/models when empty.",
)
@click.option(
    "--candidate-model",
    default="",
    show_envvar=True,
    help="Model name at the candidate; discovered from /v1/models when empty.",
)
@click.option("--api-key", default="", show_envvar=True, help="Bearer key for both endpoints.")
@goldens_option
@click.option(
    "--repeats",
    type=click.IntRange(min=1),
    default=3,
    show_envvar=True,
    help="Runs of the golden set per endpoint.",
)
@click.option(
    "--load-requests",
    type=click.IntRange(min=1),
    default=32,
    show_envvar=True,
    help="Requests in each endpoint's load run.",
)
@click.option(
    "--load-concurrency",
    type=click.IntRange(min=1),
    default=4,
    show_envvar=True,
    help="Requests in flight at once during the throughput phase.",
)
@click.option(
    "--load-max-tokens",
    type=click.IntRange(min=2),
    default=128,
    show_envvar=True,
    help="max_tokens of each throughput-phase request.",
)
@click.option(
    "--max-drop",
    type=FiniteFloat(0, 1),
    default=0.01,
    show_envvar=True,
    help="Largest tolerated (significant) pass-rate drop, as a fraction.",
)
@click.option(
    "--latency-tolerance",
    type=FiniteFloat(min=0),
    default=0.10,
    show_envvar=True,
    help="Relative slack for TTFT, TPOT and throughput noise.",
)
@timeout_option("Seconds allowed for one request.")
@json_option("gate", "Print the report as JSON.")
def gate(
    baseline: str,
    candidate: str,
    baseline_model: str,
    candidate_model: str,
    api_key: str,
    goldens: str,
    repeats: int,
    load_requests: int,
    load_concurrency: int,
    load_max_tokens: int,
    max_drop: float,
    latency_tolerance: float,
    timeout: float,
    as_json: bool,
) -> None:
    """Compare a candidate endpoint with a baseline on the golden set and a short load run.

    Exit status: 0 the candidate passes, 1 it fails a threshold, 2 bad input, 3 the gate
    could not run (an endpoint unreachable or refusing).
    """
    goldens_set = _load_set(goldens)
    base = client.Endpoint(_url(baseline, "--baseline"), baseline_model, api_key)
    cand = client.Endpoint(_url(candidate, "--candidate"), candidate_model, api_key)

    async def run() -> gating.GateReport:
        async with httpx.AsyncClient() as http:
            resolved = []
            for endpoint, hint in ((base, "baseline"), (cand, "candidate")):
                if not endpoint.model:
                    try:
                        # the timeout bounds each read; this one the whole answer
                        async with asyncio.timeout(timeout):
                            model = await client.discover_model(http, endpoint, timeout)
                    except TimeoutError:
                        raise CannotRun(
                            f"{hint} {endpoint.url}: no list of models within {timeout:g} s"
                        ) from None
                    except (httpx.HTTPError, ValueError) as exc:
                        reason = str(exc) or type(exc).__name__
                        raise CannotRun(
                            f"{hint} {endpoint.url}: cannot list models ({reason})"
                        ) from None
                    endpoint = client.Endpoint(endpoint.url, model, endpoint.api_key)
                resolved.append(endpoint)
            return await gating.run_gate(
                http,
                resolved[0],
                resolved[1],
                goldens_set,
                repeats=repeats,
                load=gating.LoadSettings(load_requests, load_concurrency, load_max_tokens),
                thresholds=gating.Thresholds(max_drop, latency_tolerance),
                limits=Limits(ttft_s=timeout, total_s=timeout),
            )

    try:
        report = asyncio.run(run())
    except gating.CouldNotRun as exc:
        raise CannotRun(f"could not run: {exc}") from None
    if as_json:
        click.echo(json.dumps(report.as_json(), indent=2, sort_keys=True))
    else:
        click.echo(gating.render_table(report, baseline, candidate))
    raise click.exceptions.Exit(ExitCode.OK if report.passed else ExitCode.FAILED)
