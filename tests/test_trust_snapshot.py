"""``inferwatch snapshot`` against a hostile Prometheus and hostile flags.

An answer of any other shape than the API's, or a bad flag, is one line and exit 2 (bad
input: the URL or the flag is wrong); a Prometheus that trickles ends at the overall deadline
with exit 3. A ``--var`` value is one label value: a quote in it cannot close the matcher's
string and add PromQL of its own.
"""

from __future__ import annotations

import json
import re
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from click.testing import CliRunner

from inferwatch.cli import main
from support.stub_prometheus import StubPrometheus, stub_prometheus

pytestmark = pytest.mark.unit

BUILDINFO = json.dumps({"status": "success", "data": {"version": "2.53.0"}}).encode()
NO_RULES = json.dumps({"status": "success", "data": {"groups": []}}).encode()


def matrix(*series: Any) -> bytes:
    return json.dumps(
        {"status": "success", "data": {"resultType": "matrix", "result": list(series)}}
    ).encode()


def answering(stub: StubPrometheus, body: bytes, status: int = 200) -> None:
    """A Prometheus whose build info is fine, with no rules, and whose every range answer is
    ``body``."""
    fixed = {"/api/v1/status/buildinfo": BUILDINFO, "/api/v1/rules": NO_RULES}
    stub.answer = lambda path, query: (200, fixed[path]) if path in fixed else (status, body)


@pytest.fixture
def stub() -> Iterator[StubPrometheus]:
    with stub_prometheus() as server:
        yield server


def run(stub: StubPrometheus, tmp_path: Path, *args: str) -> tuple[int, str]:
    argv = ["snapshot", "--dashboard", "fleet", "--prometheus", stub.url,
            "--out", str(tmp_path / "fleet.png"), *args]  # fmt: skip
    result = CliRunner().invoke(main, argv)
    return result.exit_code, result.output


def assert_one_line(code: int, output: str, expected: int, *words: str) -> None:
    """Exit ``expected`` with one ``Error:`` line (click adds its usage lines to a bad flag)."""
    assert code == expected, output
    errors = [line for line in output.splitlines() if line.startswith("Error: ")]
    assert len(errors) == 1 and "Traceback" not in output, output
    for word in words:
        assert word in output


#: a time for answers malformed in another way (whether it is inside the window is moot)
NOW = time.time()
MALFORMED = {
    "not JSON": b"<html>502 Bad Gateway</html>",
    "JSON too deep": b"[" * 100_000,
    "a list, not an object": b"[1, 2]",
    "success without data": b'{"status": "success"}',
    "data not an object": b'{"status": "success", "data": [1]}',
    "a vector, not a matrix": b'{"status": "success", "data": {"resultType": "vector", '
    b'"result": []}}',
    "result not a list": b'{"status": "success", "data": {"resultType": "matrix", '
    b'"result": {"a": 1}}}',
    "series not an object": matrix(1, "two"),
    "metric not an object": matrix({"metric": ["a"], "values": [[NOW, "1"]]}),
    "values not pairs": matrix({"metric": {}, "values": [[NOW]]}),
    "value not a number": matrix({"metric": {}, "values": [[NOW, "fast"]]}),
    "time not a number": matrix({"metric": {}, "values": [[None, "1"]]}),
    "time far outside the window": matrix({"metric": {}, "values": [[1e300, "1"]]}),
    "error not a string": b'{"status": "error", "error": {"nested": [1, 2]}}',
    "error over two lines": b'{"status": "error", "error": "bad\\nworse"}',
}


@pytest.mark.parametrize("name", sorted(MALFORMED))
def test_a_malformed_answer_is_one_line_and_exit_2(
    stub: StubPrometheus, tmp_path: Path, name: str
) -> None:
    answering(stub, MALFORMED[name])
    assert_one_line(*run(stub, tmp_path), 2)
    assert not (tmp_path / "fleet.png").exists()


BAD_FLAGS = {
    "timeout nan": ["--timeout", "nan"],
    "timeout inf": ["--timeout", "inf"],
    "timeout negative": ["--timeout", "-1"],
    "from zero": ["--from", "0s"],
    "from a century": ["--from", "100y"],
    "from no duration": ["--from", "yesterday"],
    "scrape interval a day": ["--scrape-interval", "1d"],
    "var without a value": ["--var", "model"],
    "var with a newline": ["--var", "model=a\nb"],
    "var unknown": ["--var", "colour=red"],
}


@pytest.mark.parametrize("name", sorted(BAD_FLAGS))
def test_a_bad_flag_is_one_line_and_exit_2_before_any_query(
    stub: StubPrometheus, tmp_path: Path, name: str
) -> None:
    answering(stub, matrix())
    assert_one_line(*run(stub, tmp_path, *BAD_FLAGS[name]), 2)
    assert stub.queries == []


@pytest.mark.parametrize(
    "url", ["http://[::1", "http://127.0.0.1:99999", "localhost:9090", "http://", "ftp://x"]
)
def test_a_bad_prometheus_url_is_one_line_and_exit_2(url: str) -> None:
    result = CliRunner().invoke(main, ["snapshot", "--dashboard", "fleet", "--prometheus", url])
    assert_one_line(result.exit_code, result.output, 2, "--prometheus")


#: a PromQL double-quoted string, escapes included
_STRING = re.compile(r'"(?:[^"\\]|\\.)*"')


def test_a_quote_in_a_var_cannot_inject_a_matcher(stub: StubPrometheus, tmp_path: Path) -> None:
    injected = 'x"} or vector(1) or up{a="'
    # a point a minute before the snapshot's window ends: now, not when the module was imported
    answering(stub, matrix({"metric": {}, "values": [[time.time() - 60, "1"]]}))
    code, output = run(stub, tmp_path, "--var", f"model_version={injected}")
    assert code == 0, output
    asked = [q for q in stub.queries if "model_version" in q]
    assert asked, stub.queries
    for query in asked:
        outside_strings = _STRING.sub('""', query)
        assert "vector(1)" not in outside_strings and "up{a=" not in outside_strings, query
        assert 'model_version=~"x\\"\\\\} or vector\\\\(1\\\\) or up\\\\{a=\\""' in query, query


def test_a_trickling_prometheus_ends_at_the_overall_deadline(
    stub: StubPrometheus, tmp_path: Path
) -> None:
    answering(stub, matrix())
    stub.trickle = lambda path: True
    assert_one_line(*run(stub, tmp_path, "--timeout", "1"), 3, "deadline")
