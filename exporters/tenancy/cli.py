"""``inferwatch proxy``: run the tenancy proxy in front of one engine."""

from __future__ import annotations

import dataclasses
import gc
import sys

import click

from inferwatch.exporters.tenancy.config import ConfigError, ProxyConfig, load


def _host_port(value: str) -> tuple[str, int]:
    host, _, port = value.rpartition(":")
    if not host or not port.isdigit():
        raise click.BadParameter(f"expected HOST:PORT, got {value!r}")
    return host.strip("[]"), int(port)


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
def proxy(config_path: str | None, listen: str, upstream: str | None, access_log: bool) -> None:
    """Meter tokens and cost per tenant in front of an OpenAI-compatible engine."""
    import uvicorn

    from inferwatch.exporters.tenancy.app import ProxyApp
    from inferwatch.exporters.tenancy.serving import uvicorn_config

    host, port = _host_port(listen)
    try:
        config = load(config_path) if config_path else ProxyConfig()
        if upstream:
            config = dataclasses.replace(config, upstream_url=upstream.rstrip("/"))
        app = ProxyApp(config, access_log=access_log)
    except (ConfigError, ValueError) as exc:
        click.echo(f"inferwatch proxy: {exc}", err=True)
        sys.exit(2)
    gc.freeze()  # start-up objects never need collecting: shorter GC pauses on requests
    uvicorn.Server(uvicorn_config(app, host, port)).run()
