"""The fleet's budget books in Redis, changed only by server-side Lua scripts.

Each script runs atomically on the server, reads the server's clock (``TIME``, so every proxy
agrees on windows and leases whatever its own clock says) and touches only one tenant's keys,
which share a hash tag (``{tenant}``) and so one Cluster slot:

- ``<prefix>:{<tenant>}:w``: a hash of the current window's ``start`` (ms), tokens ``used`` in
  it, tokens ``reserved`` by requests in flight, and the ``total`` ever charged (the books
  that reconcile with the engine's counters);
- ``<prefix>:{<tenant>}:h``: reservation id -> tokens it holds;
- ``<prefix>:{<tenant>}:l``: reservation id scored by its lease's expiry (ms). A reservation
  whose lease expired (its proxy died, or lost Redis for longer than the lease) is dropped by
  the next script that looks, and its tokens return to the room.

Reservations count against whatever window is current, so one taken just before a window
turns is still held after it (a request in flight does not vanish with the hour).
"""

from __future__ import annotations

import asyncio
from dataclasses import dataclass
from typing import Any

#: drops the tenant's expired leases (their holds go back), rolls the window when it has
#: turned; leaves ``now``, ``start``, ``used`` and ``reserved`` set for the caller's code
_PRELUDE = """
local clock = redis.call('TIME')
local now = tonumber(clock[1]) * 1000 + math.floor(tonumber(clock[2]) / 1000)
local reserved = tonumber(redis.call('HGET', KEYS[1], 'reserved') or '0')
local dead = redis.call('ZRANGEBYSCORE', KEYS[3], '-inf', now)
for _, id in ipairs(dead) do
  reserved = reserved - tonumber(redis.call('HGET', KEYS[2], id) or '0')
  redis.call('HDEL', KEYS[2], id)
end
if #dead > 0 then
  redis.call('ZREMRANGEBYSCORE', KEYS[3], '-inf', now)
end
if reserved < 0 then reserved = 0 end
local window = tonumber(ARGV[2])
local start = now - now % window
local used = 0
if tonumber(redis.call('HGET', KEYS[1], 'start') or '-1') == start then
  used = tonumber(redis.call('HGET', KEYS[1], 'used') or '0')
end
redis.call('HSET', KEYS[1], 'start', start, 'used', used, 'reserved', reserved)
"""

#: ARGV: id, window ms, limit (budget + tolerance), prompt, completion cap, choices,
#: clamp (1/0), lease ms. Returns {admitted 1/0, used, reserved, window start, now, cap,
#: requests in flight}.
RESERVE = (
    _PRELUDE
    + """
local limit, prompt = tonumber(ARGV[3]), tonumber(ARGV[4])
local asked, choices = tonumber(ARGV[5]), tonumber(ARGV[6])
local room = limit - used - reserved
local cap = asked
if prompt + cap * choices > room and ARGV[7] == '1' then
  cap = math.floor((room - prompt) / choices)
end
if cap < 0 or (cap == 0 and asked > 0) or prompt + cap * choices > room then
  return {0, used, reserved, start, now, cap, redis.call('ZCARD', KEYS[3])}
end
local tokens = prompt + cap * choices
reserved = reserved + tokens
redis.call('HSET', KEYS[1], 'reserved', reserved)
redis.call('HSET', KEYS[2], ARGV[1], tokens)
redis.call('ZADD', KEYS[3], now + tonumber(ARGV[8]), ARGV[1])
return {1, used, reserved, start, now, cap, redis.call('ZCARD', KEYS[3])}
"""
)

#: ARGV: id ("" : none held), window ms, tokens, window start they were spent in (-1: the
#: current one), journal entry TTL s. KEYS[4], when given, marks a journal entry replayed so
#: that replaying it twice charges it once. Returns {charged 1/0, used, reserved, start, now,
#: requests in flight}.
SETTLE = (
    _PRELUDE
    + """
if KEYS[4] and redis.call('SET', KEYS[4], '1', 'NX', 'EX', tonumber(ARGV[5])) == false then
  return {0, used, reserved, start, now, redis.call('ZCARD', KEYS[3])}
end
if ARGV[1] ~= '' then
  local held = redis.call('HGET', KEYS[2], ARGV[1])
  if held then
    reserved = math.max(reserved - tonumber(held), 0)
    redis.call('HDEL', KEYS[2], ARGV[1])
    redis.call('ZREM', KEYS[3], ARGV[1])
    redis.call('HSET', KEYS[1], 'reserved', reserved)
  end
end
local tokens, spent_in = tonumber(ARGV[3]), tonumber(ARGV[4])
if spent_in < 0 or spent_in == start then
  used = used + tokens
  redis.call('HSET', KEYS[1], 'used', used)
end
redis.call('HINCRBY', KEYS[1], 'total', tokens)
return {1, used, reserved, start, now, redis.call('ZCARD', KEYS[3])}
"""
)

#: ARGV: "", window ms. Returns {used, reserved, window start, now, requests in flight},
#: expired leases dropped first.
PEEK = (
    _PRELUDE
    + """
return {used, reserved, start, now, redis.call('ZCARD', KEYS[3])}
"""
)

#: KEYS: leases. ARGV: lease ms, ids... Extends the leases still held; returns how many.
RENEW = """
local clock = redis.call('TIME')
local expiry = tonumber(clock[1]) * 1000 + math.floor(tonumber(clock[2]) / 1000) + tonumber(ARGV[1])
local renewed = 0
for i = 2, #ARGV do
  renewed = renewed + redis.call('ZADD', KEYS[1], 'XX', 'CH', expiry, ARGV[i])
end
return renewed
"""

#: KEYS: the proxies' heartbeats. ARGV: proxy id, lease ms. Returns the live proxies.
HEARTBEAT = """
local clock = redis.call('TIME')
local now = tonumber(clock[1]) * 1000 + math.floor(tonumber(clock[2]) / 1000)
redis.call('ZREMRANGEBYSCORE', KEYS[1], '-inf', now)
redis.call('ZADD', KEYS[1], now + tonumber(ARGV[2]), ARGV[1])
return redis.call('ZCARD', KEYS[1])
"""

#: KEYS: one hash per bucket. ARGV: mode ("take": let a request in if every bucket holds what
#: it needs; "charge": take tokens whatever they hold), then per bucket its capacity, what it
#: must hold (take) or give (charge). Levels refill at capacity per minute; a bucket left
#: alone for a minute is full, so it expires then. Returns {admitted, wait ms, level * 1000...}.
RATE = """
local clock = redis.call('TIME')
local now = tonumber(clock[1]) * 1000 + math.floor(tonumber(clock[2]) / 1000)
local levels, wait = {}, 0
for i, key in ipairs(KEYS) do
  local capacity, amount = tonumber(ARGV[2 * i]), tonumber(ARGV[2 * i + 1])
  local state = redis.call('HMGET', key, 'level', 'at')
  local level = tonumber(state[1]) or capacity
  local at = tonumber(state[2]) or now
  level = math.min(capacity, level + (now - at) * capacity / 60000)
  levels[i] = level
  if ARGV[1] == 'take' and level < amount then
    wait = math.max(wait, (amount - level) * 60000 / capacity)
  end
end
local admitted = wait == 0 and 1 or 0
local reply = {admitted, math.ceil(wait)}
for i, key in ipairs(KEYS) do
  local capacity, amount = tonumber(ARGV[2 * i]), tonumber(ARGV[2 * i + 1])
  local level = levels[i]
  if admitted == 1 then
    if ARGV[1] == 'charge' then level = level - amount
    elseif amount >= 1 then level = level - 1 end
    redis.call('HSET', key, 'level', level, 'at', now)
    redis.call('PEXPIRE', key, math.ceil((capacity - level) * 60000 / capacity) + 1000)
  end
  reply[#reply + 1] = math.floor(level * 1000)
end
return reply
"""

#: a replayed journal entry is remembered this long, so a replay cut short is not charged twice
REPLAYED_TTL_S = 7 * 24 * 3600


@dataclass(frozen=True)
class Window:
    """What Redis said about a tenant's window: tokens used and reserved, its start and the
    server's time (ms since the epoch), and the tenant's requests in flight on every proxy
    (those holding a reservation)."""

    used: int
    reserved: int
    start_ms: int = 0
    now_ms: int = 0
    in_flight: int = 0


@dataclass(frozen=True)
class Reserved:
    admitted: bool
    window: Window
    cap: int  # completion cap per choice it holds (or would have, clamped)


class Books:
    """The scripts, registered once on a redis-py asyncio client (plain, Sentinel or Cluster)."""

    def __init__(self, client: Any, prefix: str, pipelines: bool = True) -> None:
        self.client = client
        self.prefix = prefix
        #: whether the client pipelines scripts (a Cluster's commands go node by node)
        self.pipelines = pipelines
        self._reserve = client.register_script(RESERVE)
        self._settle = client.register_script(SETTLE)
        self._renew = client.register_script(RENEW)
        self._heartbeat = client.register_script(HEARTBEAT)
        self._peek = client.register_script(PEEK)
        self._rate = client.register_script(RATE)

    def keys(self, tenant: str) -> list[str]:
        base = f"{self.prefix}:{{{tenant}}}"
        return [f"{base}:w", f"{base}:h", f"{base}:l"]

    async def reserve(
        self,
        tenant: str,
        hold: str,
        window_ms: int,
        limit: int,
        prompt: int,
        cap: int,
        choices: int,
        clamp: bool,
        lease_ms: int,
    ) -> Reserved:
        args = [hold, window_ms, limit, prompt, cap, choices, 1 if clamp else 0, lease_ms]
        admitted, used, reserved, start, now, capped, flight = await self._reserve(
            keys=self.keys(tenant), args=args
        )
        return Reserved(admitted == 1, Window(used, reserved, start, now, flight), int(capped))

    async def settle(
        self,
        tenant: str,
        hold: str,
        window_ms: int,
        tokens: int,
        spent_in_ms: int = -1,
        entry: str = "",
    ) -> Window | None:
        """Release ``hold`` and charge ``tokens``; None when ``entry`` was replayed already."""
        keys = self.keys(tenant)
        if entry:
            keys.append(f"{self.prefix}:{{{tenant}}}:j:{entry}")
        args = [hold, window_ms, tokens, spent_in_ms, REPLAYED_TTL_S]
        charged, *window = await self._settle(keys=keys, args=args)
        return Window(*window) if charged == 1 else None

    async def settle_all(self, settlements: list[tuple[str, str, int, int]]) -> list[Window]:
        """Settle ``(tenant, hold, window ms, tokens)`` each, in one round trip where the
        client pipelines (one Redis, Sentinel's master); a Cluster's go out side by side."""
        if not self.pipelines:
            found = await asyncio.gather(*(self.settle(*one) for one in settlements))
            return [window for window in found if window is not None]  # none is a replay
        pipe = self.client.pipeline(transaction=False)
        for tenant, hold, window_ms, tokens in settlements:
            await self._settle(
                keys=self.keys(tenant), args=[hold, window_ms, tokens, -1, 0], client=pipe
            )
        return [Window(*window) for _, *window in await pipe.execute()]

    async def renew(self, tenant: str, holds: list[str], lease_ms: int) -> int:
        return int(await self._renew(keys=[self.keys(tenant)[2]], args=[lease_ms, *holds]))

    async def heartbeat(self, proxy: str, lease_ms: int) -> int:
        return int(await self._heartbeat(keys=[f"{self.prefix}:proxies"], args=[proxy, lease_ms]))

    async def peek(self, tenant: str, window_ms: int) -> Window:
        """The tenant's current window, leases that expired dropped first."""
        return Window(*await self._peek(keys=self.keys(tenant), args=["", window_ms]))

    async def rate(
        self, tenant: str, buckets: list[tuple[str, int, float]], charge: bool
    ) -> tuple[bool, int, list[float]]:
        """Take from (or, with ``charge``, charge) ``(name, capacity, amount)`` buckets:
        (admitted, ms to wait, levels after)."""
        keys = [f"{self.prefix}:{{{tenant}}}:rl:{name}" for name, _, _ in buckets]
        args: list[str | int | float] = ["charge" if charge else "take"]
        for _, capacity, amount in buckets:
            args += [capacity, amount]
        admitted, wait, *levels = await self._rate(keys=keys, args=args)
        return admitted == 1, int(wait), [level / 1000 for level in levels]

    async def total(self, tenant: str) -> int:
        """Every token ever charged to the tenant (the books)."""
        value = await self.client.hget(self.keys(tenant)[0], "total")
        return int(value or 0)
