"""The service level objectives, and their multi-window, multi-burn-rate alerts (SRE
workbook, "Alerting on SLOs").

:func:`~inferwatch.mixin.objectives.objectives` is the one source of what each SLO promises to
whom (the default objective, a model's own, a tenant class's) and on which series. The
burn-rate alerts here, the Sloth, OpenSLO and Pyrra specs (:mod:`slo_specs`) and the budget
panels are all built from it.

For each objective and configured window pair one rule: the burn rate (error ratio over the
error budget) is above ``factor`` on both the long and the short window, and the model had
traffic worth judging. Page pairs are ``critical``, ticket pairs ``warning``; the windows are
labels so a fast and a slow burn of the same model stay two alerts.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from inferwatch.mixin import promql
from inferwatch.mixin.config import Config
from inferwatch.mixin.model import Alert, Panel
from inferwatch.mixin.objectives import Objective, good_bound, objectives
from inferwatch.mixin.promql import MODEL_VERSION, on

__all__ = ["SETTINGS", "SLOS", "alerts", "burn_alerts"]

#: each alert's defaults (alerts.<name> in the config, where a user's file overrides them):
#: ``for`` and its own thresholds
SETTINGS: Mapping[str, Mapping[str, Any]] = {
    # each burn-rate window pair has its own ``for`` (slo.windows)
    "InferwatchTTFTSLOBurn": {},
    "InferwatchAvailabilitySLOBurn": {},
}

#: SLO -> (alert name, what a good event is, the latency board's burn-rate panel)
SLOS = {
    "ttft": ("InferwatchTTFTSLOBurn", "TTFT (good: first token within {bound}s)", 10),
    "availability": (
        "InferwatchAvailabilitySLOBurn",
        "availability (good: the request did not fail)",
        11,
    ),
}


def alerts(config: Config) -> list[Alert]:
    """Every SLO's burn-rate alerts, for each of its objectives."""
    return [
        alert
        for slo in SLOS
        for objective in objectives(config, slo)
        for alert in burn_alerts(config, objective)
    ]


def _selector(name: str, matchers: tuple[str, ...]) -> str:
    return f"{name}{{{','.join(matchers)}}}" if matchers else name


def burn_alerts(config: Config, objective: Objective) -> list[Alert]:
    name, meaning, panel = SLOS[objective.slo]
    meaning = meaning.format(bound=promql.number(good_bound(config)))
    who = "{{ $labels.model }} {{ $labels.model_version }}"
    labels = {"slo": objective.slo}
    if objective.tenant_class is not None:
        who = f"Tenant class {objective.tenant_class} on {who}"
        labels["tenant_class"] = objective.tenant_class
    budget = promql.number(objective.budget)
    floor = promql.number(float(config.slo["traffic_floor"]))
    result = []
    for window in config.burn_windows:
        long_ratio = _selector(*objective.ratio(config, window.long))
        short_ratio = _selector(*objective.ratio(config, window.short))
        traffic = objective.traffic(config, window.long)
        factor = promql.number(window.factor)
        expr = (
            f"{long_ratio} / {budget} > {factor}\n"
            f"and {short_ratio} / {budget} > {factor}\n"
            f"and {on(config, MODEL_VERSION)} ({traffic}) > {floor}"
        )
        result.append(
            Alert(
                name=name,
                severity=window.severity,
                expr=expr,
                for_=window.for_,
                summary=f"A model version is burning its {objective.slo} error budget too fast.",
                description=(
                    f"{who} burns its {meaning} error budget (objective "
                    f"{promql.number(objective.objective * 100)}%) "
                    f"at {{{{ $value | humanize }}}}x over {window.long} and faster than "
                    f"{factor}x over {window.short} too (1x spends exactly the budget of "
                    f"the {config.slo['period']} SLO period)."
                ),
                panel=Panel("latency", panel),
                labels={**labels, "long": window.long, "short": window.short},
            )
        )
    return result
