"""``inferwatch report usage``: chargeback totals from the proxy's usage log."""

from __future__ import annotations

import csv
import io
import json
from pathlib import Path
from typing import Any

import pytest
from click.testing import CliRunner

from inferwatch.cli import main
from inferwatch.proxy.usagelog import UsageLog

pytestmark = pytest.mark.unit

DAY = 1_767_225_600  # 2026-01-01T00:00:00Z
WINDOW = ["--from", "2026-01-01T00:00:00Z", "--to", "2026-01-03T00:00:00Z"]


def _line(
    ts: float, tenant: str, prompt: int = 1000, price: float = 1.0, **extra: Any
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
        b"[1, 2]\n",
        b"x" * 9000 + b"\n",
        json.dumps(_line(DAY, "acme")).encode()[:40],  # cut short at the end of the file
    ],
    ids=[
        "not-json",
        "fields-missing",
        "negative-tokens",
        "negative-price",
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
    ],
)
def test_bad_input_exits_2_with_one_line(tmp_path: Path, args: list[str]) -> None:
    result = _run("--log-dir", str(tmp_path), *args)
    assert result.exit_code == 2
    assert "Error:" in result.stderr
