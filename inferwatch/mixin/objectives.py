"""What each SLO promises to whom: the default objective for every model, and a model's own
where the alert config sets one (``slo.<slo>.models``), as label matchers that split the
models between them. The burn-rate alerts, the exported SLO specs and the budget panels are
built from these, so they never disagree on an objective.
"""

from __future__ import annotations

from dataclasses import dataclass

from inferwatch.mixin import promql
from inferwatch.mixin.config import Config

__all__ = ["Objective", "good_bound", "objectives"]


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
