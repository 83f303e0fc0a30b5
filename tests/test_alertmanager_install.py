"""``scripts/inferwatch demo`` on a machine without Prometheus installs Debian's prometheus and
prometheus-alertmanager first; other commands never install them.

The machine is imitated with a PATH that holds only the tools the scripts need, so that
``prometheus`` and ``amtool`` are not found, and an ``apt-get`` that records its arguments.
"""

from __future__ import annotations

import os
import shutil
import subprocess
from pathlib import Path

import pytest

pytestmark = pytest.mark.proc

REPO = Path(__file__).resolve().parent.parent
TOOLS = ("bash", "dirname", "id")
RECORDED = ("apt-get", "systemctl")


@pytest.fixture
def bare_path(tmp_path: Path) -> Path:
    entry = REPO / ".venv" / "bin" / "inferwatch"
    if not entry.exists() or entry.stat().st_mtime <= (REPO / "pyproject.toml").stat().st_mtime:
        pytest.skip("needs the checkout's .venv, current with pyproject.toml (scripts/bootstrap)")
    folder = tmp_path / "bin"
    folder.mkdir()
    for tool in TOOLS:
        found = shutil.which(tool)
        assert found, tool
        (folder / tool).symlink_to(found)
    fakes = {name: f'#!/bin/bash\necho "{name} $*" >> "$CALLS"\n' for name in RECORDED}
    fakes["sudo"] = '#!/bin/bash\nexec "$@"\n'  # when the tests do not run as root
    for name, script in fakes.items():
        (folder / name).write_text(script)
        (folder / name).chmod(0o755)
    return folder


def run(
    bare_path: Path, tmp_path: Path, *args: str
) -> tuple[subprocess.CompletedProcess[str], str]:
    calls = tmp_path / "calls"
    calls.touch()
    result = subprocess.run(
        [str(REPO / "scripts" / "inferwatch"), *args],
        capture_output=True,
        text=True,
        env={**os.environ, "PATH": str(bare_path), "CALLS": str(calls)},
        timeout=60,
    )
    return result, calls.read_text()


def test_demo_installs_prometheus_and_alertmanager_when_absent(
    bare_path: Path, tmp_path: Path
) -> None:
    result, calls = run(bare_path, tmp_path, "--log-level", "info", "demo", "--help")
    assert result.returncode == 0, result.stderr
    assert "Usage: inferwatch demo" in result.stdout
    assert "installing Debian's prometheus and prometheus-alertmanager" in result.stderr
    assert "apt-get install -y -qq --no-install-recommends prometheus prometheus-alertmanager" in (
        calls
    ), calls


@pytest.mark.parametrize("args", [("sim", "--help"), ("--log-level", "demo", "--help")])
def test_other_commands_do_not_install_prometheus(
    bare_path: Path, tmp_path: Path, args: tuple[str, ...]
) -> None:
    result, calls = run(bare_path, tmp_path, *args)
    assert "prometheus" not in calls, calls
    assert "installing Debian's prometheus" not in result.stderr
