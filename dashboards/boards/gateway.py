"""Gateway: what the router in front of the replicas does, from HAProxy's built-in Prometheus
exporter (the generated haproxy.cfg serves it on its ``metrics`` address): requests, errors,
retries, redispatches and queues per backend and per server, and the requests that went to a
fallback model's replicas or failed open.

HAProxy's series are not in the metric catalogue (HAProxy names them, not inferwatch), so the
ones this board reads are listed in ``HAPROXY``; every one of them is exported from HAProxy's
start, at 0 until it grows. ``proxy`` is the backend (``m_<model>``, ``m_<model>_open`` for
the fail-open one), ``server`` is ``<version>:<replica>`` or ``fallback:<replica>``.
"""

from __future__ import annotations

from inferwatch import wire
from inferwatch.dashboards.panels import Board, Ctx, Panel, Q, Scope, above

#: the HAProxy exporter series this board reads (HAProxy 2.6's names, addons/promex)
HAPROXY = frozenset({
    "haproxy_backend_http_requests_total", "haproxy_backend_http_responses_total",
    "haproxy_backend_connection_errors_total", "haproxy_backend_response_errors_total",
    "haproxy_backend_retry_warnings_total", "haproxy_backend_redispatch_warnings_total",
    "haproxy_backend_current_queue", "haproxy_backend_queue_time_average_seconds",
    "haproxy_server_status", "haproxy_server_http_responses_total",
    "haproxy_server_current_queue", "haproxy_server_retry_warnings_total",
    "haproxy_server_redispatch_warnings_total",
})  # fmt: skip


def board(ctx: Ctx) -> Board:
    config = ctx.config
    c = config.cluster_label
    errors = config.alert("InferwatchErrorRatioHigh")

    def series(name: str, *matchers: str) -> str:
        if name not in HAPROXY:
            raise ValueError(f"{name} is not one of the HAProxy series this board reads")
        return f"{name}{{{','.join((*ctx.matchers(Scope.CLUSTER), *matchers))}}}"

    def rate(name: str, *matchers: str) -> str:
        return f"rate({series(name, *matchers)}[$__rate_interval])"

    def mean(key: str, scope: Scope) -> str:
        """Mean observation per model of a catalogue histogram, over the rate interval."""
        by = ctx.by("model")
        total = ctx.rate(key, scope, suffix="_sum")
        return f"(sum {by} ({total}) / sum {by} ({ctx.rate(key, scope, suffix='_count')}))"

    backend, server = f"{c}, proxy", f"{c}, proxy, server"
    # the fail-open backends: every model's backend name with the fail-open suffix
    suffix = wire.open_backend_name("m").removeprefix(wire.backend_name("m"))
    open_backends = f'proxy=~".+{suffix}"'
    five_xx, up = 'code="5xx"', 'state="UP"'
    fallback_servers = f'server=~"{wire.FALLBACK}:.*"'
    fail_open = ctx.rate("tenancy_requests", Scope.CLUSTER, 'split="fail_open"')
    return Board(
        "gateway", "Inferwatch / Gateway",
        "What HAProxy in front of the replicas does: requests, errors, retries, redispatches "
        "and queues per backend and server, and the requests sent to a fallback model or "
        "failed open.",
        variables=("cluster",),
    ).row(
        "Backends (one per model)",
        Panel(1, "Requests per second by backend", "HTTP requests HAProxy sent to each "
              "backend (m_<model>; m_<model>_open is the fail-open one). A model's traffic "
              "moving to another backend is a fallback.", "reqps",
              [Q(f"sum by ({backend}) ({rate('haproxy_backend_http_requests_total')})",
                 "{{proxy}}")], stack=True),
        Panel(2, "5xx share by backend", "Share of each backend's answers that are 5xx, "
              "HAProxy's own included (no server usable, a timeout). Above "
              f"{errors.number('warning'):g} warns and {errors.number('critical'):g} pages on "
              "the engines' side (InferwatchErrorRatioHigh); errors here and not there are "
              "the gateway's.", "percentunit",
              [Q(f"sum by ({backend}) ({rate('haproxy_backend_http_responses_total', five_xx)}) "
                 f"/ sum by ({backend}) ({rate('haproxy_backend_http_responses_total')})",
                 "{{proxy}}")],
              thresholds=above(errors.number("warning"), errors.number("critical")), max=1),
        Panel(3, "Connection and response errors by backend", "Connections to a replica "
              "that failed, and answers that broke off, per second. Rising with no 5xx from "
              "the engines: the replica's network, or its proxy restarting.", "reqps",
              [Q(f"sum by ({backend}) ({rate('haproxy_backend_connection_errors_total')})",
                 "connect {{proxy}}"),
               Q(f"sum by ({backend}) ({rate('haproxy_backend_response_errors_total')})",
                 "response {{proxy}}")]),
        Panel(4, "Retries and redispatches by backend", "Requests HAProxy retried on the "
              "same server, and sent to another server after a failed connection, per "
              "second. Steady redispatches mean a server that accepts no connections is "
              "still in rotation: check its readiness.", "reqps",
              [Q(f"sum by ({backend}) ({rate('haproxy_backend_retry_warnings_total')})",
                 "retries {{proxy}}"),
               Q(f"sum by ({backend}) ({rate('haproxy_backend_redispatch_warnings_total')})",
                 "redispatches {{proxy}}")]),
        Panel(5, "Queue by backend", "Requests waiting in HAProxy for a server slot. A queue "
              "here means every server of the model is at its connection limit: the model "
              "needs replicas.", "short",
              [Q(f"sum by ({backend}) ({series('haproxy_backend_current_queue')})",
                 "{{proxy}}")]),
        Panel(6, "Time queued in HAProxy (average)", "Average time the last requests of "
              "each backend waited in HAProxy's queue: the router's share of the clients' "
              "time to first token.", "s",
              [Q(f"max by ({backend}) ({series('haproxy_backend_queue_time_average_seconds')})",
                 "{{proxy}}")]),
    ).row(
        "Servers (one per replica)",
        Panel(7, "Server state", "Each server HAProxy routes to: up while its sidecar's "
              "/readyz answers 200 (fallback:<replica> servers track the fallback model's own "
              "check). A server down here is out of rotation for that model.",
              "bool_yes_no",
              [Q(f"max by ({server}) ({series('haproxy_server_status', up)})",
                 "{{proxy}} {{server}}")],
              kind="state", states=("not up", "up"), width=12),
        Panel(8, "Requests per second by server", "Answers per second from each server "
              "(per-replica QPS). An uneven split under one backend is the session hash "
              "(X-Session-Id) or the weights a canary or a runbook action set.", "reqps",
              [Q(f"sum by ({server}) ({rate('haproxy_server_http_responses_total')})",
                 "{{proxy}} {{server}}")], width=12),
        Panel(9, "Queue by server", "Requests waiting for one server. One server queueing "
              "while the others do not: sessions hashed onto it, or it is slow.", "short",
              [Q(f"sum by ({server}) ({series('haproxy_server_current_queue')})",
                 "{{proxy}} {{server}}")], width=12),
        Panel(10, "Retries and redispatches by server", "Per server: which replica makes "
              "HAProxy retry or move requests away.", "reqps",
              [Q(f"sum by ({server}) ({rate('haproxy_server_retry_warnings_total')})",
                 "retries {{proxy}} {{server}}"),
               Q(f"sum by ({server}) ({rate('haproxy_server_redispatch_warnings_total')})",
                 "redispatches {{proxy}} {{server}}")], width=12),
    ).row(
        "Where the time to first token goes",
        Panel(13, "Time to first token by stage (mean)", "The clients' mean time to first "
              "token per model, split: the tenancy proxy's own share (its concurrency queue "
              "and admission: client TTFT as the proxy measures it less the engine's), the "
              "engine's queue, and the engine's prefill (its TTFT less its queue). Stacked, "
              "they add up to what the proxy's clients wait after HAProxy (whose queue is "
              "panel 6). The stage that grew is the one to work on.", "s",
              [Q(f"{mean('tenancy_time_to_first_token', Scope.CLUSTER)} - "
                 f"{mean('engine_time_to_first_token', Scope.CLUSTER)}",
                 "proxy queue and admission {{model}}"),
               Q(mean("engine_request_queue_duration", Scope.CLUSTER), "engine queue {{model}}"),
               Q(f"{mean('engine_time_to_first_token', Scope.CLUSTER)} - "
                 f"{mean('engine_request_queue_duration', Scope.CLUSTER)}",
                 "engine prefill {{model}}")],
              stack=True, width=24),
    ).row(
        "Fallback and fail-open",
        Panel(11, "Requests served by a fallback model", "Answers per second from the "
              "fallback model's replicas inside another model's backend (servers "
              "fallback:<replica>, weight 0 until a runbook action shifts traffic to them). "
              "Non-zero means a model's own replicas were taken out and its users get the "
              "fallback model.", "reqps",
              [Q(f"sum by ({backend}) "
                 f"({rate('haproxy_server_http_responses_total', fallback_servers)})",
                 "{{proxy}}")], width=12),
        Panel(12, "Requests failing open", "Requests sent to a model's replicas regardless "
              "of readiness because neither it nor its fallback had a ready replica: by "
              "HAProxy (the m_<model>_open backend) and as the tenancy proxies counted them "
              "(split fail_open). Non-zero is InferwatchFailingOpen: users are served by "
              "replicas that said they are not fit to serve.", "reqps",
              [Q(f"sum by ({backend}) "
                 f"({rate('haproxy_backend_http_requests_total', open_backends)})",
                 "HAProxy {{proxy}}"),
               Q(ctx.or_zero(f"sum by ({c}, model) ({fail_open})", "model", scope=Scope.CLUSTER),
                 "proxies {{model}}")], width=12),
    )  # fmt: skip
