"""The console script: subcommands, version, environment twins, clear errors."""

from __future__ import annotations

import re
from collections.abc import Iterator
from typing import Any

import click
import pytest
from click.testing import CliRunner

from inferwatch import __version__
from inferwatch.cli import SUBCOMMANDS, main
from support.shared import REPO, shared_path

pytestmark = pytest.mark.unit


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
    assert forced.exit_code == 3
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
    assert result.exit_code == 3
    assert result.output.startswith("Error: scrape of http://127.0.0.1:"), result.output
    assert len(result.output.splitlines()) == 1
    assert "Traceback" not in result.output


def _options(
    command: click.Command, path: tuple[str, ...] = ()
) -> Iterator[tuple[tuple[str, ...], click.Option]]:
    """Every option of every command, with the command's path below ``inferwatch``."""
    for param in command.params:
        if isinstance(param, click.Option) and param.name not in ("help", "version"):
            yield path, param
    if isinstance(command, click.Group):
        context = click.Context(command)
        for name in command.list_commands(context):
            sub = command.get_command(context, name)
            assert sub is not None
            yield from _options(sub, (*path, name))


def _twin(path: tuple[str, ...], option: click.Option) -> str:
    """The documented pattern: INFERWATCH_<COMMAND>_<OPTION>, from the long flag's name (its
    dashes and dots, as in ``--collector.gpu``, become underscores)."""
    flag = max((o for o in option.opts if o.startswith("--")), key=len).removeprefix("--")
    return "_".join(["INFERWATCH", *path, flag]).upper().replace("-", "_").replace(".", "_")


def test_every_option_has_help_text_and_a_twin_that_follows_the_pattern() -> None:
    missing_help, wrong_twin = [], []
    for path, option in _options(main):
        where = " ".join(("inferwatch", *path, option.opts[0]))
        if not (option.help or "").strip():
            missing_help.append(where)
        prefix = "_".join(("INFERWATCH", *path)).upper().replace("-", "_")
        twin = option.envvar or f"{prefix}_{(option.name or '').upper()}"
        if twin != _twin(path, option) or not option.show_envvar:
            wrong_twin.append(f"{where}: {twin}, shown {option.show_envvar}")
    assert missing_help == []
    assert wrong_twin == []


def test_the_documented_twin_is_the_one_read() -> None:
    # INFERWATCH_SIM_FAULTS, not INFERWATCH_SIM_FAULTS_FILE (the parameter's own name)
    args = ["sim", "--port", "0", "--model", "no-such-model"]  # never starts serving
    result = CliRunner().invoke(main, args, env={"INFERWATCH_SIM_FAULTS": "/no/such/faults.yaml"})
    assert result.exit_code == 2 and "/no/such/faults.yaml" in result.output


def test_gpu_forms_in_help_and_docs_agree() -> None:
    from inferwatch.exporters.sidecar_cli import sidecar

    def forms(text: str) -> set[str]:
        return set(re.findall(r"\b(?:auto|nvml|none|[a-z]+=[A-Z]+)\b", text))

    option = next(p for p in sidecar.params if p.name == "gpu")
    assert isinstance(option, click.Option)
    page = (REPO / "docs" / "sidecar.md").read_text(encoding="utf-8")
    bullet = re.search(r"^- \*\*GPU\*\* \(`--gpu`\):(.*?)(?=^- |\Z)", page, re.M | re.S)
    assert bullet, "docs/sidecar.md lists the --gpu forms"
    assert forms(option.help or "") == forms(bullet[1]) >= {"dcgm=URL", "replay=DIR"}
