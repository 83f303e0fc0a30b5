"""The usage log as a Redis stream under ``shared_state``, and ``report usage --redis``: the
same lines as the files, never a failed request, no line lost or doubled, every bound held."""

from __future__ import annotations

import asyncio
import json
import time
from collections.abc import Iterator
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import pytest
from click.testing import CliRunner, Result

import support.scripted_engine as se
from inferwatch.cli import main
from inferwatch.proxy.config import ConfigError, parse
from inferwatch.proxy.sharedconfig import SharedState
from inferwatch.proxy.sharedstate import connect
from inferwatch.proxy.usagestream import UsageStream, stream_key
from support.fleet import Fleet, flood
from support.proxy_stack import CHAT, Engine, Stack, auth, samples
from support.redis import RedisServer, cluster_url, command, redis_cluster
from support.wait import wait_for

pytestmark = pytest.mark.proc

KEY = stream_key("inferwatch")
BODY = {"model": "m", "messages": [{"role": "user", "content": "hi"}], "max_tokens": 6}


def _window() -> list[str]:
    now = time.time()
    edges = [datetime.fromtimestamp(now + hours * 3600, UTC).isoformat() for hours in (-1, 1)]
    return ["--from", edges[0], "--to", edges[1]]


def _report(*args: str) -> Result:
    return CliRunner().invoke(main, ["report", "usage", *_window(), "--format", "json", *args])


def _lines(server: RedisServer) -> list[dict[str, Any]]:
    """The stream's lines, oldest first (redis-py reads an entry's fields as a dict)."""
    reply = command(server, "XRANGE", KEY, "-", "+")
    assert isinstance(reply, list)
    return [json.loads(fields[b"line"]) for _, fields in reply]


def _xlen(server: RedisServer) -> int:
    length = command(server, "XLEN", KEY)
    assert isinstance(length, int)
    return length


@pytest.fixture
def streaming(loop: se.LoopThread, engine: Engine, redis_server: RedisServer) -> Iterator[Stack]:
    """An in-process proxy whose usage log is the stream of ``redis_server``."""
    stack = Stack(
        loop,
        engine,
        shared_state={"url": redis_server.address, "timeout": "200ms"},
        usage_log={"stream": {"maxlen": 1000}},
    )
    yield stack
    stack.close()


def test_lines_land_in_the_stream_with_the_file_logs_fields(
    streaming: Stack, redis_server: RedisServer, tmp_path: Path, loop: se.LoopThread,
    engine: Engine,
) -> None:  # fmt: skip
    usage = tmp_path / "usage"
    files = Stack(loop, engine, usage_log={"dir": str(usage)})
    try:
        for proxy in (streaming, files):
            for tenant in ("acme", "globex", "acme"):
                assert proxy.client.post(CHAT, json=BODY, headers=auth(tenant)).status_code == 200
    finally:
        files.close()  # its lines flushed
    lines = wait_for(lambda: len(_lines(redis_server)) == 3 and _lines(redis_server), "3 lines")
    (path,) = usage.iterdir()
    logged = [json.loads(line) for line in path.read_text().splitlines()]
    assert [sorted(line) for line in lines] == [sorted(line) for line in logged]
    assert [line["tenant"] for line in lines] == ["acme", "globex", "acme"]
    assert len({line["request_id"] for line in lines}) == 3
    # the report over the stream equals the report over the files for the same traffic
    over_stream = _report("--redis", redis_server.address)
    over_files = _report("--log-dir", str(usage))
    assert over_stream.exit_code == 0 and over_files.exit_code == 0, over_stream.output
    assert json.loads(over_stream.stdout) == json.loads(over_files.stdout)
    both = json.loads(_report("--redis", redis_server.address, "--log-dir", str(usage)).stdout)
    assert both["totals"]["requests"] == 6


def test_redis_down_fails_no_request_and_back_loses_no_line(
    streaming: Stack, redis_server: RedisServer
) -> None:
    redis_server.kill()
    for _ in range(5):
        assert streaming.client.post(CHAT, json=BODY, headers=auth("acme")).status_code == 200
    errors = "inferwatch_tenancy_usage_log_errors_total"
    wait_for(lambda: samples(streaming.metrics(), errors, reason="write") > 0, "a refused flush")
    redis_server.start()
    wait_for(lambda: _xlen(redis_server) == 5, "the five lines kept while Redis was down")
    assert samples(streaming.metrics(), errors, reason="dropped") == 0
    assert [line["tenant"] for line in _lines(redis_server)] == ["acme"] * 5


def _stream(server: RedisServer, maxlen: int = 1000) -> tuple[UsageStream, Any]:
    client, _ = connect(SharedState(url=server.address, timeout_s=1.0))
    return UsageStream(client, "inferwatch", maxlen, 2.0, max_lines=10**6), client


def test_a_batch_sent_again_after_its_reply_was_lost_adds_each_line_once(
    redis_server: RedisServer, monkeypatch: pytest.MonkeyPatch
) -> None:
    async def go() -> None:
        stream, client = _stream(redis_server)
        append = stream._append

        async def reply_lost(**call: Any) -> Any:
            await append(**call)  # Redis took the lines; the client never hears so
            raise ConnectionError("connection lost before the reply")

        for n in range(3):
            stream.write({"n": n})
        monkeypatch.setattr(stream, "_append", reply_lost)
        await stream.flush()
        assert stream.errors == {"write": 1}
        monkeypatch.setattr(stream, "_append", append)
        stream.write({"n": 3})
        await stream.flush()
        await client.aclose()

    asyncio.run(go())
    assert [line["n"] for line in _lines(redis_server)] == [0, 1, 2, 3]


def test_maxlen_bounds_the_stream_to_about_its_newest_lines(redis_server: RedisServer) -> None:
    async def go() -> None:
        stream, client = _stream(redis_server, maxlen=1000)
        for n in range(5000):
            stream.write({"n": n})
        await stream.close()
        await client.aclose()

    asyncio.run(go())
    assert 1000 <= _xlen(redis_server) <= 1200  # MAXLEN ~ trims whole nodes of 100
    assert _lines(redis_server)[-1] == {"n": 4999}


def test_a_corrupt_stream_entry_is_skipped_counted_and_named(
    streaming: Stack, redis_server: RedisServer
) -> None:
    assert streaming.client.post(CHAT, json=BODY, headers=auth("acme")).status_code == 200
    wait_for(lambda: _xlen(redis_server) == 1, "the request's line")
    bad = [
        command(redis_server, "XADD", KEY, "*", "line", "{not json"),
        command(redis_server, "XADD", KEY, "*", "other", "x"),
        command(redis_server, "XADD", KEY, "*", "line", "x" * 20_000),
    ]
    result = _report("--redis", redis_server.address)
    assert result.exit_code == 0, result.output
    document = json.loads(result.stdout)
    assert document["totals"]["requests"] == 1
    assert document["totals"]["skipped_lines"] == 3
    for entry_id in bad:
        assert isinstance(entry_id, bytes)
        assert f"skipped {KEY}:{entry_id.decode()}: " in result.stderr


def test_lines_outside_the_window_and_past_max_entries(
    streaming: Stack, redis_server: RedisServer
) -> None:
    for _ in range(3):
        assert streaming.client.post(CHAT, json=BODY, headers=auth("acme")).status_code == 200
    wait_for(lambda: _xlen(redis_server) == 3, "three lines")
    earlier = ["--from", "2026-01-01T00:00:00Z", "--to", "2026-01-02T00:00:00Z"]
    result = CliRunner().invoke(
        main, ["report", "usage", "--redis", redis_server.address, *earlier, "--format", "json"]
    )
    assert result.exit_code == 0, result.output
    assert json.loads(result.stdout)["totals"]["requests"] == 0
    result = _report("--redis", redis_server.address, "--max-entries", "2")
    assert result.exit_code == 2
    assert "over 2 entries" in result.stderr


def test_several_proxies_writing_one_stream_bill_each_answer_once(
    redis_server: RedisServer, engine: Engine, tmp_path: Path
) -> None:
    """Real proxy processes, Redis killed and started again mid-traffic."""
    fleet = Fleet(redis_server, engine.url, tmp_path, {"acme": {}, "globex": {}},
                  usage_log={"stream": {}})  # fmt: skip
    try:
        proxies = fleet.add(2)
        urls = [proxy.url for proxy in proxies]
        answered = flood(urls, "acme", per_proxy=3, max_tokens=8, delay_ms=0)
        redis_server.kill()
        answered += flood(urls, "globex", per_proxy=2, max_tokens=8, delay_ms=0)
        redis_server.start()
        assert all(a.status_code == 200 for a in answered), [a.status_code for a in answered]
        wait_for(lambda: _xlen(redis_server) == 10, "every answer's line in the stream")
    finally:
        fleet.close()
    assert _xlen(redis_server) == 10
    result = _report("--redis", redis_server.address)
    assert result.exit_code == 0, result.output
    document = json.loads(result.stdout)
    assert {row["tenant"]: row["requests"] for row in document["rows"]} == {
        "acme": 6,
        "globex": 4,
    }
    billed = document["totals"]["prompt_tokens"] + document["totals"]["completion_tokens"]
    assert billed == sum(a.json()["usage"]["total_tokens"] for a in answered)


@pytest.mark.parametrize(
    "args",
    [
        [],
        ["--redis", "http://127.0.0.1:6379"],
        ["--redis", "redis://user:secret@127.0.0.1:6379/0"],
        ["--redis", "redis://127.0.0.1:6379/0", "--redis-key-prefix", "a b"],
        ["--redis", "redis://127.0.0.1:6379/0", "--redis-password-file", "/no/such/file"],
        ["--redis", "redis://127.0.0.1:6379/0", "--max-entries", "0"],
        ["--log-dir", ".", "--lateness", "2h"],
        ["--log-dir", ".", "--redis-key-prefix", "fleet"],
    ],
    ids=["no-source", "not-redis", "password-in-url", "bad-prefix", "no-password-file",
         "max-entries-0", "lateness-without-redis", "prefix-without-redis"],
)  # fmt: skip
def test_bad_stream_flags_exit_2_with_one_line(args: list[str]) -> None:
    result = _report(*args)
    assert result.exit_code == 2, result.output
    assert "Error:" in result.stderr
    assert "Traceback" not in result.output


def test_an_unreachable_redis_exits_3_with_one_line(unused_port: int) -> None:
    result = _report("--redis", f"redis://127.0.0.1:{unused_port}/0")
    assert result.exit_code == 3, result.output
    assert result.stderr.startswith("Error: cannot read the usage stream from redis://")
    assert len(result.stderr.splitlines()) == 1


@pytest.mark.parametrize(
    ("section", "shared"),
    [
        ({"stream": {}}, False),
        ({"stream": {}, "dir": "/x"}, True),
        ({"stream": {}, "retain_files": 3}, True),
        ({"stream": {"maxlen": 10}}, True),
        ({"stream": {"maxlen": 1000, "key": "x"}}, True),
        ({"stream": True}, True),
    ],
    ids=["no-shared-state", "and-dir", "and-retain-files", "maxlen-too-small", "unknown-key",
         "not-a-mapping"],
)  # fmt: skip
def test_a_bad_usage_stream_section_is_refused_naming_its_field(
    section: dict[str, Any], shared: bool
) -> None:
    document: dict[str, Any] = {"usage_log": section}
    if shared:
        document["shared_state"] = {"url": "redis://127.0.0.1:6379/0"}
    with pytest.raises(ConfigError, match=r"proxy\.yaml: usage_log\."):
        parse(document, "proxy.yaml")


def test_a_usage_stream_section_is_read() -> None:
    shared = {"url": "redis://127.0.0.1:6379/0"}
    assert parse({"shared_state": shared, "usage_log": {"stream": {}}}).usage_log_stream_maxlen
    config = parse({"shared_state": shared, "usage_log": {"stream": {"maxlen": 5000}}})
    assert (config.usage_log_stream_maxlen, config.usage_log_dir) == (5000, "")


def test_lines_left_at_shutdown_with_redis_down_are_counted_dropped(unused_port: int) -> None:
    async def go() -> dict[str, int]:
        client, _ = connect(SharedState(url=f"redis://127.0.0.1:{unused_port}/0"))
        stream = UsageStream(client, "inferwatch", 1000, 1.0)
        for n in range(3):
            stream.write({"n": n})
        await stream.close()
        await client.aclose()
        return stream.errors

    assert asyncio.run(go()) == {"write": 1, "dropped": 3}


def usage_line(tenant: str) -> dict[str, Any]:
    """A usage line with every field the report reads, settled now."""
    return dict(ts=time.time(), tenant=tenant, model="m", model_version="v1", prompt_tokens=10,
                cached_prompt_tokens=0, completion_tokens=5, request_id="r", price_prompt=1.0,
                price_cached_prompt=0.5, price_completion=2.0, busy_s=0.1)  # fmt: skip


def test_the_stream_works_on_a_redis_cluster(tmp_path: Path) -> None:
    """On a real Cluster (its keys in one slot by their hash tag) the proxies' lines land in
    the stream, and the report reads them back through a seed node, with the password."""
    password = "stream-secret"
    secret = tmp_path / "password"
    secret.write_text(password + "\n")
    with redis_cluster(tmp_path, password) as nodes:
        url = cluster_url(nodes)

        async def write() -> None:
            client, others = connect(SharedState(url=url, password=password, timeout_s=1.0))
            stream = UsageStream(client, "inferwatch", 1000, 2.0)
            for tenant in ("acme", "acme", "globex"):
                stream.write(usage_line(tenant))
            await stream.close()
            for closing in (client, *others):
                await closing.aclose()

        asyncio.run(write())
        result = _report("--redis", url, "--redis-password-file", str(secret))
    assert result.exit_code == 0, result.output
    report = json.loads(result.output)
    requests = {row["tenant"]: row["requests"] for row in report["rows"]}
    assert requests == {"acme": 2, "globex": 1}
