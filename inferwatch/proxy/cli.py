"""``inferwatch proxy``: run the tenancy proxy in front of one engine."""

from __future__ import annotations

import asyncio
import dataclasses
import gc
import logging
import socket
from collections.abc import Callable

import click

from inferwatch import tracing
from inferwatch.clikit import (
    BadInput,
    FiniteFloat,
    bind,
    config_option,
    listen_option,
    missing_extra,
    parse_listen,
)
from inferwatch.logs import log_event
from inferwatch.proxy.config import HTTP_URL, ConfigError, ProxyConfig, Serving, load

logger = logging.getLogger("inferwatch.proxy")


def _loop_factory() -> Callable[[], asyncio.AbstractEventLoop] | None:
    try:
        import uvloop
    except ImportError:  # not on Windows
        return None
    return uvloop.new_event_loop


@click.command()
@config_option("proxy", "YAML file: tenants, trusted sources, prices, limits.", path_type=str)
@listen_option(Serving.listen, "Clients call this instead of the engine.")
@click.option(
    "--metrics-listen",
    default=Serving.metrics_listen,
    show_envvar=True,
    help="HOST:PORT for the proxy's own /metrics, per-tenant series included. Keep it "
    "pod-internal (the default) so that clients never see other tenants' names, tokens or "
    "cost; the client port serves no tenant data.",
)
@click.option(
    "--drain-grace",
    type=FiniteFloat(min=0),
    default=Serving.drain_grace,
    show_default=True,
    show_envvar=True,
    help="Seconds SIGTERM lets in-flight requests finish (no new connections are accepted); "
    "streams still running then are cut short and charged for what they generated.",
)
@click.option(
    "--upstream",
    default=None,
    show_envvar=True,
    help="Engine base URL (http://host:port); overrides upstream.url in the config.",
)
@click.option(
    "--probe-metrics",
    multiple=True,
    show_envvar=True,
    help="/metrics URL of a probe runner that probes the engine directly (the sidecar with "
    "--probes); its probe tokens count in the reconciliation with the engine. Repeatable; "
    "overrides upstream.probe_metrics in the config.",
)
@click.option(
    "--access-log/--no-access-log",
    default=True,
    show_envvar=True,
    help="Write one structured line per request.",
)
@tracing.options
@tracing.caller_sampling_option
def proxy(
    config_path: str | None,
    listen: str,
    metrics_listen: str,
    drain_grace: float,
    upstream: str | None,
    probe_metrics: tuple[str, ...],
    access_log: bool,
    otlp_endpoint: str,
    otlp_sampling_ratio: float,
    otlp_caller_sampling: tracing.CallerSampling,
) -> None:
    """Meter tokens and cost per tenant in front of an OpenAI-compatible engine."""
    from inferwatch.proxy.app import ProxyApp
    from inferwatch.proxy.assembly import build
    from inferwatch.proxy.serving import serve

    address = parse_listen(listen)
    metrics_address = parse_listen(metrics_listen, "--metrics-listen")
    try:
        config = load(config_path) if config_path else ProxyConfig()
        if upstream:
            config = dataclasses.replace(config, upstream_url=upstream.rstrip("/"))
        if probe_metrics:
            bad = [url for url in probe_metrics if not HTTP_URL.match(url)]
            if bad:
                raise ConfigError(f"--probe-metrics: {bad[0]!r} is not an http(s) URL")
            config = dataclasses.replace(config, probe_metrics_urls=probe_metrics)
        if config.shared_state is not None:
            from inferwatch.proxy import sharedstate

            if not sharedstate.AVAILABLE:
                raise missing_extra("inferwatch proxy with shared_state", "redis")
        trace = tracing.TraceOptions(
            otlp_endpoint, otlp_sampling_ratio, otlp_caller_sampling, shutdown_s=drain_grace
        )  # the spans still batched get the drain's grace, no more
        provider = tracing.provider("inferwatch-proxy", trace)
        app = ProxyApp(build(config, access_log=access_log, tracer_provider=provider))
    except (ConfigError, ValueError) as exc:
        raise BadInput(str(exc)) from None
    client_sock = bind(address)
    metrics_sock = bind(metrics_address, "--metrics-listen")
    _announce(config, config_path, client_sock, metrics_sock, otlp_endpoint)
    gc.freeze()  # start-up objects never need collecting: shorter GC pauses on requests
    with asyncio.Runner(loop_factory=_loop_factory()) as runner:
        runner.run(serve(app, client_sock, metrics_sock, drain_grace))


def _url(sock: socket.socket) -> str:
    host, port = sock.getsockname()[:2]
    return f"http://[{host}]:{port}" if ":" in host else f"http://{host}:{port}"


def _announce(
    config: ProxyConfig,
    config_path: str | None,
    client: socket.socket,
    metrics: socket.socket,
    traces: str,
) -> None:
    """Say where the proxy listens and what it forwards to, and warn when it can only refuse."""
    log_event(
        logger,
        logging.INFO,
        "proxy starting",
        listen=_url(client),
        serves="OpenAI API, /healthz, /readyz",
        metrics_listen=_url(metrics),
        upstream=config.upstream_url,
        tenants=len(config.tenants),
        probe_metrics=" ".join(config.probe_metrics_urls) or "none",
        traces=tracing.traces_url(traces) if traces else "off",
        config=config_path or "none",
    )
    admits_nobody = (
        not config.key_index and not config.trusted_sources and config.unknown_policy == "reject"
    )
    if admits_nobody:
        why = "no --config given" if config_path is None else f"{config_path} names no tenant keys"
        log_event(
            logger,
            logging.WARNING,
            f"{why}: every request will be refused with 401; configure tenants with API keys "
            "(or identity.trusted_sources, or identity.unknown: attribute)",
        )
