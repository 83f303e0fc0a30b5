"""Multi-window, multi-burn-rate SLO alerts (SRE workbook, "Alerting on SLOs").

For each configured window pair one rule: the burn rate (error ratio over the error budget)
is above ``factor`` on both the long and the short window, and the model had traffic worth
judging. Page pairs are ``critical``, ticket pairs ``warning``; the windows are labels so a
fast and a slow burn of the same model stay two alerts.
"""

from __future__ import annotations

from inferwatch.mixin import promql, recording
from inferwatch.mixin.config import Config
from inferwatch.mixin.model import Alert, Panel
from inferwatch.mixin.promql import MODEL_VERSION, on


def burn_alerts(
    config: Config, name: str, slo: str, objective: float, meaning: str, panel: Panel
) -> list[Alert]:
    budget = 1 - objective
    floor = promql.number(float(config.slo["traffic_floor"]))
    alerts = []
    for window in config.burn_windows:
        long_ratio = recording.slo_error_ratio(config, slo, window.long)
        short_ratio = recording.slo_error_ratio(config, slo, window.short)
        traffic = recording.request_total(config, window.long, promql.by(config, MODEL_VERSION))
        factor = promql.number(window.factor)
        expr = (
            f"{long_ratio} / {promql.number(budget)} > {factor}\n"
            f"and {short_ratio} / {promql.number(budget)} > {factor}\n"
            f"and {on(config, MODEL_VERSION)} ({traffic}) > {floor}"
        )
        alerts.append(
            Alert(
                name=name,
                severity=window.severity,
                expr=expr,
                for_=window.for_,
                summary=f"A model version is burning its {slo} error budget too fast.",
                description=(
                    "{{ $labels.model }} {{ $labels.model_version }} burns its "
                    f"{meaning} error budget (objective {promql.number(objective * 100)}%) "
                    f"at {{{{ $value | humanize }}}}x over {window.long} and faster than "
                    f"{factor}x over {window.short} too (1x spends exactly the budget of "
                    "the SLO period)."
                ),
                panel=panel,
                labels={"slo": slo, "long": window.long, "short": window.short},
            )
        )
    return alerts
