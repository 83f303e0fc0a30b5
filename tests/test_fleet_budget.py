"""One tenant budget across real proxy processes sharing a real redis-server: concurrent
floods over four proxies, a proxy killed mid-flight, a proxy restarted; a tenant's
concurrency cap raced from two proxies."""

from __future__ import annotations

import asyncio
import contextlib
import threading
from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest
import redis.asyncio as aioredis

from inferwatch.proxy.sharedbooks import Books
from support.fleet import Fleet, flood
from support.proxy_stack import Engine, samples
from support.redis import RedisServer
from support.wait import wait_for

pytestmark = pytest.mark.proc

BUDGET = 3000
HOUR_MS = 3_600_000


#: the lease of the tests that kill a proxy, after which its holds expire, and its Redis timeout
#: (at most a sixth of it). With 2 s and 300 ms, a Redis call slowed past 300 ms on a busy
#: machine sent a proxy to its failure policy, which admits only 1/N² of the budget: the
#: doomed proxy never held the whole budget in Redis, or the survivor got a 429
LEASE_S = 6
SHORT_LEASE = {"lease": f"{LEASE_S}s", "timeout": "1s"}


@pytest.fixture
def fleet(redis_server: RedisServer, engine: Engine, tmp_path: Path) -> Iterator[Fleet]:
    fleet = Fleet(redis_server, engine.url, tmp_path, {"acme": {"budget": {"tokens": BUDGET}}})
    yield fleet
    fleet.close()


def books(server: RedisServer) -> tuple[int, int, int]:
    """(used, reserved, total) of acme's hour, as Redis has them."""

    async def read() -> tuple[int, int, int]:
        client = aioredis.Redis.from_url(server.url)
        try:
            shared = Books(client, "inferwatch")
            window = await shared.peek("acme", HOUR_MS)
            return window.used, window.reserved, await shared.total("acme")
        finally:
            await client.aclose()

    return asyncio.run(read())


def engine_tokens(engine: Engine) -> int:
    return engine.engine.prompt_total + engine.engine.generation_total


def test_four_proxies_with_fifty_concurrent_requests_each_spend_one_budget(
    fleet: Fleet, engine: Engine
) -> None:
    """Each proxy alone would let 3000 tokens through; together they still let 3000."""
    proxies = fleet.add(4)
    before = engine_tokens(engine)
    answers = flood([p.url for p in proxies], "acme", per_proxy=50, max_tokens=60)
    spent = engine_tokens(engine) - before
    errors = [samples(p.metrics(), "inferwatch_tenancy_shared_state_errors_total") for p in proxies]
    assert errors == [0, 0, 0, 0], "Redis answered every call in time"
    admitted = [a for a in answers if a.status_code == 200]
    refused = [a for a in answers if a.status_code == 429]
    assert len(admitted) + len(refused) == 200
    largest = max(a.json()["usage"]["total_tokens"] for a in admitted)
    assert refused and admitted
    assert spent <= BUDGET + largest, f"spent {spent} of {BUDGET}"
    used, reserved, total = books(fleet.redis)
    assert (used, reserved, total) == (spent, 0, spent)
    assert all("retry after" in a.json()["error"]["message"] for a in refused)


def test_a_killed_proxys_reservations_return_within_the_lease(fleet: Fleet, engine: Engine) -> None:
    fleet.shared = SHORT_LEASE
    doomed, survivor = fleet.add(2)

    # doomed holds the whole budget (its last request clamped to the rest) with requests
    # the engine keeps for a minute
    def hold() -> None:
        with contextlib.suppress(httpx.HTTPError):  # the proxy dies under them
            flood([doomed.url], "acme", per_proxy=5, max_tokens=700, delay_ms=60_000)

    holding = threading.Thread(target=hold, daemon=True)
    holding.start()
    wait_for(lambda: books(fleet.redis)[1] == BUDGET, "the doomed proxy to hold it all", 20)
    refused = flood([survivor.url], "acme", per_proxy=1, max_tokens=700)[0]
    assert refused.status_code == 429  # the room is held
    in_flight = "inferwatch_tenancy_fleet_requests_in_flight"
    assert samples(survivor.metrics(), in_flight, tenant="acme") == 5  # all of them doomed's
    doomed.kill()
    # a hold is dropped by the first script that looks after its lease expired
    wait_for(lambda: books(fleet.redis)[1] == 0, "the dead proxy's holds to expire", LEASE_S + 3)
    admitted = flood([survivor.url], "acme", per_proxy=1, max_tokens=700, delay_ms=0)[0]
    assert admitted.status_code == 200, admitted.text


def test_a_restarted_proxy_does_not_refill_the_window(fleet: Fleet, engine: Engine) -> None:
    (proxy,) = fleet.add(1)
    while any(
        a.status_code == 200
        for a in flood([proxy.url], "acme", per_proxy=5, max_tokens=200, delay_ms=0)
    ):
        pass
    used = books(fleet.redis)[0]
    assert used > BUDGET - 300
    proxy.kill()
    proxy.start()
    again = flood([proxy.url], "acme", per_proxy=1, max_tokens=200, delay_ms=0)[0]
    assert again.status_code == 429
    assert samples(proxy.metrics(), "inferwatch_tenancy_shared_state_up") == 1


def test_a_rate_limit_holds_across_the_fleet_and_its_headers_say_so(
    redis_server: RedisServer, engine: Engine, tmp_path: Path
) -> None:
    """Ten requests a minute for the tenant: two proxies let ten through between them."""
    limits = {"rate_limits": {"requests_per_minute": 10}}
    fleet = Fleet(redis_server, engine.url, tmp_path, {"acme": limits})
    try:
        proxies = fleet.add(2)
        answers = flood([p.url for p in proxies], "acme", per_proxy=15, max_tokens=4, delay_ms=0)
        admitted = [a for a in answers if a.status_code == 200]
        refused = [a for a in answers if a.status_code == 429]
        assert len(admitted) == 10 and len(refused) == 20
        remaining = sorted(int(a.headers["x-ratelimit-remaining-requests"]) for a in admitted)
        assert remaining == list(range(10))  # one bucket: each answer saw the one before
        assert all(a.headers["x-ratelimit-limit-requests"] == "10" for a in answers)
        assert all(int(a.headers["retry-after"]) >= 1 for a in refused)
    finally:
        fleet.close()


def test_a_hostile_tenant_racing_its_own_cap_from_two_proxies_never_runs_more_than_it(
    redis_server: RedisServer, engine: Engine, tmp_path: Path
) -> None:
    """Three in flight for the tenant: forty at once over two proxies, and the engine never
    runs more than three of them at a time (each proxy alone would let three through)."""
    fleet = Fleet(redis_server, engine.url, tmp_path, {"acme": {"max_concurrency": 3}})
    try:
        proxies = fleet.add(2)
        answers = flood(
            [p.url for p in proxies], "acme", per_proxy=20, max_tokens=4, tag="hostile-cap"
        )
        admitted = [a for a in answers if a.status_code == 200]
        refused = [a for a in answers if a.status_code == 429]
        assert len(admitted) + len(refused) == 40
        assert admitted and refused
        assert engine.engine.peak["hostile-cap"] <= 3
        assert all("across the fleet (limit 3)" in a.json()["error"]["message"] for a in refused)
    finally:
        fleet.close()


def test_a_killed_proxys_concurrency_slots_return_within_the_lease(
    redis_server: RedisServer, engine: Engine, tmp_path: Path
) -> None:
    limits = {"max_concurrency": 2, "budget": {"tokens": 10**9}}
    fleet = Fleet(redis_server, engine.url, tmp_path, {"acme": limits})
    fleet.shared = SHORT_LEASE
    try:
        doomed, survivor = fleet.add(2)

        def hold() -> None:
            with contextlib.suppress(httpx.HTTPError):  # the proxy dies under them
                flood([doomed.url], "acme", per_proxy=2, max_tokens=4, delay_ms=60_000)

        threading.Thread(target=hold, daemon=True).start()
        in_flight = "inferwatch_tenancy_fleet_requests_in_flight"
        wait_for(lambda: books(fleet.redis)[1] > 0, "the doomed proxy to hold both slots", 20)
        wait_for(
            lambda: (
                flood([survivor.url], "acme", 1, 4, delay_ms=0)[0].status_code == 429
                and samples(survivor.metrics(), in_flight, tenant="acme") == 2
            ),
            "the survivor to be refused: both slots held by the doomed proxy",
            20,
        )
        doomed.kill()
        # a slot is dropped by the first script that looks after its lease expired
        served = wait_for(
            lambda: [r for r in flood([survivor.url], "acme", 1, 4, delay_ms=0)
                     if r.status_code == 200],
            "the dead proxy's slots to return",
            LEASE_S + 3,
        )  # fmt: skip
        assert [r.status_code for r in served] == [200]
    finally:
        fleet.close()
