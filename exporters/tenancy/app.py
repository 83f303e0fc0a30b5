"""The proxy as a raw ASGI application (served by uvicorn with httptools).

Every request is routed on its normalised path (see :mod:`routes`): metered, passed through
(allow-list), or refused. Per metered request: resolve the tenant, read and check the body
(within a deadline), admit (input limit, budget reservation, concurrency), forward with usage
forced on, relay the response while metering it, then settle the tenant's reservation, charge
it and write one access-log line. A sampled share of complete chat and completion responses
is screened for degenerate output (counters only; no text is kept). A client that goes away
mid-request cancels the handler: the upstream connection is closed (the engine aborts the
request) and the tokens seen so far are still charged, marked ``client_cancelled``. So are
the streams still running when a shutdown's grace period ends (``shutdown_cancelled``).

Per-tenant metrics are served by :attr:`ProxyApp.metrics_app`, on its own listen address,
never on the port clients call. The per-request record and its ASGI plumbing live in
:mod:`exchange`, what a finished request leaves behind (charge, screening, access log) in
:mod:`accounting`.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import logging
import time
from collections.abc import Awaitable, Callable
from typing import Any

from prometheus_client import CollectorRegistry
from prometheus_client.core import Metric

from inferwatch.exporters import endpoints
from inferwatch.exporters.collector import Condition
from inferwatch.exporters.tenancy import jsoncodec
from inferwatch.exporters.tenancy.accesslog import AccessLog
from inferwatch.exporters.tenancy.accounting import Accounting
from inferwatch.exporters.tenancy.admission import (
    BudgetLedger,
    ConcurrencyGate,
    Refusal,
)
from inferwatch.exporters.tenancy.config import ProxyConfig
from inferwatch.exporters.tenancy.counting import PromptCounter, byte_bound, load_tokenizer
from inferwatch.exporters.tenancy.exchange import (
    ClientGone,
    DisconnectWatcher,
    Exchange,
    Receive,
    Scope,
    Send,
    read_body,
)
from inferwatch.exporters.tenancy.labels import OTHER, BoundedLabels, split_label
from inferwatch.exporters.tenancy.metrics import IDENTITY_LABELS, ProxyMetrics
from inferwatch.exporters.tenancy.reconcile import (
    DirectTraffic,
    DirectTrafficError,
    Reconciler,
    engine_token_counters,
)
from inferwatch.exporters.tenancy.routes import STREAMABLE, BadTarget, Route, Router
from inferwatch.exporters.tenancy.sampling import TranscribingMeter, prompt_text
from inferwatch.exporters.tenancy.tenants import UNKNOWN, TenantResolver
from inferwatch.exporters.tenancy.upstream import Timeouts, UpstreamError, UpstreamPool
from inferwatch.exporters.tenancy.usage import (
    EventStream,
    MalformedEvent,
    UsageMeter,
    estimate_prompt_tokens,
)
from inferwatch.identity import or_unknown
from inferwatch.logs import log_event
from inferwatch.probes.client import PROBE_TENANT
from inferwatch.probes.livesample import DegeneracySampler

#: the engine work a request may ask for is capped at this many choices (``n``, ``best_of``)
MAX_CHOICES = 128
#: bodies above this size are counted off the event loop when a tokenizer is configured
_COUNT_IN_THREAD_BYTES = 256 << 10
_DROPPED_RESPONSE_HEADERS = frozenset(
    {b"connection", b"keep-alive", b"transfer-encoding", b"content-length", b"date", b"server"}
)
_SSE_HEADERS = [(b"content-type", b"text/event-stream"), (b"cache-control", b"no-cache")]
_JSON = [(b"content-type", b"application/json")]
_PLAIN = [(b"content-type", b"text/plain")]
VALUE_LABELS = IDENTITY_LABELS[1:-1]  # split has a fixed handful of values

logger = logging.getLogger("inferwatch.proxy")


def _error_body(message: str, kind: str, code: str) -> bytes:
    return json.dumps({"error": {"message": message, "type": kind, "code": code}}).encode()


def _completion_cap(body: dict[str, Any], path: str) -> tuple[str, int | None, int]:
    """The body field that caps completion tokens, its value if valid, and the choices asked."""
    name = "max_tokens"  # chat's newer field wins where it is set, as in vLLM
    if path == "/v1/chat/completions" and type(body.get("max_completion_tokens")) is int:
        name = "max_completion_tokens"
    value = body.get(name)
    cap = value if type(value) is int and value >= 0 else None
    choices = 1
    for key in ("n", "best_of"):
        count = body.get(key)
        if type(count) is int and count > choices:
            choices = count
    return name, cap, choices


class ProxyApp:
    def __init__(self, config: ProxyConfig, access_log: bool = True) -> None:
        self.config = config
        self.access_log = AccessLog(access_log)
        self.pool = UpstreamPool(
            config.upstream_url, Timeouts(config.connect_timeout_s, config.read_timeout_s)
        )
        self.resolver = TenantResolver(config)
        self.router = Router(config.passthrough)
        self.counter = PromptCounter(
            load_tokenizer(config.tokenizer) if config.tokenizer else byte_bound
        )
        self.tenant_labels = BoundedLabels(
            config.max_tenant_labels, [*config.tenants, UNKNOWN], config.tenant_idle_seconds
        )
        # models and versions come from clients too: bounded, and released when idle, so a
        # flood of junk values holds its slots only until it stops
        v = config.versions
        self.value_labels = [
            BoundedLabels(config.max_version_labels, allow, config.value_idle_seconds)
            for allow in (
                [*config.prices],
                [v.model_version],
                [v.engine_version],
                [v.prompt_version],
            )
        ]
        self.metrics = ProxyMetrics()
        self.metrics_app = MetricsApp(self)
        #: set when the server stops accepting: a cancelled handler is then a shutdown's
        self.draining = False
        self._handlers: set[asyncio.Task[Any]] = set()
        self.ledger = BudgetLedger()
        self.gate = ConcurrencyGate(config.max_concurrency, config.queue_timeout_s)
        self.reconciler = Reconciler()
        self.direct_traffic = DirectTraffic(config.probe_metrics_urls)
        self.sampler = DegeneracySampler(config.quality_sample_rate)
        self.accounting = Accounting(
            config, self.metrics, self.ledger, self.sampler, self.access_log
        )
        self._tasks: list[asyncio.Task[None]] = []
        self._ready: tuple[float, bool, str] = (0.0, False, "not checked yet")
        self._version_headers = (
            v.model_version_header.encode(),
            v.engine_version_header.encode(),
            v.prompt_version_header.encode(),
        )
        self._version_defaults = (v.model_version, v.engine_version, v.prompt_version)
        self._stripped_request_headers = frozenset(
            {b"authorization", config.tenant_header.encode(), *self._version_headers}
        )

    # ------------------------------------------------------------------ ASGI entry point
    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        kind = scope["type"]
        if kind == "http":
            try:
                route = self.router.route(scope["method"], scope["raw_path"], scope["query_string"])
            except BadTarget as exc:
                refusal = Refusal(400, "rejected_bad_request", str(exc))
                bad = Route("refused", scope["method"], str(scope["path"])[:256], b"")
                return await self._guarded(self._refusing(refusal), bad, scope, receive, send)
            if route.kind == "metered":
                await self._guarded(self._metered, route, scope, receive, send)
            elif route.kind == "passthrough":
                await self._guarded(self._passthrough, route, scope, receive, send)
            elif route.kind == "own":
                if route.path == "/healthz":
                    await self._respond(send, 200, endpoints.HEALTHZ_BODY, list(_PLAIN))
                else:
                    await self._readyz(send)
            else:
                refusal = self._route_refusal(route)
                await self._guarded(self._refusing(refusal), route, scope, receive, send)
        elif kind == "lifespan":
            await self._lifespan(receive, send)

    @staticmethod
    def _route_refusal(route: Route) -> Refusal:
        where = f"{route.method} {route.path}"
        if route.kind == "unmetered":
            return Refusal(
                403,
                "rejected_route",
                f"{where} makes the engine generate or embed tokens in a form this proxy does "
                "not meter (it meters POST /v1/chat/completions, /v1/completions and "
                "/v1/embeddings)",
            )
        return Refusal(
            404,
            "rejected_route",
            f"{where} is not a route this proxy meters or passes through "
            "(see routes.passthrough in its config)",
        )

    def _refusing(
        self, refusal: Refusal
    ) -> Callable[[Exchange, Route, Scope, Receive, Send], Awaitable[None]]:
        async def refuse(
            exchange: Exchange, route: Route, scope: Scope, receive: Receive, send: Send
        ) -> None:
            await self._refuse(exchange, send, refusal)

        return refuse

    async def _lifespan(self, receive: Receive, send: Send) -> None:
        while True:
            message = await receive()
            if message["type"] == "lifespan.startup":
                self.start_background()
                await send({"type": "lifespan.startup.complete"})
            elif message["type"] == "lifespan.shutdown":
                await self.stop_background()
                await send({"type": "lifespan.shutdown.complete"})
                return

    def start_background(self) -> None:
        self._tasks.append(asyncio.ensure_future(self._housekeeping_loop()))
        if self.config.reconcile_interval > 0:
            self._tasks.append(asyncio.ensure_future(self._reconcile_loop()))

    async def stop_background(self) -> None:
        # handlers cancelled at the end of a shutdown still charge their tokens: wait for them
        pending = [task for task in self._handlers if task is not asyncio.current_task()]
        if pending:
            await asyncio.wait(pending, timeout=5.0)
        for task in self._tasks:
            task.cancel()
        for task in self._tasks:
            with contextlib.suppress(asyncio.CancelledError):
                await task
        self._tasks.clear()
        self.access_log.flush()
        self.pool.close()
        await self.direct_traffic.aclose()

    # ------------------------------------------------------------------ request handling
    async def _guarded(
        self,
        handler: Callable[[Exchange, Route, Scope, Receive, Send], Awaitable[None]],
        route: Route,
        scope: Scope,
        receive: Receive,
        send: Send,
    ) -> None:
        """Run a handler; turn a client disconnect into cancellation, and always log."""
        exchange = Exchange(start=time.perf_counter(), path=route.path)
        task = asyncio.current_task()
        if task is not None:
            self._handlers.add(task)
        try:
            await handler(exchange, route, scope, receive, send)
        except ClientGone:
            exchange.outcome = exchange.outcome or "client_cancelled"
        finally:
            if task is not None:
                self._handlers.discard(task)
            self.accounting.finish(exchange)

    def _resolve(self, exchange: Exchange, scope: Scope) -> Refusal | None:
        client = scope.get("client")
        resolution = self.resolver.resolve(scope["headers"], client[0] if client else None)
        exchange.via = resolution.via
        if resolution.tenant is None:
            return Refusal(401, "rejected_auth", resolution.reason)
        exchange.tenant = resolution.tenant
        return None

    def _label(self, exchange: Exchange, headers: list[tuple[bytes, bytes]]) -> None:
        found: list[str | None] = [None, None, None]
        names = self._version_headers
        for name, value in headers:
            for index in range(3):
                if name == names[index]:
                    found[index] = value.decode("latin-1")[:128]
        versions = tuple(
            value if value is not None else default
            for value, default in zip(found, self._version_defaults, strict=True)
        )
        exchange.versions = (versions[0], versions[1], versions[2])
        model_l, mv_l, ev_l, pv_l = self.value_labels
        exchange.identity = (
            self.tenant_labels.label(exchange.tenant),
            model_l.label(or_unknown(exchange.model)),
            mv_l.label(or_unknown(versions[0])),
            ev_l.label(or_unknown(versions[1])),
            pv_l.label(or_unknown(versions[2])),
            split_label(headers),
        )

    def _forward_headers(self, headers: list[tuple[bytes, bytes]]) -> list[tuple[bytes, bytes]]:
        stripped = self._stripped_request_headers
        return [(name, value) for name, value in headers if name not in stripped]

    async def _refuse(self, exchange: Exchange, send: Send, refusal: Refusal) -> None:
        exchange.outcome = refusal.reason
        exchange.error = refusal.message
        headers = list(_JSON)
        if refusal.retry_after is not None:
            headers.append((b"retry-after", str(refusal.retry_after).encode()))
        kind = "authentication_error" if refusal.status == 401 else "invalid_request_error"
        if refusal.status in (429, 503):
            kind = "rate_limit_error"
        exchange.status = refusal.status
        await self._respond(
            send, refusal.status, _error_body(refusal.message, kind, refusal.reason), headers
        )

    async def _count(self, body: dict[str, Any], size: int) -> int:
        """Prompt tokens of ``body``; a big body meets a real tokenizer off the event loop."""
        if size > _COUNT_IN_THREAD_BYTES and self.counter.count_text is not byte_bound:
            return await asyncio.to_thread(self.counter.count, body)
        return self.counter.count(body)

    async def _admit(
        self, exchange: Exchange, body: dict[str, Any], size: int
    ) -> tuple[Refusal | None, bool]:
        """Admit a request; also says whether the body was changed (a completion cap set)."""
        config = self.config
        tenant = config.tenants.get(exchange.tenant)
        budget = tenant.budget if tenant is not None else None
        exact = self.counter.count_text is not byte_bound
        prompt_count = 0
        if config.max_input_tokens or budget is not None or exact:  # else nothing needs it
            try:
                prompt_count = await self._count(body, size)
            except ValueError as exc:
                return Refusal(400, "rejected_bad_request", str(exc)), False
        # without a tokenizer the count is an upper bound: charge the usual estimate instead
        prompt_estimate = prompt_count if exact else estimate_prompt_tokens(body)
        if (
            exchange.path in STREAMABLE
            and exchange.tenant != PROBE_TENANT
            and self.sampler.should_sample()
        ):
            exchange.meter = TranscribingMeter(prompt_estimate, prompt_text(body))
        else:
            exchange.meter = UsageMeter(prompt_estimate)
        if config.max_input_tokens and prompt_count > config.max_input_tokens:
            exchange.meter = None
            counted = "is" if exact else "may be up to"
            return Refusal(
                400,
                "rejected_too_long",
                f"prompt {counted} {prompt_count} tokens, over this endpoint's limit of "
                f"{config.max_input_tokens} input tokens",
            ), False
        changed = False
        if tenant is not None and budget is not None:
            name, requested, choices = _completion_cap(body, exchange.path)
            if choices > MAX_CHOICES:
                exchange.meter = None
                return Refusal(
                    400, "rejected_bad_request", f"at most {MAX_CHOICES} choices per request"
                ), False
            generates = exchange.path in STREAMABLE
            cap = (requested if requested is not None else config.default_max_tokens) * generates
            reserved = self.ledger.reserve(
                exchange.tenant,
                budget,
                prompt_count,
                cap,
                choices,
                clamp=config.over_budget == "clamp",
            )
            if isinstance(reserved, Refusal):
                exchange.meter = None
                return reserved, False
            exchange.reservation = reserved
            if generates and (reserved.completion_cap is not None or requested is None):
                body[name] = cap if reserved.completion_cap is None else reserved.completion_cap
                changed = True
        if config.max_concurrency or (tenant is not None and tenant.max_concurrency):
            limit, priority = (tenant.max_concurrency, tenant.priority) if tenant else (0, 1)
            refusal = await self.gate.acquire(exchange.tenant, limit, priority)
            if refusal is not None:
                exchange.meter = None
                return refusal, False
            exchange.slot = "gated"
        else:
            self.gate.enter_ungated()
            exchange.slot = "counted"
        return None, changed

    async def _read_request(
        self, exchange: Exchange, scope: Scope, receive: Receive
    ) -> tuple[Refusal | None, dict[str, Any], bytes, bool]:
        """Resolve, read, parse and admit; the body (maybe changed) and whether it changed."""
        refusal = self._resolve(exchange, scope)
        if refusal is not None:
            self._label(exchange, scope["headers"])
            return refusal, {}, b"", False
        config = self.config
        raw = await read_body(receive, config.max_body_bytes, config.body_timeout_s)
        body: Any = None
        if isinstance(raw, Refusal):
            refusal = raw
            raw = b""
        else:
            try:
                body = jsoncodec.loads(raw, finite=True)
            except ValueError as exc:
                refusal = Refusal(400, "rejected_bad_request", f"request body is not JSON: {exc}")
            else:
                if not isinstance(body, dict):
                    refusal = Refusal(
                        400, "rejected_bad_request", "request body must be a JSON object"
                    )
        if isinstance(body, dict) and isinstance(body.get("model"), str):
            exchange.model = body["model"][:256]
        self._label(exchange, scope["headers"])
        if refusal is not None or not isinstance(body, dict):
            return refusal, {}, b"", False
        refusal, changed = await self._admit(exchange, body, len(raw))
        return refusal, body, raw, changed

    async def _metered(
        self, exchange: Exchange, route: Route, scope: Scope, receive: Receive, send: Send
    ) -> None:
        try:
            refusal, body, raw, changed = await self._read_request(exchange, scope, receive)
            if refusal is not None:
                return await self._refuse(exchange, send, refusal)
            await self._forward_metered(exchange, route, scope, receive, send, body, raw, changed)
        finally:
            if exchange.slot == "gated":
                self.gate.release(exchange.tenant)
            elif exchange.slot == "counted":
                self.gate.leave_ungated()
            self.accounting.charge(exchange)
            if isinstance(exchange.meter, TranscribingMeter):
                self.accounting.screen(exchange, exchange.meter)

    async def _forward_metered(
        self,
        exchange: Exchange,
        route: Route,
        scope: Scope,
        receive: Receive,
        send: Send,
        body: dict[str, Any],
        raw: bytes,
        changed: bool,
    ) -> None:
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
                return await self._refuse(
                    exchange, send, Refusal(400, "rejected_bad_request", str(exc))
                )
        exchange.watcher = watcher = DisconnectWatcher(receive)
        try:
            try:
                response = await self.pool.request(
                    "POST", route.target, self._forward_headers(scope["headers"]), raw
                )
            except UpstreamError as exc:
                return await self._upstream_failed(
                    exchange, send, exc, sent=exc.reason != "connect"
                )
            exchange.status = response.status
            try:
                if stream and response.status == 200:
                    await self._relay_stream(exchange, send, response, client_wants_usage)
                else:
                    await self._relay_json(exchange, send, response)
            finally:
                response.close()
        except asyncio.CancelledError:
            try:
                watcher.claim()
            except ClientGone:
                exchange.accounting = "client_cancelled"
                exchange.outcome = "client_cancelled"
            except asyncio.CancelledError:
                if not self.draining:
                    raise
                await self._cut_short(exchange, send)
        finally:
            watcher.stop()

    async def _cut_short(self, exchange: Exchange, send: Send) -> None:
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
                await self._respond(
                    send, 503, _error_body(message, "upstream_error", "shutdown"), list(_JSON)
                )

    async def _upstream_failed(
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
        await self._final(
            exchange,
            send,
            exchange.status,
            _error_body(f"engine request failed: {exc.detail}", "upstream_error", exc.reason),
            list(_JSON),
        )

    async def _relay_json(self, exchange: Exchange, send: Send, response: Any) -> None:
        try:
            data = await response.read(self.config.max_response_bytes)
        except UpstreamError as exc:
            return await self._upstream_failed(exchange, send, exc, sent=True)
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
                return await self._upstream_failed(exchange, send, error, sent=True)
            if exchange.meter is not None:
                exchange.meter.observe(payload)
                exchange.accounting = "complete"
            exchange.outcome = "ok"
        else:
            exchange.outcome = "engine_client_error" if status < 500 else "engine_error"
            exchange.meter = None  # the engine refused it: nothing to charge
        headers = [(k, v) for k, v in response.headers if k not in _DROPPED_RESPONSE_HEADERS]
        await self._final(exchange, send, status, data, headers)

    async def _relay_stream(
        self, exchange: Exchange, send: Send, response: Any, client_wants_usage: bool
    ) -> None:
        meter = exchange.meter
        assert meter is not None
        headers = [(k, v) for k, v in response.headers if k not in _DROPPED_RESPONSE_HEADERS]
        await send(
            {"type": "http.response.start", "status": 200, "headers": headers or _SSE_HEADERS}
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

    async def _passthrough(
        self, exchange: Exchange, route: Route, scope: Scope, receive: Receive, send: Send
    ) -> None:
        """An allow-listed route: authenticated like the rest, relayed as is, not metered."""
        refusal = self._resolve(exchange, scope)
        self._label(exchange, scope["headers"])
        if refusal is not None:
            return await self._refuse(exchange, send, refusal)
        raw = await read_body(receive, self.config.max_body_bytes, self.config.body_timeout_s)
        if isinstance(raw, Refusal):
            return await self._refuse(exchange, send, raw)
        exchange.watcher = watcher = DisconnectWatcher(receive)
        try:
            try:
                response = await self.pool.request(
                    route.method, route.target, self._forward_headers(scope["headers"]), raw
                )
            except UpstreamError as exc:
                return await self._upstream_failed(exchange, send, exc, sent=False)
            exchange.status = response.status
            exchange.outcome = (
                "ok"
                if response.status < 400
                else ("engine_client_error" if response.status < 500 else "engine_error")
            )
            headers = [(k, v) for k, v in response.headers if k not in _DROPPED_RESPONSE_HEADERS]
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

    # ------------------------------------------------------------------ plumbing
    async def _final(
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
        await self._respond(send, status, body, headers)

    @staticmethod
    async def _respond(
        send: Send, status: int, body: bytes, headers: list[tuple[bytes, bytes]]
    ) -> None:
        await send({"type": "http.response.start", "status": status, "headers": headers})
        await send({"type": "http.response.body", "body": body})

    def families(self) -> list[Metric]:
        budgets = {
            name: self.ledger.remaining(name, tenant.budget)
            for name, tenant in self.config.tenants.items()
            if tenant.budget is not None
        }
        return [
            *self.metrics.families(
                in_flight=self.gate.in_flight,
                waiting=self.gate.waiting,
                budgets=budgets,
                tenant_label_values=len(self.tenant_labels),
                tenant_label_folds=self.tenant_labels.folded,
                value_label_folds={
                    name: labels.folded
                    for name, labels in zip(VALUE_LABELS, self.value_labels, strict=True)
                },
            ),
            *self.sampler.families(),
        ]

    def registry(self) -> CollectorRegistry:
        return endpoints.Families(self.families).registry()

    async def _readyz(self, send: Send) -> None:
        checked, ok, reason = self._ready
        now = time.monotonic()
        if now - checked > 1.0:
            try:
                response = await self.pool.request(
                    "GET", self.config.upstream_health_path.encode(), [], b""
                )
                await response.read(1 << 16)
                ok = response.status == 200
                reason = f"engine health returned {response.status}"
            except UpstreamError as exc:
                ok, reason = False, f"engine unreachable: {exc.detail}"
            self._ready = (now, ok, reason)
        status, body = endpoints.readiness([Condition("engine", ok, "" if ok else reason)])
        await self._respond(send, status, body, list(_JSON))

    async def _housekeeping_loop(self) -> None:
        """Flush the access log often; release idle label slots now and then."""
        idle = min(self.config.tenant_idle_seconds, self.config.value_idle_seconds)
        evict_every = min(max(idle / 4, 0.05), 60.0)
        last_evict = time.monotonic()
        while True:
            await asyncio.sleep(min(0.25, evict_every))
            self.access_log.flush()
            if time.monotonic() - last_evict >= evict_every:
                last_evict = time.monotonic()
                self.evict_idle_tenants()

    def evict_idle_tenants(self) -> None:
        """Release idle tenant, model and version label slots, folding their series."""
        self.metrics.fold("tenant", self.tenant_labels.evict_idle())
        for name, labels in zip(VALUE_LABELS, self.value_labels, strict=True):
            self.metrics.fold(name, labels.evict_idle())

    async def _reconcile_loop(self) -> None:
        while True:
            await self.reconcile_once()
            await asyncio.sleep(self.config.reconcile_interval)

    async def reconcile_once(self) -> None:
        """Read the engine's token counters and update the drift gauge."""
        errors = self.metrics.reconciliation_errors
        try:
            response = await self.pool.request(
                "GET", self.config.upstream_metrics_path.encode(), [], b""
            )
            page = await response.read(self.config.max_response_bytes)
        except UpstreamError as exc:
            errors[exc.reason] = errors.get(exc.reason, 0) + 1
            return
        counters = engine_token_counters(page) if response.status == 200 else None
        if counters is None:
            reason = "http_status" if response.status != 200 else "no_token_counters"
            errors[reason] = errors.get(reason, 0) + 1
            log_event(logger, logging.WARNING, "engine token counters unreadable", reason=reason)
            return
        try:  # read after the engine: a probe the engine counted is counted here too
            direct = await self.direct_traffic.read()
        except DirectTrafficError as exc:
            errors[exc.reason] = errors.get(exc.reason, 0) + 1
            log_event(logger, logging.WARNING, "probe token counters unreadable", reason=exc.reason)
            return
        self.metrics.drift = self.reconciler.update(counters, self.metrics.charged, direct)


class MetricsApp:
    """The proxy's own metrics, per-tenant series included, for its separate listen address."""

    def __init__(self, proxy: ProxyApp) -> None:
        self.proxy = proxy

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            return
        path, method = scope["path"], scope["method"].upper()
        if method not in ("GET", "HEAD"):
            await ProxyApp._respond(send, 405, b"", [(b"allow", b"GET")])
        elif path == "/metrics":
            headers = dict(scope["headers"])
            body, reply = endpoints.encode_metrics(
                self.proxy.families(),
                headers.get(b"accept", b"").decode("latin-1"),
                headers.get(b"accept-encoding", b"").decode("latin-1"),
            )
            encoded = [(k.lower().encode(), v.encode()) for k, v in reply.items()]
            await ProxyApp._respond(send, 200, body, encoded)
        elif path == "/healthz":
            await ProxyApp._respond(send, 200, endpoints.HEALTHZ_BODY, list(_PLAIN))
        else:
            await ProxyApp._respond(send, 404, b"not found\n", [(b"content-type", b"text/plain")])


__all__ = ["OTHER", "MetricsApp", "ProxyApp"]
