"""The proxy's parts, assembled from its config in one place (:func:`build`).

What a config turns on is decided here, once: the fleet's books in Redis or this process's
(the Redis client is imported only then), rate limits, the usage log as files or a Redis
stream, tracing. :class:`~inferwatch.proxy.app.ProxyApp` receives the parts and serves
requests with them.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING

from inferwatch.probes.livesample import DegeneracySampler
from inferwatch.proxy.accesslog import AccessLog
from inferwatch.proxy.accounting import Accounting
from inferwatch.proxy.admission import BudgetLedger, ConcurrencyGate, Ledger
from inferwatch.proxy.config import ProxyConfig
from inferwatch.proxy.counting import PromptCounter, byte_bound, load_tokenizer
from inferwatch.proxy.engineinfo import EngineInfo
from inferwatch.proxy.labels import BoundedLabels
from inferwatch.proxy.metrics import ProxyMetrics
from inferwatch.proxy.pipeline import Admission
from inferwatch.proxy.ratelimit import RateLimiter
from inferwatch.proxy.reconcile import DirectTraffic, Reconciler
from inferwatch.proxy.routes import Router
from inferwatch.proxy.tenants import UNKNOWN, TenantResolver
from inferwatch.proxy.upstream import Timeouts, UpstreamPool
from inferwatch.proxy.usagelog import UsageLog

if TYPE_CHECKING:
    from opentelemetry.sdk.trace import TracerProvider

    from inferwatch.proxy.sharedstate import SharedLedger
    from inferwatch.proxy.tracing import RequestTracing
    from inferwatch.proxy.usagestream import UsageStream


@dataclass(frozen=True)
class Parts:
    """What one proxy is made of."""

    config: ProxyConfig
    access_log: AccessLog
    pool: UpstreamPool
    resolver: TenantResolver
    router: Router
    #: the tenant label's values, bounded, and those of the model and the three versions
    tenant_labels: BoundedLabels
    value_labels: list[BoundedLabels]
    metrics: ProxyMetrics
    engine: EngineInfo
    sampler: DegeneracySampler
    admission: Admission
    accounting: Accounting
    reconciler: Reconciler
    direct_traffic: DirectTraffic
    #: the fleet's books in Redis (None: this process keeps its own)
    shared: SharedLedger | None
    usage_log: UsageLog | None
    #: the usage log's Redis stream, where configured (then there are no files)
    usage_stream: UsageStream | None
    tracer_provider: TracerProvider | None
    #: a span per metered request (None: tracing off, and not imported)
    tracing: RequestTracing | None


def build(
    config: ProxyConfig, access_log: bool = True, tracer_provider: TracerProvider | None = None
) -> Parts:
    """Assemble a proxy's parts from ``config``; ``access_log``: write one line a request."""
    pool = UpstreamPool(
        config.upstream_url, Timeouts(config.connect_timeout_s, config.read_timeout_s)
    )
    # models and versions come from clients too: bounded, and released when idle, so a
    # flood of junk values holds its slots only until it stops
    v = config.versions
    value_labels = [
        BoundedLabels(config.max_version_labels, allow, config.value_idle_seconds)
        for allow in ([*config.prices], [v.model_version], [v.engine_version], [v.prompt_version])
    ]
    metrics = ProxyMetrics()
    shared: SharedLedger | None = None
    ledger: Ledger = BudgetLedger()
    if config.shared_state is not None:
        from inferwatch.proxy.sharedstate import SharedLedger

        ledger = shared = SharedLedger(config)
    limits = {n: t.rate_limits for n, t in config.tenants.items() if t.rate_limits}
    counter = PromptCounter(load_tokenizer(config.tokenizer) if config.tokenizer else byte_bound)
    engine = EngineInfo(pool)
    sampler = DegeneracySampler(config.quality_sample_rate)
    gate = ConcurrencyGate(
        config.max_concurrency, config.queue_timeout_s, config.max_queue, config.min_class_share
    )
    admission = Admission(
        config,
        counter,
        engine,
        sampler,
        ledger,
        RateLimiter(limits, shared) if limits else None,
        gate,
        metrics,
    )
    usage_log = (
        UsageLog(
            config.usage_log_dir,
            config.usage_log_rotate_bytes,
            config.usage_log_retain_files,
            errors=metrics.usage_log_errors,
        )
        if config.usage_log_dir
        else None
    )
    usage_stream: UsageStream | None = None
    if config.usage_log_stream_maxlen:
        from inferwatch.proxy.usagestream import UsageStream

        assert shared is not None and config.shared_state is not None  # config's rule
        usage_stream = UsageStream(
            shared.client,
            config.shared_state.key_prefix,
            config.usage_log_stream_maxlen,
            shared.call_bound_s,
            errors=metrics.usage_log_errors,
        )
    access = AccessLog(access_log)
    tracing: RequestTracing | None = None
    if tracer_provider is not None:
        from inferwatch.proxy.tracing import RequestTracing

        tracing = RequestTracing(tracer_provider)
    return Parts(
        config=config,
        access_log=access,
        pool=pool,
        resolver=TenantResolver(config),
        router=Router(config.passthrough),
        tenant_labels=BoundedLabels(
            config.max_tenant_labels, [*config.tenants, UNKNOWN], config.tenant_idle_seconds
        ),
        value_labels=value_labels,
        metrics=metrics,
        engine=engine,
        sampler=sampler,
        admission=admission,
        accounting=Accounting(config, metrics, ledger, sampler, access, usage_log or usage_stream),
        reconciler=Reconciler(),
        direct_traffic=DirectTraffic(config.probe_metrics_urls),
        shared=shared,
        usage_log=usage_log,
        usage_stream=usage_stream,
        tracer_provider=tracer_provider,
        tracing=tracing,
    )
