"""A small keep-alive HTTP/1.1 client for the one engine behind the proxy.

httpx costs about half a millisecond of CPU per request, more than the whole overhead budget
of the proxy, so requests go out over pooled asyncio connections and responses are parsed by
httptools (the C parser uvicorn uses). Bodies are streamed to the caller as they arrive;
closing a response early closes its connection, which is how an engine such as vLLM learns
that the request was abandoned and stops generating.
"""

from __future__ import annotations

import asyncio
import collections
from collections.abc import AsyncIterator, Iterable
from dataclasses import dataclass
from typing import cast
from urllib.parse import urlsplit

import httptools

# Hop-by-hop headers (RFC 9110 section 7.6.1) and the ones this client sets itself.
_NOT_FORWARDED = frozenset(
    {
        b"connection",
        b"keep-alive",
        b"proxy-authenticate",
        b"proxy-authorization",
        b"te",
        b"trailer",
        b"transfer-encoding",
        b"upgrade",
        b"host",
        b"content-length",
    }
)
_PAUSE_ABOVE_BYTES = 1 << 20


class UpstreamError(Exception):
    """The engine could not be reached or broke the protocol; ``reason`` is a metric label."""

    def __init__(self, reason: str, detail: str) -> None:
        super().__init__(f"{reason}: {detail}")
        self.reason = reason
        self.detail = detail


@dataclass(frozen=True)
class Timeouts:
    connect: float = 5.0
    #: longest wait for the response headers, and then between two body chunks
    read: float = 300.0


class _Connection(asyncio.Protocol):
    """One upstream connection; parser callbacks feed the response currently in flight."""

    def __init__(self) -> None:
        self.transport: asyncio.Transport | None = None
        self.parser = httptools.HttpResponseParser(self)
        self.closed = False
        self.reused = False
        self._headers: list[tuple[bytes, bytes]] = []
        self._head: asyncio.Future[None] | None = None
        self._chunks: collections.deque[bytes] = collections.deque()
        self._buffered = 0
        self._wakeup: asyncio.Future[None] | None = None
        self._complete = False
        self._error: UpstreamError | None = None
        self._paused = False
        self._received_any = False
        self._keep_alive = False
        # one timer per connection, pushed forward by each wait instead of re-armed per wait
        self._timer: asyncio.TimerHandle | None = None
        self._deadline = 0.0
        self._wait_timeout_s = 0.0

    # asyncio.Protocol
    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        self.transport = cast(asyncio.Transport, transport)  # uvloop's is not a subclass

    def data_received(self, data: bytes) -> None:
        self._received_any = True
        try:
            self.parser.feed_data(data)
        except httptools.HttpParserError as exc:
            self._fail(UpstreamError("protocol", f"malformed HTTP response: {exc}"))
            self.close()

    def connection_lost(self, exc: Exception | None) -> None:
        self.closed = True
        if not self._complete:
            self._fail(UpstreamError("reset", "engine closed the connection mid-response"))

    # httptools callbacks
    def on_header(self, name: bytes, value: bytes) -> None:
        self._headers.append((name.lower(), value))

    def on_headers_complete(self) -> None:
        # must be read here: llhttp has reset its flags by the time the message completes
        self._keep_alive = self.parser.should_keep_alive()
        if self._head is not None and not self._head.done():
            self._head.set_result(None)

    def on_body(self, body: bytes) -> None:
        self._chunks.append(body)
        self._buffered += len(body)
        if self._buffered > _PAUSE_ABOVE_BYTES and self.transport and not self._paused:
            self._paused = True
            self.transport.pause_reading()
        self._wake()

    def on_message_complete(self) -> None:
        self._complete = True
        self._wake()

    # used by the pool and the response
    def start(self, request: bytes, timeout_s: float) -> asyncio.Future[None]:
        """Send a request; the future resolves on the response headers, or fails."""
        assert self.transport is not None
        self._headers = []
        self._chunks.clear()
        self._buffered = 0
        self._complete = False
        self._error = None
        self._received_any = False
        self._head = asyncio.get_running_loop().create_future()
        self._start_clock(timeout_s)
        self.transport.write(request)
        return self._head

    def _start_clock(self, timeout_s: float) -> None:
        """The wait that begins now fails with a timeout after ``timeout_s`` seconds."""
        loop = asyncio.get_running_loop()
        self._wait_timeout_s = timeout_s
        self._deadline = loop.time() + timeout_s
        if self._timer is not None and self._timer.when() > self._deadline:
            self._timer.cancel()  # a shorter timeout than the armed one
            self._timer = None
        if self._timer is None:
            self._timer = loop.call_at(self._deadline, self._on_deadline)

    def _on_deadline(self) -> None:
        self._timer = None
        head, wakeup = self._head, self._wakeup
        waiting_for_head = head is not None and not head.done()
        waiter = head if waiting_for_head else wakeup
        if waiter is None or waiter.done():
            return  # nobody waits: the next wait starts the clock again
        loop = asyncio.get_running_loop()
        if loop.time() < self._deadline:
            self._timer = loop.call_at(self._deadline, self._on_deadline)
            return
        if waiting_for_head:
            message = f"no response headers from the engine in {self._wait_timeout_s:g}s"
        else:
            message = f"no data from the engine for {self._wait_timeout_s:g}s"
        waiter.set_exception(UpstreamError("timeout", message))

    def _fail(self, error: UpstreamError) -> None:
        if self._error is None:
            self._error = error
        if self._head is not None and not self._head.done():
            self._head.set_exception(error)
        self._wake()

    def _wake(self) -> None:
        if self._wakeup is not None and not self._wakeup.done():
            self._wakeup.set_result(None)

    async def next_chunk(self, timeout_s: float) -> bytes | None:
        """The body bytes received since the last call, or None at the end of the body."""
        while not self._chunks:
            if self._complete:
                return None
            if self._error is not None:
                raise self._error
            self._wakeup = asyncio.get_running_loop().create_future()
            self._start_clock(timeout_s)
            try:
                await self._wakeup
            finally:
                self._wakeup = None
        # everything that arrived so far goes out as one piece: one write to the client
        chunks = self._chunks
        chunk = chunks.popleft() if len(chunks) == 1 else b"".join(chunks)
        chunks.clear()
        self._buffered = 0
        if self._paused and self._buffered < _PAUSE_ABOVE_BYTES // 2 and self.transport:
            self._paused = False
            self.transport.resume_reading()
        return chunk

    @property
    def keep_alive(self) -> bool:
        return self._complete and not self.closed and self._keep_alive

    def close(self) -> None:
        self.closed = True
        if self._timer is not None:
            self._timer.cancel()
            self._timer = None
        if self.transport is not None:
            self.transport.close()


class UpstreamResponse:
    """Status and headers of an engine response; the body is read with ``chunks()``."""

    def __init__(self, pool: UpstreamPool, conn: _Connection) -> None:
        self._pool = pool
        self._conn = conn
        self._done = False
        self.status: int = conn.parser.get_status_code()
        self.headers: list[tuple[bytes, bytes]] = conn._headers

    def header(self, name: bytes) -> bytes | None:
        for key, value in self.headers:
            if key == name:
                return value
        return None

    async def chunks(self) -> AsyncIterator[bytes]:
        while True:
            chunk = await self._conn.next_chunk(self._pool.timeouts.read)
            if chunk is None:
                self.release()
                return
            yield chunk

    async def read(self, limit: int) -> bytes:
        parts: list[bytes] = []
        size = 0
        async for chunk in self.chunks():
            size += len(chunk)
            if size > limit:
                self.close()
                raise UpstreamError("too_large", f"engine response exceeds {limit} bytes")
            parts.append(chunk)
        return b"".join(parts)

    def release(self) -> None:
        """Return the connection to the pool if the body was read to its end, else close it."""
        if self._done:
            return
        self._done = True
        if self._conn.keep_alive and len(self._pool._idle) < self._pool.max_idle:
            self._pool._idle.append(self._conn)
        else:
            self._conn.close()

    def close(self) -> None:
        """Abandon the response: the engine sees the connection close and aborts the request."""
        if not self._done:
            self._done = True
            self._conn.close()


class UpstreamPool:
    """Keep-alive connections to one engine base URL."""

    def __init__(self, base_url: str, timeouts: Timeouts | None = None, max_idle: int = 256):
        parts = urlsplit(base_url)
        if parts.scheme != "http" or not parts.hostname:
            raise ValueError(f"upstream URL {base_url!r} must be http://host[:port][/prefix]")
        self.host = parts.hostname
        self.port = parts.port or 80
        self.prefix = parts.path.rstrip("/").encode()
        self.host_header = parts.netloc.encode()
        self.timeouts = timeouts or Timeouts()
        self.max_idle = max_idle
        self._idle: collections.deque[_Connection] = collections.deque()

    async def _connect(self) -> _Connection:
        loop = asyncio.get_running_loop()
        try:
            async with asyncio.timeout(self.timeouts.connect):
                _, conn = await loop.create_connection(_Connection, self.host, self.port)
        except TimeoutError:
            raise UpstreamError(
                "timeout", f"connect to {self.host}:{self.port} timed out"
            ) from None
        except OSError as exc:
            raise UpstreamError("connect", f"{self.host}:{self.port}: {exc.strerror}") from None
        return conn

    def _checkout(self) -> _Connection | None:
        while self._idle:
            conn = self._idle.pop()
            if not conn.closed:
                conn.reused = True
                return conn
        return None

    def encode_request(
        self,
        method: str,
        target: bytes,
        headers: Iterable[tuple[bytes, bytes]],
        body: bytes,
    ) -> bytes:
        lines = [method.encode(), b" ", self.prefix, target, b" HTTP/1.1\r\nhost: "]
        lines += [self.host_header, b"\r\n"]
        for name, value in headers:
            if name not in _NOT_FORWARDED:
                lines += [name, b": ", value, b"\r\n"]
        if body or method not in ("GET", "HEAD"):
            lines += [b"content-length: ", str(len(body)).encode(), b"\r\n"]
        lines += [b"\r\n", body]
        return b"".join(lines)

    async def request(
        self,
        method: str,
        target: bytes,
        headers: Iterable[tuple[bytes, bytes]],
        body: bytes = b"",
    ) -> UpstreamResponse:
        """Send a request and wait for the response headers.

        A pooled connection that the engine closed while idle fails before any byte comes
        back; that request is sent once more on a fresh connection.
        """
        payload = self.encode_request(method, target, headers, body)
        conn = self._checkout()
        for attempt in range(2):
            if conn is None:
                conn = await self._connect()
            try:
                await conn.start(payload, self.timeouts.read)
            except UpstreamError as exc:
                stale = exc.reason == "reset" and conn.reused and not conn._received_any
                conn.close()
                if stale and attempt == 0:
                    conn = None
                    continue
                raise
            except BaseException:
                conn.close()
                raise
            return UpstreamResponse(self, conn)
        raise AssertionError("unreachable")

    def close(self) -> None:
        while self._idle:
            self._idle.pop().close()
