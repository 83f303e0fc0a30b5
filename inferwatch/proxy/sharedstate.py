"""Tenant budgets kept in the fleet's Redis, so that every proxy replica enforces one budget.

Admission reserves in Redis (prompt plus completion cap, clamped or refused exactly as a
single proxy does, see :mod:`admission`), settling charges the actual usage and releases the
hold. Every hold carries a lease that this proxy renews while the request runs; the holds of
a proxy that died (``kill -9``, a lost node) expire with their lease and return to the room.
A restarted proxy starts with nothing of its own: the window lives in Redis.

While Redis is unreachable or slower than ``timeout`` a tenant's ``failure_policy`` decides:
``fail_closed`` refuses its budgeted requests (503), ``fail_open`` admits them against a
local bound, this proxy's 1/N share of the room Redis last reported and at most 1/N² of the
budget, N being the live proxies Redis last counted through their heartbeats (or
``expected_replicas`` when more): N proxies then spend at most the budget times (1 + 1/N).
What is charged meanwhile is journaled (:mod:`journal`) and replayed once Redis answers
again, before it is used again, so the books lose no token.
"""

from __future__ import annotations

import asyncio
import itertools
import logging
import math
import re
import time
import uuid
from collections.abc import Coroutine, Sequence
from dataclasses import dataclass
from typing import Any

from prometheus_client.core import Metric

from inferwatch import catalog
from inferwatch.logs import log_event
from inferwatch.proxy import journal, ratelimit
from inferwatch.proxy.admission import BudgetLedger, Refusal, Reservation, budget_refusal
from inferwatch.proxy.config import Budget, ProxyConfig
from inferwatch.proxy.journal import Entry, Journal
from inferwatch.proxy.ratelimit import Bucket, Levels, need, take
from inferwatch.proxy.sharedbooks import Books, Reserved, Window, damaged
from inferwatch.proxy.sharedconfig import FailurePolicy, SharedState
from inferwatch.serving.readiness import Condition

try:
    import redis.asyncio as aioredis
    from redis.asyncio.cluster import ClusterNode, RedisCluster
    from redis.asyncio.sentinel import Sentinel
    from redis.backoff import NoBackoff
    from redis.connection import HiredisRespSerializer
    from redis.exceptions import RedisError
    from redis.retry import Retry
    from redis.utils import HIREDIS_AVAILABLE
except ImportError:  # the redis extra is not installed: only a shared_state config needs it
    aioredis = None  # type: ignore[assignment]
    HIREDIS_AVAILABLE = False

#: whether redis-py (the ``redis`` extra) is installed: the CLI refuses ``shared_state`` without
AVAILABLE = aioredis is not None

logger = logging.getLogger("inferwatch.proxy")
#: connections to Redis per proxy: each script takes well under a millisecond, so a few
#: carry thousands of requests a second, and a burst queues for one instead of opening
#: hundreds of connections at once
MAX_CONNECTIONS = 16
#: a whole call (waiting for a connection, connecting, the reply) takes at most this many
#: ``timeout``s before Redis counts as down
CALL_BOUND = 3


@dataclass(frozen=True)
class SharedReservation(Reservation):
    #: its id in Redis ("" : taken against the local bound while Redis was down)
    hold: str = ""
    window_ms: int = 0


_NODE = re.compile(r"^(\[[^\]]+\]|[^:\[\]]+)(?::(\d+))?$")


def _nodes(spec: str, default_port: int) -> list[tuple[str, int]]:
    """``host[:port],...`` (IPv6 hosts in brackets) as (host, port) pairs."""
    nodes = []
    for node in spec.split(","):
        match = _NODE.match(node)
        if match is None:
            raise ValueError(f"shared_state.url: {node!r} is not host[:port]")
        host, port = match.groups()
        nodes.append((host.strip("[]"), int(port) if port else default_port))
    return nodes


def connect(shared: SharedState) -> tuple[Any, list[Any]]:
    """A redis-py asyncio client for the URL (plain, Sentinel's master, or a Cluster), and
    the other clients it uses, to close with it (Sentinel's own connections).

    No retries inside the client: a call that fails or takes over ``timeout`` fails at once,
    and the failure policy takes over."""
    if aioredis is None:
        raise ValueError("shared_state needs the redis package (pip install 'inferwatch[redis]')")
    options: dict[str, Any] = dict(
        password=shared.password,
        socket_timeout=shared.timeout_s,
        socket_connect_timeout=shared.timeout_s,
        retry=Retry(NoBackoff(), 0),
    )
    kind, url = shared.kind, shared.url
    if kind == "sentinel":
        nodes, service, *db = url.removeprefix("redis+sentinel://").split("/")
        sentinel = Sentinel(  # type: ignore[no-untyped-call]
            _nodes(nodes, 26379),
            sentinel_kwargs={"socket_timeout": shared.timeout_s, "password": shared.password},
            **options,
        )
        return sentinel.master_for(service, db=int(db[0]) if db else 0), sentinel.sentinels
    if kind == "cluster":
        nodes = url.removeprefix("redis+cluster://")
        cluster = RedisCluster(
            startup_nodes=[ClusterNode(host, port) for host, port in _nodes(nodes, 6379)],
            max_connections=MAX_CONNECTIONS,
            **options,
        )
        return cluster, []
    pool = aioredis.BlockingConnectionPool.from_url(
        url, max_connections=MAX_CONNECTIONS, timeout=shared.timeout_s * CALL_BOUND, **options
    )
    if HIREDIS_AVAILABLE:
        pool.connection_class = type(
            pool.connection_class.__name__, (_HiredisPacking, pool.connection_class), {}
        )
    return aioredis.Redis.from_pool(pool), []  # closing the client closes the pool


class _HiredisPacking:
    """Commands packed by hiredis, as redis-py's own synchronous client does: its asyncio
    connections pack every argument in Python, the largest part of a script call's cost."""

    _serializer = HiredisRespSerializer() if HIREDIS_AVAILABLE else None

    def pack_command(self, *args: Any) -> list[bytes]:
        assert self._serializer is not None
        packed: list[bytes] = self._serializer.pack(*args)
        return packed


#: a damaged tenant's refusal says when to look again: an operator must repair its keys first
DAMAGED_RETRY_S = 30


def _reason(exc: BaseException) -> str:
    name = type(exc).__name__
    return "timeout" if "Timeout" in name else "connection" if "Connection" in name else "error"


class SharedLedger:
    """Budgets in Redis with a local fail-open bound (see the module docstring).

    A :class:`~inferwatch.proxy.admission.Ledger`: ``room`` and ``remaining`` from what
    Redis last said; :meth:`reserve` holds a tenant's fleet-wide concurrency slot too, and
    checks its rate buckets in the same script while Redis answers."""

    holds_slots = True

    def __init__(self, config: ProxyConfig) -> None:
        shared = config.shared_state
        assert shared is not None
        self.shared = shared
        self.tenants = config.tenants
        self.client, self._also = connect(shared)
        self.books = Books(self.client, shared.key_prefix, pipelines=shared.kind != "cluster")
        self.proxy = uuid.uuid4().hex[:12]
        self.lease_ms = round(shared.lease_s * 1000)
        #: longest a whole call may take, waiting for a connection included
        self.call_bound_s = shared.timeout_s * CALL_BOUND
        self.local = BudgetLedger()
        self.journal = Journal(
            shared.journal_dir,
            self.proxy,
            lambda entry: journal.fault(entry, self.tenants, round(time.time() * 1000)),
        )
        #: whether the last call reached Redis (and the journal has been replayed since)
        self.up = True
        #: live proxies Redis counted at the last heartbeat
        self.replicas = 0
        self.errors: dict[str, int] = {}
        #: tenants whose keys a script failed on, logged once until a script succeeds again
        self._broken: set[str] = set()
        self._seen: dict[str, Window] = {}
        #: this proxy's holds in Redis per tenant, each with when it was taken (monotonic)
        self._holds: dict[str, dict[str, float]] = {}
        self._sequence = itertools.count()
        self._writes: set[asyncio.Task[Any]] = set()
        self._down_since = 0.0

    # ------------------------------------------------------------------ admission
    @property
    def checks_rates(self) -> bool:
        """Redis checks the rate buckets in the reservation's script only while it answers."""
        return self.up

    def policy(self, tenant: str) -> FailurePolicy:
        configured = self.tenants.get(tenant)
        own = configured.failure_policy if configured is not None else None
        return own or self.shared.failure_policy

    def room(self, tenant: str, budget: Budget) -> int:
        """Room as Redis last reported it (the whole budget before it reported anything of
        this window): a hint for whether to count a bounded prompt exactly first, as the
        local ledger's room is; :meth:`reserve` decides."""
        seen = self._current(tenant, budget)
        used = seen.used + seen.reserved if seen else 0
        return budget.tokens + budget.tolerance - used

    def remaining(self, tenant: str, budget: Budget) -> int:
        seen = self._current(tenant, budget)
        return max(budget.tokens - (seen.used if seen else 0), 0)

    def _current(self, tenant: str, budget: Budget) -> Window | None:
        """What Redis last said of the tenant's window, if that window is still the current."""
        seen = self._seen.get(tenant)
        window_ms = round(budget.window_seconds * 1000)
        now_ms = time.time() * 1000
        if seen is None or seen.start_ms != now_ms - now_ms % window_ms:
            return None
        return seen

    async def reserve(
        self,
        tenant: str,
        budget: Budget | None,
        prompt: int,
        completion_cap: int,
        choices: int = 1,
        clamp: bool = True,
        most: int = 0,
        rate: Sequence[Bucket] = (),
        rate_tokens: int = 0,
    ) -> tuple[Reservation | Refusal, Levels | None]:
        """Reserve against the tenant's budget (if it has one) and, with ``most``, take one
        of its ``most`` concurrency slots, fleet-wide, after letting the request in against
        its shared ``rate`` buckets (taking ``rate_tokens`` from the tokens buckets): one
        script, one round trip. Also returns the buckets' levels, None where Redis did not
        read them (down, or the tenant's keys damaged)."""
        window_ms = round(budget.window_seconds * 1000) if budget is not None else 0
        if not self.up:
            return self._reserve_down(tenant, budget, prompt, completion_cap, choices, clamp), None
        hold = f"{self.proxy}:{next(self._sequence)}"
        call = asyncio.ensure_future(
            self.books.reserve(
                tenant,
                hold,
                window_ms,
                budget.tokens + budget.tolerance if budget is not None else 0,
                prompt,
                completion_cap,
                choices,
                clamp,
                self.lease_ms,
                most,
                [(b.key(), b.capacity, need(b), take(b, rate_tokens)) for b in rate],
            )
        )

        def give_back(done: asyncio.Future[Reserved]) -> None:
            self._give_back(done, tenant, hold, window_ms, rate, rate_tokens)

        try:
            async with asyncio.timeout(self.call_bound_s):
                reserved = await asyncio.shield(call)
        except asyncio.CancelledError:
            call.add_done_callback(give_back)
            raise
        except (RedisError, OSError, TimeoutError) as exc:
            call.add_done_callback(give_back)
            if damaged(exc):
                return self._damaged(tenant, exc), None
            self._down(exc)
            return self._reserve_down(tenant, budget, prompt, completion_cap, choices, clamp), None
        window = reserved.window
        self._seen[tenant] = window
        self._broken.discard(tenant)
        levels = Levels(reserved.rate_admitted, reserved.rate_levels, reserved.rate_wait_s)
        if not levels.admitted:
            return ratelimit.refusal(levels), levels
        if reserved.at_cap:
            return Refusal(
                429,
                "rejected_concurrency",
                f"tenant already has {window.in_flight} requests in flight or queued across "
                f"the fleet (limit {most})",
                1,
            ), levels
        if not reserved.admitted:
            assert budget is not None  # the only other refusal is the budget's
            retry_after = max(1, math.ceil((window.start_ms + window_ms - window.now_ms) / 1000))
            return budget_refusal(
                budget,
                prompt,
                completion_cap * choices,
                window.used,
                window.reserved,
                retry_after,
            ), levels
        self._holds.setdefault(tenant, {})[hold] = time.monotonic()
        cap = reserved.cap
        return SharedReservation(
            tenant,
            window.start_ms / 1000,
            prompt + cap * choices if budget is not None else 0,
            cap if cap != completion_cap else None,
            fleet_slot=most > 0,
            hold=hold,
            window_ms=window_ms,
        ), levels

    def _damaged(self, tenant: str, exc: BaseException) -> Refusal:
        """Count (and log, once until it heals) a tenant whose keys a script cannot use: its
        fault alone, so Redis stays up for every other tenant; its request is refused."""
        self.errors["books"] = self.errors.get("books", 0) + 1
        if tenant not in self._broken:
            self._broken.add(tenant)
            log_event(
                logger,
                logging.ERROR,
                "a tenant's books in the shared state are damaged: its requests are refused "
                "until an operator repairs its keys",
                tenant=tenant,
                keys=f"{self.shared.key_prefix}:{{{tenant}}}:*",
                error=str(exc),
            )
        return Refusal(
            503,
            "rejected_shared_state",
            "the tenant's books in the fleet's shared state are damaged (a key of the wrong "
            "type or a field that is no number); an operator must repair them",
            DAMAGED_RETRY_S,
        )

    def _reserve_down(
        self,
        tenant: str,
        budget: Budget | None,
        prompt: int,
        completion_cap: int,
        choices: int,
        clamp: bool,
    ) -> Reservation | Refusal:
        """What the tenant's failure policy admits while Redis cannot answer."""
        if budget is None:  # only a slot: this proxy's gate holds the cap meanwhile
            return SharedReservation(tenant, 0.0, 0)
        if self.policy(tenant) == "fail_closed":
            return Refusal(
                503,
                "rejected_shared_state",
                "the tenant's budget is kept in the fleet's shared state, unreachable now; "
                "retry shortly",
                1,
            )
        share = self.local_bound(tenant, budget)
        reserved = self.local.claim(tenant, share, prompt, completion_cap, choices, clamp)
        if isinstance(reserved, Refusal):
            return reserved
        return SharedReservation(
            reserved.tenant,
            reserved.window,
            reserved.tokens,
            reserved.completion_cap,
            window_ms=round(budget.window_seconds * 1000),
        )

    def live_replicas(self) -> int:
        return max(self.replicas, self.shared.expected_replicas, 1)

    def local_bound(self, tenant: str, budget: Budget) -> Budget:
        """This proxy's share while Redis is down: 1/N of the room Redis last reported, and
        at most 1/N² of the budget. The room it last saw may be long stale (all of it, if it
        never saw the tenant this window) while the others spent it; with each of N proxies
        held to 1/N² the fleet spends at most 1/N of the budget beyond it, whatever each saw."""
        replicas = self.live_replicas()
        room = max(self.room(tenant, budget), 0)
        limit = budget.tokens + budget.tolerance
        return Budget(min(room // replicas, limit // replicas**2), budget.window_seconds)

    # ------------------------------------------------------------------ settling
    def settle(self, reservation: Reservation, budget: Budget | None, tokens: int) -> None:
        """Release a reservation (its tokens, its concurrency slot) and charge its usage: in
        Redis, or journaled while down."""
        if not isinstance(reservation, SharedReservation):
            raise TypeError("a shared ledger settles only its own reservations")
        hold = reservation.hold
        if hold:
            self._holds.get(reservation.tenant, {}).pop(hold, None)
        elif budget is not None:
            self.local.settle(reservation, budget, tokens)
        else:
            return  # a slot this proxy's gate held while Redis was down: nothing in Redis
        now_ms = round(time.time() * 1000)
        window_ms = reservation.window_ms
        entry = Entry(
            id=hold or uuid.uuid4().hex,
            tenant=reservation.tenant,
            hold=hold,
            window_ms=reservation.window_ms,
            spent_in_ms=now_ms - now_ms % window_ms if window_ms else -1,
            tokens=tokens,
        )
        if not self.up:
            self.journal.write(entry)
            return
        self._spawn(self._settle(entry))

    def cancel(self, reservation: Reservation, budget: Budget | None) -> None:
        """Give back, charging nothing, a reservation whose request was refused after all
        (by a rate limit this proxy checked because Redis could not)."""
        if not isinstance(reservation, SharedReservation):
            raise TypeError("a shared ledger cancels only its own reservations")
        if reservation.hold:
            self._holds.get(reservation.tenant, {}).pop(reservation.hold, None)
            self._spawn(self._release(reservation.tenant, reservation.hold, reservation.window_ms))
        elif budget is not None:
            self.local.settle(reservation, budget, 0)

    async def _settle(self, entry: Entry) -> None:
        """Settle in Redis (settlements of one turn of the loop share a round trip, see
        :class:`Books`); one whose reply is lost is journaled, and its replay, keyed by the
        reservation, charges nothing if the first one ran."""
        try:
            async with asyncio.timeout(self.call_bound_s):
                window = await self.books.settle(
                    entry.tenant, entry.hold, entry.window_ms, entry.tokens
                )
        except (RedisError, OSError, TimeoutError) as exc:
            if damaged(exc):  # kept nowhere: its replay would fail on the same keys
                self._damaged(entry.tenant, exc)
                return
            self._down(exc)
            self.journal.write(entry)
            return
        if window is not None:
            self._seen[entry.tenant] = window

    def _give_back(
        self,
        call: asyncio.Future[Reserved],
        tenant: str,
        hold: str,
        window_ms: int,
        rate: Sequence[Bucket],
        rate_tokens: int,
    ) -> None:
        """A reservation its request stopped waiting for (the client left, or Redis took
        too long) holds for nobody: release it. A call that failed may still have run on the
        server (a reply lost to a timeout), so it is released too; releasing a hold that
        does not exist changes nothing. The tokens its rate check took go back only when its
        reply says it took them (giving back what was never taken would credit the tenant)."""
        answered = not call.cancelled() and call.exception() is None
        if not answered or call.result().admitted:
            self._spawn(self._release(tenant, hold, window_ms))
        if rate and answered and call.result().rate_admitted:
            self.charge_rate(tenant, list(rate), -rate_tokens)

    async def _release(self, tenant: str, hold: str, window_ms: int) -> None:
        """Give back a hold its request never used; if Redis is down, its lease will."""
        try:
            async with asyncio.timeout(self.call_bound_s):
                await self.books.settle(tenant, hold, window_ms, 0)
        except (RedisError, OSError, TimeoutError):
            pass

    async def _replay(self, entry: Entry) -> None:
        try:
            async with asyncio.timeout(self.call_bound_s):
                await self.books.settle(
                    entry.tenant,
                    entry.hold,
                    entry.window_ms,
                    entry.tokens,
                    entry.spent_in_ms,
                    entry.id,
                )
        except RedisError as exc:
            if not damaged(exc):
                raise  # Redis itself: the entry stays for the next replay
            self._damaged(entry.tenant, exc)

    def _spawn(self, work: Coroutine[Any, Any, None]) -> None:
        task = asyncio.ensure_future(work)
        self._writes.add(task)
        task.add_done_callback(self._writes.discard)

    # ------------------------------------------------------------------ rate limits
    async def take_rate(
        self, tenant: str, found: list[Bucket], tokens: int
    ) -> Levels | Refusal | None:
        """Let a request that may spend ``tokens`` in against the shared buckets, taking
        them in the same script; None while Redis cannot answer."""
        if not self.up:
            return None
        asked = [(b.key(), b.capacity, need(b), take(b, tokens)) for b in found]
        try:
            async with asyncio.timeout(self.call_bound_s):
                admitted, wait_ms, levels = await self.books.rate(tenant, asked, charge=False)
        except (RedisError, OSError, TimeoutError) as exc:
            if damaged(exc):
                return self._damaged(tenant, exc)
            self._down(exc)
            return None
        return Levels(admitted, tuple(levels), wait_ms / 1000)

    def charge_rate(self, tenant: str, found: list[Bucket], tokens: int) -> bool:
        """Take ``tokens`` more (below 0: give back) from the shared tokens buckets; False
        while down."""
        if not self.up:
            return False
        charged = [(b.key(), b.capacity, 0.0, float(tokens)) for b in found if b.kind == "tokens"]

        async def charge() -> None:
            try:
                async with asyncio.timeout(self.call_bound_s):
                    await self.books.rate(tenant, charged, charge=True)
            except (RedisError, OSError, TimeoutError) as exc:
                if damaged(exc):
                    self._damaged(tenant, exc)
                    return
                self._down(exc)

        self._spawn(charge())
        return True

    # ------------------------------------------------------------------ health
    def _down(self, exc: BaseException) -> None:
        reason = _reason(exc)
        self.errors[reason] = self.errors.get(reason, 0) + 1
        if self.up:
            self.up = False
            self._down_since = time.monotonic()
            log_event(
                logger,
                logging.ERROR,
                "shared state unreachable: budgets fall back to each tenant's failure policy",
                reason=reason,
                error=str(exc) or type(exc).__name__,
                replicas=self.live_replicas(),
            )

    async def run(self) -> None:
        """Heartbeat, renew this proxy's leases, and come back (journal first) when Redis does."""
        interval = self.shared.lease_s / 3
        while True:
            await self.tick()
            await asyncio.sleep(interval)

    async def tick(self) -> None:
        try:
            async with asyncio.timeout(self.call_bound_s):
                self.replicas = await self.books.heartbeat(self.proxy, self.lease_ms)
            if not self.up or self.journal.has_entries():
                await self.journal.replay(self._replay)
                if not self.up:
                    log_event(
                        logger,
                        logging.INFO,
                        "shared state reachable again; journaled usage replayed",
                        down_s=round(time.monotonic() - self._down_since, 3),
                    )
                self.up = True
            # a hold younger than a sixth of the lease outlives the next tick and a renewal
            # that takes its longest (``timeout`` is at most a sixth of the lease, a call at
            # most three): short requests are never renewed
            young = time.monotonic() - self.shared.lease_s / 6
            for tenant, holds in list(self._holds.items()):
                old = sorted(hold for hold, taken in holds.items() if taken <= young)
                if old:
                    await self._renew(tenant, old)
        except (RedisError, OSError, TimeoutError) as exc:
            self._down(exc)

    async def _renew(self, tenant: str, holds: list[str]) -> None:
        try:
            async with asyncio.timeout(self.call_bound_s):
                await self.books.renew(tenant, holds, self.lease_ms)
        except RedisError as exc:
            if not damaged(exc):
                raise
            self._damaged(tenant, exc)

    async def aclose(self) -> None:
        """Finish the writes in flight (each bounded by the timeout), then close the client."""
        if self._writes:
            await asyncio.wait(list(self._writes))
        for other in (self.client, *self._also):
            await other.aclose()

    def readiness(self) -> Condition:
        """Not ready while Redis is down and some budgeted tenant fails closed."""
        closed = [
            name
            for name, tenant in self.tenants.items()
            if tenant.budget is not None and self.policy(name) == "fail_closed"
        ]
        ok = self.up or not closed
        reason = "" if ok else f"shared state unreachable; fail_closed tenants: {len(closed)}"
        return Condition("shared_state", ok, reason)

    def families(self) -> list[Metric]:
        cat = catalog.load()
        out = []
        for key, value in (
            ("tenancy_shared_state_up", 1 if self.up else 0),
            ("tenancy_shared_state_replicas", self.live_replicas()),
            ("tenancy_shared_state_journal_entries", self.journal.pending),
        ):
            family = cat.family(key)
            family.add_metric([], value)
            out.append(family)
        flight = cat.family("tenancy_fleet_requests_in_flight")
        for name, tenant in sorted(self.tenants.items()):
            seen = (
                self._current(name, tenant.budget)
                if tenant.budget is not None
                else self._seen.get(name)  # a capped tenant's: its slots know no window
            )
            if seen is not None:
                flight.add_metric([name], seen.in_flight)
        out.append(flight)
        errors = cat.family("tenancy_shared_state_errors")
        counted = (
            {**self.errors, "journal": self.journal.skipped}
            if self.journal.skipped
            else self.errors
        )
        for reason, count in sorted(counted.items()):
            errors.add_metric([reason], count)
        out.append(errors)
        return out
