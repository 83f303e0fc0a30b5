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
  the next script that looks, and its tokens return to the room;
- ``<prefix>:{<tenant>}:x``: reservation ids whose lease expired, scored by when (kept for
  ``REPLAYED_TTL_S``), so that the settlement of one still charges its tokens, once.

Settling is keyed by the reservation id: a hold still held, or expired, is settled once; any
other id was settled already, so a settlement replayed from the journal charges nothing.

Reservations count against whatever window is current, so one taken just before a window
turns is still held after it (a request in flight does not vanish with the hour).
"""

from __future__ import annotations

import asyncio
import contextlib
import re
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

with contextlib.suppress(ImportError):  # without the redis extra no Books is ever made
    from redis.exceptions import NoScriptError, RedisError, ResponseError

#: a script's error that one tenant's keys caused (a key of the wrong type, a field that is no
#: number), as Redis 7 and 6.2 word it; any other error is Redis's own (READONLY, OOM, ...)
_DAMAGED = re.compile(r"WRONGTYPE|user_script:\d+: attempt to")


def damaged(exc: BaseException) -> bool:
    """Whether ``exc`` is a script failing on one tenant's damaged keys: that tenant's fault,
    not Redis being down for everyone."""
    return isinstance(exc, ResponseError) and _DAMAGED.search(str(exc)) is not None


#: a replayed journal entry, and the id of a hold whose lease expired, are remembered this
#: long, so that a replay cut short is not charged twice and a late settlement still charges
REPLAYED_TTL_S = 7 * 24 * 3600

#: drops the tenant's expired leases (their holds go back, their ids are kept in ``x`` so that
#: a late settlement still charges), rolls the window when it has turned (a window of 0 ms:
#: the tenant has no budget); leaves ``now``, ``start``, ``used`` and ``reserved`` set
_PRELUDE = (
    """
local clock = redis.call('TIME')
local now = tonumber(clock[1]) * 1000 + math.floor(tonumber(clock[2]) / 1000)
local state = redis.call('HMGET', KEYS[1], 'reserved', 'start', 'used')
local reserved = tonumber(state[1] or '0')
local dead = redis.call('ZRANGEBYSCORE', KEYS[3], '-inf', now)
if #dead > 0 then
  for _, id in ipairs(dead) do
    reserved = reserved - tonumber(redis.call('HGET', KEYS[2], id) or '0')
    redis.call('HDEL', KEYS[2], id)
    redis.call('ZADD', KEYS[4], now, id)
  end
  redis.call('ZREMRANGEBYSCORE', KEYS[3], '-inf', now)
  redis.call('ZREMRANGEBYSCORE', KEYS[4], '-inf', now - """
    + str(REPLAYED_TTL_S * 1000)
    + """)
  if reserved < 0 then reserved = 0 end
  redis.call('HSET', KEYS[1], 'reserved', reserved)
end
local window = tonumber(ARGV[2])
local start, used = 0, 0
if window > 0 then
  start = now - now % window
  if tonumber(state[2] or '-1') == start then
    used = tonumber(state[3] or '0')
  else
    redis.call('HSET', KEYS[1], 'start', start, 'used', 0)
  end
end
"""
)

#: the token-bucket rule of :data:`RATE` and :data:`RESERVE`: the buckets are KEYS[first..],
#: each with three ARGV from ``arg`` on (capacity, what it must hold, what it takes). Levels
#: refill at capacity per minute, never above it; a bucket left alone for a minute is full,
#: so it expires then. ``levels`` reads them (and the ms until every bucket holds what it
#: must); ``take`` takes from each (``levels`` is what they held), returning their levels
_BUCKETS = """
local function levels(now, first, arg, check)
  local found, wait = {}, 0
  for i = first, #KEYS do
    local a = arg + 3 * (i - first)
    local capacity, needed = tonumber(ARGV[a]), tonumber(ARGV[a + 1])
    local state = redis.call('HMGET', KEYS[i], 'level', 'at')
    local level = tonumber(state[1]) or capacity
    local at = tonumber(state[2]) or now
    level = math.min(capacity, level + (now - at) * capacity / 60000)
    found[#found + 1] = level
    if check and level < needed then
      wait = math.max(wait, (needed - level) * 60000 / capacity)
    end
  end
  return found, wait
end
local function take(now, first, arg, found)
  for i = first, #KEYS do
    local a, n = arg + 3 * (i - first), i - first + 1
    local capacity = tonumber(ARGV[a])
    local level = math.min(capacity, found[n] - tonumber(ARGV[a + 2]))
    redis.call('HSET', KEYS[i], 'level', level, 'at', now)
    redis.call('PEXPIRE', KEYS[i], math.ceil((capacity - level) * 60000 / capacity) + 1000)
    found[n] = level
  end
  return found
end
local function thousandths(reply, found)
  for _, level in ipairs(found) do reply[#reply + 1] = math.floor(level * 1000) end
  return reply
end
"""

#: ARGV: id, window ms (0: no budget), limit (budget + tolerance), prompt, completion cap,
#: choices, clamp (1/0), lease ms, concurrency cap (0: none), then three per rate bucket in
#: KEYS[5..] (see :data:`_BUCKETS`): the request's rate check made in the same step, first, so
#: that a rate-limited tenant's admission is one round trip. Returns {verdict (1 admitted,
#: 0 over budget, 2 at the concurrency cap, 3 over a rate limit), used, reserved, window
#: start, now, cap, requests in flight, ms until the rate limit lets it in, bucket levels *
#: 1000...}. Past the rate check its buckets are taken from whatever the budget says, as a
#: request let in by the rate limit and then refused its budget gives back only its tokens.
RESERVE = (
    _PRELUDE
    + _BUCKETS
    + """
local found, wait = levels(now, 5, 10, true)
if wait > 0 then
  return thousandths({3, used, reserved, start, now, 0, redis.call('ZCARD', KEYS[3]),
    math.ceil(wait)}, found)
end
found = take(now, 5, 10, found)
local limit, prompt = tonumber(ARGV[3]), tonumber(ARGV[4])
local asked, choices = tonumber(ARGV[5]), tonumber(ARGV[6])
local flight = redis.call('ZCARD', KEYS[3])
local cap = asked
if window > 0 then
  local room = limit - used - reserved
  if prompt + cap * choices > room and ARGV[7] == '1' then
    cap = math.floor((room - prompt) / choices)
  end
  if cap < 0 or (cap == 0 and asked > 0) or prompt + cap * choices > room then
    return thousandths({0, used, reserved, start, now, cap, flight, 0}, found)
  end
end
local most = tonumber(ARGV[9])
if most > 0 and flight >= most then
  return thousandths({2, used, reserved, start, now, cap, flight, 0}, found)
end
local tokens = 0
if window > 0 then
  tokens = prompt + cap * choices
  reserved = reserved + tokens
  redis.call('HSET', KEYS[1], 'reserved', reserved)
end
redis.call('HSET', KEYS[2], ARGV[1], tokens)
redis.call('ZADD', KEYS[3], now + tonumber(ARGV[8]), ARGV[1])
return thousandths({1, used, reserved, start, now, cap, flight + 1, 0}, found)
"""
)

#: ARGV: id ("" : none held in Redis), window ms, tokens, window start they were spent in
#: (-1: the current one), journal entry TTL s. Keyed by the reservation: a hold still held is
#: released and charged, one whose lease expired (in ``x``) is charged, and any other id was
#: settled already, so a replayed settlement charges nothing. KEYS[5], when given, marks a
#: journal entry of a request that held nothing in Redis replayed, so that replaying it twice
#: charges it once. Returns {charged 1/0, used, reserved, start, now, requests in flight}.
SETTLE = (
    _PRELUDE
    + """
if KEYS[5] and redis.call('SET', KEYS[5], '1', 'NX', 'EX', tonumber(ARGV[5])) == false then
  return {0, used, reserved, start, now, redis.call('ZCARD', KEYS[3])}
end
if ARGV[1] ~= '' then
  local held = redis.call('HGET', KEYS[2], ARGV[1])
  if held then
    reserved = math.max(reserved - tonumber(held), 0)
    redis.call('HDEL', KEYS[2], ARGV[1])
    redis.call('ZREM', KEYS[3], ARGV[1])
    redis.call('HSET', KEYS[1], 'reserved', reserved)
  elseif redis.call('ZREM', KEYS[4], ARGV[1]) == 0 then
    return {0, used, reserved, start, now, redis.call('ZCARD', KEYS[3])}
  end
end
local tokens, spent_in = tonumber(ARGV[3]), tonumber(ARGV[4])
if window > 0 then
  if spent_in < 0 or spent_in == start then
    used = used + tokens
    redis.call('HSET', KEYS[1], 'used', used)
  end
  redis.call('HINCRBY', KEYS[1], 'total', tokens)
end
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
#: it needs, and take what it takes in the same step; "charge": take what it takes whatever
#: they hold, below 0 giving back), then three per bucket (see :data:`_BUCKETS`). Returns
#: {admitted, wait ms, level * 1000...}.
RATE = (
    _BUCKETS
    + """
local clock = redis.call('TIME')
local now = tonumber(clock[1]) * 1000 + math.floor(tonumber(clock[2]) / 1000)
local found, wait = levels(now, 1, 2, ARGV[1] == 'take')
if wait > 0 then
  return thousandths({0, math.ceil(wait)}, found)
end
return thousandths({1, 0}, take(now, 1, 2, found))
"""
)


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
    #: refused for the tenant's concurrency cap (not its budget)
    at_cap: bool = False
    #: the rate check made with it: whether it let the request in, the seconds until it
    #: would, and the buckets' levels after it (none asked: let in, no levels)
    rate_admitted: bool = True
    rate_wait_s: float = 0.0
    rate_levels: tuple[float, ...] = ()


class _Script:
    """A Lua script by its SHA1, loaded into the server when it answers NOSCRIPT (a restarted
    or failed-over Redis has none)."""

    def __init__(self, client: Any, source: str) -> None:
        self.source = source
        self.sha = client.register_script(source).sha


@dataclass(frozen=True)
class _Call:
    """A script call waiting for its pipeline."""

    script: _Script
    keys: list[str]
    args: list[Any]
    future: asyncio.Future[Any]


def _answer(future: asyncio.Future[Any], reply: Any) -> None:
    """Hand ``reply`` (an exception: raise it) to a caller still waiting."""
    if future.done():
        return
    if isinstance(reply, BaseException):
        future.set_exception(reply)
    else:
        future.set_result(reply)


class Books:
    """The scripts on a redis-py asyncio client (plain, Sentinel or Cluster).

    Where the client pipelines (one Redis, Sentinel's master), every script call made in one
    turn of the event loop goes out in one pipeline: under load one round trip carries many
    requests' reservations and settlements (each script still runs on its own, atomically).
    A Cluster's calls go node by node, each on its own."""

    def __init__(self, client: Any, prefix: str, pipelines: bool = True) -> None:
        self.client = client
        self.prefix = prefix
        self.pipelines = pipelines
        self._reserve = _Script(client, RESERVE)
        self._settle = _Script(client, SETTLE)
        self._renew = _Script(client, RENEW)
        self._heartbeat = _Script(client, HEARTBEAT)
        self._peek = _Script(client, PEEK)
        self._rate = _Script(client, RATE)
        self._keys: dict[str, list[str]] = {}
        self._queued: list[_Call] = []
        self._sending: set[asyncio.Task[None]] = set()

    def keys(self, tenant: str) -> list[str]:
        """The tenant's window, holds, leases and expired holds (made once per tenant)."""
        found = self._keys.get(tenant)
        if found is None:
            base = f"{self.prefix}:{{{tenant}}}"
            found = self._keys[tenant] = [f"{base}:w", f"{base}:h", f"{base}:l", f"{base}:x"]
        return found

    async def _call(self, script: _Script, keys: list[str], args: list[Any]) -> Any:
        """Run ``script`` in the pipeline of this turn of the event loop."""
        if not self.pipelines:
            return await self._direct(script, keys, args)
        loop = asyncio.get_running_loop()
        call = _Call(script, keys, args, loop.create_future())
        self._queued.append(call)
        if len(self._queued) == 1:
            loop.call_soon(self._send)
        return await call.future

    async def _direct(self, script: _Script, keys: list[str], args: list[Any]) -> Any:
        try:
            return await self.client.evalsha(script.sha, len(keys), *keys, *args)
        except NoScriptError:
            await self.client.script_load(script.source)
            return await self.client.evalsha(script.sha, len(keys), *keys, *args)

    def _send(self) -> None:
        calls, self._queued = self._queued, []
        task = asyncio.ensure_future(self._pipeline(calls))
        self._sending.add(task)
        task.add_done_callback(self._sending.discard)

    async def _pipeline(self, calls: list[_Call]) -> None:
        """One round trip for every call queued, written in one write on a pooled
        connection (redis-py's Pipeline costs more per call than the scripts do), each reply
        handed to its caller as it is read (a script's error fails its call alone). Every
        reply is read before the connection goes back to the pool, so it is never reused out
        of step; one that failed part way is dropped. A NOSCRIPT (the script never ran) is
        loaded and run again on its own."""
        unloaded: list[_Call] = []
        try:
            pool = self.client.connection_pool
            connection = await pool.get_connection()
            try:
                await connection.send_packed_command(
                    connection.pack_commands(
                        [("EVALSHA", c.script.sha, len(c.keys), *c.keys, *c.args) for c in calls]
                    )
                )
                for call in calls:
                    try:
                        _answer(call.future, await connection.read_response())
                    except NoScriptError:
                        unloaded.append(call)
                    except ResponseError as error:
                        _answer(call.future, error)
            except BaseException:
                await connection.disconnect()
                raise
            finally:
                await pool.release(connection)
            for call in unloaded:
                _answer(call.future, await self._direct(call.script, call.keys, call.args))
        except (RedisError, OSError) as exc:
            for call in calls:
                _answer(call.future, exc)

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
        most: int = 0,
        buckets: Sequence[tuple[str, int, float, float]] = (),
    ) -> Reserved:
        """Hold ``prompt + cap * choices`` (``window_ms`` 0: no budget, only a slot) unless
        the tenant has ``most`` requests in flight already (0: no cap), after letting the
        request in against (and taking from) the ``(name, capacity, need, take)`` rate
        ``buckets`` in the same script."""
        keys = self.keys(tenant) + self._bucket_keys(tenant, buckets)
        args = [hold, window_ms, limit, prompt, cap, choices, 1 if clamp else 0, lease_ms, most]
        for _, capacity, needed, taken in buckets:
            args += [capacity, needed, taken]
        verdict, used, reserved, start, now, capped, flight, wait, *levels = await self._call(
            self._reserve, keys, args
        )
        return Reserved(
            verdict == 1,
            Window(used, reserved, start, now, flight),
            int(capped),
            at_cap=verdict == 2,
            rate_admitted=verdict != 3,
            rate_wait_s=int(wait) / 1000,
            rate_levels=tuple(level / 1000 for level in levels),
        )

    def _bucket_keys(
        self, tenant: str, buckets: Sequence[tuple[str, int, float, float]]
    ) -> list[str]:
        return [f"{self.prefix}:{{{tenant}}}:rl:{name}" for name, *_ in buckets]

    async def settle(
        self,
        tenant: str,
        hold: str,
        window_ms: int,
        tokens: int,
        spent_in_ms: int = -1,
        entry: str = "",
    ) -> Window | None:
        """Release ``hold`` and charge ``tokens``; None when it was settled already (or
        ``entry``, the journal entry of a request that held nothing, was replayed)."""
        keys = self.keys(tenant)
        if entry:
            keys = [*keys, f"{self.prefix}:{{{tenant}}}:j:{entry}"]
        args = [hold, window_ms, tokens, spent_in_ms, REPLAYED_TTL_S]
        charged, *window = await self._call(self._settle, keys, args)
        return Window(*window) if charged == 1 else None

    async def renew(self, tenant: str, holds: list[str], lease_ms: int) -> int:
        return int(await self._call(self._renew, [self.keys(tenant)[2]], [lease_ms, *holds]))

    async def heartbeat(self, proxy: str, lease_ms: int) -> int:
        return int(await self._call(self._heartbeat, [f"{self.prefix}:proxies"], [proxy, lease_ms]))

    async def peek(self, tenant: str, window_ms: int) -> Window:
        """The tenant's current window, leases that expired dropped first."""
        return Window(*await self._call(self._peek, self.keys(tenant), ["", window_ms]))

    async def rate(
        self, tenant: str, buckets: list[tuple[str, int, float, float]], charge: bool
    ) -> tuple[bool, int, list[float]]:
        """Let in against (or, with ``charge``, take from) ``(name, capacity, need, take)``
        buckets: (admitted, ms to wait, levels after)."""
        keys = self._bucket_keys(tenant, buckets)
        args: list[str | int | float] = ["charge" if charge else "take"]
        for _, capacity, needed, taken in buckets:
            args += [capacity, needed, taken]
        admitted, wait, *levels = await self._call(self._rate, keys, args)
        return admitted == 1, int(wait), [level / 1000 for level in levels]

    async def total(self, tenant: str) -> int:
        """Every token ever charged to the tenant (the books)."""
        value = await self.client.hget(self.keys(tenant)[0], "total")
        return int(value or 0)
