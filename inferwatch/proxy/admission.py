"""Admission control before the engine: token budgets and concurrency with priorities.

Budgets are fixed windows aligned to the epoch (a 1h budget resets on the hour, so every
replica of the proxy agrees on the window). Admission *reserves* what a request may spend:
its prompt count plus its completion cap (``max_tokens`` times the choices asked for; see
:mod:`pipeline` for the cap of a request that sends none). A request fits while the tokens
charged in the window, the reservations of requests still running and its own reservation
stay within the budget plus its tolerance; one that does not fit is clamped (its completion cap
lowered to what remains) or refused with the seconds until the window resets. When the
request ends, however it ends, its reservation is released and its actual usage charged, so
N concurrent requests cannot each see the whole remainder.

The concurrency gate caps requests in flight to the engine. A tenant's own cap counts its
requests in flight *and* those waiting for a slot, so handing queued requests their slots
can never put a tenant over its cap; a tenant at its cap is refused at once (it is the noisy
one). When the global cap is reached, waiters are admitted by priority class, then by
weight (weighted fair queuing across the tenants of a class), so low-priority floods queue
behind everyone else; a full queue (``max_queue``) sheds its lowest class first. Strict
priority would starve a lower class under a steady flood of a higher one, so each lower
class that waits is owed a minimum share of the slots handed over (``min_class_share``).
"""

from __future__ import annotations

import asyncio
import heapq
import itertools
import math
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Protocol

from inferwatch.proxy.config import MIN_CLASS_SHARE, Budget

if TYPE_CHECKING:
    from inferwatch.proxy.ratelimit import Bucket, Levels


@dataclass(frozen=True)
class Refusal:
    status: int
    reason: str  # metric outcome
    message: str
    retry_after: int | None = None


@dataclass(frozen=True)
class Reservation:
    tenant: str
    window: float  # start of the window it was taken in
    tokens: int
    #: the completion cap the request must be sent with (None: leave the body as it is)
    completion_cap: int | None = None
    #: whether it holds one of its tenant's concurrency slots in the fleet's shared state
    fleet_slot: bool = False


def budget_refusal(
    budget: Budget, prompt: int, completion: int, used: int, reserved: int, retry_after: int
) -> Refusal:
    """The 429 of a request its tenant's budget window cannot cover."""
    return Refusal(
        429,
        "rejected_budget",
        f"tenant token budget of {budget.tokens} per {budget.window_seconds:g}s cannot "
        f"cover this request ({prompt} prompt + up to {completion} completion tokens; "
        f"{used} used, {reserved} reserved by requests in flight); "
        f"retry after {retry_after}s",
        retry_after,
    )


class Ledger(Protocol):
    """A tenant's budget books, this process's or the fleet's: admission reserves in them,
    accounting settles, the metrics read what remains. Admission asks what they can do
    (:attr:`holds_slots`, :attr:`checks_rates`) rather than which books they are."""

    @property
    def holds_slots(self) -> bool:
        """Whether a reservation can hold one of its tenant's concurrency slots."""
        ...

    @property
    def checks_rates(self) -> bool:
        """Whether :meth:`reserve` can check the tenant's rate buckets now, in its own step."""
        ...

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
        """Reserve ``prompt + completion_cap * choices`` against ``budget`` (None: only a
        slot, one of ``most``), after letting the request in against the ``rate`` buckets
        (taking ``rate_tokens``); also the buckets' levels, None where none were read."""
        ...

    def cancel(self, reservation: Reservation, budget: Budget | None) -> None:
        """Give back, charging nothing, a reservation whose request was refused after all."""

    def room(self, tenant: str, budget: Budget) -> int: ...

    def settle(self, reservation: Reservation, budget: Budget | None, tokens: int) -> None: ...

    def remaining(self, tenant: str, budget: Budget) -> int: ...


class BudgetLedger:
    """Tokens charged and reserved per tenant in the current window of its budget, in this
    process: it holds no concurrency slot (the gate does) and checks no rate bucket."""

    holds_slots = False
    checks_rates = False

    def __init__(self, clock: Callable[[], float] = time.time) -> None:
        self._clock = clock
        self._used: dict[str, tuple[float, int]] = {}  # tenant -> (window start, tokens)
        self._reserved: dict[str, tuple[float, int]] = {}

    def _window(self, budget: Budget) -> tuple[float, float]:
        now = self._clock()
        start = math.floor(now / budget.window_seconds) * budget.window_seconds
        return now, start

    @staticmethod
    def _in(table: dict[str, tuple[float, int]], tenant: str, start: float) -> int:
        window, tokens = table.get(tenant, (start, 0))
        return tokens if window == start else 0

    def used(self, tenant: str, budget: Budget) -> int:
        return self._in(self._used, tenant, self._window(budget)[1])

    def reserved(self, tenant: str, budget: Budget) -> int:
        return self._in(self._reserved, tenant, self._window(budget)[1])

    def room(self, tenant: str, budget: Budget) -> int:
        """Tokens a new reservation may take in the current window, tolerance included."""
        start = self._window(budget)[1]
        used = self._in(self._used, tenant, start) + self._in(self._reserved, tenant, start)
        return budget.tokens + budget.tolerance - used

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
        """:meth:`claim`, as admission awaits it of any ledger (never with a slot or rate
        buckets: this ledger says it holds and checks neither)."""
        assert budget is not None and not most and not rate
        return self.claim(tenant, budget, prompt, completion_cap, choices, clamp), None

    def claim(
        self,
        tenant: str,
        budget: Budget,
        prompt: int,
        completion_cap: int,
        choices: int = 1,
        clamp: bool = True,
    ) -> Reservation | Refusal:
        """Reserve ``prompt + completion_cap * choices`` tokens, clamping the cap if allowed."""
        now, start = self._window(budget)
        used = self._in(self._used, tenant, start)
        reserved = self._in(self._reserved, tenant, start)
        room = budget.tokens + budget.tolerance - used - reserved
        cap = completion_cap
        if prompt + cap * choices > room and clamp:
            cap = (room - prompt) // choices
        if cap < 0 or (cap == 0 and completion_cap > 0) or prompt + cap * choices > room:
            retry_after = max(1, math.ceil(start + budget.window_seconds - now))
            return budget_refusal(
                budget, prompt, completion_cap * choices, used, reserved, retry_after
            )
        tokens = prompt + cap * choices
        self._reserved[tenant] = (start, reserved + tokens)
        return Reservation(tenant, start, tokens, cap if cap != completion_cap else None)

    def settle(self, reservation: Reservation, budget: Budget | None, tokens: int) -> None:
        """Release a reservation and charge what the request actually used."""
        assert budget is not None, "a local reservation is always its budget's"
        _, start = self._window(budget)
        if reservation.window == start:
            reserved = self._in(self._reserved, reservation.tenant, start) - reservation.tokens
            self._reserved[reservation.tenant] = (start, max(reserved, 0))
        self.charge(reservation.tenant, budget, tokens)

    def cancel(self, reservation: Reservation, budget: Budget | None) -> None:
        """Release a reservation, charging nothing."""
        self.settle(reservation, budget, 0)

    def charge(self, tenant: str, budget: Budget, tokens: int) -> None:
        _, start = self._window(budget)
        self._used[tenant] = (start, self._in(self._used, tenant, start) + tokens)

    def remaining(self, tenant: str, budget: Budget) -> int:
        return max(budget.tokens - self.used(tenant, budget), 0)


@dataclass(order=True)
class _Waiter:
    priority: int
    tag: float  # virtual finish time: weighted fair order within a priority class
    sequence: int
    tenant: str = field(compare=False)
    future: asyncio.Future[bool] = field(compare=False)  # True: a slot; False: shed


class ConcurrencyGate:
    """Slots to the engine: a global cap with a fair priority queue, and per-tenant caps.

    Waiters are served by priority class, then by weight: each request of a tenant is
    tagged one ``1/weight`` step after the tenant's previous one (or after the request of
    its class last served, if the tenant has been idle), and the lowest tag goes first, so
    tenants with weights 3 and 1 that both keep the queue full get three slots to one.

    Classes are not strict: each time a slot is handed to a waiter, every waiting class
    but the best one earns ``min_class_share`` of a slot, and a class that has earned a
    whole one is served first (the better class first when several have); a class whose
    queue empties is owed nothing. So under contention each lower class gets at least that
    share of the slots, counted in handovers, and the best class the rest.

    When the queue holds ``max_queue`` waiters, a newcomer of a better class sheds the worst
    waiter (the lowest class, latest tag); one that is no better is refused.
    """

    def __init__(
        self,
        capacity: int,
        queue_timeout_s: float,
        max_queue: int = 0,
        min_class_share: float = MIN_CLASS_SHARE,
    ) -> None:
        self.capacity = capacity  # 0: unlimited
        self.queue_timeout_s = queue_timeout_s
        self.max_queue = max_queue  # 0: unbounded
        self.min_class_share = min_class_share
        self._in_flight = 0
        self.per_tenant: dict[str, int] = {}
        #: priority class -> its waiters, a heap by fair order
        self._queues: dict[int, list[_Waiter]] = {}
        #: priority class -> the slots it has earned while a better class was served
        self._owed: dict[int, float] = {}
        self._sequence = itertools.count()
        self._last_tag: dict[str, float] = {}
        #: priority class -> the tag of its waiter last served
        self._virtual: dict[int, float] = {}

    @property
    def in_flight(self) -> int:
        """Requests holding a slot or counted in flight without one."""
        return self._in_flight

    @property
    def waiting(self) -> int:
        return sum(1 for waiter in self._live())

    def _live(self) -> list[_Waiter]:
        return [w for queue in self._queues.values() for w in queue if not w.future.done()]

    def enter_ungated(self) -> None:
        """Count a request in flight that needs no slot (no cap applies to it)."""
        self._in_flight += 1

    def leave_ungated(self) -> None:
        self._in_flight -= 1

    async def acquire(
        self, tenant: str, tenant_cap: int, priority: int, weight: int = 1
    ) -> Refusal | None:
        held = self.per_tenant.get(tenant, 0)  # in flight or waiting for a slot
        if tenant_cap and held >= tenant_cap:
            return Refusal(
                429,
                "rejected_concurrency",
                f"tenant already has {held} requests in flight or queued (limit {tenant_cap})",
                1,
            )
        self.per_tenant[tenant] = held + 1
        try:
            refusal = await self._slot(tenant, priority, weight)
        except BaseException:
            self._drop(tenant)
            raise
        if refusal is not None:
            self._drop(tenant)
        return refusal

    def _make_room(self, priority: int) -> bool:
        """Whether the queue has room for a waiter of ``priority``, shedding one if need be."""
        live = self._live()
        if not self.max_queue or len(live) < self.max_queue:
            return True
        worst = max(live, key=lambda waiter: (waiter.priority, waiter.tag))
        if worst.priority <= priority:
            return False
        worst.future.set_result(False)
        return True

    async def _slot(self, tenant: str, priority: int, weight: int) -> Refusal | None:
        if self.capacity and (self._in_flight >= self.capacity or self.waiting):
            if not self._make_room(priority):
                return Refusal(
                    503,
                    "rejected_queue_full",
                    f"engine is at its concurrency limit and {self.max_queue} requests of "
                    "the same or a higher priority are queued",
                    1,
                )
            virtual = self._virtual.get(priority, 0.0)
            tag = max(virtual, self._last_tag.get(tenant, 0.0)) + 1.0 / weight
            self._last_tag[tenant] = tag
            future: asyncio.Future[bool] = asyncio.get_running_loop().create_future()
            heapq.heappush(
                self._queues.setdefault(priority, []),
                _Waiter(priority, tag, next(self._sequence), tenant, future),
            )
            try:
                async with asyncio.timeout(self.queue_timeout_s):
                    granted = await future
            except TimeoutError:
                if future.done() and not future.cancelled() and future.result():
                    self._release_slot()  # handed over just as the wait timed out
                return Refusal(
                    503,
                    "rejected_queue_timeout",
                    f"engine is at its concurrency limit; waited {self.queue_timeout_s:g}s",
                    1,
                )
            except asyncio.CancelledError:
                if future.done() and not future.cancelled() and future.result():
                    self._release_slot()  # the slot was handed over as we were cancelled
                raise
            if not granted:
                return Refusal(
                    503,
                    "rejected_shed",
                    "shed from the queue for a higher-priority request; the engine is saturated",
                    1,
                )
        else:
            self._in_flight += 1
        return None

    def _drop(self, tenant: str) -> None:
        held = self.per_tenant.get(tenant, 0) - 1
        if held > 0:
            self.per_tenant[tenant] = held
        else:
            self.per_tenant.pop(tenant, None)

    def release(self, tenant: str) -> None:
        self._drop(tenant)
        self._release_slot()

    def _release_slot(self) -> None:
        waiter = self._next()
        if waiter is not None:
            waiter.future.set_result(True)  # the slot passes on; in_flight unchanged
            self._virtual[waiter.priority] = waiter.tag
            return
        self._in_flight -= 1
        self._last_tag.clear()  # nobody waits: fair order starts afresh
        self._virtual.clear()

    def _next(self) -> _Waiter | None:
        """The waiter the slot goes to: of the best class owed a whole slot, else of the
        best class waiting; the others waiting earn their share of this one."""
        for priority in list(self._queues):
            queue = self._queues[priority]
            while queue and queue[0].future.done():
                heapq.heappop(queue)  # timed out, cancelled or shed
            if not queue:
                del self._queues[priority]
                self._owed.pop(priority, None)  # an emptied class is owed no backlog
        if not self._queues:
            return None
        best, *lower = sorted(self._queues)
        for priority in lower:
            self._owed[priority] = self._owed.get(priority, 0.0) + self.min_class_share
        owed = [priority for priority in lower if self._owed[priority] >= 1.0 - 1e-9]
        chosen = owed[0] if owed else best
        if owed:
            self._owed[chosen] -= 1.0
        waiter = heapq.heappop(self._queues[chosen])
        if not self._queues[chosen]:
            del self._queues[chosen]
            self._owed.pop(chosen, None)
        return waiter
