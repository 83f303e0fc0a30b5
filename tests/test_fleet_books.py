"""The budget scripts against a real redis-server: interleavings hypothesis chooses, replayed
journal entries, expired leases and a tenant racing its own budget from many clients."""

from __future__ import annotations

import asyncio
import uuid
from collections.abc import Awaitable, Callable
from pathlib import Path
from typing import Any

import pytest
import redis.asyncio as aioredis
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from inferwatch.proxy import config as proxy_config
from inferwatch.proxy.ratelimit import Bucket
from inferwatch.proxy.sharedbooks import Books, Reserved
from inferwatch.proxy.sharedconfig import SharedState
from inferwatch.proxy.sharedstate import SharedLedger, SharedReservation, connect
from support.ports import pick_port
from support.redis import RedisServer
from support.wait import wait_until

pytestmark = pytest.mark.proc

#: a window that does not turn while the tests run
WINDOW_MS = 10**12
LEASE_MS = 60_000
HOUR_MS = 3_600_000


@pytest.fixture(scope="module")
def server(tmp_path_factory: pytest.TempPathFactory) -> Any:
    redis = RedisServer(tmp_path_factory.mktemp("redis"))
    yield redis
    redis.stop()


def run(server: RedisServer, work: Callable[[Books], Awaitable[Any]]) -> Any:
    async def go() -> Any:
        client = aioredis.Redis.from_url(server.url)
        try:
            return await work(Books(client, "t"))
        finally:
            await client.aclose()

    return asyncio.run(go())


class Model:
    """What the books must say: the single-proxy ledger's rule, applied in the same order."""

    def __init__(self, limit: int) -> None:
        self.limit = limit
        self.used = 0
        self.holds: dict[str, int] = {}

    def reserve(self, hold: str, prompt: int, cap: int, choices: int, clamp: bool) -> int | None:
        room = self.limit - self.used - sum(self.holds.values())
        granted = cap
        if prompt + cap * choices > room and clamp:
            granted = (room - prompt) // choices
        if granted < 0 or (granted == 0 and cap > 0) or prompt + granted * choices > room:
            return None
        self.holds[hold] = prompt + granted * choices
        return granted


operation = st.one_of(
    st.tuples(
        st.just("reserve"),
        st.integers(0, 3),  # which proxy asks
        st.integers(0, 400),
        st.integers(0, 400),
        st.integers(1, 3),
        st.booleans(),
    ),
    st.tuples(st.just("settle"), st.integers(0, 50), st.floats(0, 1)),
    st.tuples(st.just("expire"), st.integers(0, 50)),
)


@settings(
    max_examples=60, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture]
)
@given(limit=st.integers(1, 2000), operations=st.lists(operation, max_size=40))
def test_any_interleaving_keeps_the_books_of_one_ledger(
    server: RedisServer, limit: int, operations: list[tuple[Any, ...]]
) -> None:
    """Scripts run atomically, so every concurrent run is some order of them: in each order
    hypothesis picks, the books equal the single-proxy rule's and never hold over the limit."""
    tenant = uuid.uuid4().hex

    async def work(books: Books) -> None:
        model = Model(limit)
        live: list[str] = []
        for number, (kind, *args) in enumerate(operations):
            if kind == "reserve":
                proxy, prompt, cap, choices, clamp = args
                hold = f"p{proxy}:{number}"
                expected = model.reserve(hold, prompt, cap, choices, clamp)
                got = await books.reserve(
                    tenant, hold, WINDOW_MS, limit, prompt, cap, choices, clamp, LEASE_MS
                )
                assert got.admitted == (expected is not None)
                if expected is not None:
                    assert got.cap == expected
                    live.append(hold)
            elif kind == "settle" and live:
                hold = live.pop(args[0] % len(live))
                tokens = int(model.holds.pop(hold) * args[1])  # usage within its hold
                model.used += tokens
                await books.settle(tenant, hold, WINDOW_MS, tokens)
            elif kind == "expire" and live:
                hold = live.pop(args[0] % len(live))
                del model.holds[hold]  # its proxy died: the lease runs out
                await books.client.zadd(books.keys(tenant)[2], {hold: 0})
            window = await books.peek(tenant, WINDOW_MS)
            assert (window.used, window.reserved) == (model.used, sum(model.holds.values()))
            assert window.used + window.reserved <= limit

    run(server, work)


def test_a_tenant_racing_its_own_budget_from_many_clients_gets_exactly_the_budget(
    server: RedisServer,
) -> None:
    """200 reservations at once over 8 connections: exactly budget / size of them hold."""
    tenant = uuid.uuid4().hex

    async def work(books: Books) -> None:
        clients = [aioredis.Redis.from_url(server.url) for _ in range(8)]
        try:
            racers = [Books(client, "t") for client in clients]
            results = await asyncio.gather(
                *(
                    racers[i % 8].reserve(
                        tenant, f"h{i}", WINDOW_MS, 1000, 10, 40, 1, False, LEASE_MS
                    )
                    for i in range(200)
                )
            )
        finally:
            for client in clients:
                await client.aclose()
        assert sum(r.admitted for r in results) == 1000 // 50
        window = await books.peek(tenant, WINDOW_MS)
        assert window.reserved == 1000

    run(server, work)


def test_an_expired_lease_returns_its_hold_and_a_renewed_one_keeps_it(
    server: RedisServer,
) -> None:
    tenant = uuid.uuid4().hex

    async def work(books: Books) -> None:
        await books.reserve(tenant, "kept", WINDOW_MS, 1000, 0, 100, 1, False, 300)
        await books.reserve(tenant, "lost", WINDOW_MS, 1000, 0, 200, 1, False, 300)
        assert (await books.peek(tenant, WINDOW_MS)).reserved == 300
        # renewed while its request runs; the other's proxy is gone

        async def only_the_renewed_one_holds() -> bool:
            assert await books.renew(tenant, ["kept"], 300) == 1
            return (await books.peek(tenant, WINDOW_MS)).reserved == 100

        await wait_until(only_the_renewed_one_holds, "the unrenewed lease to expire", 10)
        assert await books.renew(tenant, ["lost"], 300) == 0  # gone, not brought back

    run(server, work)


def test_a_replayed_journal_entry_is_charged_once(server: RedisServer) -> None:
    tenant = uuid.uuid4().hex

    async def work(books: Books) -> None:
        await books.reserve(tenant, "h", WINDOW_MS, 1000, 0, 100, 1, False, LEASE_MS)
        first = await books.settle(tenant, "h", WINDOW_MS, 70, -1, "entry-1")
        again = await books.settle(tenant, "h", WINDOW_MS, 70, -1, "entry-1")
        assert first is not None and again is None
        window = await books.peek(tenant, WINDOW_MS)
        assert (window.used, window.reserved) == (70, 0)
        assert await books.total(tenant) == 70

    run(server, work)


def test_a_replayed_settlement_of_a_settled_reservation_charges_nothing(
    server: RedisServer,
) -> None:
    """A settlement whose reply was lost is journaled and replayed: keyed by its reservation,
    the replay of one that Redis had settled is a no-op, so the books never double-count."""
    tenant = uuid.uuid4().hex

    async def work(books: Books) -> None:
        await books.reserve(tenant, "h", WINDOW_MS, 1000, 0, 100, 1, False, LEASE_MS)
        assert await books.settle(tenant, "h", WINDOW_MS, 70) is not None
        assert await books.settle(tenant, "h", WINDOW_MS, 70) is None  # the replay
        window = await books.peek(tenant, WINDOW_MS)
        assert (window.used, window.reserved, window.in_flight) == (70, 0, 0)
        assert await books.total(tenant) == 70

    run(server, work)


def test_a_reservation_whose_lease_expired_is_still_charged_once_when_it_settles(
    server: RedisServer,
) -> None:
    """Its hold went back to the room when the lease ran out; the tokens it spent still
    reach the books when it settles (late, or from a journal), and only once."""
    tenant = uuid.uuid4().hex

    async def work(books: Books) -> None:
        await books.reserve(tenant, "h", WINDOW_MS, 1000, 0, 100, 1, False, LEASE_MS)
        await books.client.zadd(books.keys(tenant)[2], {"h": 0})  # the lease ran out
        assert (await books.peek(tenant, WINDOW_MS)).reserved == 0
        assert await books.settle(tenant, "h", WINDOW_MS, 40) is not None
        assert await books.settle(tenant, "h", WINDOW_MS, 40) is None
        assert await books.total(tenant) == 40

    run(server, work)


def test_tokens_spent_in_an_earlier_window_reach_the_total_not_the_window(
    server: RedisServer,
) -> None:
    tenant = uuid.uuid4().hex

    async def work(books: Books) -> None:
        window = await books.peek(tenant, 60_000)
        await books.settle(tenant, "", 60_000, 25, window.start_ms - 60_000, "old")
        await books.settle(tenant, "", 60_000, 5, window.start_ms, "now")
        assert (await books.peek(tenant, 60_000)).used in (5, 0)  # 0: the minute turned
        assert await books.total(tenant) == 30

    run(server, work)


def test_the_server_keeps_its_books_across_a_kill(server: RedisServer, tmp_path: Path) -> None:
    """The test server's append-only file survives kill -9, as a production AOF Redis does."""
    tenant = uuid.uuid4().hex
    run(server, lambda books: books.settle(tenant, "", WINDOW_MS, 42))
    server.kill()
    server.start()
    assert run(server, lambda books: books.total(tenant)) == 42


def test_the_proxys_client_loads_its_scripts_again_on_a_redis_that_lost_them(
    server: RedisServer,
) -> None:
    """A restarted or failed-over Redis holds no scripts: the proxy's own client (hiredis
    packing, one write per turn) loads them with SCRIPT LOAD and the call goes through."""
    tenant = uuid.uuid4().hex

    async def go() -> tuple[bool, bool, int]:
        client, _ = connect(SharedState(url=server.url))
        try:
            books = Books(client, "t")
            await client.script_flush()
            first, second = await asyncio.gather(  # one pipeline, both answered NOSCRIPT
                books.reserve(tenant, "a", WINDOW_MS, 100, 10, 20, 1, False, LEASE_MS),
                books.reserve(tenant, "b", WINDOW_MS, 100, 10, 20, 1, False, LEASE_MS),
            )
            await books.settle(tenant, "a", WINDOW_MS, 25)
            return first.admitted, second.admitted, await books.total(tenant)
        finally:
            await client.aclose()

    assert asyncio.run(go()) == (True, True, 25)


def test_a_slow_redis_counts_as_down_and_a_late_reservation_does_not_leak(
    server: RedisServer,
) -> None:
    """Redis paused past the call's bound: the request falls back to the local bound at once,
    and whatever the script still reserved once Redis woke up is gone within the lease (the
    reply was lost, so it is released, or it expires), not leaked."""
    tenant = uuid.uuid4().hex
    document = {
        "shared_state": {"url": server.url, "timeout": "100ms", "lease": "2s"},
        "tenants": {tenant: {"budget": {"tokens": 1000}}},
    }
    config = proxy_config.parse(document, "p.yaml")
    budget = config.tenants[tenant].budget
    assert budget is not None

    async def work(test_books: Books) -> None:
        ledger = SharedLedger(config)
        books = Books(test_books.client, config.shared_state.key_prefix)  # the proxy's keys
        try:
            first, _ = await ledger.reserve(tenant, budget, 0, 100, clamp=False)
            assert isinstance(first, SharedReservation) and first.hold
            # longer than a call may take (3 x 100 ms), shorter than the first one's lease
            await books.client.execute_command("CLIENT", "PAUSE", 700, "ALL")
            late, _ = await ledger.reserve(tenant, budget, 0, 200, clamp=False)
            assert not ledger.up and ledger.errors == {"timeout": 1}
            assert isinstance(late, SharedReservation) and not late.hold  # the local bound's

            async def back_with_only_the_first() -> bool:
                await ledger.tick()  # the heartbeat finds Redis again and renews the first
                return ledger.up and (await books.peek(tenant, HOUR_MS)).reserved == 100

            await wait_until(back_with_only_the_first, "Redis back, the late one gone", 2 + 5)
        finally:
            await ledger.aclose()

    run(server, work)


def test_the_reservation_checks_the_rate_buckets_in_the_same_script(server: RedisServer) -> None:
    """The rate check inside the reservation: a request it lets in takes from its buckets
    and holds its tokens; one let in and then refused its budget has still taken from
    them (its settlement gives the tokens back, as a separate check's did); one it refuses
    holds nothing, takes nothing and is told how long to wait."""
    tenant = uuid.uuid4().hex
    per_minute = ("requests:", 2, 1.0, 1.0)  # two requests a minute, one taken per request

    async def work(books: Books) -> None:
        def reserve(hold: str, cap: int) -> Awaitable[Reserved]:
            return books.reserve(
                tenant, hold, WINDOW_MS, 1000, 10, cap, 1, False, LEASE_MS, 0, [per_minute]
            )

        first = await reserve("a", 20)
        assert first.admitted and first.rate_admitted
        assert first.rate_levels == (pytest.approx(1, abs=0.05),)
        over_budget = await reserve("b", 2000)
        assert not over_budget.admitted and over_budget.rate_admitted
        assert over_budget.rate_levels == (pytest.approx(0, abs=0.05),)
        limited = await reserve("c", 20)
        assert not limited.rate_admitted and not limited.admitted
        assert 25 < limited.rate_wait_s <= 30  # a whole request at two a minute
        window = await books.peek(tenant, WINDOW_MS)
        assert (window.reserved, window.in_flight) == (30, 1)

    run(server, work)


def test_a_reservation_whose_request_left_gives_back_its_rate_tokens(server: RedisServer) -> None:
    """The client left while the reservation's script was on its way (Redis paused): once
    it answers, the hold is released and the tokens its rate check took go back."""
    tenant = uuid.uuid4().hex
    limits = {"tokens_per_minute": 60_000}  # the level Redis keeps is the one last taken to
    document = {
        "shared_state": {"url": server.url, "timeout": "1s"},
        "tenants": {tenant: {"budget": {"tokens": 10_000}, "rate_limits": limits}},
    }
    config = proxy_config.parse(document, "p.yaml")
    budget = config.tenants[tenant].budget
    bucket = Bucket("", "tokens", 60_000)

    async def work(test_books: Books) -> None:
        ledger = SharedLedger(config)
        books = Books(test_books.client, config.shared_state.key_prefix)
        level_key = f"{config.shared_state.key_prefix}:{{{tenant}}}:rl:tokens:"
        try:
            await books.client.execute_command("CLIENT", "PAUSE", 300, "ALL")
            left = asyncio.ensure_future(
                ledger.reserve(tenant, budget, 100, 400, rate=[bucket], rate_tokens=500)
            )
            await asyncio.sleep(0.05)
            left.cancel()
            with pytest.raises(asyncio.CancelledError):
                await left

            async def given_back() -> bool:
                level = await books.client.hget(level_key, "level")
                window = await books.peek(tenant, HOUR_MS)
                return level is not None and float(level) > 60_000 - 100 and window.reserved == 0

            await wait_until(given_back, "the hold released and its rate tokens back", 10)
            assert ledger.up
        finally:
            await ledger.aclose()

    run(server, work)


def test_a_reservation_refused_after_all_is_given_back_uncharged(tmp_path: Path) -> None:
    """Redis unreachable mid-admission: the request holds the local bound's reservation;
    when this proxy's rate limit then refuses it, cancelling gives that room back, charges
    nothing and journals nothing."""
    tenant = uuid.uuid4().hex
    nobody = pick_port()  # nothing listens there
    document = {
        "shared_state": {"url": f"redis://127.0.0.1:{nobody}/0", "timeout": "100ms",
                         "journal_dir": str(tmp_path)},
        "tenants": {tenant: {"budget": {"tokens": 100_000}, "failure_policy": "fail_open"}},
    }  # fmt: skip
    config = proxy_config.parse(document, "p.yaml")
    budget = config.tenants[tenant].budget
    assert budget is not None

    async def go() -> None:
        ledger = SharedLedger(config)
        try:
            reserved, levels = await ledger.reserve(tenant, budget, 10, 100, clamp=False)
            assert levels is None and not ledger.up
            assert isinstance(reserved, SharedReservation) and not reserved.hold
            assert ledger.local.reserved(tenant, budget) == 110
            ledger.cancel(reserved, budget)
            assert ledger.local.reserved(tenant, budget) == 0
            assert ledger.local.room(tenant, budget) == budget.tokens + budget.tolerance
            assert ledger.journal.pending == 0
        finally:
            await ledger.aclose()

    asyncio.run(go())
