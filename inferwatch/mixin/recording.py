"""Recording rules: the expensive expressions alerts and dashboards share.

Names follow ``level:metric:operations``. Levels: ``pod`` keeps every label of the replica's
series (only ``reason`` is summed away), ``model_version`` keeps cluster, model and
model_version, ``tenant`` keeps cluster, tenant, model and model_version. The rate window is
part of the name (``rate5m``), so a config with another window yields other names.

Gauges get no rule: an aggregation over one gauge sample per replica is about as cheap as
reading a recorded series (docs/scaling.md measures it), so such a rule would cost an
evaluation every interval and add lag for no faster panel.

A request is one the engine finished (any reason but error) or failed: vLLM reports errors
both as a finish reason and as errors, other engines only as errors, so the total is
finished-without-error plus errors. Where the engine's HTTP server counts its answers by
status (vLLM), its 5xx answers are failures too, some of which never reach the engine's
counters; a failure both count is counted once (the larger of the two rates).

The autoscaling group records what the autoscalers compare with ``autoscaling.targets``: each
signal is per *ready* replica, because a replica that is still loading its weights takes no
traffic and would otherwise hide the pressure on the others.
"""

from __future__ import annotations

from inferwatch import catalog
from inferwatch.mixin import promql
from inferwatch.mixin.config import Config
from inferwatch.mixin.model import Group, Recording
from inferwatch.mixin.promql import MODEL_VERSION, by, metric, one_of
from inferwatch.serving.histogram import TTFT_BUCKETS_LONG

__all__ = [
    "LATENCY",
    "POD",
    "autoscaling_signals",
    "bucket_rate",
    "catalog_name",
    "class_error_ratio",
    "class_events",
    "cost_per_1k",
    "error_ratio",
    "errors",
    "groups",
    "kv_usage_ready",
    "quantile",
    "queue_per_replica",
    "queue_wait",
    "ready_replica",
    "ready_replicas",
    "request_errors",
    "request_total",
    "requests",
    "slo_error_ratio",
    "slo_events",
    "tenant_cost",
    "tenant_tokens",
    "ttft_counters",
]

#: latency signals: alert word -> catalogue key
LATENCY = {
    "ttft": "engine_time_to_first_token",
    "tpot": "engine_time_per_output_token",
    "e2e": "engine_request_duration",
}
POD = "without (reason)"


def _w(config: Config) -> str:
    return config.rate_window


def requests(config: Config, level: str = "model_version") -> str:
    return f"{level}:inferwatch_engine_requests:rate{_w(config)}"


def errors(config: Config, level: str = "model_version") -> str:
    return f"{level}:inferwatch_engine_request_errors:rate{_w(config)}"


def error_ratio(config: Config) -> str:
    return f"model_version:inferwatch_engine_request_errors_per_request:ratio_rate{_w(config)}"


def quantile(config: Config, signal: str) -> str:
    name = catalog_name(LATENCY[signal])
    return f"model_version:{name}:histogram_quantile_rate{_w(config)}"


def bucket_rate(config: Config, signal: str) -> str:
    return f"model_version:{catalog_name(LATENCY[signal])}_bucket:rate{_w(config)}"


def slo_error_ratio(config: Config, slo: str, window: str) -> str:
    metric_name = (
        "inferwatch_engine_requests" if slo == "availability" else catalog_name(LATENCY[slo])
    )
    return f"model_version:{metric_name}:slo_error_ratio_rate{window}"


def class_error_ratio(config: Config, slo: str, window: str) -> str:
    """A tenant class's error ratio over ``window``, from the proxy's series (label
    ``tenant_class``)."""
    key = "tenancy_requests" if slo == "availability" else "tenancy_time_to_first_token"
    return f"tenant_class:{catalog_name(key).removesuffix('_total')}:slo_error_ratio_rate{window}"


#: proxy outcomes that are the engine's or the proxy's failure (refusals and the client's own
#: errors are neither good nor bad: they are left out of the total)
PROXY_FAILURES = ("engine_error", "upstream_error", "shutdown_cancelled")
PROXY_SERVED = ("ok", "client_cancelled", *PROXY_FAILURES)


def class_events(
    config: Config, slo: str, window: str, tenants: tuple[str, ...]
) -> tuple[str, str]:
    """(bad, total) events per second per model version for ``slo`` of the requests of
    ``tenants``, from the tenancy proxy's series (its TTFT buckets are the GenAI ones)."""
    mv = by(config, MODEL_VERSION)
    of = f'tenant=~"{one_of(tenants)}"'
    if slo == "availability":
        served = metric(config, "tenancy_requests", of, f'outcome=~"{one_of(PROXY_SERVED)}"')
        failed = metric(config, "tenancy_requests", of, f'outcome=~"{one_of(PROXY_FAILURES)}"')
        total = f"sum {mv} (rate({served}[{window}]))"
        return f"(sum {mv} (rate({failed}[{window}])) or {total} * 0)", f"({total})"
    good, count = ttft_counters(config, tenants=tenants)
    total = f"sum {mv} (rate({count}[{window}]))"
    return f"({total} - sum {mv} (rate({good}[{window}])))", f"({total})"


def ready_replica() -> str:
    return "pod:inferwatch_replica_ready:min"


def ready_replicas() -> str:
    return "model_version:inferwatch_replica_ready:sum"


def queue_per_replica() -> str:
    return "model_version:inferwatch_engine_requests_waiting:per_ready_replica"


def kv_usage_ready() -> str:
    return "model_version:inferwatch_engine_kv_cache_usage_ratio:avg_ready"


def queue_wait(config: Config) -> str:
    name = catalog_name("engine_request_queue_duration")
    return f"model_version:{name}:histogram_quantile_rate{_w(config)}"


def autoscaling_signals(config: Config) -> dict[str, tuple[str, tuple[str, ...]]]:
    """``autoscaling.targets`` key -> (recorded name, matchers) of the series an autoscaler
    reads."""
    q = promql.number(float(config.autoscaling["queue_wait_quantile"]))
    return {
        "queue_per_replica": (queue_per_replica(), ()),
        "kv_cache_usage": (kv_usage_ready(), ()),
        "queue_wait": (queue_wait(config), (f"quantile={promql.quoted(q)}",)),
    }


def tenant_tokens(config: Config) -> str:
    return f"tenant:inferwatch_tenancy_tokens:rate{_w(config)}"


def tenant_cost(config: Config) -> str:
    return f"tenant:inferwatch_tenancy_cost:rate{_w(config)}"


def cost_per_1k(config: Config) -> str:
    return f"model_version:inferwatch_tenancy_cost_per_1k_tokens:ratio_rate{_w(config)}"


def catalog_name(key: str) -> str:
    return catalog.load()[key].name


def request_total(config: Config, window: str, grouping: str, *matchers: str) -> str:
    """Requests started and ended (finished or failed) per second, summed by ``grouping``."""
    finished = metric(config, "engine_requests_finished", 'reason!="error"', *matchers)
    done = f"sum {grouping} (rate({finished}[{window}]))"
    return f"{done} + ({request_errors(config, window, grouping, *matchers)} or {done} * 0)"


def request_errors(config: Config, window: str, grouping: str, *matchers: str) -> str:
    """Failed requests per second: the engine's errors, or its HTTP server's 5xx answers where
    those are more."""
    errors = metric(config, "engine_request_errors", *matchers)
    engine = f"sum {grouping} (rate({errors}[{window}]))"
    http_grouping = "without (handler, status)" if grouping == POD else grouping
    http_5xx = metric(config, "engine_http_requests", 'status="5xx"', *matchers)
    http = f"sum {http_grouping} (rate({http_5xx}[{window}]))"
    return f"(({engine} >= {http}) or {http} or {engine})"


def slo_events(config: Config, slo: str, window: str, *matchers: str) -> tuple[str, str]:
    """(bad, total) events per second per model version for ``slo`` over ``window``: what
    the error-ratio rules divide, and the SLI the exported SLO specs carry (``window`` may be
    a template's placeholder, such as Sloth's ``{{.window}}``)."""
    mv = by(config, MODEL_VERSION)
    if slo == "availability":
        total = f"({request_total(config, window, mv, *matchers)})"
        return f"({request_errors(config, window, mv, *matchers)} or {total} * 0)", total
    good, count = ttft_counters(config, *matchers)
    total = f"sum {mv} (rate({count}[{window}]))"
    return f"({total} - sum {mv} (rate({good}[{window}])))", f"({total})"


def ttft_counters(config: Config, *matchers: str, tenants: tuple[str, ...] = ()) -> tuple[str, str]:
    """The TTFT SLI's counters: requests within the bound (its bucket) and all of them (the
    count); from the engine's histogram, or for ``tenants`` the proxy's (GenAI buckets), with
    the threshold snapped down to a bound of the histogram read."""
    threshold = float(config.slo["ttft"]["threshold"])
    if tenants:
        key, buckets = "tenancy_time_to_first_token", list(TTFT_BUCKETS_LONG)
        matchers = (*matchers, f'tenant=~"{one_of(tenants)}"')
    else:
        key, buckets = LATENCY["ttft"], [float(b) for b in config.slo["ttft"]["buckets"]]
    bound = promql.le_matcher(promql.snap(threshold, buckets))
    good = metric(config, key, *matchers, bound, suffix="_bucket")
    return good, metric(config, key, *matchers, suffix="_count")


def groups(config: Config) -> list[Group]:
    return [_rate_group(config), _slo_group(config), _autoscaling_group(config)]


def _rate_group(config: Config) -> Group:
    w = _w(config)
    mv = by(config, MODEL_VERSION)
    rules: list[Recording] = [
        Recording(requests(config, "pod"), request_total(config, w, POD)),
        Recording(errors(config, "pod"), request_errors(config, w, POD)),
        Recording(requests(config), f"sum {mv} ({requests(config, 'pod')})"),
        Recording(errors(config), f"sum {mv} ({errors(config, 'pod')})"),
        Recording(
            error_ratio(config),
            f"({errors(config)} or {requests(config)} * 0) / {requests(config)}",
        ),
    ]
    for key in ("engine_prompt_tokens", "engine_generation_tokens"):
        name = catalog_name(key).removesuffix("_total")
        rules.append(
            Recording(
                f"model_version:{name}:rate{w}", f"sum {mv} (rate({metric(config, key)}[{w}]))"
            )
        )
    le_by = by(config, (*MODEL_VERSION, "le"))
    for signal, key in LATENCY.items():
        rules.append(
            Recording(
                bucket_rate(config, signal),
                f"sum {le_by} (rate({metric(config, key, suffix='_bucket')}[{w}]))",
            )
        )
        for q in config.quantiles:
            rules.append(
                Recording(
                    quantile(config, signal),
                    f"histogram_quantile({promql.number(q)}, {bucket_rate(config, signal)})",
                    {"quantile": promql.number(q)},
                )
            )
    tenant_by = by(config, ("tenant", *MODEL_VERSION))
    rules += [
        Recording(
            tenant_tokens(config),
            f"sum {by(config, ('tenant', *MODEL_VERSION, 'token_type'))} "
            f"(rate({metric(config, 'tenancy_tokens')}[{w}]))",
        ),
        Recording(
            tenant_cost(config),
            f"sum {tenant_by} (rate({metric(config, 'tenancy_cost')}[{w}]))",
        ),
        Recording(  # no sample while a version has no tokens: a 0/0 NaN would poison
            # every average over a window that includes it (the drift alert's baseline)
            cost_per_1k(config),
            f"1000 * sum {mv} ({tenant_cost(config)}) / (sum {mv} "
            f'({tenant_tokens(config)}{{token_type=~"prompt|completion"}}) > 0)',
        ),
    ]
    return Group("inferwatch-recording", tuple(rules))


def _ratio(bad: str, total: str) -> str:
    """``bad / total``, and no sample while there was no traffic: a 0/0 NaN would poison
    every average over a period that includes it (the budget panels')."""
    return f"{bad} / ({total} > 0)"


def _slo_group(config: Config) -> Group:
    """Error ratios per SLO window: the bad/total the burn-rate alerts compare."""
    rules: list[Recording] = []
    for window in config.slo_windows:
        for slo in ("ttft", "availability"):
            bad, total = slo_events(config, slo, window)
            rules.append(
                Recording(slo_error_ratio(config, slo, window), _ratio(bad, total), {"slo": slo})
            )
            for name, entry in sorted(config.slo["tenant_classes"].items()):
                if slo in entry:
                    bad, total = class_events(config, slo, window, tuple(entry["tenants"]))
                    rules.append(
                        Recording(
                            class_error_ratio(config, slo, window),
                            _ratio(bad, total),
                            {"slo": slo, "tenant_class": name},
                        )
                    )
    return Group("inferwatch-recording-slo", tuple(rules))


def _autoscaling_group(config: Config) -> Group:
    """Queue depth and KV-cache usage per ready replica, and the queue-wait quantile.

    A replica is ready while every /readyz condition holds; only ready replicas' queues
    count (a version with none ready reads 0, its replica count says the rest); the
    queue wait is 0 while nothing was queued (a quantile of no requests is NaN, which an
    autoscaler cannot act on and which would block its scale-down).
    """
    w = _w(config)
    mv = by(config, MODEL_VERSION)
    q = promql.number(float(config.autoscaling["queue_wait_quantile"]))
    le_by = by(config, (*MODEL_VERSION, "le"))
    buckets = f"rate({metric(config, 'engine_request_queue_duration', suffix='_bucket')}[{w}])"
    on_mv = promql.on(config, MODEL_VERSION)
    waiting = f"sum {mv} ({metric(config, 'engine_requests_waiting')})"
    # a loading replica's queue is its own warm-up, not demand: counted, it would ask for
    # more replicas every time one starts
    ready_waiting = (
        f"(sum {mv} ({metric(config, 'engine_requests_waiting')} and {ready_replica()} == 1)"
        f" or {ready_replicas()} * 0)"
    )
    rules = (
        Recording(ready_replica(), f"min without (condition) ({metric(config, 'replica_ready')})"),
        Recording(ready_replicas(), f"sum {mv} ({ready_replica()})"),
        Recording(
            queue_per_replica(), f"{ready_waiting} / {on_mv} clamp_min({ready_replicas()}, 1)"
        ),
        Recording(
            kv_usage_ready(),
            f"avg {mv} ({metric(config, 'engine_kv_cache_usage')} and {ready_replica()} == 1)",
        ),
        Recording(
            queue_wait(config),
            f"(histogram_quantile({q}, sum {le_by} ({buckets})) >= 0) or {on_mv} ({waiting} * 0)",
            {"quantile": q},
        ),
    )
    return Group("inferwatch-recording-autoscaling", rules)
