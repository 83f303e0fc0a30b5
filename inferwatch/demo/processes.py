"""Child processes of the demo: started together, checked until they answer, always reaped.

Each child runs in its own session, so a Ctrl-C at the terminal reaches only the demo, which
then stops the children in order (load first, then every component at once). On Linux each
child also gets SIGTERM from the kernel if the demo itself dies without cleaning up, so a
killed demo leaves no servers behind.
"""

from __future__ import annotations

import asyncio
import contextlib
import ctypes
import ctypes.util
import json
import os
import shutil
import signal
import socket
import subprocess
import sys
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path

import httpx

from inferwatch.clikit import CannotRun

#: the PATH of an unprivileged shell often lacks /usr/sbin, where Debian installs haproxy and
#: redis-server
SEARCH_PATH = "/usr/local/sbin:/usr/sbin:/sbin"


def installed(name: str, purpose: str, package: str) -> str:
    """The path of the external binary ``name``; a one-line error naming what it is for
    (``purpose``) and how to install it (``scripts/install-PACKAGE`` or Debian's package)."""
    found = shutil.which(name, path=f"{os.environ.get('PATH', '')}:{SEARCH_PATH}")
    if found is None:
        raise CannotRun(
            f"{name} is not installed: {purpose} "
            f"(scripts/install-{package}, or the Debian package {name})"
        )
    return found


#: how a child starts the CLI: the interpreter running the demo, never the working directory's
#: ``inferwatch/`` folder (``-P``), which in a checkout would shadow the installed mapping
INFERWATCH = (sys.executable, "-P", "-m", "inferwatch", "--log-format", "json")
_PR_SET_PDEATHSIG = 1


class StartError(RuntimeError):
    """A component that did not come up; the message names it and says why."""


class PortInUse(StartError):
    """A component could not bind a port it was given: another process holds it."""


#: exit status of an inferwatch server whose listen address is taken (ExitCode.PORT_TAKEN)
_PORT_TAKEN = 4
#: how many sets of ports :func:`start_on_free_ports` tries before it gives up
ATTEMPTS = 5


@dataclass
class Component:
    """One child process and where it answers once it is up."""

    kind: str  # sim, sidecar, proxy, prometheus, redis
    name: str  # the replica (or proxy) it serves ("" for fleet-wide components)
    url: str  # http://... (answers 200 on ready_path) or redis://... (answers PING)
    ready_path: str
    argv: Sequence[str]
    env: Mapping[str, str] = field(default_factory=dict)
    process: subprocess.Popen[bytes] | None = None
    log: Path | None = None
    held_down: bool = False  # stopped by the demo itself (a crash it staged, a restart)
    #: where it writes the address it bound (the simulator); else its JSON start line says
    ready_file: Path | None = None

    @property
    def label(self) -> str:
        return f"{self.kind} {self.name}".strip()

    @property
    def pid(self) -> int:
        assert self.process is not None
        return self.process.pid

    def last_log_line(self) -> str:
        """The child's last line of output, which is usually why it stopped."""
        if self.log is None or not self.log.exists():
            return ""
        lines = self.log.read_text(encoding="utf-8", errors="replace").strip().splitlines()
        return lines[-1].strip().removeprefix("Error: ") if lines else ""

    def failure(self) -> StartError:
        """Why the exited process did not start: PortInUse when its port was taken."""
        assert self.process is not None
        text = self.log.read_text(encoding="utf-8", errors="replace") if self.log else ""
        reason = self.last_log_line() or f"exit code {self.process.returncode}"
        taken = self.process.returncode == _PORT_TAKEN or "address already in use" in text.lower()
        return (PortInUse if taken else StartError)(f"{self.label} failed to start: {reason}")

    def announcement(self) -> dict[str, str] | None:
        """The addresses it says it bound: its ready file, or the first JSON line of its log
        with a ``listen`` field (``HOST:PORT`` or a URL); None until it has said so."""
        if self.ready_file is not None:
            with contextlib.suppress(OSError, ValueError):
                return dict(json.loads(self.ready_file.read_text(encoding="utf-8")))
            return None
        text = self.log.read_text(encoding="utf-8", errors="replace") if self.log else ""
        for line in text.splitlines():
            with contextlib.suppress(ValueError):
                event = json.loads(line)
                if isinstance(event, dict) and event.get("listen"):
                    return {key: str(value) for key, value in event.items()}
        return None


def port_of(address: str) -> int:
    """The port of ``HOST:PORT`` or of a URL such as ``http://HOST:PORT``."""
    return int(address.rstrip("/").rsplit(":", 1)[1])


def _death_signal() -> Callable[[], None] | None:
    """Linux: ask the kernel to SIGTERM the child when the demo dies."""
    if not sys.platform.startswith("linux"):
        return None
    libc_name = ctypes.util.find_library("c")
    if libc_name is None:
        return None
    prctl = ctypes.CDLL(libc_name, use_errno=True).prctl

    def set_death_signal() -> None:
        prctl(_PR_SET_PDEATHSIG, signal.SIGTERM, 0, 0, 0)

    return set_death_signal


class Supervisor:
    """Starts components, waits for them to answer, notices deaths, stops them all."""

    def __init__(self, log_dir: Path) -> None:
        self.log_dir = log_dir
        self.components: list[Component] = []
        self._preexec = _death_signal()

    def start(self, component: Component) -> None:
        component.log = self.log_dir / f"{component.label.replace(' ', '-')}.log"
        self._spawn(component)
        self.components.append(component)

    def _spawn(self, component: Component) -> None:
        assert component.log is not None
        with component.log.open("ab") as log:
            component.process = subprocess.Popen(
                list(component.argv),
                stdin=subprocess.DEVNULL,
                stdout=log,
                stderr=subprocess.STDOUT,
                env={**os.environ, **component.env},
                start_new_session=True,
                preexec_fn=self._preexec,  # only prctl, and the demo starts them before threads
            )

    def discard(self, component: Component) -> None:
        """Forget a component that exited without starting (it is started again elsewhere)."""
        self.components.remove(component)

    async def announced(self, component: Component, timeout_s: float) -> dict[str, str]:
        """What a component that binds port 0 says it bound (:meth:`Component.announcement`),
        once it has; raise StartError (PortInUse) if it exits first or stays silent."""
        assert component.process is not None
        deadline = time.monotonic() + timeout_s
        while (said := component.announcement()) is None:
            if component.process.poll() is not None:
                raise component.failure()
            if time.monotonic() > deadline:
                raise StartError(
                    f"{component.label} did not say its address within {timeout_s:g} s"
                )
            await asyncio.sleep(0.05)
        return said

    async def crash(self, component: Component) -> None:
        """SIGKILL a component, as the OOM killer or a segfault would; it stays down."""
        assert component.process is not None
        component.held_down = True
        component.process.kill()
        await _terminate([component.process], grace=1.0)

    async def restart(self, component: Component, grace: float = 5.0) -> None:
        """Stop a component if it runs and start it again with the same command (a pod
        restart); returns once it is started, not once it answers."""
        assert component.process is not None
        component.held_down = True
        try:
            await _terminate([component.process], grace)
            self._spawn(component)
        finally:
            component.held_down = False

    async def wait_ready(self, http: httpx.AsyncClient, timeout_s: float) -> None:
        """Return once every component answers 200 on its ready path; raise StartError."""
        try:
            async with asyncio.TaskGroup() as group:  # the first failure cancels the others
                for component in self.components:
                    group.create_task(self.wait_answering(component, http, timeout_s))
        except* StartError as failures:
            raise failures.exceptions[0] from None

    async def wait_answering(
        self, component: Component, http: httpx.AsyncClient, timeout_s: float
    ) -> None:
        """Return once the component answers 200 on its ready path; raise StartError."""
        assert component.process is not None
        deadline = time.monotonic() + timeout_s
        probe_url = component.url + component.ready_path
        while True:
            if component.process.poll() is not None:
                raise component.failure()
            if await _answers(http, probe_url):
                return
            if time.monotonic() > deadline:
                raise StartError(
                    f"{component.label} did not answer on {probe_url} within {timeout_s:g} s"
                )
            await asyncio.sleep(0.05)

    def find(self, kind: str, name: str) -> Component:
        return next(c for c in self.components if c.kind == kind and c.name == name)

    def exited(self) -> Component | None:
        """The first component that has stopped on its own, if any."""
        for component in self.components:
            process = component.process
            if process is not None and not component.held_down and process.poll() is not None:
                return component
        return None

    async def stop_all(self, grace: float = 5.0) -> list[int]:
        """SIGTERM every child, SIGKILL what is left after ``grace`` seconds; reap all; the
        pids stopped."""
        processes = [c.process for c in self.components if c.process is not None]
        await _terminate(processes, grace)
        return [process.pid for process in processes]


async def start_on_free_ports(
    supervisor: Supervisor,
    http: httpx.AsyncClient,
    count: int,
    build: Callable[[list[int]], Component],
    fixed: list[int] | None,
    timeout_s: float,
) -> Component:
    """Start an external server (Prometheus, Alertmanager, HAProxy) whose ``count`` listen
    ports ``build`` writes into its command line, and wait until it answers.

    Such a binary cannot bind port 0 and say what it got, so its ports are picked free and
    bound only when it starts: another process may take one in between (a busy CI machine
    does). When that happens it is started again on other ports, at most :data:`ATTEMPTS`
    times. ``fixed`` ports (the user's ``--base-port``) are never replaced: a taken one is
    PortInUse at once.
    """
    tries = 1 if fixed is not None else ATTEMPTS
    while True:
        component = build(fixed if fixed is not None else _loopback_ports(count))
        supervisor.start(component)
        try:
            await supervisor.wait_answering(component, http, timeout_s)
            return component
        except PortInUse:
            supervisor.discard(component)
            tries -= 1
            if tries == 0:
                raise


async def _answers(http: httpx.AsyncClient, url: str) -> bool:
    """Whether a component answers: 200 on an HTTP URL, PONG from a ``redis://HOST:PORT/DB``
    (one RESP round trip, no client library)."""
    if not url.startswith("redis://"):
        try:
            return (await http.get(url, timeout=1.0)).status_code == 200
        except httpx.TransportError:
            return False
    host, port = url.removeprefix("redis://").split("/", 1)[0].rsplit(":", 1)
    try:
        async with asyncio.timeout(1.0):
            reader, writer = await asyncio.open_connection(host, int(port))
    except (OSError, TimeoutError):
        return False
    try:
        writer.write(b"PING\r\n")
        async with asyncio.timeout(1.0):
            return (await reader.read(64)).startswith(b"+PONG")
    except (OSError, TimeoutError):
        return False
    finally:
        writer.close()


def _loopback_ports(count: int) -> list[int]:
    """``count`` distinct loopback ports free a moment ago, for :func:`start_on_free_ports`."""
    with contextlib.ExitStack() as stack:
        sockets = [stack.enter_context(socket.socket()) for _ in range(count)]
        for sock in sockets:
            sock.bind(("127.0.0.1", 0))
        return [int(sock.getsockname()[1]) for sock in sockets]


async def _terminate(processes: Sequence[subprocess.Popen[bytes]], grace: float) -> None:
    for process in processes:
        if process.poll() is None:
            process.terminate()
    deadline = time.monotonic() + grace
    while any(p.poll() is None for p in processes) and time.monotonic() < deadline:
        await asyncio.sleep(0.05)
    for process in processes:
        if process.poll() is None:
            process.kill()
            process.wait()
