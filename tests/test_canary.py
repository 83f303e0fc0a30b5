"""Canary analysis: the statistics, the selectors, the Prometheus client and the CLI's errors.

The verdicts on realistic data, against a real Prometheus, are in test_canary_e2e.py.
"""

from __future__ import annotations

import itertools
import json
import math
import subprocess
from collections.abc import Callable
from fractions import Fraction
from typing import Any

import httpx
import pytest
from click.testing import CliRunner
from hypothesis import given, settings
from hypothesis import strategies as st

from inferwatch.canary import analysis, checks, selector, stats
from inferwatch.canary.analysis import Result
from inferwatch.canary.checks import CHECKS
from inferwatch.canary.prometheus import MAX_REPLY_BYTES, Prometheus, PrometheusError
from inferwatch.cli import main
from inferwatch.mixin import config as alert_config

pytestmark = pytest.mark.proc


def exact_p(k_c: int, n_c: int, k_b: int, n_b: int) -> Fraction:
    """The one-sided Fisher p-value by enumerating the hypergeometric distribution."""
    events, total = k_c + k_b, n_c + n_b
    norm = math.comb(total, n_c)
    return sum(
        (
            Fraction(math.comb(events, k) * math.comb(total - events, n_c - k), norm)
            for k in range(k_c, min(events, n_c) + 1)
        ),
        Fraction(0),
    )


tables = st.integers(0, 40).flatmap(
    lambda n_c: st.integers(0, 40).flatmap(
        lambda n_b: st.tuples(st.integers(0, n_c), st.just(n_c), st.integers(0, n_b), st.just(n_b))
    )
)


@settings(deadline=None)  # hundreds of exact p-values per case, on a busy machine
@given(tables)
def test_fisher_matches_exact_enumeration(table: tuple[int, int, int, int]) -> None:
    expected = float(exact_p(*table)) if table[0] + table[2] and table[1] and table[3] else 1.0
    assert stats.fisher_greater(*table) == pytest.approx(expected, rel=1e-9, abs=1e-12)


@settings(deadline=None)  # hundreds of exact p-values per case, on a busy machine
@given(st.integers(1, 30), st.integers(1, 30), st.integers(0, 60), st.floats(0.001, 0.5))
def test_fisher_never_rejects_more_often_than_alpha_under_the_null(
    n_c: int, n_b: int, events: int, alpha: float
) -> None:
    """Given the margins, every way the events can split between the sides, weighted by its
    probability under 'no difference': the share of them called significant is <= alpha."""
    events = min(events, n_c + n_b)
    total, norm = n_c + n_b, math.comb(n_c + n_b, n_c)
    rejected = Fraction(0)
    for k in range(max(0, events - n_b), min(events, n_c) + 1):
        if stats.fisher_greater(k, n_c, events - k, n_b) <= alpha:
            rejected += Fraction(math.comb(events, k) * math.comb(total - events, n_c - k), norm)
    assert rejected <= alpha + 1e-12


@settings(deadline=None)  # hundreds of exact p-values per case, on a busy machine
@given(st.integers(1, 500), st.integers(1, 500), st.integers(0, 500))
def test_fisher_p_falls_as_candidate_events_rise(n_c: int, n_b: int, k_b: int) -> None:
    k_b = min(k_b, n_b)
    values = [stats.fisher_greater(k, n_c, k_b, n_b) for k in range(n_c + 1)]
    assert all(0 <= v <= 1 for v in values)
    assert all(a >= b - 1e-12 for a, b in itertools.pairwise(values))


def test_fisher_on_a_large_window_is_exact_where_the_sum_stops_early() -> None:
    # a million requests a side, 1 % vs 1.05 % above the bound
    p = stats.fisher_greater(10_500, 1_000_000, 10_000, 1_000_000)
    z = (0.0105 - 0.01) / math.sqrt(0.01025 * 0.98975 * 2 / 1_000_000)
    assert p == pytest.approx(0.5 * math.erfc(z / math.sqrt(2)), rel=0.05)


@pytest.mark.parametrize(
    "table", [(-1, 10, 0, 10), (11, 10, 0, 10), (0, 10, 11, 10), (0, 10, -2, 10)]
)
def test_fisher_refuses_impossible_counts(table: tuple[int, int, int, int]) -> None:
    with pytest.raises(ValueError):
        stats.fisher_greater(*table)


def test_tail_bound_is_the_bucket_holding_the_quantile() -> None:
    bounds = [0.1, 0.25, 0.5, 1.0, math.inf]
    assert stats.tail_bound(bounds, [50, 90, 99, 100, 100], 0.99) == 2
    assert stats.tail_bound(bounds, [50, 90, 98, 98, 100], 0.99) is None  # in +Inf
    assert stats.tail_bound(bounds, [0, 0, 0, 0, 0], 0.99) is None


# ------------------------------------------------------------------ selectors
@pytest.mark.parametrize(
    ("text", "promql"),
    [
        ('model_version="2024-09-25"', 'model_version="2024-09-25"'),
        (
            '{model="llama", engine_version=~"0\\\\.34.*"}',
            'model="llama",engine_version=~"0\\\\.34.*"',
        ),
        ('prompt_version="v\\"2"', 'prompt_version="v\\"2"'),
        ('model_version="b", split!="header"', 'model_version="b",split!="header"'),
    ],
)
def test_selectors_read_as_promql_matchers(text: str, promql: str) -> None:
    assert selector.parse(text).promql() == promql


@pytest.mark.parametrize(
    ("text", "reason"),
    [
        ('model="llama"', "name at least one of"),
        ('model_version!="a"', "name at least one of"),
        ('pod="x",model_version="a"', "not one of"),
        ('model_version="a" model="b"', "expected ','"),
        ('model_version="a",model_version="b"', "named twice"),
        ('model_version=~"("', "bad regex"),
        ("model_version=a", "cannot read"),
        ("", "no label matchers"),
        ('model_version="' + "a" * 2000 + '"', "longer than"),
    ],
)
def test_bad_selectors_say_why(text: str, reason: str) -> None:
    with pytest.raises(selector.SelectorError, match=reason):
        selector.parse(text, "--candidate")


@given(st.text(max_size=200))
def test_any_text_is_a_selector_or_a_selector_error(text: str) -> None:
    try:
        parsed = selector.parse(text)
    except selector.SelectorError as exc:
        assert "\n" not in str(exc)
    else:
        assert selector.parse(str(parsed)) == parsed


# ------------------------------------------------------------------ Prometheus client
def _prometheus(handler: httpx.MockTransport) -> Prometheus:
    return Prometheus("http://prometheus:9090", httpx.Client(transport=handler))


@pytest.mark.parametrize(
    ("reply", "reason"),
    [
        (httpx.Response(200, content=b"<html>"), "not a Prometheus API reply"),
        (
            httpx.Response(400, json={"status": "error", "error": "parse error at char 3"}),
            "query refused: parse error",
        ),
        (
            httpx.Response(200, json={"status": "success", "data": {"resultType": "matrix"}}),
            "expected an instant vector",
        ),
        (
            httpx.Response(
                200,
                json={"status": "success", "data": {"resultType": "vector", "result": [{}]}},
            ),
            "malformed sample",
        ),
        (httpx.Response(200, content=b" " * (MAX_REPLY_BYTES + 1)), "answer over"),
    ],
)
def test_bad_prometheus_replies_are_one_line_errors(reply: httpx.Response, reason: str) -> None:
    client = _prometheus(httpx.MockTransport(lambda request: reply))
    with pytest.raises(PrometheusError, match=reason):
        client.query("up", 0)


def test_queries_are_posted_at_one_evaluation_time() -> None:
    seen = []

    def handler(request: httpx.Request) -> httpx.Response:
        seen.append(request.content.decode())
        body = {"resultType": "vector", "result": [{"metric": {"le": "+Inf"}, "value": [1, "7"]}]}
        return httpx.Response(200, json={"status": "success", "data": body})

    assert _prometheus(httpx.MockTransport(handler)).query("up", 1700000000.5) == [
        ({"le": "+Inf"}, 7.0)
    ]
    assert "time=1700000000.500" in seen[0] and "query=up" in seen[0]


def test_prometheus_url_must_be_http() -> None:
    with pytest.raises(PrometheusError, match="http"):
        Prometheus("prometheus:9090")


# ------------------------------------------------------------------ verdict
def _results(*outcomes: analysis.Outcome) -> list[Result]:
    return [Result(c, o, "", "", None, "") for c, o in zip(CHECKS, outcomes, strict=False)]


@pytest.mark.parametrize(
    ("outcomes", "expected"),
    [
        (("pass", "pass", "n/a"), "promote"),
        (("pass", "no data", "n/a"), "inconclusive"),
        (("fail", "no data", "pass"), "roll back"),
        (("n/a", "n/a"), "inconclusive"),
    ],
)
def test_verdict(outcomes: tuple[analysis.Outcome, ...], expected: str) -> None:
    assert analysis.verdict(_results(*outcomes)) == expected


# ------------------------------------------------------------------ CLI errors
GOOD = ["--baseline", 'model_version="a"', "--candidate", 'model_version="b"']
LOCAL = ["--prometheus", "http://127.0.0.1:{port}"]
ONLY_MODEL = ["--baseline", 'model="a"', "--candidate", 'model_version="b"']
SAME = ["--baseline", 'model_version="a"', "--candidate", 'model_version="a"']


@pytest.mark.parametrize(
    ("args", "env", "reason"),
    [
        ([*LOCAL, *GOOD], {}, "cannot reach Prometheus"),
        (["--prometheus", "ftp://x", *GOOD], {}, "http(s) URL"),
        ([*LOCAL, *GOOD, "--window", "30"], {}, "--window"),
        ([*LOCAL, *GOOD, "--window", "5s"], {}, "10s..1w"),
        ([*LOCAL, *GOOD], {"INFERWATCH_CANARY_WINDOW": "8d"}, "10s..1w"),
        # a short window is a valid question where scrapes are frequent (the demo's are 2 s)
        ([*LOCAL, *GOOD, "--window", "20s"], {}, "cannot reach Prometheus"),
        ([*LOCAL, *ONLY_MODEL], {}, "--baseline"),
        ([*LOCAL, *SAME], {}, "same series"),
        (GOOD, {}, "Missing option '--prometheus'"),
        (["--prometheus", "http://x", *GOOD, "--alpha", "0"], {}, "--alpha"),
        ([*LOCAL, *GOOD, "--config", "/nonexistent/alerts.yaml"], {}, "alerts.yaml"),
    ],
)
def test_bad_input_is_one_clear_line_and_exit_3(
    args: list[str], env: dict[str, str], reason: str, unused_port: int
) -> None:
    args = [a.replace("{port}", str(unused_port)) for a in args]
    result = CliRunner().invoke(main, ["canary", *args], env=env)
    assert result.exit_code == 3, result.output
    assert reason in result.output
    assert "Traceback" not in result.output


def _a_against_b(handler: Callable[[httpx.Request], httpx.Response]) -> analysis.Analysis:
    """Version a against version b over 30 minutes, on the shipped alert config and default
    thresholds, querying a Prometheus that ``handler`` answers for."""
    return analysis.Analysis(
        _prometheus(httpx.MockTransport(handler)),
        alert_config.load(),
        selector.parse('model_version="a"'),
        selector.parse('model_version="b"'),
        "30m",
        0.0,
        analysis.Thresholds(),
    )


def test_an_empty_prometheus_is_inconclusive(unused_port: int) -> None:
    """No series at all is not an error: every check lacks data, and the pipeline waits."""

    def handler(request: httpx.Request) -> httpx.Response:
        return httpx.Response(
            200, json={"status": "success", "data": {"resultType": "vector", "result": []}}
        )

    run = _a_against_b(handler)
    results = run.run()
    assert {r.outcome for r in results} == {"no data"}
    assert analysis.verdict(results) == "inconclusive"
    assert json.dumps([r.detail for r in results])  # every row says why


def _ttft(buckets: list[tuple[str, float]]) -> Result:
    """The TTFT check of both sides having ``buckets`` (le, increase)."""

    def handler(request: httpx.Request) -> httpx.Response:
        query = request.content.decode()
        if "histogram_quantile" in query:
            result = [{"metric": {}, "value": [0, "0.5"]}]
        elif "_bucket" in query:
            result = [{"metric": {"le": le}, "value": [0, str(v)]} for le, v in buckets]
        else:
            result = []
        return httpx.Response(
            200, json={"status": "success", "data": {"resultType": "vector", "result": result}}
        )

    run = _a_against_b(handler)
    (ttft,) = [r for r in run.run() if r.check.name == "ttft_p99"]
    return ttft


def test_a_bucket_bound_spelt_two_ways_is_one_bucket() -> None:
    """Python's client writes le="1.0", Go's le="1": ``sum by (le)`` keeps both groups, and
    the analysis must add them rather than keep one."""
    ttft = _ttft([("0.5", 0), ("1", 150), ("1.0", 150), ("+Inf", 300)])
    assert ttft.outcome == "pass", ttft
    assert "above 1000 ms: 0.00% of 300" in ttft.detail


def test_extrapolated_counts_that_round_past_the_total_are_an_empty_tail() -> None:
    """``increase`` extrapolates each series on its own: a bucket may round above +Inf."""
    ttft = _ttft([("0.5", 0), ("1", 300.6), ("+Inf", 300.4)])
    assert ttft.outcome == "pass", ttft
    assert "0.00% of 300 vs 0.00% of 300" in ttft.detail


def _cost_series(
    version: str, tenant: str, minutes: int, tokens: int, cost: float
) -> list[dict[str, str]]:
    labels = f'model_version="{version}",tenant="{tenant}"'
    return [
        {"series": f'inferwatch_tenancy_tokens_total{{{labels},token_type="prompt"}}',
         "values": f"0+{tokens}x{minutes}"},
        {"series": f"inferwatch_tenancy_cost_total{{{labels}}}", "values": f"0+{cost}x{minutes}"},
    ]  # fmt: skip


@pytest.mark.parametrize(("candidate_rate", "expected"), [(1.0, 1.0), (1.3, 1.3)])
def test_cost_is_compared_at_the_baselines_tenant_mix(
    promtool: str, tmp_path: Any, candidate_rate: float, expected: float
) -> None:
    """Tenants' cost per token differs (here fourfold): the baseline served mostly the cheap
    tenant and the candidate mostly the dear one, so plain cost per token would call the
    candidate nearly 3x dearer at the same rates; priced at the baseline's mix it is not, and a
    candidate 30 % dearer for each tenant is 30 % dearer."""
    config = alert_config.load()
    compared = checks.cost_comparison(config, 'model_version="v1"', 'model_version="v2"', "10m")
    series = [
        *_cost_series("v1", "cheap", 10, 900, 0.9),
        *_cost_series("v1", "dear", 10, 100, 0.4),
        *_cost_series("v2", "cheap", 10, 100, 0.1 * candidate_rate),
        *_cost_series("v2", "dear", 10, 900, 3.6 * candidate_rate),
    ]
    cases = {
        f"round({compared.at_candidate} / {compared.actual}, 0.001)": expected,
        f"{compared.tokens}": 1000 * 10,
    }
    tests = tmp_path / "cost.yaml"
    tests.write_text(json.dumps({"rule_files": [], "evaluation_interval": "1m", "tests": [{
        "interval": "1m",
        "input_series": series,
        "promql_expr_test": [
            {"expr": expr, "eval_time": "10m", "exp_samples": [{"labels": "{}", "value": value}]}
            for expr, value in cases.items()
        ],
    }]}))  # fmt: skip
    result = subprocess.run(
        [promtool, "test", "rules", str(tests)], capture_output=True, text=True, timeout=60
    )
    assert result.returncode == 0, result.stdout + result.stderr
