"""Quality layer: probe verdicts, pass rate against the version's baseline, live degeneracy.

Probe series are per target (a replica probed directly, or the router) x model x version;
a failing verdict through the router means users see it, so it pages, while one replica
probed directly is already out of /readyz and goes to a ticket.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from inferwatch.mixin import promql
from inferwatch.mixin.config import Config
from inferwatch.mixin.model import Alert, Panel
from inferwatch.mixin.promql import MODEL_VERSION, by, metric

QUALITY = "quality"
#: each alert's defaults (alerts.<name> in the config, where a user's file overrides them):
#: ``for`` and its own thresholds
SETTINGS: Mapping[str, Mapping[str, Any]] = {
    "InferwatchProbeFailing": {"for": "1m"},
    "InferwatchProbePassRateBelowBaseline": {"for": "10m", "margin": 0.1},
    # degenerate share of screened live completions
    "InferwatchDegenerateOutputRising": {"for": "10m", "ratio": 0.05, "min_rate": 0.01},
}


def alerts(config: Config) -> list[Alert]:
    failing = config.alert("InferwatchProbeFailing")
    below = config.alert("InferwatchProbePassRateBelowBaseline")
    margin = promql.number(below.number("margin"))
    fail = 'state="fail"'
    result = [
        Alert(
            name="InferwatchProbeFailing",
            severity=severity,
            expr=f"{metric(config, 'probe_verdict', fail, route)} == 1",
            for_=failing.for_,
            summary="Golden-answer probes fail on a model version.",
            description=(
                "Probes of {{ $labels.model }} {{ $labels.model_version }} through "
                "{{ $labels.target }} ({{ $labels.route }}) fail their verdict: the pass rate "
                "fell too far below the version's baseline."
            ),
            panel=Panel(QUALITY, 1),
        )
        for severity, route in (("critical", 'route="router"'), ("warning", 'route!="router"'))
    ]
    result.append(
        Alert(
            name="InferwatchProbePassRateBelowBaseline",
            severity="warning",
            expr=(
                f"{metric(config, 'probe_pass_ratio')}\n"
                f"< {metric(config, 'probe_expected_pass_ratio')} - {margin}"
            ),
            for_=below.for_,
            summary="Probe pass rate is below the version's baseline.",
            description=(
                "Probes of {{ $labels.model }} {{ $labels.model_version }} through "
                "{{ $labels.target }} pass {{ $value | humanizePercentage }}, more than "
                f"{margin} below the baseline captured for this version."
            ),
            panel=Panel(QUALITY, 2),
        )
    )
    result += _degenerate(config)
    return result


def _degenerate(config: Config) -> list[Alert]:
    settings = config.alert("InferwatchDegenerateOutputRising")
    window = config.rate_window
    # per namespace: the receiver's namespace guard and its route shift need the label
    version = (*MODEL_VERSION, "namespace")
    sampled = (
        f"sum {by(config, version)} "
        f"(rate({metric(config, 'quality_sampled_outputs')}[{window}]))"
    )
    degenerate = (
        f"sum {by(config, (*version, 'signal'))} "
        f"(rate({metric(config, 'quality_degenerate_outputs')}[{window}]))"
    )
    return [
        Alert(
            name="InferwatchDegenerateOutputRising",
            severity="warning",
            expr=(
                f"{degenerate}\n/ ignoring (signal) group_left {sampled}\n"
                f"> {promql.number(settings.number('ratio'))}\n"
                f"and ignoring (signal) {sampled} > {promql.number(settings.number('min_rate'))}"
            ),
            for_=settings.for_,
            summary="Live completions of a model version degenerate.",
            description=(
                "{{ $value | humanizePercentage }} of the screened live completions of "
                "{{ $labels.model }} {{ $labels.model_version }} showed "
                f"{{{{ $labels.signal }}}} over {window}."
            ),
            panel=Panel(QUALITY, 3),
        )
    ]
