"""``inferwatch report usage``: chargeback totals from the proxy's usage log."""

from __future__ import annotations

import csv
import io
import json
import re
import sys
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pytest
from click.testing import CliRunner

from inferwatch.cli import main
from inferwatch.proxy.usagelog import UsageLog
from support.stub_prometheus import StubPrometheus, stub_prometheus, vector

pytestmark = pytest.mark.unit

DAY = 1_767_225_600  # 2026-01-01T00:00:00Z
WINDOW = ["--from", "2026-01-01T00:00:00Z", "--to", "2026-01-03T00:00:00Z"]


def _line(
    ts: float, tenant: str, prompt: int = 1000, price: float = 1.0, busy: Any = 0.5, **extra: Any
) -> dict[str, Any]:
    return dict(
        ts=ts,
        tenant=tenant,
        model="m",
        model_version="v1",
        prompt_tokens=prompt,
        cached_prompt_tokens=0,
        completion_tokens=500,
        request_id="r",
        price_prompt=price,
        price_cached_prompt=price / 2,
        price_completion=2 * price,
        busy_s=busy,
        **extra,
    )


def _log(directory: Path, lines: list[dict[str, Any]]) -> None:
    log = UsageLog(str(directory))
    for line in lines:
        log.write(line)
    log.flush()


def _run(*args: str) -> Any:
    return CliRunner().invoke(main, ["report", "usage", *args])


def test_a_price_change_mid_window_bills_each_request_at_its_own_price(tmp_path: Path) -> None:
    _log(tmp_path, [_line(DAY + 10, "acme", price=1.0), _line(DAY + 20, "acme", price=3.0)])
    result = _run("--log-dir", str(tmp_path), *WINDOW, "--format", "json")
    assert result.exit_code == 0, result.output
    (row,) = json.loads(result.stdout)["rows"]
    # 1000 prompt at 1 + 500 completion at 2, then the same at three times the price
    assert row["cost"] == pytest.approx((1000 * 1 + 500 * 2 + 1000 * 3 + 500 * 6) / 1e6)
    assert row["requests"] == 2


def test_a_renamed_tenant_keeps_its_rows_as_logged_by_day(tmp_path: Path) -> None:
    _log(tmp_path, [_line(DAY + 10, "acme"), _line(DAY + 86_400 + 10, "acme-corp")])
    result = _run("--log-dir", str(tmp_path), *WINDOW)
    assert result.exit_code == 0, result.output
    rows = list(csv.DictReader(io.StringIO(result.stdout.split("# totals")[0])))
    assert [(r["period"], r["tenant"]) for r in rows] == [
        ("2026-01-01", "acme"),
        ("2026-01-02", "acme-corp"),
    ]
    assert "# totals requests=2 prompt_tokens=2000" in result.stdout


def test_lines_outside_the_window_are_left_out_and_hours_split(tmp_path: Path) -> None:
    _log(tmp_path, [_line(DAY - 1, "acme"), _line(DAY + 10, "acme"), _line(DAY + 3700, "acme")])
    result = _run("--log-dir", str(tmp_path), *WINDOW, "--by", "hour", "--format", "json")
    periods = [r["period"] for r in json.loads(result.stdout)["rows"]]
    assert periods == ["2026-01-01T00:00Z", "2026-01-01T01:00Z"]


@pytest.mark.parametrize(
    "bad",
    [
        b"{not json\n",
        b'{"ts": 1}\n',
        json.dumps(_line(DAY, "acme", prompt=-1)).encode() + b"\n",
        json.dumps(_line(DAY, "acme", price=-1.0)).encode() + b"\n",
        json.dumps(_line(DAY, "acme", busy=True)).encode() + b"\n",
        b"[1, 2]\n",
        b"x" * 9000 + b"\n",
        json.dumps(_line(DAY, "acme")).encode()[:40],  # cut short at the end of the file
    ],
    ids=[
        "not-json",
        "fields-missing",
        "negative-tokens",
        "negative-price",
        "busy-not-a-number",
        "not-object",
        "over-long",
        "cut-short",
    ],
)
def test_a_corrupt_line_is_skipped_counted_and_named(tmp_path: Path, bad: bytes) -> None:
    _log(tmp_path, [_line(DAY + 10, "acme")])
    (path,) = tmp_path.iterdir()
    with path.open("ab") as out:
        out.write(bad)
    result = _run("--log-dir", str(tmp_path), *WINDOW, "--format", "json")
    assert result.exit_code == 0, result.output
    document = json.loads(result.stdout)
    assert document["totals"]["requests"] == 1
    assert document["totals"]["skipped_lines"] == 1
    assert f"skipped {path.name}:2:" in result.stderr


def test_a_file_of_garbage_is_counted_whole_but_only_its_first_lines_named(
    tmp_path: Path,
) -> None:
    _log(tmp_path, [_line(DAY + 10, "acme")])
    (path,) = tmp_path.iterdir()
    with path.open("ab") as out:
        out.write(b"not json\n" * 5000)
    result = _run("--log-dir", str(tmp_path), *WINDOW, "--format", "json")
    assert result.exit_code == 0, result.output
    document = json.loads(result.stdout)
    assert document["totals"]["skipped_lines"] == 5000
    assert len(document["skipped"]) == 100
    assert result.stderr.count("skipped usage-") == 100
    assert "skipped 4900 more lines" in result.stderr


@pytest.mark.parametrize(
    "args",
    [
        ["--from", "yesterday", "--to", "2026-01-03T00:00:00Z"],
        ["--from", "2026-01-01T00:00:00", "--to", "2026-01-03T00:00:00Z"],
        ["--from", "2026-01-03T00:00:00Z", "--to", "2026-01-01T00:00:00Z"],
        [*WINDOW, "--by", "week"],
        [*WINDOW, "--format", "xml"],
        [*WINDOW, "--prometheus", "file:///etc/passwd"],
        [*WINDOW, "--prometheus", "http://127.0.0.1:9", "--tolerance", "nan"],
    ],
)
def test_bad_input_exits_2_with_one_line(tmp_path: Path, args: list[str]) -> None:
    result = _run("--log-dir", str(tmp_path), *args)
    assert result.exit_code == 2
    assert "Error:" in result.stderr


# ---------------------------------------------------------------- reconciliation (--prometheus)
#: two requests of 1000 prompt and 500 completion tokens each: 3000 logged
LOGGED = 3000


@dataclass
class Engines:
    """A Prometheus whose engines grew by ``growth``: a counter's catalogue name (with
    ``{route="direct"}`` for the probes') to its increase over the window asked."""

    prometheus: StubPrometheus
    growth: dict[str, float] = field(default_factory=dict)
    rates: dict[str, float] = field(default_factory=dict)  # tokens/s, at both edges
    idle: dict[str, float] = field(default_factory=dict)  # model -> idle GPU-hours a period
    idle_ranges: list[str] = field(default_factory=list)  # the subquery range of each period

    def answer(self, path: str, query: str) -> tuple[int, bytes]:
        idle = re.fullmatch(
            r"sum by \(model\) \(sum_over_time\(.*\[(\d+s):15s\]\)\) \* 15 / 3600", query
        )
        if idle:
            self.idle_ranges.append(idle[1])
            return 200, vector(*(({"model": m}, str(h)) for m, h in self.idle.items()))
        match = re.fullmatch(r"sum\((increase|rate)\((\w+)\{(.*)\}\[(\d+)s\]\)\)", query)
        assert match, query
        kept = self.growth if match[1] == "increase" else self.rates
        value = kept.get(match[2] + (f"{{{match[3]}}}" if match[3] else ""))
        return 200, vector(({}, str(value))) if value is not None else vector()


@pytest.fixture
def engines() -> Iterator[Engines]:
    with stub_prometheus() as stub:
        engines = Engines(stub)
        stub.answer = engines.answer
        yield engines


def _reconciled(tmp_path: Path, prometheus: StubPrometheus, *args: str) -> Any:
    _log(tmp_path, [_line(DAY + 10, "acme"), _line(DAY + 20, "globex")])
    return _run("--log-dir", str(tmp_path), *WINDOW, "--prometheus", prometheus.url, *args)


def test_tokens_the_engines_counted_reconcile_with_the_log(
    tmp_path: Path, engines: Engines
) -> None:
    """The engines grew by the logged tokens plus the direct probes' and the warm-up's, give
    or take what increase() extrapolates: the footer says so, over the report's window, and
    allows the drift tolerance plus the engines' token rate at each edge times a scrape."""
    engines.growth.update({
        "inferwatch_engine_prompt_tokens_total": 2100.4,
        "inferwatch_engine_generation_tokens_total": 1150.0,
        'inferwatch_probe_tokens_total{route="direct"}': 200.0,
        "inferwatch_warmup_tokens_total": 40.0,
    })  # fmt: skip
    engines.rates.update({
        "inferwatch_engine_prompt_tokens_total": 10.0,
        "inferwatch_engine_generation_tokens_total": 5.0,
    })  # fmt: skip
    result = _reconciled(tmp_path, engines.prometheus, "--format", "json")
    assert result.exit_code == 0, result.output
    assert json.loads(result.stdout)["reconciliation"] == {
        "logged_tokens": LOGGED,
        "engine_tokens": 3250,
        "around_proxy_tokens": 240,
        "gap_tokens": -10,
        "edge_tokens": 450,  # 15 s x (10 + 5) tokens/s at each of the two edges
        "tolerance_tokens": 1450.0,  # the alert config's drift tolerance, 1000, and the edges
        "reconciled": True,
    }
    two_days = 2 * 86400
    grown = [query for query in engines.prometheus.queries if "increase(" in query]
    assert len(grown) == 4 and all(f"[{two_days}s]" in query for query in grown), grown
    csv_result = _reconciled(tmp_path / "csv", engines.prometheus, "--scrape-interval", "1m")
    assert csv_result.stdout.splitlines()[-1] == (
        "# reconciliation logged_tokens=3000 engine_tokens=3250 around_proxy_tokens=240 "
        "gap_tokens=-10 edge_tokens=1800 tolerance_tokens=2800.0 reconciled=yes"
    )


@pytest.mark.parametrize("engine_tokens", [1000, 6000], ids=["billed-more", "served-more"])
def test_a_gap_past_the_tolerance_prints_the_report_and_exits_1(
    tmp_path: Path, engines: Engines, engine_tokens: int
) -> None:
    engines.growth["inferwatch_engine_prompt_tokens_total"] = engine_tokens
    result = _reconciled(tmp_path, engines.prometheus, "--tolerance", "100")
    assert result.exit_code == 1, result.output
    assert "reconciled=no" in result.stdout
    assert result.stdout.startswith("period,tenant,")  # the report itself is still printed
    (error,) = result.stderr.splitlines()
    assert error.startswith("Error: the report does not reconcile")
    assert f"gap_tokens={LOGGED - engine_tokens}" in error


@pytest.mark.parametrize(
    "reply",
    [
        (503, b"overloaded"),
        (200, b'{"status": "error", "error": "bad_data: parse error"}'),
        (200, vector(({}, "NaN"))),
        (200, vector(({"a": "1"}, "1"), ({"a": "2"}, "2"))),
    ],
    ids=["unavailable", "refused", "nan", "two-samples"],
)
def test_a_prometheus_that_cannot_answer_exits_3_with_one_line(
    tmp_path: Path, reply: tuple[int, bytes]
) -> None:
    with stub_prometheus() as prometheus:
        prometheus.always(reply[1], reply[0])
        result = _reconciled(tmp_path, prometheus)
    assert result.exit_code == 3, result.output
    (error,) = result.stderr.splitlines()
    assert error.startswith("Error: ")


# ---------------------------------------------------------------- idle GPU cost (--gpu-hour-price)
def test_idle_gpu_hours_are_billed_to_the_models_rows_by_busy_time_per_period(
    tmp_path: Path, engines: Engines
) -> None:
    """Each UTC day the model's GPUs idle 2 hours (and another model's, which nobody used,
    1 hour) at 10 a GPU-hour: acme and globex share the first day's 20 by their busy time
    (1 s and 3 s), acme alone bears the second's; the other model's 10 a day is unbilled."""
    _log(tmp_path, [_line(DAY + 10, "acme", busy=1.0), _line(DAY + 20, "globex", busy=3.0),
                    _line(DAY + 86_400 + 10, "acme", busy=0.25)])  # fmt: skip
    engines.idle.update({"m": 2.0, "unused": 1.0})
    priced = ["--log-dir", str(tmp_path), *WINDOW, "--prometheus", engines.prometheus.url,
              "--gpu-hour-price", "10", "--tolerance", "1e9"]  # fmt: skip
    result = _run(*priced, "--format", "json")
    assert result.exit_code == 0, result.output
    document = json.loads(result.stdout)
    idle = {(r["period"], r["tenant"]): r["idle_gpu_cost"] for r in document["rows"]}
    assert idle == {
        ("2026-01-01", "acme"): pytest.approx(5.0),
        ("2026-01-01", "globex"): pytest.approx(15.0),
        ("2026-01-02", "acme"): pytest.approx(20.0),
    }
    assert document["totals"]["idle_gpu_cost"] == pytest.approx(40.0)
    assert document["totals"]["idle_gpu_cost_unbilled"] == pytest.approx(20.0)
    assert engines.idle_ranges == ["86400s", "86400s"]  # one query per day, the day's range
    csv_result = _run(*priced)
    assert csv_result.stdout.splitlines()[0].endswith(",cost,idle_gpu_cost")
    assert "idle_gpu_cost=40.0 idle_gpu_cost_unbilled=20.0" in csv_result.stdout


def test_a_gpu_hour_price_without_prometheus_is_one_line_and_exit_2(tmp_path: Path) -> None:
    result = _run("--log-dir", str(tmp_path), *WINDOW, "--gpu-hour-price", "2.5")
    assert result.exit_code == 2
    assert result.stderr.strip().splitlines() == [
        "Error: --gpu-hour-price needs --prometheus (the GPUs' utilization)"
    ]


# ---------------------------------------------------------------- files (--out, parquet)
def test_a_parquet_report_holds_the_rows_typed_and_the_totals_in_its_metadata(
    tmp_path: Path,
) -> None:
    import pyarrow.parquet as pq

    logs, out = tmp_path / "logs", tmp_path / "usage.parquet"
    logs.mkdir()
    _log(logs, [_line(DAY + 10, "acme"), _line(DAY + 20, "globex", prompt=7)])
    shown = _run("--log-dir", str(logs), *WINDOW, "--format", "json")
    result = _run("--log-dir", str(logs), *WINDOW, "--format", "parquet", "--out", str(out))
    assert result.exit_code == 0, result.output
    assert result.stdout == ""
    table = pq.read_table(out)
    assert table.to_pylist() == json.loads(shown.stdout)["rows"]
    types = {field.name: str(field.type) for field in table.schema}
    assert types["tenant"] == "string" and types["prompt_tokens"] == "int64"
    assert types["cost"] == "double"
    metadata = table.schema.metadata
    assert json.loads(metadata[b"inferwatch.totals"]) == json.loads(shown.stdout)["totals"]
    assert json.loads(metadata[b"inferwatch.skipped"]) == []
    assert [p.name for p in tmp_path.iterdir() if p.name.startswith(".")] == []


def test_an_empty_window_is_an_empty_parquet_table_of_the_same_columns(tmp_path: Path) -> None:
    import pyarrow.parquet as pq

    out = tmp_path / "empty.parquet"
    result = _run("--log-dir", str(tmp_path), *WINDOW, "--format", "parquet", "--out", str(out))
    assert result.exit_code == 0, result.output
    table = pq.read_table(out)
    assert table.num_rows == 0
    assert table.column_names[:2] == ["period", "tenant"] and "cost" in table.column_names


def test_out_writes_a_csv_report_to_the_file_alone(tmp_path: Path) -> None:
    logs, out = tmp_path / "logs", tmp_path / "usage.csv"
    logs.mkdir()
    _log(logs, [_line(DAY + 10, "acme")])
    result = _run("--log-dir", str(logs), *WINDOW, "--out", str(out))
    assert result.exit_code == 0, result.output
    assert result.stdout == ""
    assert out.read_text().splitlines()[-1].startswith("# totals requests=1 ")


@pytest.mark.parametrize(
    ("args", "code", "message"),
    [
        (
            ["--format", "parquet"],
            2,
            "Error: --format parquet needs --out FILE (Parquet is binary)",
        ),
        (
            ["--out", "/nonexistent/dir/usage.csv"],
            3,
            "Error: cannot write /nonexistent/dir/usage.csv",
        ),
    ],
    ids=["parquet-to-stdout", "unwritable"],
)
def test_a_report_that_cannot_be_written_where_asked_is_one_line(
    tmp_path: Path, args: list[str], code: int, message: str
) -> None:
    result = _run("--log-dir", str(tmp_path), *WINDOW, *args)
    assert result.exit_code == code, result.output
    (line,) = result.stderr.splitlines()
    assert line.startswith(message)


def test_parquet_without_its_extra_says_which_to_install(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setitem(sys.modules, "pyarrow", None)  # the core install: no pyarrow
    out = tmp_path / "usage.parquet"
    result = _run("--log-dir", str(tmp_path), *WINDOW, "--format", "parquet", "--out", str(out))
    assert result.exit_code == 3, result.output
    assert result.stderr.splitlines() == [
        "Error: inferwatch report usage --format parquet needs inferwatch[parquet], which is "
        "not installed: pip install 'inferwatch[parquet]'"
    ]
    assert not out.exists()
