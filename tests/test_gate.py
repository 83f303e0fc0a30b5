"""The quality gate: statistics, the pass/fail rules and the command's exit codes."""

from __future__ import annotations

import json

import pytest
from click.testing import CliRunner

from inferwatch.cli import main
from inferwatch.probes import gate, golden, stats

pytestmark = pytest.mark.unit

GOLDENS = golden.load()


def test_wilson_matches_published_values() -> None:
    # Newcombe (1998), table I: 81/263 -> 0.2553 to 0.3662; 0/10 -> 0 to 0.2775.
    low, high = stats.wilson(81, 263)
    assert (round(low, 4), round(high, 4)) == (0.2553, 0.3662)
    low, high = stats.wilson(0, 10)
    assert (low, round(high, 4)) == (0.0, 0.2775)


def test_newcombe_difference_matches_the_paper() -> None:
    # Newcombe (1998), "Interval estimation for the difference between independent
    # proportions", example (a): 56/70 vs 48/80 -> difference 0.2000, method 10: 0.0524-0.3339.
    d = stats.newcombe(48, 80, 56, 70)
    assert round(d.delta, 4) == 0.2
    assert (round(d.low, 4), round(d.high, 4)) == (0.0524, 0.3339)
    assert not d.significant_drop
    assert stats.newcombe(56, 70, 48, 80).significant_drop


def test_percentile_interpolates() -> None:
    assert stats.percentile([1, 2, 3, 4], 50) == 2.5
    assert stats.percentile([], 50) is None


def _quality(passes: int, runs: int) -> gate.Quality:
    return gate.Quality(passes=passes, runs=runs)


def _load(ttft: float, tpot: float, throughput: float, errors: int = 0) -> gate.Load:
    return gate.Load(32, errors, ttft, ttft * 2, tpot, tpot * 2, throughput)


def _verdicts(report: gate.GateReport) -> dict[str, bool]:
    return {c.name: c.ok for c in report.comparisons}


STEADY = _load(0.05, 0.01, 900)


def _compare(
    quality: tuple[gate.Quality, gate.Quality],
    load: tuple[gate.Load, gate.Load] = (STEADY, STEADY),
    repeats: int = 3,
) -> gate.GateReport:
    """The gate on (baseline, candidate) results, default thresholds."""
    return gate.compare(GOLDENS, repeats, *quality, *load, gate.Thresholds())


def test_identical_results_pass() -> None:
    report = _compare((_quality(96, 96), _quality(96, 96)))
    assert report.passed


def test_one_flipped_answer_is_noise_but_a_real_drop_fails() -> None:
    noise = _compare((_quality(96, 96), _quality(95, 96)))
    assert noise.passed
    drop = _compare((_quality(96, 96), _quality(84, 96)))
    assert _verdicts(drop) == {
        "pass_rate": False,
        "ttft_p50": True,
        "tpot_p50": True,
        "throughput": True,
    }


def test_latency_within_tolerance_passes_and_beyond_fails() -> None:
    base = _load(0.100, 0.020, 1000)
    within = _compare(
        (_quality(32, 32), _quality(32, 32)), (base, _load(0.108, 0.021, 950)), repeats=1
    )
    assert within.passed
    slower = _compare(
        (_quality(32, 32), _quality(32, 32)), (base, _load(0.150, 0.030, 700)), repeats=1
    )
    assert _verdicts(slower) == {
        "pass_rate": True,
        "ttft_p50": False,
        "tpot_p50": False,
        "throughput": False,
    }
    errors = _compare(
        (_quality(32, 32), _quality(32, 32)), (base, _load(0.1, 0.02, 1000, errors=3)), repeats=1
    )
    assert not _verdicts(errors)["throughput"]


def test_report_renders_as_table_and_json() -> None:
    report = _compare((_quality(96, 96), _quality(84, 96)))
    table = gate.render_table(report, "http://base", "http://cand")
    assert "pass_rate" in table and "-12.5 pts" in table and table.endswith("verdict: FAIL")
    document = json.loads(json.dumps(report.as_json()))
    assert document["verdict"] == "fail"
    assert document["quality"]["delta"] == pytest.approx(-0.125)
    low, high = document["quality"]["ci95"]
    assert low < -0.125 < high < 0


def test_unreachable_endpoint_is_one_line_and_exit_2() -> None:
    result = CliRunner().invoke(
        main,
        [
            "gate",
            "--baseline",
            "http://127.0.0.1:9",
            "--candidate",
            "http://127.0.0.1:9",
            "--timeout",
            "1",
        ],
    )
    assert result.exit_code == 3
    assert result.output.count("\n") == 1 and "cannot list models" in result.output


@pytest.mark.parametrize(
    ("args", "message"),
    [
        (["--baseline", "nope", "--candidate", "http://x"], "not an http(s) URL"),
        (
            ["--baseline", "http://x", "--candidate", "http://y", "--goldens", "missing"],
            "no such golden set",
        ),
    ],
)
def test_bad_arguments_exit_2(args: list[str], message: str) -> None:
    result = CliRunner().invoke(main, ["gate", *args])
    assert result.exit_code == 2 and message in result.output
