"""The service level objectives, and their multi-window, multi-burn-rate alerts (SRE
workbook, "Alerting on SLOs").

:func:`objectives` is the one source of what each SLO promises to whom: the default objective
for every model, and a model's own where the config sets one (``slo.<slo>.models``). The
burn-rate alerts here and the Sloth, OpenSLO and Pyrra specs (:mod:`slo_specs`) are both
built from it, on the SLI of :func:`inferwatch.mixin.recording.slo_events`.

For each objective and configured window pair one rule: the burn rate (error ratio over the
error budget) is above ``factor`` on both the long and the short window, and the model had
traffic worth judging. Page pairs are ``critical``, ticket pairs ``warning``; the windows are
labels so a fast and a slow burn of the same model stay two alerts.
"""

from __future__ import annotations

from dataclasses import dataclass

from inferwatch.mixin import promql, recording
from inferwatch.mixin.config import Config
from inferwatch.mixin.model import Alert, Panel
from inferwatch.mixin.promql import MODEL_VERSION, on

#: SLO -> (alert name, what a good event is, the latency board's burn-rate panel)
SLOS = {
    "ttft": ("InferwatchTTFTSLOBurn", "TTFT (good: first token within {bound}s)", 10),
    "availability": (
        "InferwatchAvailabilitySLOBurn",
        "availability (good: the request did not fail)",
        11,
    ),
}


@dataclass(frozen=True)
class Objective:
    """One promise: ``slo`` met for ``objective`` of the events of the models ``matchers``
    select (``model`` names the one model with its own objective; None: all the others)."""

    slo: str
    objective: float
    model: str | None
    matchers: tuple[str, ...]

    @property
    def budget(self) -> float:
        return 1 - self.objective


def objectives(config: Config, slo: str) -> list[Objective]:
    """The default objective (for the models without their own), then each model's own."""
    own = sorted(config.slo[slo]["models"])
    default = (f'model!~"{promql.one_of(own)}"',) if own else ()
    return [
        Objective(slo, config.slo_objective(slo), None, default),
        *(
            Objective(
                slo, config.slo_objective(slo, model), model, (f"model={promql.quoted(model)}",)
            )
            for model in own
        ),
    ]


def good_bound(config: Config) -> float:
    """The TTFT a good request stays within: the threshold snapped down to a bucket bound."""
    ttft = config.slo["ttft"]
    return promql.snap(float(ttft["threshold"]), [float(b) for b in ttft["buckets"]])


def alerts(config: Config) -> list[Alert]:
    """Every SLO's burn-rate alerts, for each of its objectives."""
    return [
        alert
        for slo in SLOS
        for objective in objectives(config, slo)
        for alert in burn_alerts(config, objective)
    ]


def burn_alerts(config: Config, objective: Objective) -> list[Alert]:
    name, meaning, panel = SLOS[objective.slo]
    meaning = meaning.format(bound=promql.number(good_bound(config)))
    budget = promql.number(objective.budget)
    floor = promql.number(float(config.slo["traffic_floor"]))
    narrowed = f"{{{','.join(objective.matchers)}}}" if objective.matchers else ""
    result = []
    for window in config.burn_windows:
        long_ratio = recording.slo_error_ratio(config, objective.slo, window.long) + narrowed
        short_ratio = recording.slo_error_ratio(config, objective.slo, window.short) + narrowed
        traffic = recording.request_total(config, window.long, promql.by(config, MODEL_VERSION))
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
                    "{{ $labels.model }} {{ $labels.model_version }} burns its "
                    f"{meaning} error budget (objective "
                    f"{promql.number(objective.objective * 100)}%) "
                    f"at {{{{ $value | humanize }}}}x over {window.long} and faster than "
                    f"{factor}x over {window.short} too (1x spends exactly the budget of "
                    f"the {config.slo['period']} SLO period)."
                ),
                panel=Panel("latency", panel),
                labels={"slo": objective.slo, "long": window.long, "short": window.short},
            )
        )
    return result
