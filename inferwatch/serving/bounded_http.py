"""What a slow or hostile client may hold of a server: every inferwatch server's HTTP limits.

uvicorn bounds an idle keep-alive connection but neither a client that trickles a request's
head (slowloris) nor how many connections are open; past the process' file-descriptor limit,
accept() fails and so does every socket the server opens itself (a sidecar's engine scrape).
:class:`BoundedHttpToolsProtocol` is uvicorn's httptools protocol with three more rules:

- a request's line and headers must be complete within ``header_timeout_s`` and within
  ``max_header_bytes`` (431 past it), or the connection is closed;
- at most ``max_connections`` are open: a connection past the cap closes the one that has
  been idle longest (waiting for a head, or kept alive between requests), so that a flood of
  idle connections never locks out a health check; with none idle, the newcomer gets a 503;
- the default cap is half the soft ``RLIMIT_NOFILE`` (at most ``DEFAULT_MAX_CONNECTIONS``), so
  that the process keeps descriptors for its own sockets and files.

The idle deadline is uvicorn's ``timeout_keep_alive``, set from ``keep_alive_timeout_s``.
"""

from __future__ import annotations

import asyncio
import resource
from dataclasses import dataclass
from typing import Any

from uvicorn.protocols.http.httptools_impl import HttpToolsProtocol

__all__ = [
    "DEFAULT_MAX_CONNECTIONS",
    "BoundedHttpToolsProtocol",
    "ServerLimits",
    "default_max_connections",
]

#: the default connection cap where the descriptor limit allows more
DEFAULT_MAX_CONNECTIONS = 4096
#: the smallest default cap, however low the descriptor limit
MIN_CONNECTIONS = 16


def default_max_connections() -> int:
    """Half the soft descriptor limit, between ``MIN_CONNECTIONS`` and the default cap."""
    soft, _ = resource.getrlimit(resource.RLIMIT_NOFILE)
    if soft == resource.RLIM_INFINITY:
        return DEFAULT_MAX_CONNECTIONS
    return max(MIN_CONNECTIONS, min(DEFAULT_MAX_CONNECTIONS, soft // 2))


@dataclass(frozen=True)
class ServerLimits:
    """A server's deadlines and caps on its clients (``max_connections`` 0: the default)."""

    header_timeout_s: float = 10.0
    keep_alive_timeout_s: float = 5.0
    max_header_bytes: int = 64 << 10
    max_connections: int = 0

    def protocol(self) -> type[BoundedHttpToolsProtocol]:
        """The protocol class uvicorn is given (its ``http`` setting) for these limits."""
        return type(
            "BoundedHttpProtocol",
            (BoundedHttpToolsProtocol,),
            {
                "header_timeout_s": self.header_timeout_s,
                "max_header_bytes": self.max_header_bytes,
                "max_connections": self.max_connections or default_max_connections(),
            },
        )


class BoundedHttpToolsProtocol(HttpToolsProtocol):
    """uvicorn's httptools protocol with a head deadline, a head size cap and a connection cap."""

    header_timeout_s = 10.0
    max_header_bytes = 64 << 10
    max_connections = DEFAULT_MAX_CONNECTIONS

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self._head_timer: asyncio.TimerHandle | None = None
        self._head_bytes = 0
        self._idle_since = 0.0

    def connection_made(self, transport: asyncio.Transport) -> None:  # type: ignore[override]
        super().connection_made(transport)
        self._idle_since = self.loop.time()
        self._arm()
        if len(self.connections) > self.max_connections:
            self._make_room()

    @property
    def idle(self) -> bool:
        """No request running: waiting for a head, or kept alive after a response."""
        return self.cycle is None or self.cycle.response_complete

    def _make_room(self) -> None:
        """Close the connection idle longest, or this one with a 503 when none is idle."""
        others = (
            c
            for c in self.connections
            if c is not self and isinstance(c, BoundedHttpToolsProtocol) and c.idle
        )
        oldest = min(others, key=lambda c: c._idle_since, default=None)
        if oldest is not None:
            oldest._close()
            return
        self._disarm()
        self._reply_and_close(503, b"Service Unavailable", b"too many connections\n")

    def _arm(self) -> None:
        self._disarm()
        self._head_bytes = 0
        self._head_timer = self.loop.call_later(self.header_timeout_s, self._close)

    def _disarm(self) -> None:
        if self._head_timer is not None:
            self._head_timer.cancel()
            self._head_timer = None

    def _close(self) -> None:
        self._disarm()
        self.connections.discard(self)  # counts no more against the cap
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
            self._reply_and_close(
                431, b"Request Header Fields Too Large", b"request head too large\n"
            )
            return False
        return True

    def _reply_and_close(self, status: int, phrase: bytes, body: bytes) -> None:
        self.transport.write(
            b"HTTP/1.1 %d %s\r\ncontent-type: text/plain\r\nconnection: close\r\n"
            b"content-length: %d\r\n\r\n%s" % (status, phrase, len(body), body)
        )
        self._close()

    def on_headers_complete(self) -> None:
        self._disarm()
        if not self.transport.is_closing():  # no request for a head cut off above
            super().on_headers_complete()

    def on_response_complete(self) -> None:
        self._idle_since = self.loop.time()
        super().on_response_complete()

    def connection_lost(self, exc: Exception | None) -> None:
        self._disarm()
        super().connection_lost(exc)
