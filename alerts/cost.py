"""Cost and tenancy layer: budgets, cost per token, admission rejections, reconciliation,
and the fleet's shared state (Redis) that keeps the budgets of every proxy replica.

Each replica's proxy keeps its own budget ledger, so budget alerts are per proxy instance;
the cost and rejection ratios are summed over proxies first (ratios of sums, never averages
of ratios).
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from inferwatch.mixin import promql, recording
from inferwatch.mixin.config import Config
from inferwatch.mixin.model import Alert, Panel
from inferwatch.mixin.promql import MODEL_VERSION, by, metric, one_of

COST = "cost"
#: each alert's defaults (alerts.<name> in the config, where a user's file overrides them):
#: ``for`` and its own thresholds
SETTINGS: Mapping[str, Mapping[str, Any]] = {
    "InferwatchTenantBudgetExhaustionPredicted": {"for": "10m", "lookback": "30m", "horizon": "1h"},
    # cost per 1k tokens above (1 + drift) x its baseline: the per-model `baselines` (currency
    # per 1k tokens) where given, else its own average over `baseline_window`
    "InferwatchCostPer1kTokensDrift": {
        "for": "30m",
        "drift": 0.25,
        "baseline_window": "1d",
        "baselines": {},
    },
    # share of a tenant's requests the proxy refused (400 too long / bad request, 429 budget,
    # concurrency, queue timeout)
    "InferwatchAdmissionRejectionsRising": {"for": "10m", "ratio": 0.1, "min_rate": 0.01},
    "InferwatchReconciliationDrift": {"for": "15m", "tokens": 1000.0},
    # a proxy that cannot reach the fleet's Redis (shared_state) for this long
    "InferwatchSharedStateDown": {"for": "3m"},
}
#: request outcomes that are the proxy refusing a request at admission (400 and 429)
REJECTIONS = (
    "rejected_bad_request",
    "rejected_too_long",
    "rejected_budget",
    "rejected_concurrency",
    "rejected_queue_timeout",
)


def alerts(config: Config) -> list[Alert]:
    return [
        *_budget(config),
        *_cost_drift(config),
        *_rejections(config),
        *_drift(config),
        *_shared_state(config),
    ]


def _budget(config: Config) -> list[Alert]:
    settings = config.alert("InferwatchTenantBudgetExhaustionPredicted")
    lookback, horizon = settings.text("lookback"), settings.text("horizon")
    remaining = metric(config, "tenancy_budget_remaining")
    return [
        Alert(
            name="InferwatchTenantBudgetExhaustionPredicted",
            severity="warning",
            expr=(
                f"predict_linear({remaining}[{lookback}], {promql.seconds_text(horizon)}) < 0\n"
                f"and {remaining} > 0"
            ),
            for_=settings.for_,
            summary="A tenant will run out of token budget soon.",
            description=(
                "Tenant {{ $labels.tenant }} on {{ $labels.instance }} burns tokens at a rate "
                f"that empties its budget within {horizon} (trend over {lookback}); its "
                "requests will then get HTTP 429."
            ),
            panel=Panel(COST, 1),
        )
    ]


def _cost_drift(config: Config) -> list[Alert]:
    settings = config.alert("InferwatchCostPer1kTokensDrift")
    drift = settings.number("drift")
    factor = promql.number(1 + drift)
    series = recording.cost_per_1k(config)
    baselines: dict[str, float] = {k: float(v) for k, v in settings.params["baselines"].items()}
    description = (
        '{{ $labels.model }} {{ $labels.model_version }} costs {{ printf "%.4f" $value }} per 1k '
        f"tokens over {config.rate_window}, more than {promql.number(drift * 100)}% above "
    )
    alerts = []
    for model, baseline in sorted(baselines.items()):
        alerts.append(
            Alert(
                name="InferwatchCostPer1kTokensDrift",
                severity="warning",
                expr=f"{series}{{model={promql.quoted(model)}}} > "
                f"{promql.number(baseline * (1 + drift))}",
                for_=settings.for_,
                summary="Cost per token drifts above its baseline.",
                description=description + f"its baseline of {promql.number(baseline)}.",
                panel=Panel(COST, 2),
            )
        )
    others = f'{{model!~"{one_of(sorted(baselines))}"}}' if baselines else ""
    window = settings.text("baseline_window")
    alerts.append(
        Alert(
            name="InferwatchCostPer1kTokensDrift",
            severity="warning",
            expr=f"{series}{others}\n> {factor} * avg_over_time({series}{others}[{window}])",
            for_=settings.for_,
            summary="Cost per token drifts above its baseline.",
            description=description + f"its own average over {window}.",
            panel=Panel(COST, 2),
        )
    )
    return alerts


def _rejections(config: Config) -> list[Alert]:
    settings = config.alert("InferwatchAdmissionRejectionsRising")
    window = config.rate_window
    tenant = by(config, ("tenant", *MODEL_VERSION))
    requests = metric(config, "tenancy_requests")
    rejected = metric(config, "tenancy_requests", f'outcome=~"{one_of(REJECTIONS)}"')
    total = f"sum {tenant} (rate({requests}[{window}]))"
    return [
        Alert(
            name="InferwatchAdmissionRejectionsRising",
            severity="warning",
            expr=(
                f"sum {by(config, ('tenant', *MODEL_VERSION, 'outcome'))} "
                f"(rate({rejected}[{window}]))\n"
                f"/ ignoring (outcome) group_left {total}\n"
                f"> {promql.number(settings.number('ratio'))}\n"
                f"and ignoring (outcome) ({total}) > {promql.number(settings.number('min_rate'))}"
            ),
            for_=settings.for_,
            summary="The proxy refuses a growing share of a tenant's requests.",
            description=(
                "The proxy refused {{ $value | humanizePercentage }} of the requests of tenant "
                "{{ $labels.tenant }} to {{ $labels.model }} over "
                f"{window} as {{{{ $labels.outcome }}}}."
            ),
            panel=Panel(COST, 3),
        )
    ]


def _drift(config: Config) -> list[Alert]:
    settings = config.alert("InferwatchReconciliationDrift")
    drift = metric(config, "tenancy_reconciliation_drift")
    return [
        Alert(
            name="InferwatchReconciliationDrift",
            severity="warning",
            expr=f"abs({drift}) > {promql.number(settings.number('tokens'))}",
            for_=settings.for_,
            summary="Proxy and engine token counts disagree.",
            description=(
                "The proxy at {{ $labels.instance }} charged {{ $value | humanize }} "
                "{{ $labels.token_type }} tokens more or fewer than its engine counted, for "
                f"{settings.for_}: traffic bypasses the proxy or usage is lost."
            ),
            panel=Panel(COST, 4),
        )
    ]


def _shared_state(config: Config) -> list[Alert]:
    """Redis unreachable: fail_closed tenants are refused and their replicas unready, fail_open
    tenants each get budget / N per proxy, so the books are no longer the fleet's one ledger."""
    settings = config.alert("InferwatchSharedStateDown")
    up = metric(config, "tenancy_shared_state_up")
    return [
        Alert(
            name="InferwatchSharedStateDown",
            severity="critical",
            expr=f"{up} == 0",
            for_=settings.for_,
            summary="A proxy cannot reach the fleet's shared state (Redis) for tenant budgets.",
            description=(
                "The proxy at {{ $labels.instance }} has not reached its shared state for "
                f"{settings.for_}: fail_closed tenants get 503 and this replica reports not "
                "ready; fail_open tenants are held to their budget / N on each proxy, and usage "
                "is journaled until Redis is back."
            ),
            panel=Panel(COST, 9),
        )
    ]
