"""The proxy as a raw ASGI application (served by uvicorn with httptools).

Every request is routed on its normalised path (see :mod:`routes`): metered, passed through
(allow-list), or refused. Per metered request: resolve the tenant, read and check the body
(within a deadline), admit it (:mod:`pipeline`: input limit, rate limit, budget reservation,
concurrency), forward with usage forced on, relay the response while metering it, then settle
the tenant's reservation, charge it and write one access-log line. A sampled share of
complete chat and completion responses is screened for degenerate output (counters only; no
text is kept). A client that goes away mid-request cancels the handler: the upstream
connection is closed (the engine aborts the request) and the tokens seen so far are still
charged, marked ``client_cancelled``. So are the streams still running when a shutdown's
grace period ends (``shutdown_cancelled``).

Per-tenant metrics are served by :attr:`ProxyApp.metrics_app`, on its own listen address,
never on the port clients call. This module is the ASGI entry and a metered request's path
through the parts :func:`assembly.build` makes: which handler serves a request is
:mod:`routing`, admission :mod:`pipeline`, forwarding and relaying :mod:`relays`, the
per-request record and its ASGI plumbing :mod:`exchange`, and what a finished request leaves
behind (charge, screening, access log) :mod:`accounting`.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
from typing import Any

from prometheus_client import CollectorRegistry
from prometheus_client.core import Metric

from inferwatch.identity import or_unknown
from inferwatch.logs import log_event
from inferwatch.proxy import jsoncodec
from inferwatch.proxy.admission import Refusal
from inferwatch.proxy.assembly import Parts
from inferwatch.proxy.engineinfo import REFRESH_S
from inferwatch.proxy.exchange import (
    Exchange,
    Receive,
    Scope,
    Send,
    read_body,
)
from inferwatch.proxy.labels import OTHER, split_label
from inferwatch.proxy.metrics import IDENTITY_LABELS
from inferwatch.proxy.pipeline import Admitted
from inferwatch.proxy.reconcile import DirectTrafficError, engine_token_counters
from inferwatch.proxy.relays import JSON, PLAIN, Forward, Relays, respond
from inferwatch.proxy.routes import Route
from inferwatch.proxy.routing import Routing
from inferwatch.proxy.sampling import TranscribingMeter
from inferwatch.proxy.upstream import UpstreamError
from inferwatch.serving import endpoints
from inferwatch.serving.readiness import Condition

VALUE_LABELS = IDENTITY_LABELS[1:-1]  # split has a fixed handful of values
#: how long a dropped stream's prompt may wait for the engine's count before it is estimated
DROPPED_COUNT_TIMEOUT_S = 5.0

logger = logging.getLogger("inferwatch.proxy")


def _with_headers(send: Send, extra: tuple[tuple[bytes, bytes], ...]) -> Send:
    """``send`` that adds ``extra`` to the response's headers, whatever the response is."""

    async def sending(message: Any) -> None:
        if message["type"] == "http.response.start":
            message = {**message, "headers": [*message.get("headers", ()), *extra]}
        await send(message)

    return sending


class ProxyApp:
    """The ASGI entry: routes each request, and takes a metered one from its tenant through
    admission and the relay to its charge (see the module docstring)."""

    def __init__(self, parts: Parts) -> None:
        """Serve requests with ``parts`` (see :func:`assembly.build`)."""
        self.parts = parts
        self.config = config = parts.config
        self.metrics_app = MetricsApp(self)
        #: set when the server stops accepting: a cancelled handler is then a shutdown's
        self.draining = False
        self._handlers: set[asyncio.Task[Any]] = set()
        self._tasks: list[asyncio.Task[None]] = []
        self._ready: tuple[float, bool, str] = (0.0, False, "not checked yet")
        v = config.versions
        self._version_headers = (
            v.model_version_header.encode(),
            v.engine_version_header.encode(),
            v.prompt_version_header.encode(),
        )
        self._version_defaults = (v.model_version, v.engine_version, v.prompt_version)
        # credentials and what the gateway told the proxy never reach the engine
        stripped = {b"authorization", *(name.encode() for name in config.gateway_headers)}
        self.relays = Relays(
            config, parts.pool, parts.metrics, frozenset(stripped), lambda: self.draining
        )
        self.routing = Routing(
            parts.router,
            metered=self._metered,
            passthrough=self._passthrough,
            own=self._own,
            refuse=self.relays.refuse,
            finish=self._finish,
            handlers=self._handlers,
        )

    # ------------------------------------------------------------------ ASGI entry point
    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        kind = scope["type"]
        if kind == "http":
            await self.routing(scope, receive, send)
        elif kind == "lifespan":
            await self._lifespan(receive, send)

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
        self._tasks.append(asyncio.ensure_future(self._engine_info_loop()))
        if self.config.reconcile_interval > 0:
            self._tasks.append(asyncio.ensure_future(self._reconcile_loop()))
        if self.parts.shared is not None:
            self._tasks.append(asyncio.ensure_future(self.parts.shared.run()))
        if self.parts.usage_stream is not None:
            self._tasks.append(asyncio.ensure_future(self.parts.usage_stream.run()))

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
        if self.parts.usage_stream is not None:  # its last lines, before the client is closed
            await self.parts.usage_stream.close()
        if self.parts.shared is not None:
            await self.parts.shared.aclose()
        self.parts.access_log.flush()
        if self.parts.usage_log is not None:
            self.parts.usage_log.close()
        self.parts.pool.close()
        await self.parts.direct_traffic.aclose()
        if self.parts.tracer_provider is not None:  # export the spans still batched
            await asyncio.to_thread(self.parts.tracer_provider.shutdown)

    def _resolve(self, exchange: Exchange, scope: Scope) -> Refusal | None:
        client = scope.get("client")
        resolution = self.parts.resolver.resolve(scope["headers"], client[0] if client else None)
        exchange.via = resolution.via
        if resolution.tenant is None:
            return Refusal(401, "rejected_auth", resolution.reason)
        exchange.tenant = resolution.tenant
        return None

    def _gateway_said(self, scope: Scope) -> list[tuple[bytes, bytes]]:
        """The request's headers if its peer may set the split and versions, else none."""
        client = scope.get("client")
        return (
            scope["headers"]
            if self.parts.resolver.from_gateway(client[0] if client else None)
            else []
        )

    def _label(self, exchange: Exchange, headers: list[tuple[bytes, bytes]]) -> None:
        found: list[str | None] = [None, None, None]
        names = self._version_headers
        for name, value in headers:
            for index in range(3):
                if name == names[index]:
                    found[index] = value.decode("latin-1")[:128]
        model_version, engine_version, prompt_version = self._version_defaults
        defaults = (model_version, engine_version or self.parts.engine.version, prompt_version)
        versions = tuple(
            value if value is not None else default
            for value, default in zip(found, defaults, strict=True)
        )
        exchange.versions = (versions[0], versions[1], versions[2])
        model, model_version, engine_version, prompt_version = self._values(exchange, take=False)
        exchange.identity = (
            self.parts.tenant_labels.label(exchange.tenant),
            model,
            model_version,
            engine_version,
            prompt_version,
            split_label(headers),
        )

    def _values(self, exchange: Exchange, take: bool) -> tuple[str, str, str, str]:
        """The model and version labels of a request (``take``: values may take a slot)."""
        values = (exchange.model, *exchange.versions)
        model, model_version, engine_version, prompt_version = (
            labels.label(or_unknown(value), take)
            for labels, value in zip(self.parts.value_labels, values, strict=True)
        )
        return model, model_version, engine_version, prompt_version

    def _served(self, exchange: Exchange) -> None:
        """A model or version the engine served takes a label slot, one it refused never: a
        flood of junk names answered 404 would otherwise hold every slot."""
        if 200 <= exchange.status < 400:
            tenant, *_, split = exchange.identity
            exchange.identity = (tenant, *self._values(exchange, take=True), split)

    async def _count_dropped(self, exchange: Exchange, body: dict[str, Any]) -> None:
        """A stream the client dropped ends without usage, and its prompt would be charged at
        4 characters a token: the engine, which has counted that prompt, counts it again
        (bounded by :data:`DROPPED_COUNT_TIMEOUT_S`, the client being gone)."""
        meter = exchange.meter
        if (
            exchange.outcome != "client_cancelled"
            or meter is None
            or meter.reported is not None
            or meter.prompt_counted
            or not body
        ):
            return
        with contextlib.suppress(TimeoutError):
            async with asyncio.timeout(DROPPED_COUNT_TIMEOUT_S):
                counted = await self.parts.engine.count(exchange.path, body)
                if counted is not None:
                    meter.prompt_estimate, meter.prompt_counted = counted, True

    async def _read_request(
        self, exchange: Exchange, scope: Scope, receive: Receive
    ) -> tuple[Admitted | Refusal, dict[str, Any], bytes]:
        """Resolve, read, parse and admit; also the body (maybe changed) and as received."""
        refusal = self._resolve(exchange, scope)
        if refusal is not None:
            self._label(exchange, self._gateway_said(scope))
            return refusal, {}, b""
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
        self._label(exchange, self._gateway_said(scope))
        if refusal is not None or not isinstance(body, dict):
            assert refusal is not None
            return refusal, {}, b""
        return await self.parts.admission.admit(exchange, body, len(raw)), body, raw

    async def _metered(
        self, exchange: Exchange, route: Route, scope: Scope, receive: Receive, send: Send
    ) -> None:
        tracing = self.parts.tracing
        if tracing is not None:
            tracing.start(exchange, scope)
        body: dict[str, Any] = {}
        try:
            admitted, body, raw = await self._read_request(exchange, scope, receive)
            if exchange.rate_headers:
                send = _with_headers(send, exchange.rate_headers)
            if isinstance(admitted, Refusal):
                return await self.relays.refuse(exchange, send, admitted)
            if tracing is not None:
                tracing.admitted(exchange)
            forward = Forward(exchange, route, scope, receive, send)
            await self.relays.forward_metered(forward, body, raw, admitted.changed)
        finally:
            admission = self.parts.admission
            admission.release(exchange)
            self._served(exchange)
            try:
                await self._count_dropped(exchange, body)
            finally:  # charged and settled even if a shutdown cancels the count
                self.parts.accounting.charge(exchange)
                admission.settle_rates(exchange)
                if isinstance(exchange.meter, TranscribingMeter):
                    self.parts.accounting.screen(exchange, exchange.meter)

    def _finish(self, exchange: Exchange) -> None:
        self.parts.accounting.finish(exchange)
        if self.parts.tracing is not None:
            self.parts.tracing.end(exchange)

    async def _passthrough(
        self, exchange: Exchange, route: Route, scope: Scope, receive: Receive, send: Send
    ) -> None:
        """An allow-listed route: authenticated like the rest, relayed as is, not metered."""
        refusal = self._resolve(exchange, scope)
        self._label(exchange, self._gateway_said(scope))
        if refusal is not None:
            return await self.relays.refuse(exchange, send, refusal)
        raw = await read_body(receive, self.config.max_body_bytes, self.config.body_timeout_s)
        if isinstance(raw, Refusal):
            return await self.relays.refuse(exchange, send, raw)
        try:
            await self.relays.passthrough(Forward(exchange, route, scope, receive, send), raw)
        finally:
            self._served(exchange)

    async def _own(self, route: Route, send: Send) -> None:
        if route.path == "/healthz":
            await respond(send, 200, endpoints.HEALTHZ_BODY, list(PLAIN))
        else:
            await self._readyz(send)

    def families(self) -> list[Metric]:
        budgets = {
            name: self.parts.admission.ledger.remaining(name, tenant.budget)
            for name, tenant in self.config.tenants.items()
            if tenant.budget is not None
        }
        return [
            *self.parts.metrics.families(
                in_flight=self.parts.admission.gate.in_flight,
                waiting=self.parts.admission.gate.waiting,
                budgets=budgets,
                weights={name: tenant.weight for name, tenant in self.config.tenants.items()},
                tenant_label_values=len(self.parts.tenant_labels),
                tenant_label_folds=self.parts.tenant_labels.folded,
                value_label_folds={
                    name: labels.folded
                    for name, labels in zip(VALUE_LABELS, self.parts.value_labels, strict=True)
                },
            ),
            *self.parts.sampler.families(),
            *(self.parts.shared.families() if self.parts.shared is not None else []),
        ]

    def registry(self) -> CollectorRegistry:
        return endpoints.Families(self.families).registry()

    async def _readyz(self, send: Send) -> None:
        checked, ok, reason = self._ready
        now = time.monotonic()
        if now - checked > 1.0:
            try:
                response = await self.parts.pool.request(
                    "GET", self.config.upstream_health_path.encode(), [], b""
                )
                await response.read(1 << 16)
                ok = response.status == 200
                reason = f"engine health returned {response.status}"
            except UpstreamError as exc:
                ok, reason = False, f"engine unreachable: {exc.detail}"
            self._ready = (now, ok, reason)
        conditions = [Condition("engine", ok, "" if ok else reason)]
        if self.parts.shared is not None:
            conditions.append(self.parts.shared.readiness())
        status, body = endpoints.readiness(conditions)
        await respond(send, status, body, list(JSON))

    async def _housekeeping_loop(self) -> None:
        """Flush the access log often; release idle label slots now and then."""
        idle = min(self.config.tenant_idle_seconds, self.config.value_idle_seconds)
        evict_every = min(max(idle / 4, 0.05), 60.0)
        last_evict = time.monotonic()
        while True:
            await asyncio.sleep(min(0.25, evict_every))
            self.parts.access_log.flush()
            if self.parts.usage_log is not None:
                self.parts.usage_log.flush()
            if time.monotonic() - last_evict >= evict_every:
                last_evict = time.monotonic()
                self.evict_idle_tenants()

    def evict_idle_tenants(self) -> None:
        """Release idle tenant, model and version label slots, folding their series."""
        self.parts.metrics.fold("tenant", self.parts.tenant_labels.evict_idle())
        for name, labels in zip(VALUE_LABELS, self.parts.value_labels, strict=True):
            self.parts.metrics.fold(name, labels.evict_idle())

    async def _engine_info_loop(self) -> None:
        """Keep the engine's version (and context lengths) current for unbudgeted traffic too."""
        while True:
            await self.parts.engine.current()
            await asyncio.sleep(REFRESH_S)

    async def _reconcile_loop(self) -> None:
        while True:
            await self.reconcile_once()
            await asyncio.sleep(self.config.reconcile_interval)

    async def reconcile_once(self) -> None:
        """Read the engine's token counters and update the drift gauge."""
        errors = self.parts.metrics.reconciliation_errors
        try:
            response = await self.parts.pool.request(
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
            direct = await self.parts.direct_traffic.read()
        except DirectTrafficError as exc:
            errors[exc.reason] = errors.get(exc.reason, 0) + 1
            log_event(logger, logging.WARNING, "probe token counters unreadable", reason=exc.reason)
            return
        self.parts.metrics.drift = self.parts.reconciler.update(
            counters, self.parts.metrics.charged, direct
        )


class MetricsApp:
    """The proxy's own metrics, per-tenant series included, for its separate listen address."""

    def __init__(self, proxy: ProxyApp) -> None:
        self.proxy = proxy

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            return
        path, method = scope["path"], scope["method"].upper()
        if method not in ("GET", "HEAD"):
            await respond(send, 405, b"", [(b"allow", b"GET")])
        elif path == "/metrics":
            headers = dict(scope["headers"])
            body, reply = endpoints.encode_metrics(
                self.proxy.families(),
                headers.get(b"accept", b"").decode("latin-1"),
                headers.get(b"accept-encoding", b"").decode("latin-1"),
            )
            encoded = [(k.lower().encode(), v.encode()) for k, v in reply.items()]
            await respond(send, 200, body, encoded)
        elif path == "/healthz":
            await respond(send, 200, endpoints.HEALTHZ_BODY, list(PLAIN))
        else:
            await respond(send, 404, b"not found\n", [(b"content-type", b"text/plain")])


__all__ = ["OTHER", "MetricsApp", "ProxyApp"]
