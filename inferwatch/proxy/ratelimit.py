"""Requests and tokens per minute per tenant, and per tenant and model: token buckets.

Each limit is a bucket as large as its per-minute figure that refills continuously at that
figure per minute. A request takes one from each of its requests buckets and needs every
tokens bucket above zero; it takes what it may spend (its prompt count plus its completion
cap) from the tokens buckets at admission, in the same step as the check, so a burst of
concurrent requests cannot all see the same full bucket; when it ends, what it did not use
is given back (or what it used beyond is taken). One large request may leave a bucket in
debt, refused until it has refilled. A refused
request gets 429 with ``Retry-After``; every answer to a limited tenant carries the headers
OpenAI's API sends (``x-ratelimit-limit-requests``, ``x-ratelimit-remaining-requests``,
``x-ratelimit-reset-requests`` and the ``-tokens`` twins) for the tightest bucket of each kind.

With ``shared_state`` the buckets live in Redis, shared by every proxy; while Redis is down,
or without it, they live in this process (each proxy then allows its 1/N share, as budgets
do).
"""

from __future__ import annotations

import math
import time
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Protocol

from inferwatch.proxy.admission import Refusal
from inferwatch.proxy.config import RateLimits

KINDS = ("requests", "tokens")


@dataclass(frozen=True)
class Bucket:
    scope: str  # "" : the tenant's; else a model name
    kind: str  # requests | tokens
    capacity: int

    def key(self) -> str:
        return f"{self.kind}:{self.scope}"


def buckets(limits: RateLimits, model: str, divide: int = 1) -> list[Bucket]:
    """The buckets a request to ``model`` meets, each 1/``divide`` of its configured size."""
    found = []
    for scope, limit in (("", limits.tenant), (model, limits.models.get(model))):
        if limit is None:
            continue
        for kind in KINDS:
            capacity = limit.per_minute(kind)
            if capacity:
                found.append(Bucket(scope, kind, max(capacity // divide, 1)))
    return found


@dataclass(frozen=True)
class Levels:
    """What the buckets held after a request was let in, or why it was not."""

    admitted: bool
    levels: tuple[float, ...]
    wait_s: float = 0.0  # until the refusing bucket lets a request in


def need(bucket: Bucket) -> float:
    """What a bucket must hold to let a request in: one request, or any tokens at all."""
    return 1.0 if bucket.kind == "requests" else 1e-9


def take(bucket: Bucket, tokens: int) -> float:
    """What a request admitted takes from a bucket: one request, or the tokens it may spend."""
    return 1.0 if bucket.kind == "requests" else float(tokens)


@dataclass(frozen=True)
class Taken:
    """The tokens a request took from its tokens buckets at admission, and where."""

    tokens: int
    shared: bool  # from the fleet's buckets (else this process's)


class LocalBuckets:
    """Buckets in this process (the same rule as the shared script, on the local clock)."""

    def __init__(self) -> None:
        self._state: dict[tuple[str, str], tuple[float, float]] = {}  # -> (level, at)

    def _level(self, tenant: str, bucket: Bucket, now: float) -> float:
        level, at = self._state.get((tenant, bucket.key()), (bucket.capacity, now))
        return min(bucket.capacity, level + (now - at) * bucket.capacity / 60.0)

    def take(self, tenant: str, found: list[Bucket], tokens: int = 0) -> Levels:
        """Let a request that may spend ``tokens`` in, taking them with its check."""
        now = time.monotonic()
        levels = [self._level(tenant, bucket, now) for bucket in found]
        waits = [
            (need(bucket) - level) * 60.0 / bucket.capacity
            for bucket, level in zip(found, levels, strict=True)
            if level < need(bucket)
        ]
        if waits:
            return Levels(False, tuple(levels), max(waits))
        after = []
        for bucket, level in zip(found, levels, strict=True):
            level -= take(bucket, tokens)
            self._state[(tenant, bucket.key())] = (level, now)
            after.append(level)
        return Levels(True, tuple(after))

    def charge(self, tenant: str, found: list[Bucket], tokens: int) -> None:
        """Take ``tokens`` more from the tokens buckets (fewer than 0: give them back)."""
        now = time.monotonic()
        for bucket in found:
            if bucket.kind == "tokens":
                level = min(self._level(tenant, bucket, now) - tokens, bucket.capacity)
                self._state[(tenant, bucket.key())] = (level, now)


def _duration(seconds: float) -> str:
    """A reset time as OpenAI spells it: 20ms, 1.5s, 6m0s."""
    if seconds < 1:
        return f"{max(math.ceil(seconds * 1000), 0)}ms"
    if seconds < 60:
        return f"{round(seconds, 3):g}s"
    minutes, rest = divmod(seconds, 60)
    return f"{int(minutes)}m{round(rest):d}s"


def headers(found: list[Bucket], levels: Levels) -> list[tuple[bytes, bytes]]:
    """``x-ratelimit-*`` for the tightest bucket of each kind."""
    out = []
    for kind in KINDS:
        mine = [(b, lv) for b, lv in zip(found, levels.levels, strict=True) if b.kind == kind]
        if not mine:
            continue
        bucket, level = min(mine, key=lambda pair: pair[1] / pair[0].capacity)
        reset = (bucket.capacity - level) * 60.0 / bucket.capacity
        out += [
            (f"x-ratelimit-limit-{kind}".encode(), str(bucket.capacity).encode()),
            (f"x-ratelimit-remaining-{kind}".encode(), str(max(math.floor(level), 0)).encode()),
            (f"x-ratelimit-reset-{kind}".encode(), _duration(reset).encode()),
        ]
    return out


def refusal(levels: Levels) -> Refusal:
    retry_after = max(1, math.ceil(levels.wait_s))
    return Refusal(
        429,
        "rejected_rate_limit",
        f"tenant rate limit reached; retry after {retry_after}s",
        retry_after,
    )


class SharedBuckets(Protocol):
    """Buckets in the fleet's shared state: None when it cannot answer now (a Refusal when
    the tenant's own keys are damaged)."""

    async def take_rate(
        self, tenant: str, found: list[Bucket], tokens: int
    ) -> Levels | Refusal | None: ...

    def charge_rate(self, tenant: str, found: list[Bucket], tokens: int) -> bool: ...

    def live_replicas(self) -> int: ...


class RateLimiter:
    """Admits a request against its tenant's buckets (shared where configured)."""

    def __init__(self, limits: Mapping[str, RateLimits], shared: SharedBuckets | None) -> None:
        self.limits = limits
        self.shared = shared
        self.local = LocalBuckets()

    def limited(self, tenant: str) -> bool:
        return tenant in self.limits

    def buckets(self, tenant: str, model: str) -> list[Bucket]:
        """The buckets a request of ``tenant`` to ``model`` meets, at their fleet-wide size."""
        return buckets(self.limits[tenant], model)

    async def admit(
        self, tenant: str, model: str, tokens: int
    ) -> tuple[Refusal | None, list[tuple[bytes, bytes]], Taken | None]:
        """Let in a request that may spend ``tokens``: the refusal (None: admitted), the
        headers, and what it took (to :meth:`settle` when it ends)."""
        found = self.buckets(tenant, model)
        if not found:
            return None, [], None
        levels = await self.shared.take_rate(tenant, found, tokens) if self.shared else None
        if isinstance(levels, Refusal):
            return levels, [], None
        return self.conclude(tenant, model, tokens, levels)

    def conclude(
        self, tenant: str, model: str, tokens: int, levels: Levels | None
    ) -> tuple[Refusal | None, list[tuple[bytes, bytes]], Taken | None]:
        """:meth:`admit`'s answer from the shared buckets' ``levels`` after the check (made
        by the shared reservation's script, for one), or from this process's buckets where
        the fleet's could not answer (None)."""
        found = self.buckets(tenant, model)
        if not found:
            return None, [], None
        shared = levels is not None
        if levels is None:
            divide = self.shared.live_replicas() if self.shared else 1
            found = buckets(self.limits[tenant], model, divide)
            levels = self.local.take(tenant, found, tokens)
        if not levels.admitted:
            return refusal(levels), headers(found, levels), None
        return None, headers(found, levels), Taken(tokens, shared)

    def settle(self, tenant: str, model: str, taken: Taken, tokens: int) -> None:
        """A request that took ``taken`` at admission ended having used ``tokens``: give the
        difference back to (or take it from) the buckets it took from."""
        found = buckets(self.limits[tenant], model)
        difference = tokens - taken.tokens
        if not any(bucket.kind == "tokens" for bucket in found) or not difference:
            return
        if taken.shared:  # Redis down meanwhile: its buckets keep the reservation, then refill
            assert self.shared is not None
            self.shared.charge_rate(tenant, found, difference)
            return
        divide = self.shared.live_replicas() if self.shared else 1
        self.local.charge(tenant, buckets(self.limits[tenant], model, divide), difference)
