"""``inferwatch canary`` against a hostile Prometheus and hostile flags.

A pipeline rolls back on exit 1, so a tool fault (a crash, a bad URL, a nonsense answer, a
Prometheus that trickles) must end with 3, "could not run", and one line; a threshold flag of
``nan`` must be refused rather than disable its check. The Prometheus here is a real HTTP
server on loopback, answering every query with what the test gives it.
"""

from __future__ import annotations

import json
from collections.abc import Iterator
from typing import Any

import click
import pytest
from click.testing import CliRunner
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from inferwatch.canary.cli import canary
from inferwatch.cli import main
from inferwatch.serving.prometheus_api import DEADLINE_S
from support.stub_prometheus import StubPrometheus, stub_prometheus, vector

pytestmark = pytest.mark.unit

SIDES = ["--baseline", 'model_version="a"', "--candidate", 'model_version="b"']


@pytest.fixture
def stub() -> Iterator[StubPrometheus]:
    with stub_prometheus() as server:
        yield server


def run(*args: str) -> tuple[int, str]:
    result = CliRunner().invoke(main, ["canary", *args])
    return result.exit_code, result.output


def assert_cannot_run(code: int, output: str, *words: str) -> None:
    """Exit 3 with one ``Error:`` line naming ``words``, and no traceback or internal error."""
    assert code == 3, output
    lines = output.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("Error: "), output
    assert "internal error" not in output
    for word in words:
        assert word in output


@pytest.mark.parametrize("value", ["+Inf", "-Inf", "NaN", "1e999"])
def test_a_non_finite_count_is_could_not_run_never_roll_back(
    stub: StubPrometheus, value: str
) -> None:
    stub.always(vector(({"le": "+Inf"}, value)))
    assert_cannot_run(*run("--prometheus", stub.url, *SIDES), "Prometheus answered")


def test_a_bucket_without_a_numeric_bound_is_could_not_run(stub: StubPrometheus) -> None:
    stub.always(vector(({"le": "abc"}, "5")))
    assert_cannot_run(*run("--prometheus", stub.url, *SIDES), "histogram bucket")


@pytest.mark.parametrize(
    "url",
    ["http://[::1", "http://127.0.0.1:99999", "localhost:9090", "http://", "ftp://x"],
)
def test_a_bad_prometheus_url_is_one_line_and_exit_3(url: str) -> None:
    assert_cannot_run(*run("--prometheus", url, *SIDES), "--prometheus")


@pytest.mark.parametrize(
    "body",
    [
        b"",
        b"[]",
        b'{"status": "success"}',
        b'{"status": "success", "data": {"resultType": "vector", "result": {}}}',
        b'{"status": "success", "data": {"resultType": "vector", "result": [1]}}',
        b'{"status": "success", "data": {"resultType": "vector", "result": '
        b'[{"metric": [], "value": [1, "2"]}]}}',
        b'{"status": "success", "data": {"resultType": "vector", "result": '
        b'[{"metric": {}, "value": [1, 2]}]}}',
        b'{"status": "error", "error": {"nested": true}}',
        b'{"status": "error", "error": "line one\\nline two"}',
        b"[" * 100_000,
    ],
)
def test_a_malformed_answer_is_one_line_and_exit_3(stub: StubPrometheus, body: bytes) -> None:
    stub.always(body)
    assert_cannot_run(*run("--prometheus", stub.url, *SIDES))


def test_two_samples_for_a_sum_is_a_malformed_answer(stub: StubPrometheus) -> None:
    stub.always(vector(({"le": "1"}, "5"), ({"le": "+Inf"}, "6")))
    assert_cannot_run(*run("--prometheus", stub.url, *SIDES), "samples where one")


def test_a_trickling_prometheus_ends_at_the_overall_deadline(stub: StubPrometheus) -> None:
    stub.trickle = lambda path: True
    assert_cannot_run(*run("--prometheus", stub.url, *SIDES, "--timeout", "1"), "deadline")
    assert len(stub.queries) == 1  # the deadline is the analysis', not each query's


def test_the_overall_deadline_has_a_finite_default() -> None:
    timeout = next(p for p in canary.params if p.name == "timeout")
    assert timeout.default == DEADLINE_S and 0 < DEADLINE_S <= 600


FLOAT_FLAGS = sorted(
    p.opts[0]
    for p in canary.params
    if isinstance(p, click.Option) and isinstance(p.type, click.FloatRange)
)


def test_every_float_flag_is_checked() -> None:
    assert {"--latency-tolerance", "--alpha", "--timeout", "--at"} <= set(FLOAT_FLAGS)


@pytest.mark.parametrize("flag", FLOAT_FLAGS)
@pytest.mark.parametrize("value", ["nan", "inf", "-inf", "-1", "1e999"])
def test_a_non_finite_or_negative_float_flag_is_bad_input(
    stub: StubPrometheus, flag: str, value: str
) -> None:
    stub.always(vector())
    code, output = run("--prometheus", stub.url, *SIDES, f"{flag}={value}")
    assert code == 3, output
    assert flag in output and "Traceback" not in output
    assert stub.queries == []  # refused before any query


# ---- hostile answers, generated -----------------------------------------------------------

_json = st.recursive(
    st.none() | st.booleans() | st.integers() | st.floats() | st.text(max_size=8),
    lambda inner: st.lists(inner, max_size=4) | st.dictionaries(st.text(max_size=6), inner,
                                                                max_size=4),
    max_leaves=12,
)  # fmt: skip
_value = st.sampled_from(["NaN", "+Inf", "-Inf", "1e999", "abc", "", "-5", "0", "1e300"]) | (
    st.floats(allow_nan=False).map(repr)
)
_label = st.dictionaries(st.sampled_from(["le", "signal", "tenant", "x"]), _value, max_size=3)
_sample = st.fixed_dictionaries(
    {"metric": _label | _json, "value": st.tuples(st.integers() | _json, _value | _json)}
)
_reply = st.one_of(
    _json,
    st.fixed_dictionaries({"status": st.just("success"), "data": _json}),
    st.fixed_dictionaries(
        {
            "status": st.just("success"),
            "data": st.fixed_dictionaries(
                {"resultType": st.just("vector"), "result": st.lists(_sample, max_size=4)}
            ),
        }
    ),
)


@settings(
    max_examples=60, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture]
)
@given(reply=_reply, status=st.sampled_from([200, 400, 422, 503]))
def test_no_answer_prometheus_gives_crashes_canary_or_rolls_back(
    stub: StubPrometheus, reply: Any, status: int
) -> None:
    """Both sides get the same answer to every query, so no answer can show a regression:
    whatever it is, the command ends with a verdict other than roll back, or with 3 and one
    line that is not the backstop's internal error."""
    stub.always(json.dumps(reply).encode(), status)
    code, output = run("--prometheus", stub.url, *SIDES)
    assert code in (0, 2, 3), output
    if code == 3:
        assert_cannot_run(code, output)
