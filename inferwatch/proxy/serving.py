"""How the proxy is served: uvicorn settings, bounded request heads, and graceful shutdown.

uvicorn bounds idle keep-alive connections but not a client that trickles a request's head:
:class:`BoundedHttpToolsProtocol` closes a connection whose request line and headers are not
complete within ``header_timeout_s`` seconds or exceed ``max_header_bytes`` (the body has its
own deadline in the app). :class:`ProxyServer` marks the app as draining when shutdown
begins, so that the streams still running when the grace period ends are cut short and
charged rather than dropped (uvicorn cancels them then).
"""

from __future__ import annotations

import asyncio
import math
import socket
from typing import Any

import uvicorn
from uvicorn.protocols.http.httptools_impl import HttpToolsProtocol

from inferwatch.proxy.app import ProxyApp
from inferwatch.serving import uvicorn_server


class BoundedHttpToolsProtocol(HttpToolsProtocol):
    """uvicorn's httptools protocol with a deadline and a size cap on each request head."""

    header_timeout_s = 10.0
    max_header_bytes = 64 << 10

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self._head_timer: asyncio.TimerHandle | None = None
        self._head_bytes = 0

    def connection_made(self, transport: asyncio.Transport) -> None:  # type: ignore[override]
        super().connection_made(transport)
        self._arm()

    def _arm(self) -> None:
        self._disarm()
        self._head_bytes = 0
        self._head_timer = self.loop.call_later(self.header_timeout_s, self._head_overdue)

    def _disarm(self) -> None:
        if self._head_timer is not None:
            self._head_timer.cancel()
            self._head_timer = None

    def _head_overdue(self) -> None:
        self._head_timer = None
        if not self.transport.is_closing():
            self.transport.close()

    def on_message_begin(self) -> None:
        if self._head_timer is None:
            self._arm()  # a later request on a kept-alive connection
        super().on_message_begin()

    def on_url(self, url: bytes) -> None:
        if self._grow(len(url)):
            super().on_url(url)

    def on_header(self, name: bytes, value: bytes) -> None:
        if self._grow(len(name) + len(value)):
            super().on_header(name, value)

    def _grow(self, size: int) -> bool:
        """Count head bytes; False once the connection is being closed."""
        if self.transport.is_closing():
            return False
        self._head_bytes += size
        if self._head_bytes > self.max_header_bytes:
            self._disarm()
            self.send_431()
            return False
        return True

    def send_431(self) -> None:
        body = b"request head too large\n"
        self.transport.write(
            b"HTTP/1.1 431 Request Header Fields Too Large\r\ncontent-type: text/plain\r\n"
            b"connection: close\r\ncontent-length: %d\r\n\r\n%s" % (len(body), body)
        )
        self.transport.close()

    def on_headers_complete(self) -> None:
        self._disarm()
        if not self.transport.is_closing():  # no request for a head cut off above
            super().on_headers_complete()

    def connection_lost(self, exc: Exception | None) -> None:
        self._disarm()
        super().connection_lost(exc)


def _protocol(app: ProxyApp) -> type[BoundedHttpToolsProtocol]:
    config = app.config
    return type(
        "ProxyHttpProtocol",
        (BoundedHttpToolsProtocol,),
        {"header_timeout_s": config.header_timeout_s, "max_header_bytes": config.max_header_bytes},
    )


def uvicorn_config(
    app: ProxyApp, host: str, port: int, drain_grace: float | None = None
) -> uvicorn.Config:
    return uvicorn_server.config(  # no uvicorn access log: the proxy writes its own
        app,
        host=host,
        port=port,
        loop="auto",  # uvloop when installed
        http=_protocol(app),
        lifespan="on",
        server_header=False,
        date_header=False,
        timeout_keep_alive=max(1, round(app.config.keep_alive_timeout_s)),
        # whole seconds, rounded up (uvicorn's setting is an int)
        timeout_graceful_shutdown=None if drain_grace is None else math.ceil(drain_grace),
        # The tenant header is trusted by the address of the TCP peer. uvicorn would otherwise
        # replace that address with one from X-Forwarded-For when the peer is local, and any
        # process in the pod could then pass as a trusted gateway and bill another tenant.
        proxy_headers=False,
    )


def metrics_config(app: ProxyApp, host: str, port: int) -> uvicorn.Config:
    """The metrics listener: tenant series, scraped by Prometheus from inside the pod."""
    return uvicorn_server.config(
        app.metrics_app,
        host=host,
        port=port,
        loop="auto",
        http=_protocol(app),
        lifespan="off",
        server_header=False,
        date_header=False,
        proxy_headers=False,
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
