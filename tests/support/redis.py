"""A real ``redis-server`` for the fleet tests: started on a free port, killed and restarted.

The server keeps an append-only file fsynced on every write in its own directory, so a
``kill -9`` loses nothing and a restart on the same port comes back with the same books, as a
production Redis with AOF does. ``scripts/install-redis`` installs Debian's package.
"""

from __future__ import annotations

import contextlib
import os
import shutil
import socket
import subprocess
import threading
import uuid
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest

from support.ports import PortTaken, in_use, pick_port, start_on_free_port
from support.restartable import Restartable
from support.shared import tool
from support.wait import wait_for

#: why a run under scripts/faketime-pytest starts no Redis
UNDER_FAKETIME = (
    "redis-server cannot run under libfaketime: Debian's links jemalloc, which reads the clock "
    "while libfaketime 0.9.10 is still initialising, and the server aborts at start; with the "
    "real clock instead it would be a year from the proxies', whose books take the window from "
    "Redis's TIME"
)


def _answers(port: int) -> bool:
    """Whether a Redis on ``port`` answers PING (one RESP round trip, no client library)."""
    try:
        with socket.create_connection(("127.0.0.1", port), timeout=1) as sock:
            sock.sendall(b"PING\r\n")
            return sock.recv(64).startswith(b"+PONG")
    except OSError:
        return False


class RedisServer(Restartable):
    """One ``redis-server`` process; :meth:`kill` (no last write: the port stops answering at
    once) and :meth:`start` keep its port and data."""

    def __init__(
        self,
        directory: Path,
        password: str = "",
        fsync: str = "always",
        extra: tuple[str, ...] = (),
        pick: Callable[[], int] = pick_port,
    ) -> None:
        binary = shutil.which("redis-server")
        if binary is None:
            pytest.skip("redis-server is not installed (scripts/install-redis)")
        if "libfaketime" in os.environ.get("LD_PRELOAD", ""):
            pytest.skip(UNDER_FAKETIME)
        self.binary = binary
        self.directory = directory
        self.password = password
        #: ``always`` loses nothing to kill -9 (the tests); ``everysec`` is production's usual
        self.fsync = fsync
        #: more arguments: a Cluster node's, for example
        self.extra = extra
        self.port = 0
        self.process: subprocess.Popen[bytes] | None = None
        directory.mkdir(parents=True, exist_ok=True)
        start_on_free_port(self._start, pick=pick)

    @property
    def url(self) -> str:
        auth = f":{self.password}@" if self.password else ""
        return f"redis://{auth}127.0.0.1:{self.port}/0"

    @property
    def address(self) -> str:
        """The URL without its password, as a proxy config names it."""
        return f"redis://127.0.0.1:{self.port}/0"

    def _argv(self, port: int) -> list[str]:
        """The server's command line; ``{port}`` in an extra argument is its port."""
        argv = [
            self.binary,
            "--port", str(port),
            "--bind", "127.0.0.1",
            "--dir", str(self.directory),
            "--save", "",
            "--appendonly", "yes",
            "--appendfsync", self.fsync,
            "--daemonize", "no",
        ]  # fmt: skip
        if self.password:
            argv += ["--requirepass", self.password]
        return argv + [arg.replace("{port}", str(port)) for arg in self.extra]

    def _start(self, port: int) -> None:
        log = self.directory / "redis.log"
        with log.open("a") as out:
            process = subprocess.Popen(self._argv(port), stdout=out, stderr=subprocess.STDOUT)

        def up() -> bool:
            if process.poll() is not None:
                text = log.read_text(encoding="utf-8", errors="replace")
                if in_use(text):
                    raise PortTaken(f"redis-server: port {port} taken")
                raise AssertionError(f"redis-server exited: {text[-2000:]}")
            return _answers(port) or (self.password != "" and self._auth_required(port))

        try:
            wait_for(up, "redis-server to answer PING", 30)
        except BaseException:
            process.kill()
            process.wait()
            raise
        self.port, self.process = port, process

    @staticmethod
    def _auth_required(port: int) -> bool:
        try:
            with socket.create_connection(("127.0.0.1", port), timeout=1) as sock:
                sock.sendall(b"PING\r\n")
                return sock.recv(64).startswith(b"-NOAUTH")
        except OSError:
            return False

    def start(self) -> None:
        """Start it again on the port it had (its data comes back from the append-only file)."""
        self._start(self.port)


@pytest.fixture
def redis_server(tmp_path: Path) -> Iterator[RedisServer]:
    """A redis-server of the test's own, stopped after it (skipped where none is installed)."""
    server = RedisServer(tmp_path / "redis")
    yield server
    server.stop()


def pick_cluster_port() -> int:
    """A free port for a Cluster node: at most 55535, its bus port (+10000) free as well."""
    while True:
        port = pick_port()
        if port > 55535:
            continue
        with socket.socket() as bus:
            try:
                bus.bind(("127.0.0.1", port + 10000))
            except OSError:
                continue
        return port


def command(server: RedisServer, *args: str | int) -> object:
    """Run one Redis command on ``server`` (what an operator or an attacker types into
    ``redis-cli``) and return its reply."""
    import redis

    client = redis.Redis.from_url(server.url)
    try:
        return client.execute_command(*args)
    finally:
        client.close()


@contextlib.contextmanager
def monitored(server: RedisServer) -> Iterator[list[str]]:
    """Every command clients send ``server`` inside the block (not those its scripts run),
    as ``MONITOR`` shows it (its arguments joined by spaces), in the list it yields,
    complete when the block ends."""
    import redis

    seen: list[str] = []
    started = threading.Event()
    end = f"inferwatch-monitor-end-{uuid.uuid4().hex}"

    def watch() -> None:
        client = redis.Redis.from_url(server.url, socket_timeout=None)
        try:
            with client.monitor() as monitor:  # MONITOR is on once entered
                started.set()
                for event in monitor.listen():
                    if end in event["command"]:
                        return
                    if event["client_type"] != "lua":
                        seen.append(event["command"])
        finally:
            client.close()

    thread = threading.Thread(target=watch, daemon=True)
    thread.start()
    assert started.wait(10), "MONITOR did not start"
    try:
        yield seen
    finally:
        command(server, "ECHO", end)
        thread.join(10)


@contextlib.contextmanager
def redis_cluster(folder: Path, password: str, size: int = 3) -> Iterator[list[RedisServer]]:
    """A real Redis Cluster of ``size`` primaries (no replicas) under ``folder``, every slot
    covered and every node agreeing so before the block starts; stopped when it ends."""
    cli = tool("redis-cli")
    node = ("--cluster-enabled", "yes", "--cluster-config-file", "nodes.conf",
            "--masterauth", password)  # fmt: skip
    nodes: list[RedisServer] = []
    try:
        for index in range(size):
            nodes.append(
                RedisServer(folder / f"node-{index}", password, extra=node, pick=pick_cluster_port)
            )
        addresses = [f"127.0.0.1:{node.port}" for node in nodes]
        subprocess.run(
            [cli, "-a", password, "--no-auth-warning", "--cluster", "create", *addresses,
             "--cluster-replicas", "0", "--cluster-yes"],
            check=True, capture_output=True, timeout=60,
        )  # fmt: skip

        def cluster_ok() -> bool:
            """Every node agrees the cluster covers every slot (each learns it by gossip)."""
            return all(
                "cluster_state:ok"
                in subprocess.run(
                    [cli, "-a", password, "--no-auth-warning", "-p", str(node.port),
                     "cluster", "info"],
                    capture_output=True, text=True, timeout=10,
                ).stdout
                for node in nodes
            )  # fmt: skip

        wait_for(cluster_ok, "the cluster to cover every slot")
        yield nodes
    finally:
        for started in nodes:
            started.stop()


def cluster_url(nodes: list[RedisServer]) -> str:
    """The proxy config's URL of a cluster, naming two of its nodes as seeds."""
    return "redis+cluster://" + ",".join(f"127.0.0.1:{node.port}" for node in nodes[:2])
