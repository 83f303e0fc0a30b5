"""Ports for servers that tests start, with no window between picking a port and binding it.

Our own servers bind ``127.0.0.1:0`` themselves and log the address they got
(:func:`announced_url`). External binaries (Prometheus, Alertmanager, HAProxy) take a port only on
their command line, so a port is picked for them and, when another process took it before they
bound it, they are started again on another (:func:`start_on_free_port`).
"""

from __future__ import annotations

import contextlib
import json
import os
import socket
import subprocess
from collections.abc import Callable, Iterator, Sequence
from pathlib import Path
from typing import TypeVar

import httpx

from support.wait import wait_for

T = TypeVar("T")

#: how many ports :func:`start_on_free_port` tries before it gives up
ATTEMPTS = 5


class PortTaken(Exception):
    """A server could not bind the port it was given: another process holds it."""


def in_use(log_text: str) -> bool:
    """Whether a server's log says its port was taken (Go's, HAProxy's and Python's wording)."""
    return "address already in use" in log_text.lower()


def pick_port() -> int:
    """A port that was free a moment ago: only for a start that is retried on another one
    when it was taken (:func:`start_on_free_port`, :func:`launch`)."""
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


#: Linux's ip_local_port_range: where the kernel picks a port for a bind to port 0
LOCAL_PORT_RANGE = Path("/proc/sys/net/ipv4/ip_local_port_range")


def fixed_run(count: int) -> int:
    """The first of ``count`` consecutive loopback ports, all free now, for a program that
    takes fixed ports (the demo's ``--base-port``, with a Prometheus configured for them).

    The run lies below the ports the kernel hands to binds on port 0, which is how every other
    server a test starts binds, so no test on the other worker can take one of them between
    now and the program's own binds (a run inside that range lost such races)."""
    try:
        floor = int(LOCAL_PORT_RANGE.read_text().split()[0])
    except (OSError, ValueError, IndexError):
        floor = 32768
    bases = list(range(10000, floor - count, count))
    start = os.getpid() % len(bases)  # concurrent runs of the suite start apart
    for base in bases[start:] + bases[:start]:
        with contextlib.ExitStack() as held:
            try:
                for port in range(base, base + count):
                    held.enter_context(socket.socket()).bind(("127.0.0.1", port))
            except OSError:
                continue
            return base
    raise RuntimeError(f"no {count} consecutive free ports below {floor}")


def start_on_free_port(
    start: Callable[[int], T], attempts: int = ATTEMPTS, pick: Callable[[], int] = pick_port
) -> T:
    """``start(port)`` on a picked port, again on another one each time it raises
    :class:`PortTaken`, at most ``attempts`` times: a picked port can be taken by another
    process before the server binds it, which a CI machine running many tests does see."""
    tried = []
    for _ in range(attempts):
        port = pick()
        try:
            return start(port)
        except PortTaken:
            tried.append(port)
    raise PortTaken(f"every port tried was taken before it was bound: {tried}")


def launch(
    argv: Callable[[int], Sequence[str]],
    log: Path,
    ready_path: str,
    what: str,
    timeout: float = 30.0,
) -> tuple[subprocess.Popen[bytes], str]:
    """Start an external server whose port is ``argv(port)``'s, on a free port (another one
    when it was taken), and wait until it answers 200 on ``ready_path`` (at most ``timeout``
    seconds: one that loads a large database is given longer); (process, its URL)."""

    def start(port: int) -> tuple[subprocess.Popen[bytes], str]:
        with log.open("w") as out:
            process = subprocess.Popen(list(argv(port)), stdout=out, stderr=subprocess.STDOUT)
        url = f"http://127.0.0.1:{port}"

        def answering() -> bool:
            if process.poll() is not None:
                text = log.read_text(encoding="utf-8", errors="replace")
                if in_use(text):
                    raise PortTaken(f"{what}: port {port} taken")
                raise AssertionError(f"{what} exited: {text[-2000:]}")
            return httpx.get(url + ready_path, timeout=5).status_code == 200

        try:
            wait_for(answering, what, timeout)
        except BaseException:
            process.kill()
            process.wait()
            raise
        return process, url

    return start_on_free_port(start)


@contextlib.contextmanager
def running(
    argv: Callable[[int], Sequence[str]], log: Path, ready_path: str, what: str
) -> Iterator[str]:
    """:func:`launch` for the length of a ``with``: yields the URL, then SIGTERM and a wait."""
    process, url = launch(argv, log, ready_path, what)
    try:
        yield url
    finally:
        process.terminate()
        process.wait(10)


#: an engine URL nothing listens on: our servers start without their engine
NO_ENGINE = "http://127.0.0.1:9"
#: each of our servers asked for port 0 with no engine behind it (``inferwatch`` ARGS), and a
#: path it answers 200 on: the listen tests start them from the checkout and from the wheel
ON_PORT_0: dict[str, tuple[list[str], str]] = {
    "sidecar": (["sidecar", "--listen", "127.0.0.1:0", "--engine-url", NO_ENGINE], "/metrics"),
    "proxy": (
        [
            "proxy",
            "--listen",
            "127.0.0.1:0",
            "--metrics-listen",
            "127.0.0.1:0",
            "--upstream",
            NO_ENGINE,
        ],
        "/healthz",
    ),
    "probe": (["probe", "--listen", "127.0.0.1:0", "--target", NO_ENGINE], "/healthz"),
    "runbooks serve": (["runbooks", "serve", "--listen", "127.0.0.1:0"], "/healthz"),
    "sim": (["sim", "--port", "0"], "/metrics"),
}


def announced_url(process: subprocess.Popen[bytes], log: Path, what: str) -> str:
    """The ``listen`` URL an inferwatch server logs once it has bound (``--listen HOST:0``
    gets a port from the OS); fails with the log's last line if the server exits first."""

    def logged() -> str | None:
        text = log.read_text(encoding="utf-8", errors="replace") if log.exists() else ""
        for line in text.splitlines():
            with contextlib.suppress(ValueError):
                event = json.loads(line)
                if isinstance(event, dict) and event.get("listen"):
                    address = str(event["listen"])  # HOST:PORT as bound
                    return address if address.startswith("http") else f"http://{address}"
        if process.poll() is not None:
            last = text.strip().splitlines()[-1:] or [f"exit code {process.returncode}"]
            raise AssertionError(f"{what} exited before it listened: {last[0]}")
        return None

    return wait_for(logged, f"{what} to log its address")


@contextlib.contextmanager
def refused_port() -> Iterator[int]:
    """A loopback port bound but not listening while the block runs: connecting to it is
    refused, and no other process can start listening on it meanwhile."""
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        yield int(sock.getsockname()[1])
