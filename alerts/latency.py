"""Latency layer: p-quantile thresholds per model version, and SLO burn rates.

The threshold alerts read the recorded quantiles; a model with its own thresholds gets its
own rule and is left out of the default one, so each model version fires at most once per
severity. The critical twin of each alert shares its name (Alertmanager inhibits the warning
while the critical fires).
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from inferwatch.alerts import slo
from inferwatch.mixin import promql, recording
from inferwatch.mixin.config import Config
from inferwatch.mixin.model import Alert, Panel

#: each alert's defaults (alerts.<name> in the config, where a user's file overrides them):
#: ``for`` and its own thresholds
SETTINGS: Mapping[str, Mapping[str, Any]] = {
    "InferwatchTTFTHigh": {"for": "10m"},
    "InferwatchTPOTHigh": {"for": "10m"},
    "InferwatchE2ELatencyHigh": {"for": "10m"},
    **slo.SETTINGS,
}

#: alert name, signal, what it measures, panel id on the latency board
THRESHOLD_ALERTS = (
    ("InferwatchTTFTHigh", "ttft", "time to first token", 1),
    ("InferwatchTPOTHigh", "tpot", "time per output token", 2),
    ("InferwatchE2ELatencyHigh", "e2e", "end-to-end request latency", 3),
)


def alerts(config: Config) -> list[Alert]:
    result: list[Alert] = []
    for name, signal, meaning, panel in THRESHOLD_ALERTS:
        result += _threshold(config, name, signal, meaning, Panel("latency", panel))
    return result + slo.alerts(config)


def _threshold(config: Config, name: str, signal: str, meaning: str, panel: Panel) -> list[Alert]:
    settings = config.alert(name)
    q = promql.number(float(config.latency["quantile"]))
    series = recording.quantile(config, signal)
    own = [m for m in config.latency["models"] if signal in config.latency["models"][m]]
    scopes: list[tuple[str | None, str]] = [(m, f"model={promql.quoted(m)}") for m in sorted(own)]
    scopes.append((None, f'model!~"{promql.one_of(sorted(own))}"' if own else ""))
    result = []
    for severity in ("critical", "warning"):
        for model, matcher in scopes:
            threshold = config.latency_threshold(signal, severity, model)
            matchers = ",".join(m for m in (f'quantile="{q}"', matcher) if m)
            result.append(
                Alert(
                    name=name,
                    severity=severity,
                    expr=f"{series}{{{matchers}}} > {promql.number(threshold)}",
                    for_=settings.for_,
                    summary=f"A model version's p{promql.number(float(q) * 100)} "
                    f"{meaning} is too high.",
                    description=(
                        f"p{promql.number(float(q) * 100)} {meaning} of "
                        "{{ $labels.model }} {{ $labels.model_version }} is "
                        "{{ $value | humanizeDuration }} over the last "
                        f"{config.rate_window} (threshold {promql.number(threshold)}s)."
                    ),
                    panel=panel,
                )
            )
    return result
