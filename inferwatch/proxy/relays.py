"""Forwarding a request to the engine and relaying its reply to the client.

A metered request goes upstream with usage forced on and its reply is relayed while it is
metered (a JSON body whole, a stream event by event); an allow-listed route is relayed as
is. Every way a relay can end is recorded on the exchange (outcome, accounting, error): the
engine failing before or after it took the prompt, the client leaving, a shutdown's grace
period running out. Also here: the proxy's own replies (refusals, errors) in the OpenAI
error shape.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from inferwatch.proxy import jsoncodec, tracecontext
from inferwatch.proxy.admission import Refusal
from inferwatch.proxy.config import ProxyConfig
from inferwatch.proxy.exchange import (
    ClientGone,
    DisconnectWatcher,
    Exchange,
    Receive,
    Scope,
    Send,
)
from inferwatch.proxy.metrics import ProxyMetrics
from inferwatch.proxy.routes import STREAMABLE, Route
from inferwatch.proxy.upstream import UpstreamError, UpstreamPool
from inferwatch.proxy.usage import EventStream, MalformedEvent

DROPPED_RESPONSE_HEADERS = frozenset(
    {b"connection", b"keep-alive", b"transfer-encoding", b"content-length", b"date", b"server"}
)
SSE_HEADERS = [(b"content-type", b"text/event-stream"), (b"cache-control", b"no-cache")]
JSON = [(b"content-type", b"application/json")]
PLAIN = [(b"content-type", b"text/plain")]


def error_body(message: str, kind: str, code: str) -> bytes:
    return json.dumps({"error": {"message": message, "type": kind, "code": code}}).encode()


async def respond(send: Send, status: int, body: bytes, headers: list[tuple[bytes, bytes]]) -> None:
    await send({"type": "http.response.start", "status": status, "headers": headers})
    await send({"type": "http.response.body", "body": body})


@dataclass(frozen=True, slots=True)
class Forward:
    """One request as a relay forwards it: what is known of it (the exchange), where it goes
    (the route) and the ASGI connection it came on; the metered and the allow-listed relay
    both need all five."""

    exchange: Exchange
    route: Route
    scope: Scope
    receive: Receive
    send: Send


class Relays:
    def __init__(
        self,
        config: ProxyConfig,
        pool: UpstreamPool,
        metrics: ProxyMetrics,
        stripped_request_headers: frozenset[bytes],
        draining: Callable[[], bool],
    ) -> None:
        """``stripped_request_headers`` never reach the engine (credentials, the proxy's
        own labelling headers); ``draining`` says whether a shutdown has begun."""
        self.config = config
        self.pool = pool
        self.metrics = metrics
        self._stripped = stripped_request_headers
        self.draining = draining

    def forward_headers(self, headers: list[tuple[bytes, bytes]]) -> list[tuple[bytes, bytes]]:
        stripped = self._stripped
        return tracecontext.checked([(n, v) for n, v in headers if n not in stripped])

    async def forward_metered(
        self, forward: Forward, body: dict[str, Any], raw: bytes, changed: bool
    ) -> None:
        exchange, route, send = forward.exchange, forward.route, forward.send
        stream = route.path in STREAMABLE and body.get("stream") is True
        exchange.stream = stream
        client_wants_usage = False
        if stream:
            options = body.get("stream_options")
            client_wants_usage = isinstance(options, dict) and options.get("include_usage") is True
            forced = dict(options) if isinstance(options, dict) else {}
            forced["include_usage"] = True
            if self.config.continuous_usage:
                forced["continuous_usage_stats"] = True
            if forced != options:
                body["stream_options"] = forced
                changed = True
        if changed:
            try:
                raw = jsoncodec.dumps(body)
            except ValueError as exc:
                exchange.meter = None
                return await self.refuse(
                    exchange, send, Refusal(400, "rejected_bad_request", str(exc))
                )
        exchange.watcher = watcher = DisconnectWatcher(forward.receive)
        try:
            try:
                response = await self.pool.request(
                    "POST", route.target, self.forward_headers(forward.scope["headers"]), raw
                )
            except UpstreamError as exc:
                return await self.upstream_failed(exchange, send, exc, sent=exc.reason != "connect")
            exchange.status = response.status
            try:
                if stream and response.status == 200:
                    await self.stream(exchange, send, response, client_wants_usage)
                else:
                    await self.json(exchange, send, response)
            finally:
                response.close()
        except asyncio.CancelledError:
            try:
                watcher.claim()
            except ClientGone:
                exchange.accounting = "client_cancelled"
                exchange.outcome = "client_cancelled"
            except asyncio.CancelledError:
                if not self.draining():
                    raise
                await self.cut_short(exchange, send)
        finally:
            watcher.stop()

    async def cut_short(self, exchange: Exchange, send: Send) -> None:
        """End a response the shutdown's grace period ran out on; its tokens are charged."""
        task = asyncio.current_task()
        if task is not None:
            task.uncancel()
        exchange.accounting = exchange.outcome = "shutdown_cancelled"
        exchange.error = "the proxy is shutting down"
        message = "the proxy is shutting down; the request was cut short"
        with contextlib.suppress(Exception):
            if exchange.response_started:
                event = {
                    "error": {"message": message, "type": "upstream_error", "code": "shutdown"}
                }
                await send(
                    {
                        "type": "http.response.body",
                        "body": b"data: " + json.dumps(event).encode() + b"\n\n",
                        "more_body": False,
                    }
                )
            else:
                exchange.status = 503
                await respond(
                    send, 503, error_body(message, "upstream_error", "shutdown"), list(JSON)
                )

    async def upstream_failed(
        self, exchange: Exchange, send: Send, exc: UpstreamError, sent: bool
    ) -> None:
        self.metrics.upstream_error(exc.reason)
        exchange.outcome = "upstream_error"
        exchange.error = exc.detail
        if sent:
            # the engine may have processed the prompt: charge the estimate, marked as an error
            exchange.accounting = "error"
        else:
            exchange.meter = None
        exchange.status = 504 if exc.reason == "timeout" else 502
        await self.final(
            exchange,
            send,
            exchange.status,
            error_body(f"engine request failed: {exc.detail}", "upstream_error", exc.reason),
            list(JSON),
        )

    async def json(self, exchange: Exchange, send: Send, response: Any) -> None:
        try:
            data = await response.read(self.config.max_response_bytes)
        except UpstreamError as exc:
            return await self.upstream_failed(exchange, send, exc, sent=True)
        status = response.status
        if status < 400:
            payload: Any = None
            with contextlib.suppress(ValueError):
                payload = jsoncodec.loads(data)
            if not isinstance(payload, dict):
                # a garbled success: the engine did take the prompt, so charge the estimate
                error = UpstreamError(
                    "protocol", f"engine reply is not a JSON object: {data[:80]!r}"
                )
                return await self.upstream_failed(exchange, send, error, sent=True)
            if exchange.meter is not None:
                exchange.meter.observe(payload, whole=True)
                exchange.accounting = "complete"
            exchange.outcome = "ok"
        else:
            exchange.outcome = "engine_client_error" if status < 500 else "engine_error"
            exchange.meter = None  # the engine refused it: nothing to charge
        headers = [(k, v) for k, v in response.headers if k not in DROPPED_RESPONSE_HEADERS]
        await self.final(exchange, send, status, data, headers)

    async def stream(
        self, exchange: Exchange, send: Send, response: Any, client_wants_usage: bool
    ) -> None:
        meter = exchange.meter
        assert meter is not None
        headers = [(k, v) for k, v in response.headers if k not in DROPPED_RESPONSE_HEADERS]
        await send(
            {"type": "http.response.start", "status": 200, "headers": headers or SSE_HEADERS}
        )
        exchange.response_started = True
        events = EventStream()
        done = False
        error: str | None = None
        chunks = response.chunks()
        try:
            async for chunk in chunks:
                out: list[bytes] = []
                content_before = meter.content_events
                try:
                    for raw, payload in events.feed(chunk):
                        if isinstance(payload, dict):
                            carried_usage = meter.observe(payload)
                            if (
                                carried_usage
                                and not client_wants_usage
                                and not payload.get("choices")
                            ):
                                continue  # the usage chunk the client did not ask for
                        elif payload == "[DONE]":
                            done = True
                        out.append(raw)
                except MalformedEvent:
                    if out:  # the good events before the bad one still reach the client
                        await send(
                            {"type": "http.response.body", "body": b"".join(out), "more_body": True}
                        )
                    raise
                if out:
                    if exchange.ttft is None and meter.content_events > content_before:
                        exchange.ttft = time.perf_counter() - exchange.start
                    await send(
                        {"type": "http.response.body", "body": b"".join(out), "more_body": True}
                    )
                if done and exchange.watcher is not None:
                    # The client has the whole stream: it may hang up now (most clients do
                    # at [DONE]) without that making a complete request a cancelled one.
                    exchange.watcher.stop()
            if events.pending.strip():
                raise MalformedEvent("stream ended inside an event")
        except UpstreamError as exc:
            self.metrics.upstream_error(exc.reason)
            error = None if done else exc.detail  # after [DONE] the reply was already whole
        except MalformedEvent as exc:
            self.metrics.upstream_error("malformed_stream")
            error = None if done else str(exc)
        finally:
            with contextlib.suppress(Exception):
                await chunks.aclose()
        if error is not None:
            exchange.outcome = "upstream_error"
            exchange.accounting = "error"
            exchange.error = error
            event = {
                "error": {
                    "message": f"engine stream failed: {error}",
                    "type": "upstream_error",
                    "code": "upstream_error",
                }
            }
            await send(
                {
                    "type": "http.response.body",
                    "body": b"data: " + json.dumps(event).encode() + b"\n\n",
                    "more_body": True,
                }
            )
        else:
            exchange.outcome = "ok"
            exchange.accounting = "complete"
            if not done:
                exchange.done_marker_missing = True
        if exchange.watcher is not None:
            exchange.watcher.stop()
        await send({"type": "http.response.body", "body": b"", "more_body": False})

    async def passthrough(self, forward: Forward, raw: bytes) -> None:
        """An allow-listed route's request (already authenticated), relayed as is, not metered."""
        exchange, route, send = forward.exchange, forward.route, forward.send
        exchange.watcher = watcher = DisconnectWatcher(forward.receive)
        try:
            try:
                response = await self.pool.request(
                    route.method, route.target, self.forward_headers(forward.scope["headers"]), raw
                )
            except UpstreamError as exc:
                return await self.upstream_failed(exchange, send, exc, sent=False)
            exchange.status = response.status
            exchange.outcome = (
                "ok"
                if response.status < 400
                else ("engine_client_error" if response.status < 500 else "engine_error")
            )
            headers = [(k, v) for k, v in response.headers if k not in DROPPED_RESPONSE_HEADERS]
            await send(
                {"type": "http.response.start", "status": response.status, "headers": headers}
            )
            try:
                async for chunk in response.chunks():
                    await send({"type": "http.response.body", "body": chunk, "more_body": True})
            except UpstreamError as exc:
                self.metrics.upstream_error(exc.reason)
                exchange.outcome = "upstream_error"
                exchange.error = exc.detail
            finally:
                response.close()
            watcher.stop()
            await send({"type": "http.response.body", "body": b"", "more_body": False})
        except asyncio.CancelledError:
            try:
                watcher.claim()
            except ClientGone:
                exchange.outcome = "client_cancelled"
        finally:
            watcher.stop()

    async def refuse(self, exchange: Exchange, send: Send, refusal: Refusal) -> None:
        exchange.outcome = refusal.reason
        exchange.error = refusal.message
        headers = list(JSON)
        if refusal.retry_after is not None:
            headers.append((b"retry-after", str(refusal.retry_after).encode()))
        kind = "authentication_error" if refusal.status == 401 else "invalid_request_error"
        if refusal.status in (429, 503):
            kind = "rate_limit_error"
        exchange.status = refusal.status
        await respond(
            send, refusal.status, error_body(refusal.message, kind, refusal.reason), headers
        )

    async def final(
        self,
        exchange: Exchange,
        send: Send,
        status: int,
        body: bytes,
        headers: list[tuple[bytes, bytes]],
    ) -> None:
        """Send a whole response, first releasing the disconnect watcher it would trip."""
        if exchange.watcher is not None:
            exchange.watcher.stop()
        await respond(send, status, body, headers)
