"""``inferwatch canary``: the verdict table, and the exit code a pipeline gates on.

Exit codes: 0 promote, 1 roll back, 2 inconclusive, 3 the analysis could not run (bad
option, bad selector or window, Prometheus unreachable, slow, refusing a query or answering
nonsense). The verdicts keep their documented numbers; as 2 is a verdict here, bad input
joins the table's 3 (:class:`inferwatch.exitcodes.ExitCode`) instead of exiting 2. A pipeline
rolls back on 1, so no fault of the tool's may ever end with 1: whatever goes wrong before a
verdict is 3.
"""

from __future__ import annotations

import dataclasses
import time
from pathlib import Path
from typing import Any

import click
from rich.console import Console
from rich.table import Table

from inferwatch.alerts import config as alert_config
from inferwatch.canary import analysis, selector
from inferwatch.canary.analysis import EXIT_CODES, Analysis, Result, Thresholds
from inferwatch.canary.prometheus import Prometheus, PrometheusError
from inferwatch.clikit import CannotRun, FiniteFloat, config_option, option_group, prometheus_option
from inferwatch.config import Duration, DurationParam
from inferwatch.exitcodes import ExitCode
from inferwatch.serving.prometheus_api import timeout_option

#: a window must hold a few scrapes for ``increase()`` to count anything: 10 s does at the
#: 2 s intervals of the demo or a high-resolution setup, and where scrapes are sparser its
#: checks simply have no data (inconclusive, never a wrong verdict); longer than a week
#: outlives most retention
WINDOW = DurationParam(minimum=Duration.parse("10s"), maximum=Duration.parse("7d"))
_COLOURS = {"pass": "green", "fail": "red", "no data": "yellow", "n/a": "dim"}


class _BadUsage(click.UsageError):
    exit_code = ExitCode.CANNOT_RUN


class _Command(click.Command):
    """Usage errors exit 3 (could not run), not click's 2, which means inconclusive here."""

    def parse_args(self, ctx: click.Context, args: list[str]) -> list[str]:
        try:
            return super().parse_args(ctx, args)
        except click.UsageError as exc:
            raise _BadUsage(exc.format_message(), exc.ctx) from None


def _threshold_options() -> list[Any]:
    options = []
    for field in dataclasses.fields(Thresholds):
        kind: click.ParamType[Any] = click.IntRange(1)
        if field.name == "alpha":
            kind = FiniteFloat(0, 1, min_open=True)
        elif field.name.endswith("_margin"):
            kind = FiniteFloat(0, 1)
        elif field.name.endswith("_tolerance"):
            kind = FiniteFloat(0)
        options.append(
            click.option(
                f"--{field.name.replace('_', '-')}",
                field.name,
                type=kind,
                default=field.default,
                show_envvar=True,
                help=_HELP[field.name],
            )
        )
    return options


_HELP = {
    "alpha": "Significance level of each test.",
    "min_requests": "Requests per side before latency and error ratio are judged.",
    "min_probes": "Probe runs per side before the probe pass rate is judged.",
    "min_screened": "Screened live outputs per side before the degeneracy rate is judged.",
    "min_tokens": "Billed tokens per side before cost per 1k tokens is judged.",
    "latency_tolerance": "Relative p99 increase (TTFT, TPOT) that is a regression.",
    "error_margin": "Absolute error-ratio increase that is a regression.",
    "probe_margin": "Absolute probe pass-rate drop that is a regression.",
    "degeneracy_margin": "Absolute increase of the degenerate share that is a regression.",
    "cost_tolerance": "Relative increase of cost per 1k tokens that is a regression.",
}


@click.command(cls=_Command)
@prometheus_option()
@click.option(
    "--baseline",
    required=True,
    show_envvar=True,
    help='Label matchers of the baseline, e.g. model_version="2024-07-23".',
)
@click.option(
    "--candidate",
    required=True,
    show_envvar=True,
    help='Label matchers of the candidate, e.g. model_version="2024-09-25".',
)
@click.option(
    "--window",
    type=WINDOW,
    default="30m",
    show_envvar=True,
    help="How far back both sides are compared (10s..7d).",
)
@click.option(
    "--at",
    "at",
    type=FiniteFloat(0),
    default=None,
    show_envvar=True,
    help="End of the window, unix seconds [default: now].",
)
@timeout_option(
    "Seconds all queries to Prometheus may take together; past it the analysis "
    "could not run (exit 3)."
)
@config_option("canary", "Alert config whose source selectors (job labels) the queries use.")
@option_group(*_threshold_options())
def canary(
    prometheus: str,
    baseline: str,
    candidate: str,
    window: Duration,
    at: float | None,
    timeout: float,
    config_path: Path | None,
    **limits: Any,
) -> None:
    """Compare a candidate version with its baseline: exit 0 promote, 1 roll back,
    2 inconclusive, 3 bad input or Prometheus unreachable."""
    try:
        sides = selector.parse(baseline, "--baseline"), selector.parse(candidate, "--candidate")
        if sides[0] == sides[1]:
            raise selector.SelectorError("--baseline and --candidate select the same series")
        config = alert_config.load(config_path)
        with Prometheus(prometheus, deadline_s=timeout) as source:
            run = Analysis(
                source, config, *sides, str(window), at or time.time(), Thresholds(**limits)
            )
            results = run.run()
    except (
        selector.SelectorError,
        click.BadParameter,
        PrometheusError,
        alert_config.ConfigError,
    ) as exc:
        raise CannotRun(exc.message if isinstance(exc, click.BadParameter) else str(exc)) from None
    except Exception as exc:  # a bug must not exit 1, which a pipeline reads as "roll back"
        raise CannotRun(f"internal error: {type(exc).__name__}: {exc}") from None
    decided = analysis.verdict(results)
    _print(results, decided, sides, str(window))
    raise click.exceptions.Exit(EXIT_CODES[decided])


def _print(results: list[Result], decided: analysis.Verdict, sides: Any, window: str) -> None:
    table = Table(title=f"canary over {window}: {sides[1]} against {sides[0]}")
    for column in ("check", "baseline", "candidate", "p-value", "verdict", "detail"):
        table.add_column(column)
    for r in results:
        p = "" if r.p_value is None else f"{r.p_value:.3g}"
        colour = _COLOURS[r.outcome]
        table.add_row(
            r.check.title, r.baseline, r.candidate, p, f"[{colour}]{r.outcome}[/]", r.detail
        )
    console = Console(width=160)
    console.print(table)
    colour = {"promote": "green", "roll back": "red", "inconclusive": "yellow"}[decided]
    console.print(f"verdict: [bold {colour}]{decided}[/]")
