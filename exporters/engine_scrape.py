"""Fetching an engine's /metrics page safely.

Everything that can go wrong with an upstream page ends here as a ``ScrapeFailure`` with a
short ``reason`` (the value of the ``reason`` label on ``inferwatch_engine_scrape_errors_total``)
within the deadline: a refused connection, a hung or trickling server, an error status, an
HTML error page, an empty or oversized body. Concurrent callers share one upstream request, so
two Prometheus replicas scraping the sidecar at once cost the engine one scrape.
"""

from __future__ import annotations

import asyncio
import time
from dataclasses import dataclass

import httpx

# Ask for the classic text format first: every engine serves it, and it is what our parser is
# tuned for. OpenMetrics is accepted too (vLLM's make_asgi_app negotiates it).
ACCEPT = (
    "text/plain;version=0.0.4;q=0.9,text/plain;version=1.0.0;q=0.8,"
    "application/openmetrics-text;version=1.0.0;q=0.5,*/*;q=0.1"
)
_NOT_METRICS_TYPES = ("text/html", "application/json", "application/xml")


class ScrapeFailure(Exception):
    """The engine page could not be fetched; ``reason`` is a short, stable label value."""

    def __init__(self, reason: str, detail: str):
        super().__init__(f"{reason}: {detail}")
        self.reason = reason
        self.detail = detail


@dataclass(frozen=True)
class Page:
    body: bytes
    content_type: str
    fetched_at: float
    duration: float


class EngineScraper:
    """Fetches ``url`` with a deadline, a size cap and one shared in-flight request."""

    def __init__(
        self,
        url: str,
        *,
        timeout: float = 5.0,
        max_bytes: int = 16 * 1024 * 1024,
        client: httpx.AsyncClient | None = None,
    ):
        self.url = url
        self.timeout = timeout
        self.max_bytes = max_bytes
        self.client = client or httpx.AsyncClient(
            headers={"Accept": ACCEPT, "Accept-Encoding": "gzip", "User-Agent": "inferwatch"},
            timeout=httpx.Timeout(timeout),
            follow_redirects=False,
        )
        self._in_flight: asyncio.Task[Page] | None = None

    async def fetch(self, deadline: float | None = None) -> Page:
        """The engine's page; waits at most ``deadline`` seconds (default: the timeout).

        A caller that joins a request already in flight shares its result. When the caller's
        own deadline passes first, the shared request keeps running for the others.
        """
        if self._in_flight is None or self._in_flight.done():
            self._in_flight = asyncio.create_task(self._fetch_once())
            # Every waiter may have given up by the time it ends: mark its outcome as seen.
            self._in_flight.add_done_callback(_consume_outcome)
        wait = self.timeout if deadline is None else min(deadline, self.timeout)
        try:
            return await asyncio.wait_for(asyncio.shield(self._in_flight), wait)
        except TimeoutError:
            raise ScrapeFailure("timeout", f"no complete answer within {wait:.1f}s") from None

    async def _fetch_once(self) -> Page:
        started = time.monotonic()
        try:
            async with asyncio.timeout(self.timeout):
                body, content_type = await self._get()
        except TimeoutError:
            raise ScrapeFailure(
                "timeout", f"no complete answer within {self.timeout:.1f}s"
            ) from None
        except httpx.TimeoutException as exc:
            raise ScrapeFailure("timeout", type(exc).__name__) from None
        except httpx.TransportError as exc:
            raise ScrapeFailure("connect", f"{type(exc).__name__}: {exc}") from None
        if not body.strip():
            raise ScrapeFailure("empty", "the engine answered with an empty body")
        return Page(body, content_type, time.time(), time.monotonic() - started)

    async def _get(self) -> tuple[bytes, str]:
        async with self.client.stream("GET", self.url) as response:
            if response.status_code != 200:
                raise ScrapeFailure("http_status", f"HTTP {response.status_code}")
            content_type = response.headers.get("content-type", "")
            if content_type.startswith(_NOT_METRICS_TYPES):
                raise ScrapeFailure("not_metrics", f"content-type {content_type}")
            declared = int(response.headers.get("content-length") or 0)
            if declared > self.max_bytes and "gzip" not in response.headers.get(
                "content-encoding", ""
            ):
                raise ScrapeFailure("too_large", f"{declared} bytes > cap {self.max_bytes}")
            chunks: list[bytes] = []
            size = 0
            async for chunk in response.aiter_bytes():  # decompressed
                size += len(chunk)
                if size > self.max_bytes:
                    raise ScrapeFailure("too_large", f"over the {self.max_bytes}-byte cap")
                chunks.append(chunk)
            return b"".join(chunks), content_type

    async def aclose(self) -> None:
        if self._in_flight is not None and not self._in_flight.done():
            self._in_flight.cancel()
        await self.client.aclose()


def _consume_outcome(task: asyncio.Task[Page]) -> None:
    if not task.cancelled():
        task.exception()
