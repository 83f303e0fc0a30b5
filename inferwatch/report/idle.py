"""Idle GPU cost: what a model's GPUs cost while they served nothing, billed to the tenants
that kept them.

Token prices bill what the GPUs did; the hours they stood idle are paid for too. Per period
and model, the idle GPU-hours are the sum over its GPUs of one minus their utilization, read
from Prometheus (each GPU joined to its replica's model, the rule of the cost board's GPU
cost panel), times the GPU-hour price. Each of the model's rows in that period bears a share
in proportion to its requests' busy time (the seconds the proxy held them). A model whose
GPUs idled through a period none of its tenants used is left unbilled: that cost is totalled
in the footer, for the finance team to place.
"""

from __future__ import annotations

from collections import defaultdict
from dataclasses import dataclass

from inferwatch.canary.prometheus import Prometheus, PrometheusError, finite
from inferwatch.mixin import config as alert_config
from inferwatch.mixin.promql import IDENTITY_KEY, metric, with_model
from inferwatch.report.usage import FIELDS, Key, Totals, periods

BUSY = FIELDS.index("busy_s")


@dataclass(frozen=True)
class IdleCost:
    by_row: dict[Key, float]  # each row's share
    unbilled: float  # idle cost of a model and period no row used


def idle_gpu_hours(
    prometheus: Prometheus, start: float, end: float, step_s: int
) -> dict[str, float]:
    """Per model, the GPU-hours its GPUs stood idle over ``[start, end)``."""
    config = alert_config.load()
    utilization = with_model(
        config, metric(config, "gpu_utilization"), metric(config, IDENTITY_KEY)
    )
    seconds = max(step_s, round(end - start))
    idle = f"sum_over_time((1 - {utilization})[{seconds}s:{step_s}s])"
    expr = f"sum by (model) ({idle}) * {step_s} / 3600"
    hours: dict[str, float] = {}
    for labels, value in prometheus.query(expr, end):
        if "model" not in labels:
            raise PrometheusError(f"{prometheus.url}: an idle-hours sample without a model")
        hours[labels["model"]] = max(0.0, finite(value))
    return hours


def spread(
    prometheus: Prometheus, totals: Totals, start: float, end: float, by: str, *,
    price: float, step_s: int,
) -> IdleCost:  # fmt: skip
    """The idle cost of each period's GPUs, shared among that period's rows of their model."""
    by_row: dict[Key, float] = {}
    unbilled = 0.0
    in_period: dict[str, list[Key]] = defaultdict(list)
    for key in totals.rows:
        in_period[key[0]].append(key)
    for period, since, until in periods(start, end, by):
        rows = in_period[period]
        busy: dict[str, float] = defaultdict(float)
        for key in rows:
            busy[key[2]] += totals.rows[key][BUSY]
        for model, hours in idle_gpu_hours(prometheus, since, until, step_s).items():
            cost = price * hours
            if busy[model] <= 0:
                unbilled += cost
                continue
            for key in rows:
                if key[2] == model:
                    by_row[key] = cost * totals.rows[key][BUSY] / busy[model]
    return IdleCost(by_row, unbilled)
