"""How the proxy is served: uvicorn settings, bounded request heads, and graceful shutdown.

Both listeners hold clients to the limits every inferwatch server has
(:mod:`inferwatch.serving.bounded_http`), with the head deadline, head size and idle deadline
from the proxy's config (the body has its own deadline in the app). :class:`ProxyServer`
marks the app as draining when shutdown begins, so that the streams still running when the
grace period ends are cut short and charged rather than dropped (uvicorn cancels them then).
"""

from __future__ import annotations

import asyncio
import math
import socket

import uvicorn

from inferwatch.proxy.app import ProxyApp
from inferwatch.serving import uvicorn_server
from inferwatch.serving.bounded_http import ServerLimits


def limits(app: ProxyApp) -> ServerLimits:
    """The client limits of the proxy's listeners, from its config."""
    config = app.config
    return ServerLimits(
        header_timeout_s=config.header_timeout_s,
        keep_alive_timeout_s=config.keep_alive_timeout_s,
        max_header_bytes=config.max_header_bytes,
    )


def uvicorn_config(
    app: ProxyApp, host: str, port: int, drain_grace: float | None = None
) -> uvicorn.Config:
    return uvicorn_server.config(  # no uvicorn access log: the proxy writes its own
        app,
        limits(app),
        host=host,
        port=port,
        loop="auto",  # uvloop when installed
        lifespan="on",
        server_header=False,
        date_header=False,
        timeout_graceful_shutdown=None if drain_grace is None else math.ceil(drain_grace),
    )


def metrics_config(app: ProxyApp, host: str, port: int) -> uvicorn.Config:
    """The metrics listener: tenant series, scraped by Prometheus from inside the pod."""
    return uvicorn_server.config(
        app.metrics_app,
        limits(app),
        host=host,
        port=port,
        loop="auto",
        lifespan="off",
        server_header=False,
        date_header=False,
    )


class ProxyServer(uvicorn.Server):
    """uvicorn's server, telling the app when shutdown (and so the drain) begins."""

    def __init__(self, config: uvicorn.Config, app: ProxyApp) -> None:
        super().__init__(config)
        self.app = app

    async def shutdown(self, sockets: list[socket.socket] | None = None) -> None:
        self.app.draining = True
        await super().shutdown(sockets)


async def serve(
    app: ProxyApp, client: socket.socket, metrics: socket.socket, drain_grace: float
) -> None:
    """Serve clients and metrics on bound sockets until SIGTERM/SIGINT; metrics stop last."""
    metrics_server = uvicorn.Server(metrics_config(app, *metrics.getsockname()[:2]))
    metrics_task = asyncio.ensure_future(metrics_server.serve(sockets=[metrics]))
    while not metrics_server.started:
        if metrics_task.done():
            return metrics_task.result()  # it could not start: its error ends the proxy
        await asyncio.sleep(0.01)
    host, port = client.getsockname()[:2]
    server = ProxyServer(uvicorn_config(app, host, port, drain_grace=drain_grace), app)
    try:
        await server.serve(sockets=[client])
    finally:
        metrics_server.should_exit = True
        await metrics_task
