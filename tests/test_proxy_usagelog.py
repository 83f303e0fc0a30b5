"""The proxy's usage log: a line per settled request, bounded rotation, a restart continues."""

from __future__ import annotations

import json
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

from inferwatch.proxy import usagelog
from inferwatch.proxy.config import ConfigError, parse
from inferwatch.proxy.usagelog import UsageLog, files
from support.proxy_stack import CHAT, Stack, auth
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
