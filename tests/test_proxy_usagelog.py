"""The proxy's usage log: a line per settled request, bounded rotation, a restart continues."""

from __future__ import annotations

import json
import time
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import pytest
from click.testing import CliRunner

from inferwatch.cli import main
from inferwatch.proxy import usagelog
from inferwatch.proxy.config import ConfigError, parse
from inferwatch.proxy.usagelog import UsageLog, files
from support.fleet import Fleet, flood
from support.proxy_stack import CHAT, Engine, Stack, auth
from support.redis import RedisServer
from support.wait import wait_for

pytestmark = pytest.mark.proc


def _lines(directory: Path) -> list[dict[str, Any]]:
    return [json.loads(line) for path in files(directory) for line in path.read_text().splitlines()]


def test_every_settled_request_appends_one_line_with_the_prices_in_force(
    stack: Callable[..., Stack], tmp_path: Path
) -> None:
    proxy = stack(
        usage_log={"dir": str(tmp_path)},
        prices={"default": {"prompt": 1.0, "cached_prompt": 0.5, "completion": 2.0}},
    )
    body = {"model": "m", "messages": [{"role": "user", "content": "hi"}], "max_tokens": 6}
    for tenant in ("acme", "globex", "acme"):
        assert proxy.client.post(CHAT, json=body, headers=auth(tenant)).status_code == 200
    lines = wait_for(lambda: len(_lines(tmp_path)) == 3 and _lines(tmp_path), "three usage lines")
    assert [line["tenant"] for line in lines] == ["acme", "globex", "acme"]
    assert all(line["completion_tokens"] == 6 and line["model"] == "m" for line in lines)
    assert all(
        (line["price_prompt"], line["price_cached_prompt"], line["price_completion"])
        == (1.0, 0.5, 2.0)
        for line in lines
    )
    assert len({line["request_id"] for line in lines}) == 3


def test_rotation_keeps_at_most_retain_files_and_the_newest_lines(tmp_path: Path) -> None:
    log = UsageLog(str(tmp_path), rotate_bytes=100, retain_files=3, max_lines=1)
    for number in range(20):
        log.write({"n": number, "pad": "x" * 60})
    assert len(files(tmp_path)) == 3
    assert [line["n"] for line in _lines(tmp_path)][-1] == 19


def test_a_restart_continues_the_log_in_a_new_file_losing_nothing(tmp_path: Path) -> None:
    first = UsageLog(str(tmp_path))
    first.write({"n": 1})
    first.flush()
    second = UsageLog(str(tmp_path))
    second.write({"n": 2})
    second.flush()
    assert len(files(tmp_path)) == 2
    assert [line["n"] for line in _lines(tmp_path)] == [1, 2]


def test_a_proxy_process_stopped_mid_traffic_and_started_again_bills_every_answer_once(
    redis_server: RedisServer, engine: Engine, tmp_path: Path
) -> None:
    """A real proxy stopped (SIGTERM, as a rollout stops its pod) with requests in flight and
    started again: what it answered while draining is flushed before it exits, the new
    process continues in a file of its own, and the report bills each answer once."""
    usage = tmp_path / "usage"
    fleet = Fleet(redis_server, engine.url, tmp_path, {"acme": {}, "globex": {}},
                  usage_log={"dir": str(usage)})  # fmt: skip
    try:
        (proxy,) = fleet.add(1)
        with ThreadPoolExecutor(1) as pool:
            draining = pool.submit(flood, [proxy.url], "acme", 4, 8, 500, "drained")
            wait_for(lambda: engine.engine.running.get("drained") == 4, "4 requests in flight")
            proxy.stop()
            before = draining.result()
        proxy.start()
        after = flood([proxy.url], "globex", per_proxy=3, max_tokens=8, delay_ms=0)
    finally:
        fleet.close()  # the second process, stopped: its lines flushed too
    answered = [a for a in before + after if a.status_code == 200]
    assert len(answered) == 7, [a.status_code for a in before + after]
    assert len(files(usage)) == 2
    now = time.time()
    window = [datetime.fromtimestamp(now + hours * 3600, UTC).isoformat() for hours in (-1, 1)]
    report = ["report", "usage", "--log-dir", str(usage), "--format", "json"]
    result = CliRunner().invoke(main, [*report, "--from", window[0], "--to", window[1]])
    assert result.exit_code == 0, result.output
    document = json.loads(result.stdout)
    requests = {row["tenant"]: row["requests"] for row in document["rows"]}
    assert requests == {"acme": 4, "globex": 3}
    billed = document["totals"]["prompt_tokens"] + document["totals"]["completion_tokens"]
    assert billed == sum(a.json()["usage"]["total_tokens"] for a in answered)


def test_a_volume_that_refuses_writes_keeps_the_lines_until_it_takes_them(tmp_path: Path) -> None:
    volume = tmp_path / "usage"
    volume.write_text("a file where the log's folder should be")  # every append fails
    log = UsageLog(str(volume), max_lines=1000)
    for n in range(3):
        log.write({"n": n})
    log.flush()
    log.flush()
    assert log.errors == {"write": 2}
    volume.unlink()  # the volume is back
    log.write({"n": 3})
    log.flush()
    assert [line["n"] for line in _lines(volume)] == [0, 1, 2, 3]
    assert log.errors == {"write": 2}


def test_lines_past_the_buffer_bound_are_dropped_oldest_first_and_counted(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(usagelog, "MAX_BUFFERED", 4)
    volume = tmp_path / "usage"
    volume.write_text("")
    log = UsageLog(str(volume), max_lines=1000)
    for n in range(6):
        log.write({"n": n})
    log.flush()
    volume.unlink()
    log.flush()
    assert [line["n"] for line in _lines(volume)] == [2, 3, 4, 5]
    assert log.errors == {"write": 1, "dropped": 2}


@pytest.mark.parametrize(
    "section",
    [{"rotate_bytes": 10}, {"retain_files": 0}, {"dir": "/x", "other": 1}],
)
def test_a_bad_usage_log_section_is_refused(section: dict[str, Any]) -> None:
    with pytest.raises(ConfigError):
        parse({"usage_log": section}, "proxy.yaml")


def test_lines_left_at_shutdown_with_the_volume_refusing_are_counted_dropped(
    tmp_path: Path,
) -> None:
    volume = tmp_path / "usage"
    volume.write_text("")  # every append fails
    log = UsageLog(str(volume), max_lines=1000)
    for n in range(3):
        log.write({"n": n})
    log.close()
    assert log.errors == {"write": 1, "dropped": 3}
