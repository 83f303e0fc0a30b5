"""The fleet's shared books under hostile conditions, against a real redis-server: one
tenant's damaged keys, fail-open with proxies that never saw the tenant, a burst against
a tokens-per-minute limit, a planted journal, and a core install without redis-py."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

from inferwatch.exitcodes import ExitCode

pytestmark = pytest.mark.proc


def test_a_core_install_with_shared_state_says_it_needs_the_redis_extra(tmp_path: Path) -> None:
    """Without redis-py (the core install, simulated by blocking its import) a config with
    ``shared_state`` is one line and exit 3, never a traceback."""
    path = tmp_path / "proxy.yaml"
    path.write_text(json.dumps({"shared_state": {"url": "redis://127.0.0.1:1/0"}}))
    core = "import sys; sys.modules['redis'] = None; from inferwatch.cli import main; main()"
    result = subprocess.run(
        [sys.executable, "-c", core, "proxy", "--config", str(path), "--listen", "127.0.0.1:0"],
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )
    assert result.returncode == ExitCode.CANNOT_RUN, result.stderr
    assert result.stderr.splitlines() == [
        "Error: inferwatch proxy with shared_state needs inferwatch[redis], which is not "
        "installed: pip install 'inferwatch[redis]'"
    ]
