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
never on the port clients call. This module composes the proxy and admits requests; which
handler serves a request is :mod:`routing`, forwarding and relaying :mod:`relays`, the
per-request record and its ASGI plumbing :mod:`exchange`, and what a finished request leaves
behind (charge, screening, access log) :mod:`accounting`.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from prometheus_client import CollectorRegistry
from prometheus_client.core import Metric

from inferwatch.config.schema import kind
from inferwatch.identity import or_unknown
from inferwatch.logs import log_event
from inferwatch.probes.livesample import DegeneracySampler
from inferwatch.proxy import jsoncodec
from inferwatch.proxy.accesslog import AccessLog
from inferwatch.proxy.accounting import Accounting
from inferwatch.proxy.admission import (
    BudgetLedger,
    ConcurrencyGate,
    Ledger,
    Refusal,
)
from inferwatch.proxy.config import ProxyConfig
from inferwatch.proxy.counting import PromptCounter, byte_bound, load_tokenizer
from inferwatch.proxy.engineinfo import REFRESH_S, EngineInfo
from inferwatch.proxy.exchange import (
    Exchange,
    Receive,
    Scope,
    Send,
    read_body,
)
from inferwatch.proxy.labels import OTHER, BoundedLabels, split_label
from inferwatch.proxy.metrics import IDENTITY_LABELS, ProxyMetrics
from inferwatch.proxy.ratelimit import Levels, RateLimiter
from inferwatch.proxy.reconcile import (
    DirectTraffic,
    DirectTrafficError,
    Reconciler,
    engine_token_counters,
)
from inferwatch.proxy.relays import JSON, PLAIN, Forward, Relays, respond
from inferwatch.proxy.routes import STREAMABLE, Route, Router
from inferwatch.proxy.routing import Routing
from inferwatch.proxy.sampling import TranscribingMeter, prompt_text
from inferwatch.proxy.tenants import UNKNOWN, TenantResolver
from inferwatch.proxy.upstream import Timeouts, UpstreamError, UpstreamPool
from inferwatch.proxy.usage import (
    TEMPLATE_ALLOWANCE,
    Bounds,
    UsageMeter,
    estimate_prompt_tokens,
)
from inferwatch.proxy.usagelog import UsageLog
from inferwatch.serving import endpoints
from inferwatch.serving.readiness import Condition
from inferwatch.wire import PROBE_TENANT

if TYPE_CHECKING:
    from opentelemetry.sdk.trace import TracerProvider

    from inferwatch.proxy.sharedstate import SharedLedger
    from inferwatch.proxy.tracing import RequestTracing
    from inferwatch.proxy.usagestream import UsageStream

#: the engine work a request may ask for is capped at this many choices (``n``, ``best_of``)
MAX_CHOICES = 128
#: bodies above this size are counted off the event loop when a tokenizer is configured
_COUNT_IN_THREAD_BYTES = 256 << 10
VALUE_LABELS = IDENTITY_LABELS[1:-1]  # split has a fixed handful of values
#: what the OpenAI completions API generates when a request sets no ``max_tokens``
COMPLETIONS_DEFAULT_MAX_TOKENS = 16
#: how long a dropped stream's prompt may wait for the engine's count before it is estimated
DROPPED_COUNT_TIMEOUT_S = 5.0

logger = logging.getLogger("inferwatch.proxy")


@dataclass
class Prompt:
    """A request's prompt tokens as admission knows them: exact, or an upper bound."""

    exact: bool
    tokens: int = 0


#: the body fields that cap completion tokens (chat reads the newer one where it is set)
CAP_FIELDS = ("max_completion_tokens", "max_tokens")
#: the body fields that ask for more than one choice
CHOICE_FIELDS = ("n", "best_of")


def _whole_number(body: dict[str, Any], key: str) -> int | None:
    """``body[key]`` as a count, None when unset; an integral float is rewritten as an int.

    Raises ValueError for anything else (a string, a fraction, a boolean, a negative number):
    an engine may read such a value its own way, so it is refused rather than guessed at.
    """
    value = body.get(key)
    if value is None or type(value) is int:
        number = value
    elif type(value) is float and value.is_integer():
        number = body[key] = int(value)
    else:
        raise ValueError(f"{key} must be a whole number, got {kind(value)[:60]}")
    if number is not None and number < 0:
        raise ValueError(f"{key} must be 0 or more, got {number}")
    return number


@dataclass
class Caps:
    """What a body asks the engine to generate, its counts normalised (see ``_whole_number``)."""

    #: the cap fields the body sets
    fields: list[str]
    #: the largest cap they set: whichever an engine reads, it generates no more than that
    requested: int | None
    choices: int
    #: a count was rewritten (an integral float), so the body must be sent re-encoded
    rewritten: bool


def _completion_cap(body: dict[str, Any]) -> Caps:
    """Raises ValueError for a cap or choice count that is not a whole number."""
    floats = any(type(body.get(key)) is float for key in (*CAP_FIELDS, *CHOICE_FIELDS))
    caps = {key: _whole_number(body, key) for key in CAP_FIELDS}
    fields = [key for key, value in caps.items() if value is not None]
    requested = max((caps[key] or 0 for key in fields), default=None)
    choices = max([1, *(_whole_number(body, key) or 0 for key in CHOICE_FIELDS)])
    return Caps(fields, requested, choices, floats)


def _with_headers(send: Send, extra: tuple[tuple[bytes, bytes], ...]) -> Send:
    """``send`` that adds ``extra`` to the response's headers, whatever the response is."""

    async def sending(message: Any) -> None:
        if message["type"] == "http.response.start":
            message = {**message, "headers": [*message.get("headers", ()), *extra]}
        await send(message)

    return sending


class ProxyApp:
    def __init__(
        self,
        config: ProxyConfig,
        access_log: bool = True,
        tracer_provider: TracerProvider | None = None,
    ) -> None:
        """``tracer_provider``: a span per metered request (off, and not imported, without)."""
        self.config = config
        self.tracer_provider = tracer_provider
        self.tracing: RequestTracing | None = None
        if tracer_provider is not None:
            from inferwatch.proxy.tracing import RequestTracing

            self.tracing = RequestTracing(tracer_provider)
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
        #: the fleet's books in Redis, where configured; else this process's own (the Redis
        #: client is imported only then: a proxy without shared_state loads none of it)
        self.shared: SharedLedger | None = None
        if config.shared_state is not None:
            from inferwatch.proxy.sharedstate import SharedLedger

            self.shared = SharedLedger(config)
        limits = {n: t.rate_limits for n, t in config.tenants.items() if t.rate_limits}
        self.rates = RateLimiter(limits, self.shared) if limits else None
        self.gate = ConcurrencyGate(
            config.max_concurrency,
            config.queue_timeout_s,
            config.max_queue,
            config.min_class_share,
        )
        self.reconciler = Reconciler()
        self.engine = EngineInfo(self.pool)
        self.direct_traffic = DirectTraffic(config.probe_metrics_urls)
        self.sampler = DegeneracySampler(config.quality_sample_rate)
        self.usage_log = (
            UsageLog(
                config.usage_log_dir,
                config.usage_log_rotate_bytes,
                config.usage_log_retain_files,
                errors=self.metrics.usage_log_errors,
            )
            if config.usage_log_dir
            else None
        )
        #: the usage log's Redis stream, where configured (then there are no files)
        self.usage_stream: UsageStream | None = None
        if config.usage_log_stream_maxlen:
            from inferwatch.proxy.usagestream import UsageStream

            assert self.shared is not None and config.shared_state is not None  # config's rule
            self.usage_stream = UsageStream(
                self.shared.client,
                config.shared_state.key_prefix,
                config.usage_log_stream_maxlen,
                self.shared.call_bound_s,
                errors=self.metrics.usage_log_errors,
            )
        self.accounting = Accounting(
            config,
            self.metrics,
            self.budgets,
            self.sampler,
            self.access_log,
            self.usage_log or self.usage_stream,
        )
        self._tasks: list[asyncio.Task[None]] = []
        self._ready: tuple[float, bool, str] = (0.0, False, "not checked yet")
        self._version_headers = (
            v.model_version_header.encode(),
            v.engine_version_header.encode(),
            v.prompt_version_header.encode(),
        )
        self._version_defaults = (v.model_version, v.engine_version, v.prompt_version)
        # credentials and what the gateway told the proxy never reach the engine
        stripped = {b"authorization", *(name.encode() for name in config.gateway_headers)}
        self.relays = Relays(
            config, self.pool, self.metrics, frozenset(stripped), lambda: self.draining
        )
        self.routing = Routing(
            self.router,
            metered=self._metered,
            passthrough=self._passthrough,
            own=self._own,
            refuse=self.relays.refuse,
            finish=self._finish,
            handlers=self._handlers,
        )

    @property
    def budgets(self) -> Ledger:
        """The books budgets are kept in: the fleet's shared state, or this process's."""
        return self.shared if self.shared is not None else self.ledger

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
        if self.shared is not None:
            self._tasks.append(asyncio.ensure_future(self.shared.run()))
        if self.usage_stream is not None:
            self._tasks.append(asyncio.ensure_future(self.usage_stream.run()))

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
        if self.usage_stream is not None:  # its last lines, before the client is closed
            await self.usage_stream.close()
        if self.shared is not None:
            await self.shared.aclose()
        self.access_log.flush()
        if self.usage_log is not None:
            self.usage_log.close()
        self.pool.close()
        await self.direct_traffic.aclose()
        if self.tracer_provider is not None:  # export the spans still batched
            await asyncio.to_thread(self.tracer_provider.shutdown)

    def _resolve(self, exchange: Exchange, scope: Scope) -> Refusal | None:
        client = scope.get("client")
        resolution = self.resolver.resolve(scope["headers"], client[0] if client else None)
        exchange.via = resolution.via
        if resolution.tenant is None:
            return Refusal(401, "rejected_auth", resolution.reason)
        exchange.tenant = resolution.tenant
        return None

    def _gateway_said(self, scope: Scope) -> list[tuple[bytes, bytes]]:
        """The request's headers if its peer may set the split and versions, else none."""
        client = scope.get("client")
        return scope["headers"] if self.resolver.from_gateway(client[0] if client else None) else []

    def _label(self, exchange: Exchange, headers: list[tuple[bytes, bytes]]) -> None:
        found: list[str | None] = [None, None, None]
        names = self._version_headers
        for name, value in headers:
            for index in range(3):
                if name == names[index]:
                    found[index] = value.decode("latin-1")[:128]
        model_version, engine_version, prompt_version = self._version_defaults
        defaults = (model_version, engine_version or self.engine.version, prompt_version)
        versions = tuple(
            value if value is not None else default
            for value, default in zip(found, defaults, strict=True)
        )
        exchange.versions = (versions[0], versions[1], versions[2])
        model, model_version, engine_version, prompt_version = self._values(exchange, take=False)
        exchange.identity = (
            self.tenant_labels.label(exchange.tenant),
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
            for labels, value in zip(self.value_labels, values, strict=True)
        )
        return model, model_version, engine_version, prompt_version

    def _served(self, exchange: Exchange) -> None:
        """A model or version the engine served takes a label slot, one it refused never: a
        flood of junk names answered 404 would otherwise hold every slot."""
        if 200 <= exchange.status < 400:
            tenant, *_, split = exchange.identity
            exchange.identity = (tenant, *self._values(exchange, take=True), split)

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
        try:
            asked = _completion_cap(body)  # the counts reach the engine as normalised here
            prompt = Prompt(self.counter.count_text is not byte_bound)
            prompt.tokens = await self._count(body, size)  # also the charge's ceiling
        except ValueError as exc:
            return Refusal(400, "rejected_bad_request", str(exc)), False
        requested, choices = asked.requested, asked.choices
        exchange.choices = choices
        # without a tokenizer the count is an upper bound: charge the usual estimate instead
        prompt_estimate = prompt.tokens if prompt.exact else estimate_prompt_tokens(body)
        if (
            exchange.path in STREAMABLE
            and exchange.tenant != PROBE_TENANT
            and self.sampler.should_sample()
        ):
            exchange.meter = TranscribingMeter(prompt_estimate, prompt_text(body))
        else:
            exchange.meter = UsageMeter(prompt_estimate)
        exchange.meter.prompt_counted = prompt.exact
        if config.max_input_tokens and prompt.tokens > config.max_input_tokens:
            await self._recount(exchange, body, prompt)
        if config.max_input_tokens and prompt.tokens > config.max_input_tokens:
            exchange.meter = None
            counted = "is" if prompt.exact else "may be up to"
            return Refusal(
                400,
                "rejected_too_long",
                f"prompt {counted} {prompt.tokens} tokens, over this endpoint's limit of "
                f"{config.max_input_tokens} input tokens",
            ), False
        changed = asked.rewritten
        cap, engine_applies = await self._reserved_cap(exchange, body, requested, prompt)
        # with shared state a tenant's concurrency cap is a slot in the fleet's books
        fleet_cap = tenant.max_concurrency if tenant is not None and self.shared else 0
        if tenant is not None and budget is not None:
            if choices > MAX_CHOICES:
                exchange.meter = None
                return Refusal(
                    400, "rejected_bad_request", f"at most {MAX_CHOICES} choices per request"
                ), False
            if prompt.tokens + cap * choices > self.budgets.room(exchange.tenant, budget):
                await self._recount(exchange, body, prompt)  # a bound must not refuse or clamp
                cap, engine_applies = await self._reserved_cap(exchange, body, requested, prompt)
        # what it may spend is taken from its tokens buckets with the check itself
        spend = prompt.tokens + cap * choices
        rated = self.rates is not None and self.rates.limited(exchange.tenant)
        reserving = tenant is not None and (budget is not None or fleet_cap > 0)
        # a reservation in Redis checks the shared buckets in its own script: one round trip
        merged = rated and reserving and self.shared is not None and self.shared.up
        if rated and not merged:
            assert self.rates is not None
            limited, headers, exchange.rate_taken = await self.rates.admit(
                exchange.tenant, exchange.model, spend
            )
            exchange.rate_headers = tuple(headers)
            if limited is not None:
                exchange.meter = None
                return limited, False
        if reserving:
            clamp = config.over_budget == "clamp"
            if self.shared is not None:
                reserved, levels = await self.shared.reserve(
                    exchange.tenant, budget, prompt.tokens, cap, choices, clamp, fleet_cap,
                    self.rates.buckets(exchange.tenant, exchange.model)
                    if merged and self.rates is not None
                    else (),
                    spend,
                )  # fmt: skip
                if merged and (levels is not None or not isinstance(reserved, Refusal)):
                    limited = self._rate_limited(exchange, spend, levels)
                    if limited is not None:
                        if not isinstance(reserved, Refusal):
                            self.shared.cancel(reserved, budget)
                        exchange.meter = None
                        return limited, False
            else:
                assert budget is not None  # without shared state only a budget reserves
                reserved = self.ledger.reserve(
                    exchange.tenant, budget, prompt.tokens, cap, choices, clamp
                )
            if isinstance(reserved, Refusal):
                exchange.meter = None
                return reserved, False
            exchange.reservation = reserved
            if budget is not None and (reserved.completion_cap is not None or not engine_applies):
                cap = cap if reserved.completion_cap is None else reserved.completion_cap
                for key in asked.fields or ["max_tokens"]:  # no twin left uncapped
                    body[key] = cap
                changed = engine_applies = True
        exchange.meter.bounds = Bounds(
            prompt.tokens + TEMPLATE_ALLOWANCE,
            cap * choices if engine_applies else None,
        )
        if body.get("echo") is not True:  # an echoed prompt in the reply is not completion
            exchange.meter.bounds.text_floor = self.counter.floor
        if config.max_concurrency or (tenant is not None and tenant.max_concurrency):
            limit, priority, weight = (
                (tenant.max_concurrency, tenant.priority, tenant.weight) if tenant else (0, 1, 1)
            )
            if exchange.reservation is not None and exchange.reservation.fleet_slot:
                limit = 0  # held fleet-wide already
            queued = time.perf_counter()
            refusal = await self.gate.acquire(exchange.tenant, limit, priority, weight)
            self.metrics.queued(exchange.identity[0], time.perf_counter() - queued, refusal)
            if refusal is not None:
                exchange.meter = None
                return refusal, False
            exchange.slot = "gated"
        else:
            self.gate.enter_ungated()
            exchange.slot = "counted"
        return None, changed

    def _rate_limited(
        self, exchange: Exchange, spend: int, levels: Levels | None
    ) -> Refusal | None:
        """The rate limit's verdict on a request whose shared reservation checked its buckets
        (``levels``; None: Redis could not, so this proxy's buckets decide)."""
        assert self.rates is not None
        limited, headers, exchange.rate_taken = self.rates.conclude(
            exchange.tenant, exchange.model, spend, levels
        )
        exchange.rate_headers = tuple(headers)
        return limited

    async def _recount(self, exchange: Exchange, body: dict[str, Any], prompt: Prompt) -> None:
        """Replace a prompt's upper bound by the engine's own count, where it can count it."""
        if prompt.exact:
            return
        counted = await self.engine.count(exchange.path, body)
        if counted is not None:
            prompt.tokens, prompt.exact = counted, True
            if exchange.meter is not None:
                exchange.meter.prompt_estimate = counted
                exchange.meter.prompt_counted = True

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
                counted = await self.engine.count(exchange.path, body)
                if counted is not None:
                    meter.prompt_estimate, meter.prompt_counted = counted, True

    async def _reserved_cap(
        self, exchange: Exchange, body: dict[str, Any], requested: int | None, prompt: Prompt
    ) -> tuple[int, bool]:
        """The completion cap to reserve per choice, and whether the engine applies it itself.

        A cap the client set is the engine's too. Without one, an engine that lists its
        context length (vLLM) gives completions the API's default (16) and chat the rest of the
        context after the prompt (an upper bound of the prompt leaves the whole context).
        llama.cpp runs completions to the end of its slot's context as well, and that cap is
        sent too, where a budget holds it (a server with context shift generates past it). An
        engine that says neither gets the configured default, sent: the reservation is then
        what the engine may generate, which also bounds the charge.
        """
        if exchange.path not in STREAMABLE:
            return 0, True  # embeddings generate nothing
        if requested is not None:
            return requested, True
        context = await self.engine.context(str(body.get("model", "")))
        if context is None:
            return self.config.default_max_tokens, False
        rest = max(context - (prompt.tokens if prompt.exact else 0), 0)
        if self.engine.completes_to_context:
            return rest, False
        if exchange.path == "/v1/completions":
            return COMPLETIONS_DEFAULT_MAX_TOKENS, True
        return rest, True

    async def _read_request(
        self, exchange: Exchange, scope: Scope, receive: Receive
    ) -> tuple[Refusal | None, dict[str, Any], bytes, bool]:
        """Resolve, read, parse and admit; the body (maybe changed) and whether it changed."""
        refusal = self._resolve(exchange, scope)
        if refusal is not None:
            self._label(exchange, self._gateway_said(scope))
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
        self._label(exchange, self._gateway_said(scope))
        if refusal is not None or not isinstance(body, dict):
            return refusal, {}, b"", False
        refusal, changed = await self._admit(exchange, body, len(raw))
        return refusal, body, raw, changed

    async def _metered(
        self, exchange: Exchange, route: Route, scope: Scope, receive: Receive, send: Send
    ) -> None:
        tracing = self.tracing
        if tracing is not None:
            tracing.start(exchange, scope)
        body: dict[str, Any] = {}
        try:
            refusal, body, raw, changed = await self._read_request(exchange, scope, receive)
            if exchange.rate_headers:
                send = _with_headers(send, exchange.rate_headers)
            if refusal is not None:
                return await self.relays.refuse(exchange, send, refusal)
            if tracing is not None:
                tracing.admitted(exchange)
            forward = Forward(exchange, route, scope, receive, send)
            await self.relays.forward_metered(forward, body, raw, changed)
        finally:
            if exchange.slot == "gated":
                self.gate.release(exchange.tenant)
            elif exchange.slot == "counted":
                self.gate.leave_ungated()
            self._served(exchange)
            try:
                await self._count_dropped(exchange, body)
            finally:  # charged and settled even if a shutdown cancels the count
                self.accounting.charge(exchange)
                if self.rates is not None and exchange.rate_taken is not None:
                    used = exchange.usage.total if exchange.usage is not None else 0
                    self.rates.settle(exchange.tenant, exchange.model, exchange.rate_taken, used)
                if isinstance(exchange.meter, TranscribingMeter):
                    self.accounting.screen(exchange, exchange.meter)

    def _finish(self, exchange: Exchange) -> None:
        self.accounting.finish(exchange)
        if self.tracing is not None:
            self.tracing.end(exchange)

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
            name: self.budgets.remaining(name, tenant.budget)
            for name, tenant in self.config.tenants.items()
            if tenant.budget is not None
        }
        return [
            *self.metrics.families(
                in_flight=self.gate.in_flight,
                waiting=self.gate.waiting,
                budgets=budgets,
                weights={name: tenant.weight for name, tenant in self.config.tenants.items()},
                tenant_label_values=len(self.tenant_labels),
                tenant_label_folds=self.tenant_labels.folded,
                value_label_folds={
                    name: labels.folded
                    for name, labels in zip(VALUE_LABELS, self.value_labels, strict=True)
                },
            ),
            *self.sampler.families(),
            *(self.shared.families() if self.shared is not None else []),
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
        conditions = [Condition("engine", ok, "" if ok else reason)]
        if self.shared is not None:
            conditions.append(self.shared.readiness())
        status, body = endpoints.readiness(conditions)
        await respond(send, status, body, list(JSON))

    async def _housekeeping_loop(self) -> None:
        """Flush the access log often; release idle label slots now and then."""
        idle = min(self.config.tenant_idle_seconds, self.config.value_idle_seconds)
        evict_every = min(max(idle / 4, 0.05), 60.0)
        last_evict = time.monotonic()
        while True:
            await asyncio.sleep(min(0.25, evict_every))
            self.access_log.flush()
            if self.usage_log is not None:
                self.usage_log.flush()
            if time.monotonic() - last_evict >= evict_every:
                last_evict = time.monotonic()
                self.evict_idle_tenants()

    def evict_idle_tenants(self) -> None:
        """Release idle tenant, model and version label slots, folding their series."""
        self.metrics.fold("tenant", self.tenant_labels.evict_idle())
        for name, labels in zip(VALUE_LABELS, self.value_labels, strict=True):
            self.metrics.fold(name, labels.evict_idle())

    async def _engine_info_loop(self) -> None:
        """Keep the engine's version (and context lengths) current for unbudgeted traffic too."""
        while True:
            await self.engine.current()
            await asyncio.sleep(REFRESH_S)

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
