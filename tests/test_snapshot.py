"""``inferwatch snapshot`` without a Prometheus: bad input is one line and exit 2, and the
pieces that make a panel read like Grafana's (units, legends, time ticks).

The rendering against a real Prometheus is checked in test_dashboards_e2e.py, on the stack
that test runs.
"""

from __future__ import annotations

import math
import re
import time
from collections.abc import Callable, Iterator
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

import httpx
import pytest
from click.testing import CliRunner

from inferwatch.alerts import config as alert_config
from inferwatch.cli import main
from inferwatch.dashboards import writer
from inferwatch.dashboards.snapshot import (
    MAX_ANSWER_BYTES,
    BadInput,
    Prometheus,
    format_value,
    legend,
    rules_mismatch,
    time_ticks,
)
from inferwatch.mixin import recording

pytestmark = pytest.mark.unit


def run(*args: str) -> tuple[int, list[str]]:
    result = CliRunner().invoke(main, ["snapshot", *args])
    return result.exit_code, result.output.strip().splitlines()


@pytest.mark.parametrize(
    ("args", "line"),
    [
        (["--dashboard", "nope", "--prometheus", "http://127.0.0.1:1"],
         "Error: unknown dashboard 'nope'; known: fleet, latency, replica, gpu, cost, quality, "
         "versions, gateway"),
        (["--dashboard", "gpu", "--prometheus", "http://127.0.0.1:1", "--from", "soon"],
         "Error: --from: expected a duration such as 30s, 5m, 1h30m or 2d, got 'soon'"),
        (["--dashboard", "gpu", "--prometheus", "http://127.0.0.1:1", "--from", "0m"],
         "Error: --from: must be longer than 0s, got '0m'"),
        (["--dashboard", "gpu", "--prometheus", "127.0.0.1:9090"],
         "Error: --prometheus '127.0.0.1:9090': expected an http(s) URL with a host"),
        (["--dashboard", "gpu", "--prometheus", "http://127.0.0.1:1", "--var", "gpu=0"],
         "Error: --var gpu: the board has no such variable "
         "(cluster, namespace, model, model_version, replica)"),
        (["--dashboard", "gpu", "--prometheus", "http://127.0.0.1:1", "--var", "replica"],
         "Error: --var 'replica': expected NAME=VALUE"),
    ],
)  # fmt: skip
def test_bad_input_is_one_line_and_exit_2(args: list[str], line: str) -> None:
    assert run(*args) == (2, [line])


def test_an_unreachable_prometheus_is_one_line_and_exit_3(unused_port: int, tmp_path: Path) -> None:
    out = tmp_path / "gpu.png"
    url = f"http://127.0.0.1:{unused_port}"
    code, lines = run("--dashboard", "gpu", "--prometheus", url, "--out", str(out))
    assert code == 3 and len(lines) == 1, lines
    assert lines[0].startswith(f"Error: cannot reach Prometheus at {url}: ")
    assert not out.exists()


def test_a_server_that_is_not_prometheus_is_one_line_and_exit_2(page_server: Any) -> None:
    url = page_server.url  # serves fixtures, answers 404 elsewhere
    code, lines = run("--dashboard", "gpu", "--prometheus", url, "--timeout", "5")
    assert code == 2 and len(lines) == 1, lines
    assert "is it a Prometheus?" in lines[0] or "Prometheus refused" in lines[0], lines


@pytest.mark.parametrize(
    ("value", "unit", "text"),
    [
        (0.05, "s", "50 ms"), (3.0, "s", "3 s"), (0.5, "percentunit", "50%"),
        (2.5e9, "hertz", "2.5 GHz"), (1500, "watt", "1.5 kW"), (5e10, "bytes", "46.6 GiB"),
        (1234, "short", "1.23k"), (3, "short", "3"), (1234, "suffix: tok/s", "1.23k tok/s"),
        (12, "reqps", "12 req/s"), (30, "celsius", "30 °C"), (1, "bool_yes_no", "yes"),
        (0, "bool_yes_no", "no"), (0.0012, "currencyUSD", "$0.0012"), (math.nan, "s", "NaN"),
    ],
)  # fmt: skip
def test_values_are_written_in_the_panels_unit(value: float, unit: str, text: str) -> None:
    assert format_value(value, unit) == text


def test_legends_follow_grafanas_legend_format() -> None:
    labels = {"__name__": "x", "pod": "p1", "model_version": "v2"}
    assert legend("{{pod}} {{ model_version }}", labels) == "p1 v2"
    assert legend("{{missing}} up", labels) == "up"
    assert legend("__auto", labels) == "model_version=v2, pod=p1"
    assert legend("", {"__name__": "x"}) == "value"


@pytest.mark.parametrize(("window", "step"), [(120, 30), (900, 300), (3600, 600), (86400, 21600)])
def test_time_ticks_fall_on_round_times(window: int, step: int) -> None:
    end = 1_800_000_123.0
    ticks = time_ticks(end - window, end)
    assert 2 <= len(ticks) <= 6
    assert all(t.timestamp() % step == 0 for t in ticks)
    assert ticks[0] >= datetime.fromtimestamp(end - window, UTC)


@pytest.fixture
def local_zone(monkeypatch: pytest.MonkeyPatch) -> Iterator[Callable[[str], None]]:
    """Set the process's local time zone (TZ and tzset), restored afterwards."""

    def use(zone: str) -> None:
        monkeypatch.setenv("TZ", zone)
        time.tzset()

    yield use
    monkeypatch.undo()
    time.tzset()


def test_time_ticks_are_round_utc_times_in_a_half_hour_zone(
    local_zone: Callable[[str], None],
) -> None:
    local_zone("America/St_Johns")  # UTC-3:30: local round hours are UTC's :30
    end = 1_800_000_000.0  # 2027-01-15 08:00 UTC
    ticks = time_ticks(end - 86400, end)
    assert all(t.utcoffset() == timedelta(0) for t in ticks)
    assert [t.strftime("%m-%d %H:%M") for t in ticks] == [
        "01-14 12:00", "01-14 18:00", "01-15 00:00", "01-15 06:00",
    ]  # fmt: skip


def prometheus_answering(handler: Callable[[httpx.Request], httpx.Response]) -> Prometheus:
    return Prometheus("http://prom", httpx.Client(transport=httpx.MockTransport(handler)))


def test_an_answer_over_the_size_cap_is_refused_while_read() -> None:
    sent = []

    def huge(request: httpx.Request) -> httpx.Response:
        def body() -> Iterator[bytes]:
            for _ in range(MAX_ANSWER_BYTES // 65536 + 10):
                sent.append(1)
                yield b" " * 65536

        return httpx.Response(200, content=body())

    with pytest.raises(BadInput, match=f"answer over {MAX_ANSWER_BYTES} bytes"):
        prometheus_answering(huge).range("up", 0, 60, 15)
    assert len(sent) <= MAX_ANSWER_BYTES // 65536 + 2  # stopped reading at the cap


@pytest.mark.parametrize(
    ("status", "body", "message"),
    [
        (400, '{"status":"error","errorType":"bad_data","error":"parse error at char 3"}',
         "Prometheus refused 'up{': parse error at char 3"),
        (200, "<html>hello</html>", "answered 200 without JSON: is it a Prometheus?"),
        (200, "[1, 2]", "Prometheus refused 'up{': not a Prometheus API answer"),
    ],
)  # fmt: skip
def test_a_refused_or_foreign_answer_is_one_clear_error(
    status: int, body: str, message: str
) -> None:
    prom = prometheus_answering(lambda request: httpx.Response(status, text=body))
    with pytest.raises(BadInput, match=re.escape(message)):
        prom.range("up{", 0, 60, 15)


def rules_answer(*names: str) -> httpx.Response:
    rules = [{"type": "recording", "name": name, "query": "1"} for name in names]
    return httpx.Response(200, json={"status": "success", "data": {"groups": [
        {"name": "g", "file": "f.yaml", "rules": rules}]}})  # fmt: skip


def test_the_recording_rules_prometheus_evaluates_are_read_from_the_rules_api() -> None:
    asked = []

    def handler(request: httpx.Request) -> httpx.Response:
        asked.append((request.url.path, request.url.params.get("type")))
        return rules_answer("a:b:rate5m", "c:d:ratio")

    assert prometheus_answering(handler).recording_rules() == {"a:b:rate5m", "c:d:ratio"}
    assert asked == [("/api/v1/rules", "record")]
    foreign = prometheus_answering(
        lambda request: httpx.Response(200, json={"status": "success", "data": {"groups": 3}})
    )
    with pytest.raises(BadInput, match="without rule groups"):
        foreign.recording_rules()


def test_a_board_whose_rules_prometheus_lacks_is_said_in_one_line(tmp_path: Path) -> None:
    """The demo run with another alert config: Prometheus has the rules of a 1m window, the
    boards read the 5m ones (the snapshot that drew 9 of 18 panels and said nothing)."""
    config = alert_config.load()
    fleet = writer.dashboards(config)["fleet"]
    ours = {r.record for g in recording.groups(config) for r in g.rules if hasattr(r, "record")}
    assert rules_mismatch(fleet, config, ours) is None
    other = tmp_path / "other.yaml"
    other.write_text("rate_window: 1m\n")
    theirs = {r.record for g in recording.groups(alert_config.load(other)) for r in g.rules
              if hasattr(r, "record")}  # fmt: skip
    line = rules_mismatch(fleet, config, theirs)
    assert line is not None and "\n" not in line
    assert line.startswith("Warning: Prometheus lacks ")
    assert "board inferwatch-fleet reads (e.g. " in line
    assert "another alert config than this snapshot's --config" in line
    assert "rate5m" in line and "rate1m" in line
    none = rules_mismatch(fleet, config, set())
    assert none is not None and "loads no inferwatch recording rules" in none
