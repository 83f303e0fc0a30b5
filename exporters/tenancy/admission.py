"""Admission control before the engine: token budgets and concurrency with priorities.

Budgets are fixed windows aligned to the epoch (a 1h budget resets on the hour, so every
replica of the proxy agrees on the window). A request is admitted while the tokens already
charged in the window plus its own prompt estimate fit; tokens are charged after the response,
so a stream admitted near the limit can overrun it by at most its own size, and the next
request is refused with the seconds until the window resets.

The concurrency gate caps requests in flight to the engine. A tenant at its own cap is
refused at once (it is the noisy one); when the global cap is reached, waiters are admitted
by priority class, then in arrival order, so low-priority floods queue behind everyone else.
"""

from __future__ import annotations

import asyncio
import heapq
import itertools
import math
import time
from collections.abc import Callable
from dataclasses import dataclass

from inferwatch.exporters.tenancy.config import Budget


@dataclass(frozen=True)
class Refusal:
    status: int
    reason: str  # metric outcome
    message: str
    retry_after: int | None = None


class BudgetLedger:
    """Tokens charged per tenant in the current window of its budget."""

    def __init__(self, clock: Callable[[], float] = time.time) -> None:
        self._clock = clock
        self._used: dict[str, tuple[float, int]] = {}  # tenant -> (window start, tokens)

    def _window(self, budget: Budget) -> tuple[float, float]:
        now = self._clock()
        start = math.floor(now / budget.window_seconds) * budget.window_seconds
        return now, start

    def used(self, tenant: str, budget: Budget) -> int:
        _, start = self._window(budget)
        window, tokens = self._used.get(tenant, (start, 0))
        return tokens if window == start else 0

    def check(self, tenant: str, budget: Budget, prompt_estimate: int) -> Refusal | None:
        now, start = self._window(budget)
        used = self.used(tenant, budget)
        if used + prompt_estimate <= budget.tokens:
            return None
        retry_after = max(1, math.ceil(start + budget.window_seconds - now))
        return Refusal(
            429,
            "rejected_budget",
            f"tenant token budget of {budget.tokens} per {budget.window_seconds:g}s is spent "
            f"({used} used); retry after {retry_after}s",
            retry_after,
        )

    def charge(self, tenant: str, budget: Budget, tokens: int) -> None:
        _, start = self._window(budget)
        self._used[tenant] = (start, self.used(tenant, budget) + tokens)

    def remaining(self, tenant: str, budget: Budget) -> int:
        return max(budget.tokens - self.used(tenant, budget), 0)


class ConcurrencyGate:
    """Slots to the engine: a global cap with a priority queue, and per-tenant caps."""

    def __init__(self, capacity: int, queue_timeout: float) -> None:
        self.capacity = capacity  # 0: unlimited
        self.queue_timeout = queue_timeout
        self.in_flight = 0
        self.per_tenant: dict[str, int] = {}
        self._waiters: list[tuple[int, int, asyncio.Future[None]]] = []
        self._sequence = itertools.count()

    @property
    def waiting(self) -> int:
        return sum(1 for *_, future in self._waiters if not future.done())

    async def acquire(self, tenant: str, tenant_cap: int, priority: int) -> Refusal | None:
        held = self.per_tenant.get(tenant, 0)
        if tenant_cap and held >= tenant_cap:
            return Refusal(
                429,
                "rejected_concurrency",
                f"tenant already has {held} requests in flight (limit {tenant_cap})",
                1,
            )
        if self.capacity and (self.in_flight >= self.capacity or self.waiting):
            future: asyncio.Future[None] = asyncio.get_running_loop().create_future()
            entry = (priority, next(self._sequence), future)
            heapq.heappush(self._waiters, entry)
            try:
                async with asyncio.timeout(self.queue_timeout):
                    await future
            except TimeoutError:
                if future.done() and not future.cancelled():
                    self._release_slot()  # handed over just as the wait timed out
                return Refusal(
                    503,
                    "rejected_queue_timeout",
                    f"engine is at its concurrency limit; waited {self.queue_timeout:g}s",
                    1,
                )
            except asyncio.CancelledError:
                if future.done() and not future.cancelled():
                    self._release_slot()  # the slot was handed over as we were cancelled
                raise
        else:
            self.in_flight += 1
        self.per_tenant[tenant] = self.per_tenant.get(tenant, 0) + 1
        return None

    def release(self, tenant: str) -> None:
        held = self.per_tenant.get(tenant, 0) - 1
        if held > 0:
            self.per_tenant[tenant] = held
        else:
            self.per_tenant.pop(tenant, None)
        self._release_slot()

    def _release_slot(self) -> None:
        while self._waiters:
            _, _, future = heapq.heappop(self._waiters)
            if not future.done():
                future.set_result(None)  # the slot passes to the waiter; in_flight unchanged
                return
        self.in_flight -= 1
