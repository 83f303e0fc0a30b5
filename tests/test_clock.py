"""The suite does not depend on today's date or on the local time zone.

A test that hard-codes a date (a token or certificate with a fixed expiry, a fixture whose
timestamps go stale) passes today and fails on the day it goes stale; code that formats local
time where UTC is meant passes wherever the machine runs in UTC. Both are caught here by
running one unit file with the wall clock a year ahead and the local zone at Pacific/Chatham
(UTC+13:45, or +12:45: the local date differs from UTC's for more than half of every day),
through ``scripts/faketime-pytest``, which does the same for any tier by hand.

The file is the unit file that leans on the wall clock the most: runbook actions compare an
alert's ``startsAt`` with the creation times the fake Kubernetes API stamps now, write RFC 3339
request times into annotations, and read them back. A date-bound test added to it fails here.
"""

from __future__ import annotations

import os
import re
import shutil
import signal
import subprocess
import sys
from datetime import UTC, datetime, timedelta
from pathlib import Path

import pytest

from support.shared import REPO, under_ci

pytestmark = pytest.mark.proc

#: the unit file run under the faked clock
CANARY = "tests/test_kube_actions.py"
ZONE = "Pacific/Chatham"
#: the run's own deadline (the file takes about 20 s on a quiet machine)
DEADLINE_S = 240


def require_faketime() -> None:
    if shutil.which("faketime"):
        return
    message = (
        "faketime is not installed: scripts/install-faketime installs Debian's "
        "(apt-get install faketime)"
    )
    if under_ci():
        pytest.fail(message, pytrace=False)
    pytest.skip(message)


def real_now() -> datetime:
    """The machine's clock, even when this run is itself under faketime."""
    unfaked = {k: v for k, v in os.environ.items() if k not in ("LD_PRELOAD", "FAKETIME")}
    seconds = subprocess.run(
        ["date", "+%s"], env=unfaked, capture_output=True, text=True, check=True, timeout=30
    ).stdout
    return datetime.fromtimestamp(int(seconds), UTC)


def faked_run(*args: str) -> tuple[int, str, str]:
    """``scripts/faketime-pytest ARGS`` a year ahead in :data:`ZONE`: (status, stdout, stderr).
    The whole process group is killed at the deadline (faketime waits for its child)."""
    env = {
        **os.environ,
        "FAKETIME_AT": "+365d",
        "FAKETIME_TZ": ZONE,
        "PYTEST": str(Path(sys.executable).parent / "pytest"),
    }
    process = subprocess.Popen(
        [str(REPO / "scripts" / "faketime-pytest"), *args],
        cwd=REPO,
        env=env,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        start_new_session=True,
    )
    try:
        out, err = process.communicate(timeout=DEADLINE_S)
    except subprocess.TimeoutExpired:
        os.killpg(process.pid, signal.SIGKILL)
        out, err = process.communicate()
        pytest.fail(f"the faked-clock run did not end within {DEADLINE_S} s:\n{out[-4000:]}")
    return process.returncode, out, err


def test_a_unit_file_passes_a_year_ahead_in_a_far_off_time_zone() -> None:
    require_faketime()
    status, out, err = faked_run("-m", "unit", "-q", CANARY)
    clock = re.search(r"wall clock at (\S+) \((\S+)\)", err)
    assert clock is not None, err
    faked = datetime.strptime(clock[1], "%Y-%m-%dT%H:%M:%S%z")
    assert faked - real_now() > timedelta(days=364), clock[0]  # faketime took effect
    assert clock[2] == ZONE and faked.utcoffset() >= timedelta(hours=12), clock[0]
    assert status == 0, f"{CANARY} fails under {clock[0]}:\n{out[-6000:]}\n{err[-2000:]}"
    assert re.search(r"\b\d+ passed\b", out) and " skipped" not in out, out[-2000:]
