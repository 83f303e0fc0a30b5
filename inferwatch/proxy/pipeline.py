"""Admission as one pipeline: a metered request passes its stages in order, top to bottom.

Each stage has one concern and either lets the request on (None) or refuses it:

1. :func:`measure`: the body's completion caps and choices, normalised, and the prompt's
   tokens, counted (an exact count with a tokenizer, else an upper bound); the meter that
   will charge the request;
2. :func:`limit_input`: the prompt within the endpoint's ``max_input_tokens``;
3. :func:`plan_completion`: the completion cap to reserve per choice, and the choices a
   budget may cover;
4. :func:`limit_rate`: the tenant's requests and tokens buckets. Where the ledger can check
   them in its reservation (the fleet's books, while Redis answers), it is left to it, so
   that a budgeted, rate-limited tenant's admission is one round trip;
5. :func:`reserve`: the budget (and, with the fleet's books, the tenant's concurrency slot)
   reserved in the ledger; a clamped cap is written into the body;
6. :func:`bound_meter`: what the reservation allows, as the meter's ceilings;
7. :func:`take_slot`: a slot of the concurrency gate (or the request counted in flight).

A refused request leaves no meter (nothing is charged); what a stage took before a later one
refused is given back by that stage's own code: a reservation refused its rate limit is
cancelled, and ending the request (:meth:`Admission.release`, accounting's settlement)
releases the rest.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field
from typing import Any

from inferwatch.config.schema import kind
from inferwatch.probes.livesample import DegeneracySampler
from inferwatch.proxy.admission import ConcurrencyGate, Ledger, Refusal
from inferwatch.proxy.config import Budget, ProxyConfig, Tenant
from inferwatch.proxy.counting import PromptCounter, byte_bound
from inferwatch.proxy.engineinfo import EngineInfo
from inferwatch.proxy.exchange import Exchange
from inferwatch.proxy.metrics import ProxyMetrics
from inferwatch.proxy.ratelimit import Bucket, Levels, RateLimiter
from inferwatch.proxy.routes import STREAMABLE
from inferwatch.proxy.sampling import TranscribingMeter, prompt_text
from inferwatch.proxy.usage import (
    TEMPLATE_ALLOWANCE,
    Bounds,
    UsageMeter,
    estimate_prompt_tokens,
)
from inferwatch.wire import PROBE_TENANT

#: the engine work a request may ask for is capped at this many choices (``n``, ``best_of``)
MAX_CHOICES = 128
#: bodies above this size are counted off the event loop when a tokenizer is configured
COUNT_IN_THREAD_BYTES = 256 << 10
#: what the OpenAI completions API generates when a request sets no ``max_tokens``
COMPLETIONS_DEFAULT_MAX_TOKENS = 16
#: the body fields that cap completion tokens (chat reads the newer one where it is set)
CAP_FIELDS = ("max_completion_tokens", "max_tokens")
#: the body fields that ask for more than one choice
CHOICE_FIELDS = ("n", "best_of")


@dataclass
class Prompt:
    """A request's prompt tokens as admission knows them: exact, or an upper bound."""

    exact: bool
    tokens: int = 0


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


def completion_caps(body: dict[str, Any]) -> Caps:
    """Raises ValueError for a cap or choice count that is not a whole number."""
    floats = any(type(body.get(key)) is float for key in (*CAP_FIELDS, *CHOICE_FIELDS))
    caps = {key: _whole_number(body, key) for key in CAP_FIELDS}
    fields = [key for key, value in caps.items() if value is not None]
    requested = max((caps[key] or 0 for key in fields), default=None)
    choices = max([1, *(_whole_number(body, key) or 0 for key in CHOICE_FIELDS)])
    return Caps(fields, requested, choices, floats)


@dataclass(frozen=True)
class Admitted:
    """A request let through every stage."""

    #: the body was changed (a count normalised, a completion cap set): send it re-encoded
    changed: bool


#: the two answers of an admitted request, made once rather than per request
_AS_SENT, _CHANGED = Admitted(False), Admitted(True)


@dataclass(slots=True)
class Admitting:
    """One request on its way through the stages: what the stages before have found."""

    exchange: Exchange
    body: dict[str, Any]
    #: the body's size in bytes, as received
    size: int
    #: the tenant's configuration (None: a tenant the config does not list)
    tenant: Tenant | None
    budget: Budget | None
    caps: Caps = field(init=False)
    prompt: Prompt = field(init=False)
    #: the completion cap per choice to reserve, and whether the engine applies it itself
    cap: int = 0
    engine_applies: bool = True
    #: what the request may spend: its prompt plus its cap times its choices
    spend: int = 0
    changed: bool = False
    #: the rate buckets the ledger checks with its reservation (None: not left to it)
    rate_buckets: list[Bucket] | None = None

    @property
    def fleet_cap(self) -> int:
        """The tenant's concurrency cap, where a reservation holds it (0: none)."""
        return self.tenant.max_concurrency if self.tenant is not None else 0

    def reserving(self, ledger: Ledger) -> bool:
        """Whether the request reserves in ``ledger``: a budget, or a fleet-wide slot."""
        return self.tenant is not None and (
            self.budget is not None or (ledger.holds_slots and self.fleet_cap > 0)
        )


#: a stage: None lets the request on to the next, a refusal ends its admission
Stage = Callable[["Admission", Admitting], Awaitable[Refusal | None]]


class Admission:
    """Admits a metered request through its stages (see the module docstring).

    The stages read their collaborators from here: the prompt counter, the engine (its
    context lengths, its own prompt counts), the budget ledger, the rate limiter (None: no
    tenant is rate-limited), the concurrency gate and the queue metrics."""

    def __init__(
        self,
        config: ProxyConfig,
        counter: PromptCounter,
        engine: EngineInfo,
        sampler: DegeneracySampler,
        ledger: Ledger,
        rates: RateLimiter | None,
        gate: ConcurrencyGate,
        metrics: ProxyMetrics,
    ) -> None:
        self.config = config
        self.counter = counter
        self.engine = engine
        self.sampler = sampler
        self.ledger = ledger
        self.rates = rates
        self.gate = gate
        self.metrics = metrics
        stages: list[Stage] = [measure]
        if config.max_input_tokens:
            stages.append(limit_input)
        stages.append(plan_completion)
        if rates is not None:
            stages.append(limit_rate)
        stages += [reserve, bound_meter, take_slot]
        #: run in this order; a stage with nothing to check in this config is left out
        self.stages: tuple[Stage, ...] = tuple(stages)

    async def admit(
        self, exchange: Exchange, body: dict[str, Any], size: int
    ) -> Admitted | Refusal:
        """Run the stages; a refused request is left with no meter."""
        tenant = self.config.tenants.get(exchange.tenant)
        request = Admitting(exchange, body, size, tenant, tenant.budget if tenant else None)
        for stage in self.stages:
            refusal = await stage(self, request)
            if refusal is not None:
                exchange.meter = None
                return refusal
        return _CHANGED if request.changed else _AS_SENT

    def release(self, exchange: Exchange) -> None:
        """Give back the slot (or the count in flight) :func:`take_slot` took."""
        if exchange.slot == "gated":
            self.gate.release(exchange.tenant)
        elif exchange.slot == "counted":
            self.gate.leave_ungated()

    def settle_rates(self, exchange: Exchange) -> None:
        """Give the tenant's tokens buckets what the request took and did not use (or take
        what it used beyond)."""
        if self.rates is not None and exchange.rate_taken is not None:
            used = exchange.usage.total if exchange.usage is not None else 0
            self.rates.settle(exchange.tenant, exchange.model, exchange.rate_taken, used)

    async def count(self, body: dict[str, Any], size: int) -> int:
        """Prompt tokens of ``body``; a big body meets a real tokenizer off the event loop."""
        if size > COUNT_IN_THREAD_BYTES and self.counter.count_text is not byte_bound:
            return await asyncio.to_thread(self.counter.count, body)
        return self.counter.count(body)

    async def recount(self, request: Admitting) -> None:
        """Replace a prompt's upper bound by the engine's own count, where it can count it:
        a bound must not refuse or clamp a request its exact count would let through."""
        prompt = request.prompt
        if prompt.exact:
            return
        exchange = request.exchange
        counted = await self.engine.count(exchange.path, request.body)
        if counted is not None:
            prompt.tokens, prompt.exact = counted, True
            if exchange.meter is not None:
                exchange.meter.prompt_estimate = counted
                exchange.meter.prompt_counted = True

    async def reserved_cap(self, request: Admitting) -> tuple[int, bool]:
        """The completion cap to reserve per choice, and whether the engine applies it itself.

        A cap the client set is the engine's too. Without one, an engine that lists its
        context length (vLLM) gives completions the API's default (16) and chat the rest of
        the context after the prompt (an upper bound of the prompt leaves the whole context).
        llama.cpp runs completions to the end of its slot's context as well, and that cap is
        sent too, where a budget holds it (a server with context shift generates past it). An
        engine that says neither gets the configured default, sent: the reservation is then
        what the engine may generate, which also bounds the charge.
        """
        path = request.exchange.path
        if path not in STREAMABLE:
            return 0, True  # embeddings generate nothing
        if request.caps.requested is not None:
            return request.caps.requested, True
        context = await self.engine.context(str(request.body.get("model", "")))
        if context is None:
            return self.config.default_max_tokens, False
        prompt = request.prompt
        rest = max(context - (prompt.tokens if prompt.exact else 0), 0)
        if self.engine.completes_to_context:
            return rest, False
        if path == "/v1/completions":
            return COMPLETIONS_DEFAULT_MAX_TOKENS, True
        return rest, True

    def conclude_rate(self, request: Admitting, levels: Levels | None) -> Refusal | None:
        """The rate limit's verdict on a request whose reservation checked its buckets
        (``levels``; None: Redis could not, so this proxy's buckets decide)."""
        assert self.rates is not None
        exchange = request.exchange
        limited, headers, exchange.rate_taken = self.rates.conclude(
            exchange.tenant, exchange.model, request.spend, levels
        )
        exchange.rate_headers = tuple(headers)
        return limited


# ---------------------------------------------------------------------------- the stages
async def measure(admission: Admission, request: Admitting) -> Refusal | None:
    """Normalise the caps and choices, count the prompt (also the charge's ceiling) and give
    the request its meter: a sampled share of chat and completions is transcribed."""
    body, exchange = request.body, request.exchange
    try:
        request.caps = completion_caps(body)  # the counts reach the engine as normalised here
        prompt = request.prompt = Prompt(admission.counter.count_text is not byte_bound)
        prompt.tokens = await admission.count(body, request.size)
    except ValueError as exc:
        return Refusal(400, "rejected_bad_request", str(exc))
    exchange.choices = request.caps.choices
    request.changed = request.caps.rewritten
    # without a tokenizer the count is an upper bound: charge the usual estimate instead
    estimate = prompt.tokens if prompt.exact else estimate_prompt_tokens(body)
    if (
        exchange.path in STREAMABLE
        and exchange.tenant != PROBE_TENANT
        and admission.sampler.should_sample()
    ):
        exchange.meter = TranscribingMeter(estimate, prompt_text(body))
    else:
        exchange.meter = UsageMeter(estimate)
    exchange.meter.prompt_counted = prompt.exact
    return None


async def limit_input(admission: Admission, request: Admitting) -> Refusal | None:
    """Refuse a prompt over ``max_input_tokens``, counted by the engine first where the
    count is only a bound."""
    limit, prompt = admission.config.max_input_tokens, request.prompt
    if prompt.tokens > limit:
        await admission.recount(request)
    if prompt.tokens <= limit:
        return None
    counted = "is" if prompt.exact else "may be up to"
    return Refusal(
        400,
        "rejected_too_long",
        f"prompt {counted} {prompt.tokens} tokens, over this endpoint's limit of "
        f"{limit} input tokens",
    )


async def plan_completion(admission: Admission, request: Admitting) -> Refusal | None:
    """Choose the completion cap to reserve; a budget covers at most :data:`MAX_CHOICES`
    choices, and a prompt's bound that would not fit it is counted exactly first."""
    cap, request.engine_applies = await admission.reserved_cap(request)
    choices, budget = request.caps.choices, request.budget
    if budget is not None:
        if choices > MAX_CHOICES:
            return Refusal(
                400, "rejected_bad_request", f"at most {MAX_CHOICES} choices per request"
            )
        room = admission.ledger.room(request.exchange.tenant, budget)
        if request.prompt.tokens + cap * choices > room:
            await admission.recount(request)
            cap, request.engine_applies = await admission.reserved_cap(request)
    request.cap = cap
    # what it may spend is taken from its tokens buckets with the check itself
    request.spend = request.prompt.tokens + cap * choices
    return None


async def limit_rate(admission: Admission, request: Admitting) -> Refusal | None:
    """Check (and take from) the tenant's rate buckets; a ledger that can check them in its
    own reservation is left to, one round trip for both."""
    rates, exchange = admission.rates, request.exchange
    assert rates is not None  # the stage is there only with rate limits
    if not rates.limited(exchange.tenant):
        return None
    if admission.ledger.checks_rates and request.reserving(admission.ledger):
        request.rate_buckets = rates.buckets(exchange.tenant, exchange.model)
        return None
    limited, headers, exchange.rate_taken = await rates.admit(
        exchange.tenant, exchange.model, request.spend
    )
    exchange.rate_headers = tuple(headers)
    return limited


async def reserve(admission: Admission, request: Admitting) -> Refusal | None:
    """Reserve what the request may spend (clamping its cap where ``over_budget`` allows)
    and its fleet-wide slot; the rate check left to the ledger concludes here, and a
    reservation it refuses is cancelled."""
    ledger = admission.ledger
    if not request.reserving(ledger):
        return None
    exchange, budget, caps = request.exchange, request.budget, request.caps
    buckets = request.rate_buckets
    reserved, levels = await ledger.reserve(
        exchange.tenant,
        budget,
        request.prompt.tokens,
        request.cap,
        caps.choices,
        admission.config.over_budget == "clamp",
        request.fleet_cap if ledger.holds_slots else 0,
        buckets or (),
        request.spend,
    )
    if buckets is not None and (levels is not None or not isinstance(reserved, Refusal)):
        limited = admission.conclude_rate(request, levels)
        if limited is not None:
            if not isinstance(reserved, Refusal):
                ledger.cancel(reserved, budget)
            return limited
    if isinstance(reserved, Refusal):
        return reserved
    exchange.reservation = reserved
    if budget is not None and (reserved.completion_cap is not None or not request.engine_applies):
        if reserved.completion_cap is not None:
            request.cap = reserved.completion_cap
        for key in caps.fields or ["max_tokens"]:  # no twin left uncapped
            request.body[key] = request.cap
        request.changed = request.engine_applies = True
    return None


async def bound_meter(admission: Admission, request: Admitting) -> Refusal | None:
    """Give the meter its ceilings: the prompt's count, and the cap the engine applies."""
    meter = request.exchange.meter
    assert meter is not None  # measured
    meter.bounds = Bounds(
        request.prompt.tokens + TEMPLATE_ALLOWANCE,
        request.cap * request.caps.choices if request.engine_applies else None,
    )
    if request.body.get("echo") is not True:  # an echoed prompt in the reply is not completion
        meter.bounds.text_floor = admission.counter.floor
    return None


async def take_slot(admission: Admission, request: Admitting) -> Refusal | None:
    """Wait for a concurrency slot where a cap applies (a fleet-wide slot reserved already
    stands for the tenant's own cap); else count the request in flight."""
    exchange, tenant, gate = request.exchange, request.tenant, admission.gate
    if not (admission.config.max_concurrency or (tenant is not None and tenant.max_concurrency)):
        gate.enter_ungated()
        exchange.slot = "counted"
        return None
    limit, priority, weight = (
        (tenant.max_concurrency, tenant.priority, tenant.weight) if tenant else (0, 1, 1)
    )
    if exchange.reservation is not None and exchange.reservation.fleet_slot:
        limit = 0  # held fleet-wide already
    queued = time.perf_counter()
    refusal = await gate.acquire(exchange.tenant, limit, priority, weight)
    admission.metrics.queued(exchange.identity[0], time.perf_counter() - queued, refusal)
    if refusal is None:
        exchange.slot = "gated"
    return refusal
