"""The console script: subcommands, version, environment twins, clear errors."""

from __future__ import annotations

from typing import Any

import pytest
from click.testing import CliRunner

from inferwatch import __version__
from inferwatch.cli import SUBCOMMANDS, main
from tests.conftest import shared_path


def test_version() -> None:
    result = CliRunner().invoke(main, ["--version"])
    assert result.exit_code == 0
    assert __version__ in result.output


@pytest.mark.parametrize("name", sorted(SUBCOMMANDS))
def test_every_subcommand_loads_and_documents_env_twins(name: str) -> None:
    result = CliRunner().invoke(main, [name, "--help"])
    assert result.exit_code == 0, result.output
    if "--" in result.output.split("Options:")[-1].replace("--help", ""):
        assert "INFERWATCH_" in result.output


def test_options_read_their_environment_twin(page_server: Any) -> None:
    shared_path("fixtures/engines/vllm-generated-0.33.0-1engine.prom")  # what the page serves
    url = f"{page_server.url}/fixture/vllm-generated-0.33.0-1engine/metrics"
    detected = CliRunner().invoke(main, ["scrape", url])
    assert detected.exit_code == 0, detected.output
    assert detected.output.startswith("engine: vllm")
    forced = CliRunner().invoke(main, ["scrape", url], env={"INFERWATCH_SCRAPE_ENGINE": "tgi"})
    assert forced.exit_code == 1
    assert "no tgi metrics on the page" in forced.output


def test_scrape_prints_the_canonical_table(page_server: Any) -> None:
    shared_path("fixtures/engines/vllm-generated-0.33.0-1engine.prom")  # what the page serves
    url = f"{page_server.url}/fixture/vllm-generated-0.33.0-1engine/metrics"
    result = CliRunner().invoke(main, ["scrape", url])
    rows = {line.split()[0] for line in result.output.splitlines()[2:]}
    assert "inferwatch_engine_requests_running" in rows
    assert "inferwatch_engine_time_to_first_token_seconds" in rows
    assert "p99≈" in result.output


def test_a_bad_url_is_one_clear_line() -> None:
    result = CliRunner().invoke(main, ["scrape", "not a url"])
    assert result.exit_code == 2
    assert "is not an http(s) URL" in result.output
    assert "Traceback" not in result.output


def test_unreachable_engine_is_one_clear_line(unused_port: int) -> None:
    result = CliRunner().invoke(main, ["scrape", f"http://127.0.0.1:{unused_port}"])
    assert result.exit_code == 1
    assert result.output.startswith("Error: scrape of http://127.0.0.1:"), result.output
    assert len(result.output.splitlines()) == 1
    assert "Traceback" not in result.output
