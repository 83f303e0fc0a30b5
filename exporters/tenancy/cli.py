"""``inferwatch proxy``: run the tenancy proxy in front of one engine."""

from __future__ import annotations

import dataclasses
import gc
import logging
import os
import socket
import sys

import click

from inferwatch.exporters.tenancy.config import HTTP_URL, ConfigError, ProxyConfig, load
from inferwatch.logs import log_event

logger = logging.getLogger("inferwatch.proxy")


def _host_port(value: str) -> tuple[str, int]:
    host, _, port = value.rpartition(":")
    if not host or not port.isdigit():
        raise click.BadParameter(f"expected HOST:PORT, got {value!r}")
    return host.strip("[]"), int(port)


@click.command()
@click.option(
    "--config",
    "config_path",
    envvar="INFERWATCH_PROXY_CONFIG",
    type=click.Path(dir_okay=False),
    default=None,
    show_envvar=True,
    help="YAML file: tenants, trusted sources, prices, limits.",
)
@click.option(
    "--listen",
    default="0.0.0.0:8080",
    show_envvar=True,
    help="HOST:PORT to serve on (clients call this instead of the engine).",
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
def proxy(
    config_path: str | None,
    listen: str,
    upstream: str | None,
    probe_metrics: tuple[str, ...],
    access_log: bool,
) -> None:
    """Meter tokens and cost per tenant in front of an OpenAI-compatible engine."""
    import uvicorn

    from inferwatch.exporters.tenancy.app import ProxyApp
    from inferwatch.exporters.tenancy.serving import uvicorn_config

    host, port = _host_port(listen)
    try:
        config = load(config_path) if config_path else ProxyConfig()
        if upstream:
            config = dataclasses.replace(config, upstream_url=upstream.rstrip("/"))
        if probe_metrics:
            bad = [url for url in probe_metrics if not HTTP_URL.match(url)]
            if bad:
                raise ConfigError(f"--probe-metrics: {bad[0]!r} is not an http(s) URL")
            config = dataclasses.replace(config, probe_metrics_urls=probe_metrics)
        app = ProxyApp(config, access_log=access_log)
    except (ConfigError, ValueError) as exc:
        click.echo(f"inferwatch proxy: {exc}", err=True)
        sys.exit(2)
    try:  # bound here so that the log line names the real port (--listen HOST:0 picks one)
        family = socket.AF_INET6 if ":" in host else socket.AF_INET
        sock = socket.create_server((host, port), family=family)
    except OSError as exc:
        reason = os.strerror(exc.errno) if exc.errno else str(exc)
        click.echo(f"inferwatch proxy: cannot listen on {listen}: {reason}", err=True)
        sys.exit(2)
    _announce(config, config_path, host, sock.getsockname()[1])
    gc.freeze()  # start-up objects never need collecting: shorter GC pauses on requests
    uvicorn.Server(uvicorn_config(app, host, port)).run(sockets=[sock])


def _announce(config: ProxyConfig, config_path: str | None, host: str, port: int) -> None:
    """Say where the proxy listens and what it forwards to, and warn when it can only refuse."""
    log_event(
        logger,
        logging.INFO,
        "proxy starting",
        listen=f"http://[{host}]:{port}" if ":" in host else f"http://{host}:{port}",
        serves="OpenAI API, /metrics, /healthz, /readyz",
        upstream=config.upstream_url,
        tenants=len(config.tenants),
        probe_metrics=" ".join(config.probe_metrics_urls) or "none",
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
