"""Latency and SLOs: each latency signal's quantiles and every burn-rate window, and the
clients' latency as the tenancy proxy measures it, with its exemplars (trace ids).

Panels 1-3 and 10-11 are the ones the latency alerts link to (their ``dashboard_url``).
"""

from __future__ import annotations

from inferwatch.dashboards.panels import Board, Ctx, Panel, Q, Scope, above, below, histogram
from inferwatch.mixin import promql, recording
from inferwatch.mixin.objectives import objectives

MEANING = {
    "ttft": ("Time to first token", "prefill: long prompts, a full queue or a cold prefix "
             "cache"),
    "tpot": ("Time per output token", "decode: batch too large, KV-cache pressure or a slow "
             "GPU (clocks, temperature)"),
    "e2e": ("End-to-end request latency", "the sum of both, plus queueing; long outputs "
            "raise it without anything being wrong"),
}  # fmt: skip


def board(ctx: Ctx) -> Board:
    config = ctx.config
    c = config.cluster_label
    return Board(
        "latency", "Inferwatch / Latency and SLOs",
        "TTFT, TPOT and end-to-end latency quantiles per model version against the alert "
        "thresholds, and the SLO burn rates on every window the alerts read.",
    ).row(
        "Latency quantiles",
        *[_quantiles(ctx, pid, signal) for pid, signal in ((1, "ttft"), (2, "tpot"), (3, "e2e"))],
        Panel(4, "Queue time p99", "Time requests waited in the engine before being "
              "scheduled. When it makes up most of TTFT, the replica is saturated rather "
              "than slow.", "s",
              [Q(_quantile(ctx, "engine_request_queue_duration", 0.99), "p99 {{model_version}}")],
              width=12),
        Panel(5, "Inter-token latency p50 / p99", "Time between consecutive output tokens "
              "of a request (what a streaming user feels). Spikes with steady TPOT mean "
              "prefill of new requests interrupts decoding: consider chunked prefill.", "s",
              [Q(_quantile(ctx, "engine_inter_token_latency", q),
                 f"p{q * 100:g} {{{{model_version}}}}") for q in (0.5, 0.99)], width=12),
    ).row(
        "Latency distributions",
        *[histogram(pid, f"{MEANING[signal][0]} distribution",
                    f"Requests per second in each latency bucket, over {ctx.w} (the recording "
                    "the quantiles read). A second band above the usual one is a group of "
                    "requests that got slow (one replica, one prompt shape), which a "
                    "quantile line averages away.",
                    ctx.r(recording.bucket_rate(config, signal)), width=8)
          for pid, signal in ((15, "ttft"), (16, "tpot"), (17, "e2e"))],
    ).row(
        "Requests",
        Panel(6, "Prompt and output length p50 / p99", "Tokens per request in and out. "
              "Longer prompts raise TTFT and longer outputs E2E latency without anything "
              "being wrong: check here before blaming the engine.", "short",
              [Q(_quantile(ctx, key, q), f"{name} p{q * 100:g} {{{{model_version}}}}")
               for key, name in (("engine_request_prompt_tokens", "prompt"),
                                 ("engine_request_generation_tokens", "output"))
               for q in (0.5, 0.99)]),
        Panel(7, "Finished requests by reason", "Requests per second by finish reason: "
              "stop (the model ended), length (hit max_tokens), abort, error. A jump in "
              "length means clients' max_tokens truncate answers.", "reqps",
              [Q(f"sum by ({c}, model_version, reason) "
                 f"({ctx.rate('engine_requests_finished', Scope.ENGINE)})",
                 "{{model_version}} {{reason}}")]),
        Panel(8, "Prefill and decode time per request (mean)", "Mean time each request "
              "spent in prefill and in decode, as the engine measures its phases (vLLM); "
              "for engines without them, mean time to first token less mean queue time "
              "(prefill) and mean end-to-end less mean time to first token (decode). Which "
              "of the two grew tells prompt-side from output-side slowness.", "s",
              [Q(f"{_mean(ctx, 'engine_request_prefill_duration')} or "
                 f"({_mean(ctx, 'engine_time_to_first_token')} - "
                 f"{_mean(ctx, 'engine_request_queue_duration')})", "prefill {{model_version}}"),
               Q(f"{_mean(ctx, 'engine_request_decode_duration')} or "
                 f"({_mean(ctx, 'engine_request_duration')} - "
                 f"{_mean(ctx, 'engine_time_to_first_token')})", "decode {{model_version}}")]),
        Panel(9, "Engine HTTP answers by status", "Requests the engine's HTTP server "
              "answered per second, by status class (vLLM). 4xx are requests the engine "
              "refused (a prompt over the context, max_tokens too large, an unknown model): "
              "no other engine series counts them, and a jump usually means a client or "
              "proxy sends what this deployment cannot serve. 5xx count against the "
              "availability SLO.", "reqps",
              [Q(f"sum by ({c}, model_version, status) "
                 f"({ctx.rate('engine_http_requests', Scope.ENGINE)})",
                 "{{model_version}} {{status}}")]),
        Panel(19, "Prefix-cache hits, local and shared", "Share of the prompt tokens looked "
              "up that were found in the engine's own prefix cache and in a cache shared "
              "across instances (vLLM's KV connector), per model version. Each hit is "
              "prefill not computed: a drop raises time to first token and GPU load; a "
              "shared-cache share near 0 with a connector configured means it is not "
              "reached. No shared line without a connector: vLLM then counts no shared-cache "
              "lookups (0 of 0 is no share).", "percentunit",
              [Q(_hit_share(ctx, "engine_prefix_cache_hit_tokens",
                            "engine_prefix_cache_queried_tokens"), "local {{model_version}}"),
               Q(_hit_share(ctx, "engine_external_prefix_cache_hit_tokens",
                            "engine_external_prefix_cache_queried_tokens"),
                 "shared {{model_version}}")], max=1, width=24),
    ).row(
        "SLO burn rates",
        _burn(ctx, 10, "ttft", "TTFT SLO"),
        _burn(ctx, 11, "availability", "Availability SLO"),
        *[_budget(ctx, pid, slo, name)
          for pid, slo, name in ((12, "ttft", "TTFT"), (13, "availability", "Availability"))],
    ).row(
        "Traces",
        Panel(14, "Client TTFT and request duration p99 (proxy), with traces", "What clients "
              "see, measured by the tenancy proxy (its queue and admission included). The "
              "dots are exemplars: a traced request's latency in its bucket; open one to "
              "follow that request's trace (the proxy traces with --otlp-endpoint; "
              "Prometheus keeps exemplars with --enable-feature=exemplar-storage).", "s",
              [Q(_client_quantile(ctx, key, 0.99), f"{name} p99 {{{{model_version}}}}",
                 exemplar=True)
               for key, name in (("tenancy_time_to_first_token", "TTFT"),
                                 ("tenancy_request_duration", "duration"))],
              width=12),
        histogram(18, "Client TTFT distribution (proxy), with traces", "Requests per second "
                  "in each bucket of the tenancy proxy's time to first token (queue and "
                  "admission included); the dots are exemplars, each a traced request to open.",
                  ctx.rate("tenancy_time_to_first_token", Scope.MODEL_VERSION, suffix="_bucket"),
                  exemplar=True),
    )  # fmt: skip


def _client_quantile(ctx: Ctx, key: str, q: float) -> str:
    """A quantile per model version of one of the proxy's histograms (all tenants)."""
    bucket = ctx.m(key, Scope.MODEL_VERSION, suffix="_bucket")
    return (f"histogram_quantile({q:g}, sum by ({ctx.config.cluster_label}, model, "
            f"model_version, le) (rate({bucket}[$__rate_interval])))")  # fmt: skip


def _quantile(ctx: Ctx, key: str, q: float) -> str:
    """A quantile per model version straight from a histogram no recording rule covers."""
    bucket = ctx.m(key, Scope.ENGINE, suffix="_bucket")
    return (f"histogram_quantile({q:g}, sum by ({ctx.config.cluster_label}, model, "
            f"model_version, le) (rate({bucket}[$__rate_interval])))")  # fmt: skip


def _hit_share(ctx: Ctx, hits: str, queried: str) -> str:
    """Cache hits over lookups per model version, from two token counters."""
    mv = ctx.by("model", "model_version")
    return (f"sum {mv} ({ctx.rate(hits, Scope.ENGINE)}) / "
            f"sum {mv} ({ctx.rate(queried, Scope.ENGINE)})")  # fmt: skip


def _mean(ctx: Ctx, key: str) -> str:
    """Mean observation per model version over the rate window of a histogram."""
    mv = ctx.by("model", "model_version")
    total = ctx.rate(key, Scope.ENGINE, suffix="_sum")
    count = ctx.rate(key, Scope.ENGINE, suffix="_count")
    return f"(sum {mv} ({total}) / sum {mv} ({count}))"


def _quantiles(ctx: Ctx, pid: int, signal: str) -> Panel:
    title, cause = MEANING[signal]
    warning = ctx.config.latency_threshold(signal, "warning")
    critical = ctx.config.latency_threshold(signal, "critical")
    q = ctx.config.latency["quantile"]
    return Panel(
        pid, f"{title} quantiles",
        f"p50/p90/p99 over {ctx.w} per model version. The p{q * 100:g} above {warning:g}s "
        f"warns and above {critical:g}s pages (models with their own thresholds in the alert "
        f"config differ). A rise usually comes from {cause}.", "s",
        [Q(ctx.quantile(signal, quantile), f"p{quantile * 100:g} {{{{model_version}}}}")
         for quantile in ctx.config.quantiles],
        thresholds=above(warning, critical), width=8,
    )  # fmt: skip


def _burn(ctx: Ctx, pid: int, slo: str, title: str) -> Panel:
    config = ctx.config
    allowed = 1 - float(config.slo[slo]["objective"])
    pairs = ", ".join(f"{w.long}/{w.short} x{w.factor:g} ({w.severity})"
                      for w in config.burn_windows)  # fmt: skip
    factors = sorted({w.factor for w in config.burn_windows if w.severity == "critical"})
    warning = factors[0] if len(factors) > 1 else None
    return Panel(
        pid, f"{title} burn rate",
        f"Bad-request ratio / allowed ratio ({allowed:g}) on every window. An alert fires "
        f"when both windows of a pair burn faster than its factor: {pairs}. A short window "
        "far above the long one is a fresh incident; the reverse, one that is ending.",
        "short",
        [Q(f"{ctx.r(recording.slo_error_ratio(config, slo, window))} / {allowed:g}",
           f"{window} {{{{model_version}}}}") for window in config.slo_windows],
        thresholds=above(warning, factors[-1] if factors else None), width=12,
    )  # fmt: skip


def _budget(ctx: Ctx, pid: int, slo: str, name: str) -> Panel:
    """The budget left over the SLO period, one query per objective (the default, each
    model's own, each tenant class's): 1 - the period's mean error ratio / the budget, as
    Sloth reads it (the mean of the shortest window's ratios; the ratio rules record no
    sample while there was no traffic)."""
    config = ctx.config
    period, step = config.slo["period"], config.slo_windows[0]
    promises = objectives(config, slo)
    queries = []
    for o in promises:
        ratio, matchers = o.ratio(config, step)
        legend = "{{model}} {{model_version}}"
        queries.append(
            Q(
                f"1 - avg_over_time({ctx.r(ratio, Scope.MODEL_VERSION, *matchers)}"
                f"[{period}]) / {promql.number(o.budget)}",
                legend if o.tenant_class is None else f"{o.tenant_class} {legend}",
            )
        )
    own = "".join(
        f"; {o.model or o.tenant_class}: {o.objective:g}"
        for o in promises
        if o.model is not None or o.tenant_class is not None
    )
    return Panel(
        pid, f"{name} error budget remaining ({period})",
        f"The share of the SLO period's ({period}) error budget still unspent: 1 - bad ratio "
        f"/ allowed ratio. Under 0 the objective ({config.slo_objective(slo):g}{own}) is "
        "missed for the period.", "percentunit",
        queries, thresholds=below(0), width=12,
    )  # fmt: skip
