"""Every command that talks to a server ends within its deadline, whatever the server does.

httpx's timeouts bound each read, and a server that sends a byte now and then never trips
them: ``runbooks reset-breaker``, ``scrape`` and ``gate`` each end against such a trickle
with exit 3 and one line, and reset-breaker refuses an answer that is not a receiver's.
"""

from __future__ import annotations

from collections.abc import Iterator

import pytest
from click.testing import CliRunner

from inferwatch.cli import main
from inferwatch.runbooks import cli as runbooks_cli
from support.stub_prometheus import StubPrometheus, stub_prometheus

pytestmark = pytest.mark.unit

TOKEN = {"INFERWATCH_RUNBOOKS_TOKEN": "receiver-secret-0123456789"}


@pytest.fixture
def trickling() -> Iterator[StubPrometheus]:
    with stub_prometheus() as server:
        server.trickle = lambda path: True
        yield server


def assert_cannot_run(argv: list[str], env: dict[str, str] | None = None) -> str:
    result = CliRunner().invoke(main, argv, env=env)
    assert result.exit_code == 3, result.output
    errors = [line for line in result.output.splitlines() if line.startswith("Error: ")]
    assert len(errors) == 1 and "Traceback" not in result.output, result.output
    return errors[0]


def test_reset_breaker_ends_at_its_deadline_against_a_trickle(
    trickling: StubPrometheus, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(runbooks_cli, "RESET_DEADLINE_S", 1.0)
    line = assert_cannot_run(["runbooks", "reset-breaker", "--url", trickling.url], TOKEN)
    assert "deadline" in line


@pytest.mark.parametrize(
    "body", [b"<html>", b"{}", b'{"closed": 3}', b'{"closed": [[1, 2, 3]]}', b"[" * 100_000]
)
def test_reset_breaker_refuses_an_answer_that_is_not_a_receivers(body: bytes) -> None:
    with stub_prometheus() as server:
        server.always(body)
        line = assert_cannot_run(["runbooks", "reset-breaker", "--url", server.url], TOKEN)
    assert "not as a runbook receiver does" in line


def test_scrape_ends_within_the_engine_timeout_against_a_trickle(
    trickling: StubPrometheus,
) -> None:
    trickling.content_type = "text/plain; version=0.0.4"
    line = assert_cannot_run(
        ["scrape", f"{trickling.url}/metrics", "--engine", "vllm", "--engine-timeout", "1"]
    )
    assert "timeout" in line


def test_gate_ends_within_its_timeout_when_the_model_list_trickles(
    trickling: StubPrometheus,
) -> None:
    line = assert_cannot_run(
        ["gate", "--baseline", trickling.url, "--candidate", trickling.url, "--timeout", "1"]
    )
    assert "no list of models" in line


def test_scrape_ends_within_the_engine_timeout_when_the_version_endpoint_trickles() -> None:
    """The page answers; the version endpoint read after it (for the model line) trickles."""
    page = b'vllm:num_requests_running{model_name="m",engine="0"} 1\n'
    with stub_prometheus() as server:
        server.content_type = "text/plain; version=0.0.4"
        server.answer = lambda path, query: (200, page)
        server.trickle = lambda path: path != "/metrics"
        result = CliRunner().invoke(
            main, ["scrape", f"{server.url}/metrics", "--engine", "vllm", "--engine-timeout", "1"]
        )
    assert result.exit_code == 0, result.output
    assert "engine: vllm" in result.output
