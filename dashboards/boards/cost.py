"""Tenants and cost: who uses what, what it costs, budgets, admission, reconciliation.

Panels 1-4 are the ones the cost alerts link to (their ``dashboard_url``). Per-tenant series
come from the tenancy proxies, which know the model and version but not the replica.
"""

from __future__ import annotations

from inferwatch.dashboards.panels import Board, Ctx, Panel, Q, Scope, above, below
from inferwatch.mixin import recording
from inferwatch.mixin.promql import IDENTITY_KEY, seconds_text, with_model

T, TO, C, MV = Scope.TENANT, Scope.TENANT_ONLY, Scope.CLUSTER, Scope.MODEL_VERSION
REJECTED = 'outcome=~"rejected_.*"'


def _fair_share(ctx: Ctx) -> tuple[str, str]:
    """Each tenant's share of the tokens, and its weight's share among the tenants that sent
    some (over every tenant: the tenant variable would make the shares of a subset)."""
    c = ctx.config.cluster_label
    on_c = f"on ({c}) group_left"
    tokens = ctx.r(recording.tenant_tokens(ctx.config), C, 'token_type=~"prompt|completion"')
    per_tenant = f"sum by ({c}, tenant) ({tokens})"
    # every proxy exports the weights of its config: one value per tenant
    weights = (f"(max by ({c}, tenant) ({ctx.m('tenancy_weight', C)}) "
               f"and on ({c}, tenant) {per_tenant})")  # fmt: skip
    share = f"({per_tenant} / {on_c} sum by ({c}) ({per_tenant}))"
    weight_share = f"({weights} / {on_c} sum by ({c}) ({weights}))"
    return share, weight_share


def _gpu_cost(ctx: Ctx, price: float) -> tuple[str, str, str]:
    """Per model: the cost per hour of its GPUs' busy share and of their idle share (the
    configured GPU-hour price times utilization, and times the rest), and their cost per 1M
    output tokens. GPU series carry no model: each is joined to its replica's identity on
    the scrape target both come from, narrowed by model and version only."""
    c = ctx.config.cluster_label
    utilization = with_model(ctx.config, ctx.m("gpu_utilization", C), ctx.m(IDENTITY_KEY, MV))
    busy = f"{price:g} * sum by ({c}, model) ({utilization})"
    idle = f"{price:g} * sum by ({c}, model) (1 - {utilization})"
    recorded = ctx.r(f"model_version:inferwatch_engine_generation_tokens:rate{ctx.w}", MV)
    output = f"sum by ({c}, model) ({recorded})"
    per_million = f"{price:g} * count by ({c}, model) ({utilization}) * 1e6 / (3600 * {output})"
    return busy, idle, per_million


def board(ctx: Ctx) -> Board:
    config = ctx.config
    c = config.cluster_label
    budget = config.alert("InferwatchTenantBudgetExhaustionPredicted")
    drift = config.alert("InferwatchCostPer1kTokensDrift")
    rejections = config.alert("InferwatchAdmissionRejectionsRising").number("ratio")
    reconcile = config.alert("InferwatchReconciliationDrift").number("tokens")
    remaining = ctx.m("tenancy_budget_remaining", TO)
    per_1k = ctx.r(recording.cost_per_1k(config))
    # the baseline is cost over tokens across the window (every tenant, as the ratio), not an
    # average of the ratio: that is NaN while a version has no tokens, and one NaN makes the
    # whole window's average NaN
    window = drift.text("baseline_window")
    mv = ctx.by("model", "model_version")
    tokens = ctx.r(recording.tenant_tokens(config), MV, 'token_type=~"prompt|completion"')
    baseline = (
        f"(1000 * sum {mv} (avg_over_time({ctx.r(recording.tenant_cost(config), MV)}[{window}])) "
        f"/ sum {mv} (avg_over_time({tokens}[{window}])))"
    )
    tenant_by = ctx.by("tenant", "model", "model_version")
    admitted = ctx.rate("tenancy_requests", T, 'outcome="ok"')
    share, weight_share = _fair_share(ctx)
    idle = config.alert("InferwatchGPUIdleWaste")
    price = idle.number("gpu_hour_price")
    busy_cost, idle_cost, per_million = _gpu_cost(ctx, price)
    return Board(
        "cost", "Inferwatch / Tenants and cost",
        "Tokens and cost by tenant and model, budgets and where they are heading, admission "
        "rejections, cost per 1k tokens and the proxy-to-engine token reconciliation.",
        variables=("cluster", "model", "model_version", "tenant"),
    ).row(
        "Budgets and alerts",
        Panel(1, "Budget remaining and projection", "Tokens left in each tenant's budget "
              f"window, and where the last {budget.text('lookback')} trend puts it in "
              f"{budget.text('horizon')}. A projection under 0 is "
              "InferwatchTenantBudgetExhaustionPredicted: the tenant will get 429s; raise the "
              "budget or tell the tenant.", "short",
              [Q(remaining, "{{tenant}} remaining"),
               Q(f"predict_linear({remaining}[{budget.text('lookback')}], "
                 f"{seconds_text(budget.text('horizon'))})", "{{tenant}} projected")],
              thresholds=below(0)),
        Panel(2, "Cost per 1k tokens against its baseline", "Cost per 1k prompt and "
              f"completion tokens divided by the same over the last {window}. "
              f"Above {1 + drift.number('drift'):g} is InferwatchCostPer1kTokensDrift: the "
              "token mix or prices changed; check for longer outputs or a pricing change.",
              "short",
              [Q(f"{per_1k} / {baseline}", "{{model}} {{model_version}}")],
              thresholds=above(None, 1 + drift.number("drift"))),
        Panel(3, "Admission rejections", "Share of each tenant's requests the proxy refused, "
              f"by reason. Above {rejections:g} is InferwatchAdmissionRejectionsRising: budget "
              "429s mean the budget is too small, too_long 400s a client sending oversize "
              "prompts. Only the admitted line until a proxy refuses one of the tenant's "
              "requests.", "percentunit",
              [Q(f"sum by ({c}, tenant, outcome) ({ctx.rate('tenancy_requests', T, REJECTED)})"
                 f" / ignoring (outcome) group_left sum by ({c}, tenant) "
                 f"({ctx.rate('tenancy_requests', T)})", "{{tenant}} {{outcome}}"),
               Q(f"sum by ({c}, tenant) ({admitted}) / sum by ({c}, tenant) "
                 f"({ctx.rate('tenancy_requests', T)})",
                 "{{tenant}} admitted")],
              thresholds=above(None, rejections), max=1),
        Panel(4, "Reconciliation drift", "Tokens the proxies counted minus what the "
              f"engines counted, by token type. Beyond {reconcile:g} either way is "
              "InferwatchReconciliationDrift: some route bypasses metering or usage is "
              "misread; compare the proxy's and engine's counters.", "short",
              [Q(f"abs({ctx.m('tenancy_reconciliation_drift', C)})",
                 "{{instance}} {{token_type}}")],
              thresholds=above(None, reconcile)),
    ).row(
        "Usage and cost",
        Panel(5, "Tokens per second by tenant", "Prompt, cached prompt and completion tokens "
              "the proxies metered, by tenant and model.", "suffix: tok/s",
              [Q(f"sum by ({c}, tenant, model, token_type) "
                 f"({ctx.r(recording.tenant_tokens(config), T)})",
                 "{{tenant}} {{token_type}} {{model}}")], stack=True),
        Panel(6, "Cost per hour by tenant", "What each tenant's traffic costs per hour at "
              "the configured prices, by model.", "currencyUSD",
              [Q(f"3600 * sum {tenant_by} ({ctx.r(recording.tenant_cost(config), T)})",
                 "{{tenant}} {{model}}")], stack=True),
        Panel(7, "Cost per 1k tokens", "Cost per 1k prompt and completion tokens by model "
              "version: the figure to compare versions and engines on.", "currencyUSD",
              [Q(per_1k, "{{model}} {{model_version}}")]),
        Panel(8, "Top tenants by cost (time range)", "The ten tenants that cost most over "
              "the dashboard's time range.", "currencyUSD",
              [Q(f"topk(10, sum by ({c}, tenant) "
                 f"(increase({ctx.m('tenancy_cost', T)}[$__range])))", instant=True)],
              kind="table", width=12),
        Panel(9, "Requests by outcome", "Every request the proxies saw, by tenant and "
              "outcome (ok, rejected_*, upstream errors).", "reqps",
              [Q(f"sum by ({c}, tenant, outcome) ({ctx.rate('tenancy_requests', T)})",
                 "{{tenant}} {{outcome}}")], width=12, stack=True),
        Panel(10, "Engine usage anomalies", "Usage fields the engines reported that the "
              "proxies charged at a bound instead: completion below the content relayed, "
              "prompt or completion above what was reserved, or no count at all. Any is an "
              "engine (or something in front of it) misreporting tokens; tenants were charged "
              "the bound. Compare with the engine's own counters (reconciliation drift).",
              "short",
              [Q(ctx.or_zero(f"sum by ({c}, instance, token_type, reason) "
                             f"(increase({ctx.m('tenancy_engine_usage_anomalies', C)}"
                             "[$__rate_interval]))", "instance", scope=C,
                             of="tenancy_requests_in_flight"),
                 "{{instance}} {{token_type}} {{reason}}")],
              thresholds=above(None, 1), width=24),
    ).row(
        "Fair share",
        Panel(11, "Queue time by tenant (p95)", "How long each tenant's requests waited for "
              "a concurrency slot to the engine: a saturated engine serves by priority class "
              "and weight, so a low-priority tenant's wait grows first (0 while no tenant has "
              "a concurrency cap).", "s",
              [Q(ctx.or_zero(f"histogram_quantile(0.95, sum by ({c}, tenant, le) "
                             f"({ctx.rate('tenancy_queue_time', TO, suffix='_bucket')}))",
                             scope=C, of="tenancy_requests_in_flight"), "{{tenant}}")],
              width=12),
        Panel(12, "Shed requests by tenant and reason", "Requests refused at a saturated "
              "engine: queue_timeout (waited too long), queue_full (no room in the queue), "
              "priority (shed for a higher-priority request).", "reqps",
              [Q(ctx.or_zero(f"sum by ({c}, tenant, reason) ({ctx.rate('tenancy_shed', TO)})",
                             scope=C, of="tenancy_requests_in_flight"),
                 "{{tenant}} {{reason}}")], width=12, stack=True),
        Panel(13, "Token share against weight share", "Each tenant's share of the prompt "
              "and completion tokens metered, and its weight's share of the weights of the "
              "tenants that sent tokens (an idle tenant is owed nothing). Under contention "
              "weighted fair queuing brings a tenant's share towards its weight's within its "
              "priority class; far below it while its requests queue, it is starved. Every "
              "tenant is shown: a share is only one against the others.", "percentunit",
              [Q(share, "{{tenant}} tokens"), Q(weight_share, "{{tenant}} weight")],
              max=1, width=16),
        Panel(14, "Fair-share gap", "The largest gap, over the tenants, between a tenant's "
              "token share and its weight share: 0 is every tenant on its weight. A large "
              "gap with no queue is only uneven demand; with queued requests, see queue "
              "time and shed requests.", "percentunit",
              [Q(f"max by ({c}) (abs({share} - {weight_share}))", "gap")],
              kind="stat", max=1, width=8),
    ).row(
        "GPU cost",
        Panel(15, "GPU cost per hour, busy and idle", "What each model's GPUs cost per hour "
              f"at {price:g} per GPU-hour (the alert config's InferwatchGPUIdleWaste "
              "gpu_hour_price), split by their utilization: the idle part is paid for and "
              "serves nothing. A large idle part is expensive and idle: scale the model in "
              "(InferwatchGPUIdleWaste fires once a GPU idles for "
              f"{idle.text('window')} with nothing queued).", "currencyUSD",
              [Q(busy_cost, "{{model}} busy"), Q(idle_cost, "{{model}} idle")],
              stack=True, width=12),
        Panel(16, "GPU cost per 1M output tokens", "What the model's GPU-hours cost per "
              "million generated tokens: it rises as utilization falls, and is the figure "
              "to compare with the prices the tenants pay.", "currencyUSD",
              [Q(per_million, "{{model}}")], width=12),
    )  # fmt: skip
