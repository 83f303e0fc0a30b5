"""Every command exits from one table: bad input 2, a missing prerequisite 3, a taken port 4.

The commands are found by walking the CLI, so a new command without a row in ``CASES``
fails ``test_every_command_has_a_case``.
"""

from __future__ import annotations

import re
import shutil
import socket
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path

import click
import pytest
from click.testing import CliRunner

from inferwatch.cli import main
from inferwatch.exitcodes import ExitCode
from support.shared import REPO

pytestmark = pytest.mark.unit

Args = Callable[[Path], list[str]]
PortArgs = Callable[[Path, int], list[str]]

BAD_ALERT_CONFIG = "latency: {thresholds: {ttft: {warning: fast}}}\n"
UNCLOSED_YAML = "tenants: [unclosed\n"
TOKEN = "s3cret-token-for-tests"


def _file(tmp: Path, name: str, text: str) -> str:
    path = tmp / name
    path.write_text(text, encoding="utf-8")
    return str(path)


def _kit_with_bad_site(tmp: Path) -> Path:
    """A new kit folder holding one unreadable site file (the shipped kit is copied in)."""
    (tmp / "kit" / "sites").mkdir(parents=True)
    _file(tmp, "kit/sites/bad.yaml", UNCLOSED_YAML)
    return tmp / "kit"


def _blocked(tmp: Path) -> str:
    """A path that cannot be created: its parent is a plain file."""
    return str(Path(_file(tmp, "plain-file", "")) / "out")


@dataclass(frozen=True)
class Case:
    bad_input: Args
    #: arguments that make a server listen on a given (taken) loopback port
    port_taken: PortArgs | None = None
    #: arguments (with which() finding no binary) under which the command cannot run
    cannot_run: Args | None = None
    #: the status of bad input: 2, except where 2 is a verdict (canary: inconclusive)
    bad_input_code: ExitCode = ExitCode.BAD_INPUT


def _alert_config(*head: str) -> Args:
    return lambda tmp: [*head, "--config", _file(tmp, "bad.yaml", BAD_ALERT_CONFIG)]


CASES: dict[str, Case] = {
    "advise": Case(
        lambda tmp: ["--prometheus", "http://127.0.0.1:1", "--model", "m", "--window", "10s"]
    ),
    "advisor": Case(
        lambda tmp: ["--prometheus", "http://127.0.0.1:1", "--model", "m", "--every", "1s"],
        port_taken=lambda tmp, port: [
            "--prometheus",
            "http://127.0.0.1:1",
            "--model",
            "m",
            "--listen",
            f"127.0.0.1:{port}",
        ],
    ),
    "canary": Case(
        lambda tmp: [
            "--prometheus",
            "http://127.0.0.1:1",
            "--baseline",
            "a=(",
            "--candidate",
            'a="b"',
        ],
        bad_input_code=ExitCode.CANNOT_RUN,
    ),
    "capacity": Case(lambda tmp: ["--gpu", "TPU"]),
    "demo": Case(
        lambda tmp: ["--scenario", str(tmp / "missing.yaml")],
        cannot_run=lambda tmp: ["--scenario", "none", "--duration", "1"],
    ),
    "drill": Case(
        lambda tmp: ["--alert-config", _file(tmp, "bad.yaml", BAD_ALERT_CONFIG)],
        cannot_run=lambda tmp: [],
    ),
    "gate": Case(
        lambda tmp: ["--baseline", "nope", "--candidate", "http://x"],
        cannot_run=lambda tmp: [
            "--baseline",
            "http://127.0.0.1:1",
            "--candidate",
            "http://127.0.0.1:1",
            "--timeout",
            "1",
        ],
    ),
    "generate alerts": Case(_alert_config(), cannot_run=lambda tmp: ["--out", _blocked(tmp)]),
    "generate slo": Case(_alert_config(), cannot_run=lambda tmp: ["--out", _blocked(tmp)]),
    "generate canary": Case(_alert_config(), cannot_run=lambda tmp: ["--out", _blocked(tmp)]),
    "generate dashboards": Case(_alert_config(), cannot_run=lambda tmp: ["--out", _blocked(tmp)]),
    "generate vmagent": Case(
        lambda tmp: ["--cluster", ""], cannot_run=lambda tmp: ["--out", _blocked(tmp)]
    ),
    "generate gateway": Case(
        lambda tmp: ["--topology", _file(tmp, "topology.yaml", "models: 3\n")],
        cannot_run=lambda tmp: ["--out", _blocked(tmp)],
    ),
    "generate k8s": Case(lambda tmp: ["--out", str(_kit_with_bad_site(tmp))]),
    "generate docs": Case(
        lambda tmp: ["--out", _file(tmp, "docs", "a file, not a folder\n")],
        cannot_run=lambda tmp: ["--out", _blocked(tmp)],
    ),
    "probe": Case(
        lambda tmp: ["--goldens", "no-such-set"],
        port_taken=lambda tmp, port: ["--listen", f"127.0.0.1:{port}"],
    ),
    "proxy": Case(
        lambda tmp: ["--config", _file(tmp, "proxy.yaml", UNCLOSED_YAML)],
        port_taken=lambda tmp, port: [
            "--listen",
            f"127.0.0.1:{port}",
            "--metrics-listen",
            "127.0.0.1:0",
        ],
    ),
    "report usage": Case(
        lambda tmp: ["--log-dir", str(tmp), "--from", "yesterday", "--to", "2026-01-01T00:00:00Z"]
    ),
    "runbooks check-config": Case(lambda tmp: [_file(tmp, "actions.yaml", UNCLOSED_YAML)]),
    "runbooks local-config": Case(lambda tmp: ["--sidecar", "no-port"]),
    "runbooks reset-breaker": Case(
        lambda tmp: [],  # no token
        cannot_run=lambda tmp: [
            "--url",
            "http://127.0.0.1:1",
            "--token-file",
            _file(tmp, "token", TOKEN),
        ],
    ),
    "runbooks serve": Case(
        lambda tmp: ["--config", _file(tmp, "actions.yaml", UNCLOSED_YAML)],
        port_taken=lambda tmp, port: [
            "--listen",
            f"127.0.0.1:{port}",
            "--token-file",
            _file(tmp, "token", TOKEN),
            "--audit-log",
            str(tmp / "audit.jsonl"),
        ],
        cannot_run=lambda tmp: [
            "--listen",
            "127.0.0.1:0",
            "--token-file",
            _file(tmp, "token", TOKEN),
            "--audit-log",
            _blocked(tmp),
        ],
    ),
    "scrape": Case(
        lambda tmp: ["not a url"], cannot_run=lambda tmp: ["http://127.0.0.1:1/metrics"]
    ),
    "node-agent": Case(
        lambda tmp: ["--listen", "nowhere", "--node", "gpu-1"],
        port_taken=lambda tmp, port: [
            "--listen",
            f"127.0.0.1:{port}",
            "--node",
            "gpu-1",
            "--token-file",
            _file(tmp, "agent-token", TOKEN),
        ],
    ),
    "sidecar": Case(
        lambda tmp: ["--engine-url", "not a url"],
        port_taken=lambda tmp, port: [
            "--listen",
            f"127.0.0.1:{port}",
            "--gpu",
            "none",
            "--engine-url",
            "http://127.0.0.1:1",
        ],
    ),
    "sim": Case(
        lambda tmp: ["--port", "0", "--faults", _file(tmp, "faults.yaml", "slow_factor: x\n")],
        port_taken=lambda tmp, port: ["--host", "127.0.0.1", "--port", str(port)],
    ),
    "snapshot": Case(
        lambda tmp: ["--dashboard", "nope", "--prometheus", "http://127.0.0.1:1"],
        cannot_run=lambda tmp: [
            "--dashboard",
            "gpu",
            "--prometheus",
            "http://127.0.0.1:1",
            "--out",
            str(tmp / "gpu.png"),
        ],
    ),
}


def _commands(command: click.Command, path: tuple[str, ...] = ()) -> Iterator[str]:
    if not isinstance(command, click.Group):
        yield " ".join(path)
        return
    context = click.Context(command)
    for name in command.list_commands(context):
        sub = command.get_command(context, name)
        assert sub is not None
        yield from _commands(sub, (*path, name))


def _invoke(name: str, args: list[str]) -> tuple[int, str]:
    env = {
        "INFERWATCH_RUNBOOKS_TOKEN": None,
        "INFERWATCH_SIDECAR_ADMIN_TOKEN": None,
        "INFERWATCH_RUNBOOKS_SIDECAR_TOKEN": TOKEN,  # the shipped config's isolate_replica
    }
    result = CliRunner().invoke(main, [*name.split(), *args], env=env)
    assert result.exception is None or isinstance(result.exception, SystemExit), result.output
    assert "Traceback" not in result.output
    return result.exit_code, result.output


def test_every_command_has_a_case() -> None:
    assert sorted(_commands(main)) == sorted(CASES)


@pytest.mark.parametrize("name", sorted(CASES))
def test_bad_input_exits_2(name: str, tmp_path: Path) -> None:
    case = CASES[name]
    code, output = _invoke(name, case.bad_input(tmp_path))
    assert code == case.bad_input_code, output
    assert output.splitlines()[-1].startswith("Error: "), output


@pytest.mark.parametrize("name", sorted(n for n, c in CASES.items() if c.port_taken))
def test_a_taken_port_exits_port_taken(name: str, tmp_path: Path) -> None:
    port_taken = CASES[name].port_taken
    assert port_taken is not None
    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        port = taken.getsockname()[1]
        code, output = _invoke(name, port_taken(tmp_path, port))
    assert code == ExitCode.PORT_TAKEN, output
    last = output.splitlines()[-1]
    assert re.fullmatch(rf"Error: cannot listen on 127\.0\.0\.1:{port}\b.*in use", last), output


@pytest.mark.parametrize("name", sorted(n for n, c in CASES.items() if c.cannot_run))
def test_a_missing_prerequisite_exits_3(
    name: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    cannot_run = CASES[name].cannot_run
    assert cannot_run is not None
    monkeypatch.setattr(shutil, "which", lambda *args, **kwargs: None)
    code, output = _invoke(name, cannot_run(tmp_path))
    assert code == ExitCode.CANNOT_RUN, output
    assert output.splitlines()[-1].startswith("Error: "), output


def test_ctrl_c_exits_interrupted(monkeypatch: pytest.MonkeyPatch) -> None:
    def interrupted(*args: object) -> None:
        raise KeyboardInterrupt

    monkeypatch.setattr("inferwatch.sim.cli.serve_forever", interrupted)
    assert _invoke("sim", ["--port", "0"])[0] == ExitCode.INTERRUPTED


def test_docs_list_the_table() -> None:
    text = (REPO / "docs" / "cli.md").read_text(encoding="utf-8")
    rows = re.findall(r"^\| (\d+) \| `(\w+)` \| (.+?) \|$", text, flags=re.MULTILINE)
    assert rows == [(str(int(code)), code.name, code.meaning) for code in ExitCode]
