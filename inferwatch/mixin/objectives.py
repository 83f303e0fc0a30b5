"""What each SLO promises to whom: the default objective for every model, a model's own where
the alert config sets one (``slo.<slo>.models``), and a tenant class's own
(``slo.tenant_classes``), each with the series that measure it. The burn-rate alerts, the
exported SLO specs and the budget panels are built from these, so they never disagree on an
objective or on what a good event is.

Model objectives are measured on the engine's series (the sidecar's), split between the
default and each model's own by label matchers; a tenant class's on the tenancy proxy's
series of its tenants, the only ones that know the tenant.
"""

from __future__ import annotations

from dataclasses import dataclass

from inferwatch.mixin import promql, recording
from inferwatch.mixin.config import Config
from inferwatch.mixin.promql import MODEL_VERSION

__all__ = ["Objective", "good_bound", "objectives"]


@dataclass(frozen=True)
class Objective:
    """One promise: ``slo`` met for ``objective`` of the events that ``matchers`` select.

    ``model`` names the one model with its own objective, ``tenant_class`` the class whose
    ``tenants`` it covers; neither: every model without its own."""

    slo: str
    objective: float
    model: str | None
    matchers: tuple[str, ...]
    tenant_class: str | None = None
    tenants: tuple[str, ...] = ()

    @property
    def budget(self) -> float:
        return 1 - self.objective

    def events(self, config: Config, window: str) -> tuple[str, str]:
        """(bad, total) events per second per model version: the SLI."""
        if self.tenant_class is not None:
            return recording.class_events(config, self.slo, window, self.tenants)
        return recording.slo_events(config, self.slo, window, *self.matchers)

    def ratio(self, config: Config, window: str) -> tuple[str, tuple[str, ...]]:
        """The recorded error ratio over ``window`` and the matchers that narrow it to this
        objective's series."""
        if self.tenant_class is not None:
            return recording.class_error_ratio(config, self.slo, window), self.matchers
        return recording.slo_error_ratio(config, self.slo, window), self.matchers

    def ttft_counters(self, config: Config) -> tuple[str, str]:
        """The counters of the TTFT SLI (good, total), for tools that take counters."""
        if self.tenant_class is not None:
            return recording.ttft_counters(config, tenants=self.tenants)
        return recording.ttft_counters(config, *self.matchers)

    def traffic(self, config: Config, window: str) -> str:
        """Requests per second per model version that this objective judges."""
        mv = promql.by(config, MODEL_VERSION)
        if self.tenant_class is not None:
            of = f'tenant=~"{promql.one_of(self.tenants)}"'
            return f"sum {mv} (rate({promql.metric(config, 'tenancy_requests', of)}[{window}]))"
        return recording.request_total(config, window, mv)


def objectives(config: Config, slo: str) -> list[Objective]:
    """The default objective (for the models without their own), each model's own, then each
    tenant class's."""
    own = sorted(config.slo[slo]["models"])
    default = (f'model!~"{promql.one_of(own)}"',) if own else ()
    classes = sorted((n, e) for n, e in config.slo["tenant_classes"].items() if slo in e)
    return [
        Objective(slo, config.slo_objective(slo), None, default),
        *(
            Objective(
                slo, config.slo_objective(slo, model), model, (f"model={promql.quoted(model)}",)
            )
            for model in own
        ),
        *(
            Objective(
                slo,
                float(entry[slo]),
                None,
                (f"tenant_class={promql.quoted(name)}",),
                name,
                tuple(entry["tenants"]),
            )
            for name, entry in classes
        ),
    ]


def good_bound(config: Config) -> float:
    """The TTFT a good request stays within: the threshold snapped down to a bucket bound."""
    ttft = config.slo["ttft"]
    return promql.snap(float(ttft["threshold"]), [float(b) for b in ttft["buckets"]])
