"""``inferwatch proxy``: run the tenancy proxy in front of one engine."""

from __future__ import annotations

import asyncio
import dataclasses
import gc
import sys
from collections.abc import Callable

import click

from inferwatch.exporters.tenancy.config import ConfigError, ProxyConfig, load


def _host_port(value: str) -> tuple[str, int]:
    host, _, port = value.rpartition(":")
    if not host or not port.isdigit():
        raise click.BadParameter(f"expected HOST:PORT, got {value!r}")
    return host.strip("[]"), int(port)


def _loop_factory() -> Callable[[], asyncio.AbstractEventLoop] | None:
    try:
        import uvloop
    except ImportError:  # not on Windows
        return None
    return uvloop.new_event_loop


@click.command()
@click.option(
    "--config",
    "config_path",
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
    "--metrics-listen",
    default="127.0.0.1:9402",
    show_envvar=True,
    help="HOST:PORT for the proxy's own /metrics, per-tenant series included. Keep it "
    "pod-internal (the default) so that clients never see other tenants' names, tokens or "
    "cost; the client port serves no tenant data.",
)
@click.option(
    "--drain-grace",
    type=click.FloatRange(min=0),
    default=25.0,
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
    "--access-log/--no-access-log",
    default=True,
    show_envvar=True,
    help="Write one structured line per request.",
)
def proxy(
    config_path: str | None,
    listen: str,
    metrics_listen: str,
    drain_grace: float,
    upstream: str | None,
    access_log: bool,
) -> None:
    """Meter tokens and cost per tenant in front of an OpenAI-compatible engine."""
    from inferwatch.exporters.tenancy.app import ProxyApp
    from inferwatch.exporters.tenancy.serving import serve

    address = _host_port(listen)
    metrics_address = _host_port(metrics_listen)
    try:
        config = load(config_path) if config_path else ProxyConfig()
        if upstream:
            config = dataclasses.replace(config, upstream_url=upstream.rstrip("/"))
        app = ProxyApp(config, access_log=access_log)
    except (ConfigError, ValueError) as exc:
        click.echo(f"inferwatch proxy: {exc}", err=True)
        sys.exit(2)
    gc.freeze()  # start-up objects never need collecting: shorter GC pauses on requests
    with asyncio.Runner(loop_factory=_loop_factory()) as runner:
        runner.run(serve(app, address, metrics_address, drain_grace))
