"""One proxied request: its record (``Exchange``) and the ASGI plumbing every part of the
proxy handles it with (reading the body within its limits, noticing a client that goes away).
"""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable, MutableMapping
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from inferwatch.identity import UNKNOWN as UNKNOWN_VALUE
from inferwatch.proxy.admission import Refusal, Reservation
from inferwatch.proxy.metrics import Identity
from inferwatch.proxy.ratelimit import Taken
from inferwatch.proxy.tenants import UNKNOWN
from inferwatch.proxy.usage import Usage, UsageMeter

if TYPE_CHECKING:
    from opentelemetry.trace import Span

Scope = MutableMapping[str, Any]
Message = MutableMapping[str, Any]
Receive = Callable[[], Awaitable[Message]]
Send = Callable[[Message], Awaitable[None]]


class ClientGone(Exception):
    """The client disconnected before the response was complete."""


@dataclass
class Exchange:
    """Everything known about one request, for metrics and the access log."""

    start: float
    path: str
    tenant: str = UNKNOWN
    via: str = ""
    model: str = ""
    versions: tuple[str, str, str] = ("", "", "")
    identity: Identity = (UNKNOWN, *(UNKNOWN_VALUE,) * 5)
    stream: bool = False
    status: int = 0
    outcome: str = ""
    accounting: str = ""
    meter: UsageMeter | None = None
    usage: Usage | None = None
    cost: float = 0.0
    ttft: float | None = None
    error: str = ""
    watcher: DisconnectWatcher | None = None
    reservation: Reservation | None = None
    #: choices asked for (``n``): the engine processes the prompt once for each
    choices: int = 1
    slot: str = ""  # "gated": holds a concurrency slot; "counted": only counted in flight
    response_started: bool = False
    #: a stream that ended without its [DONE] marker (its text is not screened)
    done_marker_missing: bool = False
    #: the request's span while tracing is on, and its trace id when sampled (the exemplar)
    span: Span | None = None
    trace_id: str = ""
    #: the tenant's x-ratelimit-* headers, added to whatever the response is
    rate_headers: tuple[tuple[bytes, bytes], ...] = ()
    #: what the request took from its tenant's tokens buckets at admission (None: nothing)
    rate_taken: Taken | None = None


async def read_body(receive: Receive, limit: int, timeout_s: float) -> bytes | Refusal:
    """The request body, or the refusal for one over ``limit`` bytes or ``timeout_s`` seconds."""
    chunks: list[bytes] = []
    size = 0
    try:
        async with asyncio.timeout(timeout_s):
            while True:
                message = await receive()
                if message["type"] == "http.disconnect":
                    raise ClientGone
                chunk = message.get("body", b"")
                size += len(chunk)
                if size > limit:
                    return Refusal(
                        413, "rejected_bad_request", f"request body exceeds {limit} bytes"
                    )
                chunks.append(chunk)
                if not message.get("more_body"):
                    return chunks[0] if len(chunks) == 1 else b"".join(chunks)
    except TimeoutError:
        return Refusal(
            408, "rejected_bad_request", f"request body not received within {timeout_s:g}s"
        )


class DisconnectWatcher:
    """Cancels the request handler when the client goes away.

    After the body is read, ASGI's ``receive()`` only returns when the client disconnects (or
    the response is complete, hence ``stop()`` before the last send). A done-callback that
    cancels the handler task costs nothing per streamed chunk, unlike racing every await.
    """

    def __init__(self, receive: Receive) -> None:
        self.gone = False
        self._task = asyncio.current_task()
        self._receive: asyncio.Future[Message] = asyncio.ensure_future(receive())
        self._receive.add_done_callback(self._on_receive)

    def _on_receive(self, future: asyncio.Future[Message]) -> None:
        if future.cancelled() or future.exception() is not None:
            return
        if future.result().get("type") == "http.disconnect" and self._task is not None:
            self.gone = True
            self._task.cancel()

    def claim(self) -> None:
        """Turn the cancellation this watcher caused into ``ClientGone``; re-raise others."""
        if not self.gone:
            raise asyncio.CancelledError
        if self._task is not None:
            self._task.uncancel()
        raise ClientGone

    def stop(self) -> None:
        self._receive.remove_done_callback(self._on_receive)
        self._receive.cancel()
