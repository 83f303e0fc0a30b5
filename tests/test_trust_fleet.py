"""The fleet's shared books under hostile conditions, against a real redis-server: one
tenant's damaged keys, fail-open with proxies that never saw the tenant, a burst against
a tokens-per-minute limit, a planted journal, and a core install without redis-py."""

from __future__ import annotations

import hashlib
import json
import subprocess
import sys
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import httpx
import pytest

from inferwatch.exitcodes import ExitCode
from inferwatch.proxy.sharedbooks import RATE, RESERVE, SETTLE
from support.fleet import Fleet, flood
from support.proxy_stack import KEYS, Engine, Stack, samples
from support.redis import RedisServer, command, monitored
from support.wait import wait_for

pytestmark = pytest.mark.proc

HOUR_MS = 3_600_000


def engine_tokens(engine: Engine) -> int:
    return engine.engine.prompt_total + engine.engine.generation_total


def charged(server: RedisServer, tenant: str) -> int:
    """Tokens the tenant was ever charged, as Redis keeps them (nothing: 0): unlike the
    window's ``used``, an hour turning between two reads does not reset it."""
    value = command(server, "HGET", f"inferwatch:{{{tenant}}}:w", "total")
    return int(value) if isinstance(value, bytes) else 0


def ok(answers: list[httpx.Response]) -> list[httpx.Response]:
    return [answer for answer in answers if answer.status_code == 200]


def settled(server: RedisServer, tenant: str) -> bool:
    """Whether no request of the tenant holds a reservation (its settlements, which follow
    the answers, have all reached Redis)."""
    return command(server, "HLEN", f"inferwatch:{{{tenant}}}:h") == 0


# ---------------------------------------------------------------- one tenant's damaged keys
@pytest.mark.parametrize(
    "planted",
    [
        ("SET", "inferwatch:{globex}:w", "not a hash"),  # its window
        ("SET", "inferwatch:{globex}:l", "not a sorted set"),  # its leases
        ("HSET", "inferwatch:{globex}:w", "reserved", "lots"),  # a field that is no number
        ("LPUSH", "inferwatch:{globex}:rl:requests:", "x"),  # its rate bucket
    ],
    ids=["window", "leases", "garbage-field", "rate-bucket"],
)
def test_one_tenants_damaged_keys_refuse_that_tenant_alone(
    planted: tuple[str, ...], redis_server: RedisServer, engine: Engine, tmp_path: Path
) -> None:
    """A key of the wrong type (WRONGTYPE) or a field a script cannot read is the tenant's
    fault: its request gets a clear 503, counted; every other tenant, fail_closed too, is
    served and /readyz stays ready, because Redis itself is healthy."""
    spec = {
        "budget": {"tokens": 100_000},
        "failure_policy": "fail_closed",
        "rate_limits": {"requests_per_minute": 1000},
    }
    fleet = Fleet(redis_server, engine.url, tmp_path, {name: spec for name in KEYS},
                  {"lease": "30s"})  # fmt: skip
    try:
        (proxy,) = fleet.add(1)
        command(redis_server, *planted)
        (damaged,) = flood([proxy.url], "globex", per_proxy=1, max_tokens=5, delay_ms=0)
        assert damaged.status_code == 503, damaged.text
        assert "damaged" in damaged.json()["error"]["message"]
        others = flood([proxy.url], "acme", per_proxy=3, max_tokens=5, delay_ms=0)
        assert [a.status_code for a in others] == [200] * 3
        assert proxy.ready().status_code == 200
        text = proxy.metrics()
        assert samples(text, "inferwatch_tenancy_shared_state_up") == 1
        assert samples(text, "inferwatch_tenancy_shared_state_errors_total", reason="books") == 1
        assert samples(text, "inferwatch_tenancy_shared_state_errors_total") == 1
    finally:
        fleet.close()


# ---------------------------------------------------------------- the fail-open bound
def test_fail_open_holds_its_bound_with_proxies_that_never_saw_the_tenant(
    redis_server: RedisServer, engine: Engine, tmp_path: Path
) -> None:
    """Three proxies, one of which spent most of the window before Redis died; the two
    others never saw the tenant this window. Together they stay within the documented
    bound, the budget times (1 + 1/N)."""
    budget, count = 3000, 3
    tenants = {"acme": {"budget": {"tokens": budget}, "failure_policy": "fail_open"}}
    fleet = Fleet(redis_server, engine.url, tmp_path, tenants, {"lease": "3s", "timeout": "250ms"})
    try:
        proxies = fleet.add_counted(count)
        before = engine_tokens(engine)
        for _ in range(9):
            assert ok(flood([proxies[0].url], "acme", per_proxy=1, max_tokens=300, delay_ms=0))
        fleet.redis.kill()
        while_down = flood([p.url for p in proxies], "acme", per_proxy=15, max_tokens=100,
                           delay_ms=0)  # fmt: skip
        assert {a.status_code for a in while_down} <= {200, 429}
        assert ok(while_down), "fail_open admits within its local bound"
        spent = engine_tokens(engine) - before
        assert spent <= budget * (1 + 1 / count), f"spent {spent} of {budget}"
    finally:
        fleet.close()


# ---------------------------------------------------------------- tokens per minute in a burst
def burst(url: str) -> list[httpx.Response]:
    """40 requests at once, each reserving 512 tokens (12 prompt + 500), all in flight
    together (the engine holds each 300 ms)."""
    return flood([url], "acme", per_proxy=40, max_tokens=500, delay_ms=300)


def spent(answers: list[httpx.Response]) -> int:
    return sum(int(a.json()["usage"]["total_tokens"]) for a in ok(answers))


@pytest.mark.parametrize("where", ["local", "shared", "shared-with-budget"])
def test_a_burst_takes_no_more_than_the_tokens_bucket_holds(
    where: str, redis_server: RedisServer, stack: Callable[..., Stack], tmp_path: Path,
    engine: Engine,
) -> None:  # fmt: skip
    """2,000 tokens per minute: a burst of 40 requests at once is let in only while the
    bucket holds their reservations, each taken at admission, so it spends at most the
    bucket plus one request (before, every one of them saw a full bucket). With a budget
    too, the shared buckets are checked by the reservation's own script."""
    limits = {"tokens_per_minute": 2000}
    if where == "local":
        from inferwatch.proxy.tenants import hash_key

        proxy = stack(tenants={"acme": {"key_sha256": [hash_key(KEYS["acme"])],
                                        "rate_limits": limits}})  # fmt: skip
        answers = burst(proxy.url)
    else:
        spec: dict[str, Any] = {"rate_limits": limits}
        if where == "shared-with-budget":
            spec["budget"] = {"tokens": 10**6}
        fleet = Fleet(redis_server, engine.url, tmp_path, {"acme": spec})
        try:
            answers = burst(fleet.add(1)[0].url)
        finally:
            fleet.close()
    assert {a.status_code for a in answers} <= {200, 429}
    assert ok(answers) and len(ok(answers)) < len(answers)
    assert spent(answers) <= 2000 + 512, f"spent {spent(answers)} against 2000 a minute"
    last = ok(answers)[-1].headers
    assert int(last["x-ratelimit-remaining-tokens"]) < 2000


def test_a_rate_limited_budgeted_request_is_admitted_by_one_script(
    redis_server: RedisServer, engine: Engine, tmp_path: Path
) -> None:
    """A tenant with a budget and rate limits is admitted by one script, the reservation's,
    which checks its rate buckets too: no rate script runs before it (the rate script runs
    only to give back, with the settlement, the tokens the request did not use)."""
    spec = {"budget": {"tokens": 10**6},
            "rate_limits": {"requests_per_minute": 100, "tokens_per_minute": 100_000}}  # fmt: skip
    fleet = Fleet(redis_server, engine.url, tmp_path, {"acme": spec}, {"lease": "30s"})
    try:
        (proxy,) = fleet.add(1)
        assert ok(flood([proxy.url], "acme", per_proxy=1, max_tokens=5, delay_ms=0))
        with monitored(redis_server) as seen:
            (answer,) = flood([proxy.url], "acme", per_proxy=1, max_tokens=50, delay_ms=0)
            settled = f"EVALSHA {sharedbooks_sha(SETTLE)}"
            wait_for(lambda: any(settled in line for line in seen), "the settlement", 10)
        assert answer.status_code == 200, answer.text
        assert answer.headers["x-ratelimit-remaining-requests"] == "98"
        mine = [line.split() for line in seen if "{acme}" in line]
        reserves = [words for words in mine if words[:2] == ["EVALSHA", sharedbooks_sha(RESERVE)]]
        assert len(reserves) == 1 and "inferwatch:{acme}:rl:requests:" in reserves[0]
        rates = [words for words in mine if words[:2] == ["EVALSHA", sharedbooks_sha(RATE)]]
        assert all("charge" in words for words in rates), rates
    finally:
        fleet.close()


def sharedbooks_sha(source: str) -> str:
    return hashlib.sha1(source.encode()).hexdigest()


# ---------------------------------------------------------------- the journal replayed
def test_a_planted_journal_credits_nothing_and_writes_no_unknown_tenant(
    redis_server: RedisServer, engine: Engine, tmp_path: Path
) -> None:
    """Every replayed line is checked against the config before it reaches Redis: a
    negative or absurd charge, an unknown tenant, a window the tenant's budget does not
    have, a window in the future, a hold that is none of ours: each skipped, counted and
    named in a log line; the one honest line is charged; the proxy stays up."""
    # Fleet's lease and Redis timeout: a call slowed past a short timeout on a busy machine
    # would send the honest request to the failure policy, not to Redis
    fleet = Fleet(redis_server, engine.url, tmp_path, {"acme": {"budget": {"tokens": 10**6}}})
    try:
        (proxy,) = fleet.add(1)
        assert ok(flood([proxy.url], "acme", per_proxy=1, max_tokens=50, delay_ms=0))
        wait_for(lambda: settled(redis_server, "acme"), "the request's settlement")
        start = charged(redis_server, "acme")
        assert start > 0
        now_ms = int(time.time() * 1000)
        hour = now_ms - now_ms % HOUR_MS

        def line(**changes: Any) -> dict[str, Any]:
            honest = {"id": "0123456789abcdef0123456789abcdef", "tenant": "acme", "hold": "",
                      "window_ms": HOUR_MS, "spent_in_ms": hour, "tokens": 40}  # fmt: skip
            return {**honest, **changes}

        planted = [
            line(id="a" * 32, tokens=-1_000_000),  # a credit
            line(id="b" * 32, tokens=10**15),  # more than any request can be charged
            line(id="c" * 32, tenant="mallory"),  # no such tenant
            line(id="d" * 32, tenant="acme}:w"),  # a key of someone else's
            line(id="e" * 32, window_ms=1),  # a window acme's budget does not have
            line(id="f" * 32, spent_in_ms=hour + 5 * HOUR_MS),  # a window to come
            line(id="9" * 32, spent_in_ms=hour + 7),  # no window starts there
            line(id="8" * 32, hold="someone-else's hold"),
            line(id="x" * 5000),  # an id no proxy writes (and a line over the bound)
        ]
        nested = "[" * 4000  # deeper than the JSON parser recurses
        journal = fleet.proxies[0].directory / "journal" / "journal-planted.jsonl"
        lines = [*(json.dumps(e) for e in planted), nested, json.dumps(line())]
        planted.append(nested)
        journal.write_text("".join(text + "\n" for text in lines))
        wait_for(lambda: not journal.exists(), "the planted journal to be replayed")
        assert charged(redis_server, "acme") == start + 40
        assert command(redis_server, "KEYS", "inferwatch:{mallory}*") == []
        assert command(redis_server, "KEYS", "inferwatch:{acme}:w}*") == []
        text = proxy.metrics()
        assert samples(text, "inferwatch_tenancy_shared_state_errors_total",
                       reason="journal") == len(planted)  # fmt: skip
        assert samples(text, "inferwatch_tenancy_shared_state_up") == 1
        log = (proxy.directory / f"proxy-{proxy.starts}.log").read_text(encoding="utf-8")
        skipped = [json.loads(x) for x in log.splitlines() if "journal line skipped" in x]
        assert [entry["line"] for entry in skipped] == list(range(1, len(planted) + 1))
        assert all(entry["path"].endswith(".replaying") for entry in skipped)
        assert ok(flood([proxy.url], "acme", per_proxy=1, max_tokens=5, delay_ms=0))
    finally:
        fleet.close()


def test_a_core_install_with_shared_state_says_it_needs_the_redis_extra(tmp_path: Path) -> None:
    """Without redis-py (the core install, simulated by blocking its import) a config with
    ``shared_state`` is one line and exit 3, never a traceback."""
    path = tmp_path / "proxy.yaml"
    path.write_text(json.dumps({"shared_state": {"url": "redis://127.0.0.1:1/0"}}))
    core = "import sys; sys.modules['redis'] = None; from inferwatch.cli import main; main()"
    result = subprocess.run(
        [sys.executable, "-c", core, "proxy", "--config", str(path), "--listen", "127.0.0.1:0"],
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )
    assert result.returncode == ExitCode.CANNOT_RUN, result.stderr
    assert result.stderr.splitlines() == [
        "Error: inferwatch proxy with shared_state needs inferwatch[redis], which is not "
        "installed: pip install 'inferwatch[redis]'"
    ]
