"""Slow and idle clients against every server inferwatch runs, as real processes.

A client that opens connections and sends nothing, or trickles a request's head, must not pin
a server: each one closes a head that is not complete within ``--header-timeout``, and past
``--max-connections`` closes the connection idle longest. Under a low file-descriptor limit a
flood of idle connections must not make the sidecar lose its own sockets to the engine (it
then reported the engine failing and logged a restart that never happened).
"""

from __future__ import annotations

import contextlib
import json
import os
import re
import resource
import socket
import subprocess
import sys
import threading
import time
from collections.abc import Callable, Iterator, Sequence
from pathlib import Path
from urllib.parse import urlsplit

import httpx
import pytest

from inferwatch.sim.server import SimHandle, run_in_thread
from inferwatch.sim.simulator import SimConfig
from support.ports import announced_url
from support.wait import wait_for

pytestmark = pytest.mark.proc

INFERWATCH = Path(sys.executable).parent / "inferwatch"
#: the descriptor limit the flooded sidecar runs under
FD_LIMIT = 256
#: a request head left unfinished: no blank line after the headers
PARTIAL_HEAD = b"GET /healthz HTTP/1.1\r\nHost: x\r\n"


@contextlib.contextmanager
def server(
    tmp_path: Path,
    argv: Sequence[str],
    env: dict[str, str] | None = None,
    preexec: Callable[[], None] | None = None,
) -> Iterator[tuple[str, Path]]:
    """``inferwatch <argv> --listen 127.0.0.1:0``, its URL and its log, stopped afterwards."""
    log = tmp_path / f"{argv[0]}.log"
    with log.open("w") as out:
        process = subprocess.Popen(
            [str(INFERWATCH), "--log-format", "json", *argv, "--listen=127.0.0.1:0"],
            stdout=out,
            stderr=subprocess.STDOUT,
            env={**os.environ, **(env or {})},
            cwd=tmp_path,
            preexec_fn=preexec,
        )
    try:
        url = announced_url(process, log, argv[0])
        wait_for(lambda: httpx.get(f"{url}/healthz").status_code == 200, f"{argv[0]} /healthz")
        yield url, log
    finally:
        process.terminate()
        process.wait(10)


def connect(url: str) -> socket.socket:
    parts = urlsplit(url)
    sock = socket.create_connection((parts.hostname or "", parts.port or 0), timeout=10)
    sock.setblocking(False)
    return sock


def closed_by_server(sock: socket.socket) -> bool:
    """Whether the server closed the connection (EOF or reset); False while it stays open."""
    try:
        while sock.recv(65536):  # a 503 or 431 before the close is read past
            pass
    except BlockingIOError:
        return False
    except ConnectionResetError:
        return True
    return True


@pytest.fixture(scope="module")
def engine() -> Iterator[SimHandle]:
    with run_in_thread(SimConfig(port=0, speed=1000, seed=3)) as handle:
        yield handle


def sidecar_argv(engine: SimHandle, *extra: str) -> list[str]:
    return ["sidecar", f"--engine-url={engine.url}/metrics", "--gpu=none", "--engine=vllm", *extra]


def receiver_argv(tmp_path: Path, *extra: str) -> list[str]:
    return ["runbooks", "serve", f"--audit-log={tmp_path / 'audit.jsonl'}", *extra]


def _low_fd_limit() -> None:
    resource.setrlimit(resource.RLIMIT_NOFILE, (FD_LIMIT, FD_LIMIT))


def test_a_flood_of_idle_connections_under_a_low_fd_limit_leaves_the_sidecar_ready(
    tmp_path: Path, engine: SimHandle
) -> None:
    with server(tmp_path, sidecar_argv(engine), preexec=_low_fd_limit) as (url, log):
        wait_for(lambda: httpx.get(f"{url}/readyz").status_code == 200, "the sidecar ready")
        flood = [connect(url) for _ in range(300)]
        try:
            # Past its cap (half the descriptor limit) the sidecar closes the connections
            # idle longest, so at least the surplus is closed without waiting for a deadline.
            wait_for(
                lambda: sum(closed_by_server(s) for s in flood) >= 300 - FD_LIMIT // 2,
                "the sidecar to close the idle connections past its cap",
            )
            for _ in range(8):  # every answer a fresh connection, as a kubelet's probe
                with httpx.Client() as client:
                    ready = client.get(f"{url}/readyz")
                assert ready.status_code == 200, ready.text
                conditions = {c["name"]: c["ok"] for c in ready.json()["conditions"]}
                assert conditions["engine"] is True
                assert "sidecar" not in conditions
            page = httpx.get(f"{url}/metrics").text
        finally:
            for sock in flood:
                sock.close()
        events = [json.loads(line) for line in log.read_text().splitlines() if line[:1] == "{"]
        messages = [e["msg"] for e in events]
        assert not [m for m in messages if m.startswith("engine gone")]
        assert "engine scrape failed" not in messages
        assert re.search(r"^inferwatch_engine_up\{.*\} 1\.0$", page, re.M)
        assert "inferwatch_sidecar_descriptor_exhaustion_total 0.0" in page


SERVERS: dict[str, Callable[[Path, SimHandle], list[str]]] = {
    "sidecar": lambda tmp, engine: sidecar_argv(engine, "--header-timeout=1"),
    "probe": lambda tmp, engine: ["probe", "--header-timeout=1"],
    "receiver": lambda tmp, engine: receiver_argv(tmp, "--header-timeout=1"),
}
TOKEN_ENV = {
    "INFERWATCH_RUNBOOKS_TOKEN": "receiver-secret-0123456789",
    "INFERWATCH_RUNBOOKS_SIDECAR_TOKEN": "sidecar-secret-0123456789",
}


@pytest.mark.parametrize("name", sorted(SERVERS))
def test_half_open_connections_are_closed_within_the_header_deadline(
    tmp_path: Path, engine: SimHandle, name: str
) -> None:
    with server(tmp_path, SERVERS[name](tmp_path, engine), env=TOKEN_ENV) as (url, _):
        half_open = [connect(url) for _ in range(200)]
        try:
            for sock in half_open:
                sock.sendall(PARTIAL_HEAD)
            # The deadline is 1 s; the wait allows for a busy machine, never less than that.
            wait_for(
                lambda: all(closed_by_server(s) for s in half_open),
                f"{name} to close 200 unfinished request heads",
                timeout=20,
            )
            assert httpx.get(f"{url}/healthz").status_code == 200  # and it still serves
        finally:
            for sock in half_open:
                sock.close()


@pytest.mark.parametrize("name", sorted(SERVERS))
def test_a_trickled_request_head_is_cut(tmp_path: Path, engine: SimHandle, name: str) -> None:
    """Slowloris: one byte of a long header at a time, each well inside any idle timeout."""
    head = PARTIAL_HEAD + b"X-Slow: " + b"a" * 4000 + b"\r\n\r\n"
    sent = 0
    cut = threading.Event()

    def trickle(sock: socket.socket) -> None:
        nonlocal sent
        sock.setblocking(True)
        try:
            for index in range(len(head)):
                sock.sendall(head[index : index + 1])
                sent = index + 1
                time.sleep(0.005)  # the attacker's pace, not a wait for an event
        except OSError:
            cut.set()

    with server(tmp_path, SERVERS[name](tmp_path, engine), env=TOKEN_ENV) as (url, _):
        sock = connect(url)
        with sock:
            thread = threading.Thread(target=trickle, args=(sock,), daemon=True)
            thread.start()
            wait_for(cut.is_set, f"{name} to cut the trickled head", timeout=20)
            thread.join(10)
    assert sent < len(head)
