"""Fetching a /metrics page someone else serves, safely: engines' and dcgm-exporter's.

Everything that can go wrong with an upstream page ends here as a ``ScrapeFailure`` with a
short ``reason`` (the value of the ``reason`` label on ``inferwatch_engine_scrape_errors_total``
and ``inferwatch_gpu_backend_error_info``) within the deadline: a refused connection, a hung
or trickling server, an error status, an HTML error page, an empty or oversized body, an
encoding we cannot undo.

The size cap holds for the body as inflated, not as sent: httpx and requests would inflate
each network chunk in one call (a few kilobytes of stacked gzip become gigabytes), so the raw
bytes are read and inflated here (``BoundedBody``), layer by layer, in steps of at most
``INFLATE_STEP`` bytes, and the read stops as soon as the cap is passed. Memory then stays
within a small multiple of the cap. The engine is read with httpx on the event loop
(``EngineScraper``, which gives the loop a turn after every step); dcgm-exporter with
``requests`` on the GPU backend's thread (``fetch_with_requests``), under the same rules.
"""

from __future__ import annotations

import asyncio
import errno
import time
import zlib
from collections.abc import Iterator, Mapping
from dataclasses import dataclass
from typing import TYPE_CHECKING

import httpx

from inferwatch.serving.readiness import SourceFailure

__all__ = [
    "ACCEPT",
    "DEFAULT_MAX_BYTES",
    "DEFAULT_TIMEOUT_S",
    "INFLATE_STEP",
    "MAX_ENCODINGS",
    "OWN_FAULT",
    "READ_CHUNK",
    "BoundedBody",
    "EngineScraper",
    "FetchedPage",
    "Inflater",
    "OwnFault",
    "ScrapeFailure",
    "check_headers",
    "fetch_with_requests",
    "own_fault",
    "read_bounded",
]

if TYPE_CHECKING:  # imported when used: only the dcgm backend reads pages with requests
    import requests

# Ask for the classic text format first: every engine serves it, and it is what our parser is
# tuned for. OpenMetrics is accepted too (vLLM's make_asgi_app negotiates it).
ACCEPT = (
    "text/plain;version=0.0.4;q=0.9,text/plain;version=1.0.0;q=0.8,"
    "application/openmetrics-text;version=1.0.0;q=0.5,*/*;q=0.1"
)
_NOT_METRICS_TYPES = ("text/html", "application/json", "application/xml")

#: the most bytes one decompression call may produce
INFLATE_STEP = 64 * 1024
#: Content-Encoding layers undone at most (servers send one; more is a decompression bomb)
MAX_ENCODINGS = 3
#: zlib window bits per encoding: gzip framing, zlib framing (raw deflate is tried after it)
_WBITS = {"gzip": 16 + zlib.MAX_WBITS, "x-gzip": 16 + zlib.MAX_WBITS, "deflate": zlib.MAX_WBITS}


class ScrapeFailure(SourceFailure):
    """The engine page could not be fetched; ``reason`` is a short, stable label value.

    The engine collector records and logs each one before it reaches the sidecar.
    """

    def __init__(self, reason: str, detail: str):
        super().__init__(f"{reason}: {detail}")
        self.reason = reason
        self.detail = detail


#: the ``reason`` of an ``OwnFault``
OWN_FAULT = "out_of_descriptors"
#: errors that say this process (or the host) ran out of descriptors, not that a peer failed
_OWN_ERRNOS = frozenset({errno.EMFILE, errno.ENFILE})


class OwnFault(ScrapeFailure):
    """The fetch failed before it reached the engine: this process could not open a socket
    (out of file descriptors). It says nothing of the engine."""

    def __init__(self, detail: str):
        super().__init__(OWN_FAULT, detail)


def own_fault(exc: BaseException) -> OSError | None:
    """The descriptor exhaustion (EMFILE, ENFILE) behind ``exc``, through its causes."""
    seen: BaseException | None = exc
    for _ in range(16):  # a chain is a few links long; a cycle ends here too
        if seen is None:
            return None
        if isinstance(seen, OSError) and seen.errno in _OWN_ERRNOS:
            return seen
        seen = seen.__cause__ or seen.__context__
    return None


#: Defaults of the engine fetch (also the sidecar's --engine-timeout and --max-page-bytes).
DEFAULT_TIMEOUT_S = 5.0
DEFAULT_MAX_BYTES = 16 * 1024 * 1024
#: Network chunks read at a time.
READ_CHUNK = 64 * 1024


@dataclass(frozen=True)
class FetchedPage:
    """A page as fetched: its bytes (inflated) and when and how fast they came."""

    body: bytes
    content_type: str
    fetched_at: float
    duration: float


def check_headers(status: int, content_type: str) -> None:
    """A response that cannot be a metrics page: an error status or an HTML/JSON error page."""
    if status != 200:
        raise ScrapeFailure("http_status", f"HTTP {status}")
    if content_type.startswith(_NOT_METRICS_TYPES):
        raise ScrapeFailure("not_metrics", f"content-type {content_type}")


class EngineScraper:
    """Fetches ``url`` with a deadline and a size cap on the inflated body."""

    def __init__(
        self,
        url: str,
        *,
        timeout_s: float = DEFAULT_TIMEOUT_S,
        max_bytes: int = DEFAULT_MAX_BYTES,
        client: httpx.AsyncClient | None = None,
    ):
        self.url = url
        self.timeout_s = timeout_s
        self.max_bytes = max_bytes
        self.client = client or httpx.AsyncClient(
            headers={"Accept": ACCEPT, "Accept-Encoding": "gzip", "User-Agent": "inferwatch"},
            timeout=httpx.Timeout(timeout_s),
            follow_redirects=False,
        )

    async def fetch(self) -> FetchedPage:
        """The engine's page, within the timeout; raises ``ScrapeFailure``."""
        started = time.monotonic()
        try:
            async with asyncio.timeout(self.timeout_s):
                body, content_type = await self._get()
        except TimeoutError:
            raise ScrapeFailure(
                "timeout", f"no complete answer within {self.timeout_s:.1f}s"
            ) from None
        except httpx.TimeoutException as exc:
            raise ScrapeFailure("timeout", type(exc).__name__) from None
        except (httpx.TransportError, OSError) as exc:
            if (cause := own_fault(exc)) is not None:
                raise OwnFault(f"cannot open a socket: {cause.strerror}") from None
            raise ScrapeFailure("connect", f"{type(exc).__name__}: {exc}") from None
        if not body.strip():
            raise ScrapeFailure("empty", "the engine answered with an empty body")
        return FetchedPage(body, content_type, time.time(), time.monotonic() - started)

    async def _get(self) -> tuple[bytes, str]:
        """One GET, sent again once on a fresh connection when the engine dropped the one
        it went out on: a kept-alive connection the engine closed as it was reused (vLLM's
        uvicorn closes idle ones after 5 s) says nothing of the engine, and GET is idempotent.
        The pool discards the dropped connection, so the second try opens a new one."""
        try:
            return await self._get_once()
        except (httpx.RemoteProtocolError, httpx.ReadError, httpx.WriteError):
            return await self._get_once()

    async def _get_once(self) -> tuple[bytes, str]:
        async with self.client.stream("GET", self.url) as response:
            content_type = response.headers.get("content-type", "")
            check_headers(response.status_code, content_type)
            return await read_bounded(response, self.max_bytes), content_type

    async def aclose(self) -> None:
        await self.client.aclose()


async def read_bounded(response: httpx.Response, max_bytes: int) -> bytes:
    """The body of a streamed response, inflated; ``ScrapeFailure("too_large")`` as soon as
    more than ``max_bytes`` were sent or inflated. A response already read into memory (one a
    mocked transport built) is taken as it is, within the cap."""
    if response.is_stream_consumed:
        if len(response.content) > max_bytes:
            raise ScrapeFailure("too_large", f"over the {max_bytes}-byte cap")
        return response.content
    body = BoundedBody(max_bytes, response.headers)
    async for raw in response.aiter_raw():
        for _ in body.feed(raw):
            await asyncio.sleep(0)  # one step at a time: /healthz keeps answering
    return body.read()


def fetch_with_requests(
    session: requests.Session, url: str, *, accept: str, timeout_s: float, max_bytes: int
) -> bytes:
    """GET ``url`` with ``requests`` under the rules above: status and content type checked,
    the body capped as sent and as inflated, and the whole answer within ``timeout_s`` (a
    server trickling bytes under requests' per-read timeout is cut off too)."""
    import requests
    import urllib3

    deadline = time.monotonic() + timeout_s
    headers = {"Accept": accept, "Accept-Encoding": "gzip", "User-Agent": "inferwatch"}
    try:
        with session.get(url, timeout=timeout_s, headers=headers, stream=True) as response:
            check_headers(response.status_code, response.headers.get("content-type", ""))
            body = BoundedBody(max_bytes, response.headers)
            for raw in response.raw.stream(READ_CHUNK, decode_content=False):
                for _ in body.feed(raw):
                    pass
                if time.monotonic() > deadline:
                    raise ScrapeFailure("timeout", f"no complete answer within {timeout_s:.1f}s")
            return body.read()
    except (requests.Timeout, urllib3.exceptions.TimeoutError) as error:
        raise ScrapeFailure("timeout", str(error)) from None
    except (requests.ConnectionError, urllib3.exceptions.ProtocolError) as error:
        raise ScrapeFailure("connect", str(error)) from None
    except (requests.RequestException, urllib3.exceptions.HTTPError) as error:
        raise ScrapeFailure("http_error", str(error)) from None


class BoundedBody:
    """A response body as it arrives, inflated in bounded steps: ``ScrapeFailure("too_large")``
    as soon as more than ``max_bytes`` are declared, sent or inflated."""

    def __init__(self, max_bytes: int, headers: Mapping[str, str]):
        declared = int(headers.get("content-length") or 0)
        if declared > max_bytes:  # what is sent is never smaller once inflated
            raise ScrapeFailure("too_large", f"{declared} bytes > cap {max_bytes}")
        self.max_bytes = max_bytes
        self._inflater = Inflater(headers.get("content-encoding", ""))
        # One growing buffer rather than a list of pieces: a refused page is one allocation
        # that goes back to the system at once, not hundreds of pieces that fragment the heap.
        self._body = bytearray()
        self._sent = 0

    def feed(self, raw: bytes) -> Iterator[None]:
        """Take one network chunk; yields after each inflated step."""
        self._sent += len(raw)
        if self._sent > self.max_bytes:
            raise ScrapeFailure("too_large", f"over the {self.max_bytes}-byte cap")
        for chunk in self._inflater.feed(raw):
            self._body += chunk
            if len(self._body) > self.max_bytes:
                del self._body[:]  # the failure's traceback keeps this frame, not the page
                raise ScrapeFailure(
                    "too_large", f"over the {self.max_bytes}-byte cap once inflated"
                )
            yield

    def read(self) -> bytes:
        return bytes(self._body)


class Inflater:
    """Undoes a ``Content-Encoding`` chain (gzip, deflate, stacked) in bounded steps.

    ``feed`` yields the inflated bytes of each network chunk in pieces of at most
    ``INFLATE_STEP`` bytes; each layer hands the next one at most that much at a time, so no
    call ever holds more than a few steps of output, however small the input that expands.
    """

    def __init__(self, content_encoding: str):
        names = [name.strip().lower() for name in content_encoding.split(",")]
        names = [name for name in names if name not in ("", "identity")]
        if len(names) > MAX_ENCODINGS:
            raise ScrapeFailure("encoding", f"{len(names)} stacked content encodings")
        unknown = [name for name in names if name not in _WBITS]
        if unknown:
            raise ScrapeFailure("encoding", f"unsupported Content-Encoding {unknown[0]!r}")
        # The last encoding applied is the first to undo.
        self.layers = [_ZlibLayer(name) for name in reversed(names)]

    def feed(self, data: bytes) -> Iterator[bytes]:
        return self._through(0, data)

    def _through(self, index: int, data: bytes) -> Iterator[bytes]:
        if index == len(self.layers):
            if data:
                yield data
            return
        layer = self.layers[index]
        while True:
            piece = layer.inflate(data, INFLATE_STEP)
            data = b""
            if not piece and not layer.pending:
                return
            yield from self._through(index + 1, piece)


class _ZlibLayer:
    """One gzip or deflate layer; concatenated gzip members are read one after another and
    anything else after the end of the stream is ignored (as zlib and httpx do)."""

    def __init__(self, encoding: str):
        self.encoding = encoding
        self.wbits = _WBITS[encoding]
        #: input of a "deflate" layer until its zlib header is known good (two bytes)
        self.unconfirmed: bytes | None = b"" if encoding == "deflate" else None
        self.decompressor = zlib.decompressobj(self.wbits)
        self.full = False  # the last call stopped at the step limit: more may be pending
        self.done = False  # past the end of the stream

    @property
    def pending(self) -> bool:
        d = self.decompressor
        if self.done:
            return False
        return self.full or bool(d.unconsumed_tail) or (d.eof and bool(d.unused_data))

    def inflate(self, data: bytes, limit: int) -> bytes:
        d = self.decompressor
        if self.done:
            return b""
        if d.eof:
            data = d.unused_data + data
            if self.wbits != _WBITS["gzip"] or not data.startswith(b"\x1f\x8b"):
                self.done, self.full = True, False
                return b""
            d = self.decompressor = zlib.decompressobj(self.wbits)
        if self.unconfirmed is not None:
            self.unconfirmed += data
        try:
            piece = d.decompress(d.unconsumed_tail + data, limit)
        except zlib.error as exc:
            if self.unconfirmed is not None:
                # "deflate" is zlib-framed by the RFC, but some servers send raw deflate
                data, self.unconfirmed = self.unconfirmed, None
                self.wbits = -zlib.MAX_WBITS
                self.decompressor = zlib.decompressobj(self.wbits)
                return self.inflate(data, limit)
            raise ScrapeFailure("encoding", f"bad {self.encoding} data: {exc}") from None
        if self.unconfirmed is not None and len(self.unconfirmed) >= 2:
            self.unconfirmed = None
        self.full = len(piece) == limit
        return piece
