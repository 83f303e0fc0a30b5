"""Redis killed during a flood, then back: each failure policy's bound, the readiness
condition and metric, and the journal that brings the books back to the engine's counters."""

from __future__ import annotations

import asyncio
import threading
from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest
import redis.asyncio as aioredis

from inferwatch.proxy.sharedbooks import Books
from support.fleet import Fleet, flood, wait_ready
from support.proxy_stack import Engine, own_engine, samples
from support.redis import RedisServer
from support.wait import wait_for

pytestmark = pytest.mark.proc

BUDGET = 3000
PROXIES = 2


@pytest.fixture
def engine() -> Iterator[Engine]:
    with own_engine() as engine:
        yield engine


def fleet_of(policy: str, server: RedisServer, engine: Engine, tmp_path: Path) -> Fleet:
    tenants = {"acme": {"budget": {"tokens": BUDGET}, "failure_policy": policy}}
    fleet = Fleet(server, engine.url, tmp_path, tenants, {"lease": "3s", "timeout": "250ms"})
    fleet.add_counted(PROXIES)
    return fleet


def total(server: RedisServer) -> int:
    async def read() -> int:
        client = aioredis.Redis.from_url(server.url)
        try:
            return await Books(client, "inferwatch").total("acme")
        finally:
            await client.aclose()

    return asyncio.run(read())


def engine_tokens(engine: Engine) -> int:
    return engine.engine.prompt_total + engine.engine.generation_total


def flood_through_an_outage(fleet: Fleet, engine: Engine) -> list[httpx.Response]:
    """A wave, a second wave still running when Redis is killed, a third while it is down;
    every answer given while Redis was down."""
    urls = [p.url for p in fleet.proxies]
    assert all(a.status_code == 200 for a in flood(urls, "acme", per_proxy=6, max_tokens=100))
    running: list[httpx.Response] = []
    started = len(engine.engine.requests)
    second = threading.Thread(
        target=lambda: running.extend(
            flood(urls, "acme", per_proxy=4, max_tokens=100, delay_ms=1500)
        ),
        daemon=True,
    )
    second.start()
    wait_for(lambda: len(engine.engine.requests) == started + 8, "the second wave in the engine")
    fleet.redis.kill()
    while_down = flood(urls, "acme", per_proxy=20, max_tokens=100, delay_ms=0)
    second.join(30)
    assert len(running) == 8 and all(a.status_code == 200 for a in running)
    for proxy in fleet.proxies:
        assert samples(proxy.metrics(), "inferwatch_tenancy_shared_state_up") == 0
    return while_down


def books_come_back(fleet: Fleet, engine: Engine) -> None:
    fleet.redis.start()
    spent = engine_tokens(engine)
    wait_for(lambda: total(fleet.redis) == spent, lambda: f"{total(fleet.redis)} == {spent}", 20)
    for proxy in fleet.proxies:
        wait_ready(proxy, True)
        text = proxy.metrics()
        assert samples(text, "inferwatch_tenancy_shared_state_up") == 1
        assert samples(text, "inferwatch_tenancy_shared_state_journal_entries") == 0


def test_fail_closed_admits_nothing_while_redis_is_down_and_the_books_catch_up(
    redis_server: RedisServer, engine: Engine, tmp_path: Path
) -> None:
    fleet = fleet_of("fail_closed", redis_server, engine, tmp_path)
    try:
        while_down = flood_through_an_outage(fleet, engine)
        assert {a.status_code for a in while_down} == {503}
        assert all(a.headers["retry-after"] == "1" for a in while_down)
        assert engine_tokens(engine) <= BUDGET
        for proxy in fleet.proxies:
            wait_ready(proxy, False)
            condition = proxy.ready().json()["conditions"][-1]
            assert condition["name"] == "shared_state" and not condition["ok"]
        books_come_back(fleet, engine)
    finally:
        fleet.close()


def test_fail_open_spends_at_most_one_nth_over_and_the_journal_loses_no_token(
    redis_server: RedisServer, engine: Engine, tmp_path: Path
) -> None:
    fleet = fleet_of("fail_open", redis_server, engine, tmp_path)
    try:
        while_down = flood_through_an_outage(fleet, engine)
        admitted = [a for a in while_down if a.status_code == 200]
        assert admitted, "fail_open admits within its local bound"
        assert {a.status_code for a in while_down} <= {200, 429}
        spent = engine_tokens(engine)
        assert spent <= BUDGET * (1 + 1 / PROXIES), f"spent {spent} of {BUDGET}"
        for proxy in fleet.proxies:
            assert proxy.ready().status_code == 200  # fail_open tenants keep it ready
            assert samples(proxy.metrics(), "inferwatch_tenancy_shared_state_replicas") == 2
        books_come_back(fleet, engine)
    finally:
        fleet.close()
