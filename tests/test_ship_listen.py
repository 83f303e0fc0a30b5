"""Every server, asked for port 0, logs the address it really bound, so that whoever started it
(a test, a supervisor, a person reading the log) can reach it."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import httpx
import pytest

from support.ports import ON_PORT_0, announced_url

pytestmark = pytest.mark.proc

INFERWATCH = str(Path(sys.executable).parent / "inferwatch")


@pytest.mark.parametrize("name", sorted(ON_PORT_0))
def test_a_server_on_port_0_logs_the_port_it_bound(name: str, tmp_path: Path) -> None:
    args, path = ON_PORT_0[name]
    log = tmp_path / "server.log"
    env = {
        **os.environ,
        "INFERWATCH_RUNBOOKS_TOKEN": "listen-test-token",
        "INFERWATCH_RUNBOOKS_SIDECAR_TOKEN": "listen-test-token",
        "INFERWATCH_RUNBOOKS_SERVE_AUDIT_LOG": str(tmp_path / "audit.jsonl"),
    }
    with log.open("w") as out:
        process = subprocess.Popen(
            [INFERWATCH, "--log-format", "json", *args],
            cwd=tmp_path,
            stdout=out,
            stderr=subprocess.STDOUT,
            env=env,
        )
    try:
        url = announced_url(process, log, name)
        assert not url.endswith(":0")
        assert httpx.get(url + path, timeout=10).status_code == 200
    finally:
        process.terminate()
        process.wait(timeout=30)
