"""Fair share at a saturated engine: slots by priority class then weight, the lowest class shed
first from a full queue, and each decision in the metrics."""

from __future__ import annotations

import asyncio
import threading
from collections.abc import Callable
from typing import Any

import httpx
import pytest

from inferwatch.proxy import config as proxy_config
from inferwatch.proxy.admission import ConcurrencyGate, Refusal
from inferwatch.proxy.config import PRIORITIES
from inferwatch.proxy.tenants import hash_key
from support.proxy_stack import CHAT, KEYS, Stack, auth, samples
from support.wait import wait_for

pytestmark = pytest.mark.unit

MakeStack = Callable[..., Stack]
LOW, NORMAL, HIGH = PRIORITIES["low"], PRIORITIES["normal"], PRIORITIES["high"]


async def queue_behind_one_slot(
    gate: ConcurrencyGate, entries: list[tuple[str, int, int]], queued: int | None = None
) -> tuple[list[str], list[asyncio.Task[Refusal | None]]]:
    """Take the only slot and queue ``(tenant, priority, weight)`` requests in that order
    (``queued`` of them stay in the queue); the order in which they then get the slot, each
    handing it on as soon as it has it."""
    assert await gate.acquire("holder", 0, NORMAL) is None
    served: list[str] = []

    async def request(tenant: str, priority: int, weight: int) -> Refusal | None:
        refusal = await gate.acquire(tenant, 0, priority, weight)
        if refusal is None:
            served.append(tenant)
            gate.release(tenant)
        return refusal

    tasks = []
    for number, entry in enumerate(entries, 1):
        tasks.append(asyncio.ensure_future(request(*entry)))
        await asyncio.sleep(0)  # the task runs up to its wait in the queue (or its refusal)
        assert gate.waiting == min(number, queued or number)
    gate.release("holder")
    await asyncio.gather(*tasks)
    return served, tasks


def test_queued_tenants_of_one_class_are_served_by_weight() -> None:
    async def run() -> list[str]:
        gate = ConcurrencyGate(1, 10)
        heavy = [("heavy", NORMAL, 2)] * 6
        light = [("light", NORMAL, 1)] * 6
        served, _ = await queue_behind_one_slot(gate, light + heavy)
        return served

    served = asyncio.run(run())
    # the light tenant queued first, yet the heavy one gets two slots to each of its one
    assert served[:9] == ["heavy", "light", "heavy", "heavy", "light", "heavy", "heavy", "light",
                          "heavy"]  # fmt: skip


def test_a_higher_class_goes_first_whatever_the_weights() -> None:
    async def run() -> list[str]:
        gate = ConcurrencyGate(1, 10)
        entries = [("bulk", LOW, 100), ("bulk", LOW, 100), ("paying", HIGH, 1), ("std", NORMAL, 1)]
        served, _ = await queue_behind_one_slot(gate, entries)
        return served

    assert asyncio.run(run()) == ["paying", "std", "bulk", "bulk"]


def test_a_full_queue_sheds_its_lowest_class_first() -> None:
    async def run() -> list[str | None]:
        gate = ConcurrencyGate(1, 10, max_queue=2)
        entries = [("bulk", LOW, 1), ("bulk", LOW, 1), ("paying", HIGH, 1), ("bulk", LOW, 1)]
        served, tasks = await queue_behind_one_slot(gate, entries, queued=2)
        assert served == ["paying", "bulk"]
        return [None if (r := t.result()) is None else r.reason for t in tasks]

    assert asyncio.run(run()) == [None, "rejected_shed", None, "rejected_queue_full"]


def tenants(**priorities: str) -> dict[str, Any]:
    return {
        name: {"key_sha256": [hash_key(KEYS[name])], "priority": priority}
        for name, priority in priorities.items()
    }


def test_sheds_and_queue_time_are_metrics_per_tenant(stack: MakeStack) -> None:
    proxy = stack(
        tenants=tenants(acme="low", globex="high"),
        limits={"max_concurrency": 1, "max_queue": 1, "queue_timeout": 30},
    )
    answers: dict[str, int] = {}

    def send(name: str, tenant: str, delay_ms: int) -> None:
        body = {"model": "m", "messages": [{"role": "user", "content": "x"}], "max_tokens": 2}
        headers = auth(tenant, **{"x-delay-ms": str(delay_ms)})
        answers[name] = httpx.post(
            proxy.url + CHAT, json=body, headers=headers, timeout=30
        ).status_code

    def start(name: str, tenant: str, delay_ms: int) -> threading.Thread:
        thread = threading.Thread(target=send, args=(name, tenant, delay_ms), daemon=True)
        thread.start()
        return thread

    waiting = "inferwatch_tenancy_requests_waiting"
    holder = start("holder", "globex", 1500)  # holds the one slot
    wait_for(lambda: samples(proxy.metrics(), "inferwatch_tenancy_requests_in_flight") == 1, "slot")
    queued_low = start("queued_low", "acme", 0)
    wait_for(lambda: samples(proxy.metrics(), waiting) == 1, "the low one to queue")
    high = start("high", "globex", 0)  # sheds the low one from the full queue
    for thread in (holder, queued_low, high):
        thread.join(30)
    assert answers == {"holder": 200, "queued_low": 503, "high": 200}
    page = proxy.metrics()
    assert samples(page, "inferwatch_tenancy_shed_total", tenant="acme", reason="priority") == 1
    assert samples(page, "inferwatch_tenancy_queue_time_seconds_count", tenant="globex") == 2
    waited = samples(page, "inferwatch_tenancy_queue_time_seconds_sum", tenant="globex")
    assert waited > 0  # the high one queued until the holder finished


async def shares_under_contention(gate: ConcurrencyGate, grants: int) -> dict[int, float]:
    """Three tenants, one per class, each keeping four requests queued behind one slot:
    the share of ``grants`` slot handovers each class got (counted, no clock)."""
    served: list[int] = []
    holder = await gate.acquire("holder", 0, HIGH)
    assert holder is None

    async def keep_asking(tenant: str, priority: int) -> None:
        while len(served) < grants:
            if await gate.acquire(tenant, 0, priority) is None:
                served.append(priority)
                await asyncio.sleep(0)  # every other waiter is queued again meanwhile
                gate.release(tenant)

    classes = {"paying": HIGH, "std": NORMAL, "bulk": LOW}
    tasks = [asyncio.ensure_future(keep_asking(t, p)) for t, p in classes.items() for _ in range(4)]
    await asyncio.sleep(0)
    gate.release("holder")
    await asyncio.gather(*tasks)
    return {priority: served[:grants].count(priority) / grants for priority in classes.values()}


@pytest.mark.parametrize("share", [0.1, 0.25])
def test_lower_classes_get_their_minimum_share_of_a_saturated_engine(share: float) -> None:
    """Strict priority gave the normal class 1-2 % of the slots under a high-priority flood
    and the low class nothing; each waiting lower class now gets at least its share."""
    shares = asyncio.run(shares_under_contention(ConcurrencyGate(1, 60, min_class_share=share),
                                                 2000))  # fmt: skip
    assert shares[NORMAL] >= share - 0.01 and shares[LOW] >= share - 0.01, shares
    assert shares[HIGH] >= 1 - 2 * share - 0.01, shares  # the rest stays the higher class's


def test_a_share_of_zero_is_strict_priority() -> None:
    shares = asyncio.run(shares_under_contention(ConcurrencyGate(1, 60, min_class_share=0), 500))
    assert shares[HIGH] == 1.0, shares


def test_the_minimum_share_is_a_limit_of_the_config() -> None:
    assert proxy_config.parse({}).min_class_share == 0.1
    parsed = proxy_config.parse({"limits": {"min_class_share": 0.2}})
    assert parsed.min_class_share == 0.2
    for bad in (-0.1, 0.5, "lots"):
        with pytest.raises(proxy_config.ConfigError, match=r"limits\.min_class_share"):
            proxy_config.parse({"limits": {"min_class_share": bad}}, "p.yaml")
