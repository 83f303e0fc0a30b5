"""Real engines for the ``realengine`` tier: vLLM's CPU build serving the tiny model.

One engine process per set of flags, started on first use and shared by every test that asks
for the same flags (a start takes about a minute on two cores); all are stopped at the end of
the session, by process group, since vLLM runs its engine core and workers as children. The
engine binds port 0 and the port it got is read back from the kernel's socket table, so no
port is probed and bound later. Under CI a missing environment is a failure; elsewhere the
tier skips and says how to install it (``scripts/install-vllm``).
"""

from __future__ import annotations

import contextlib
import functools
import os
import signal
import subprocess
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path

import httpx
import pytest

from support import tinymodel
from support.shared import REPO, under_ci
from support.wait import wait_for

#: vLLM's name for the tiny model in requests and on its /metrics
MODEL = "tiny"
#: a cold start on a busy 2-core machine, with room
START_TIMEOUT_S = 420.0


@dataclass
class Engine:
    url: str
    process: subprocess.Popen[bytes]
    log: Path
    flags: tuple[str, ...]

    def log_tail(self, lines: int = 40) -> str:
        return "\n".join(self.log.read_text(errors="replace").splitlines()[-lines:])


def installed(script: str, what: str) -> str:
    """What ``scripts/<script>`` prints (the installed binary or python), installing it on
    demand under CI; elsewhere a missing install skips the test and says how to install it."""
    installer = REPO / "scripts" / script
    if not under_ci():
        found = subprocess.run([str(installer), "--print-only"], capture_output=True, text=True)
        if found.returncode != 0:
            pytest.skip(f"{what} is not installed (scripts/{script} installs it)")
        return found.stdout.strip()
    done = subprocess.run([str(installer)], stdout=subprocess.PIPE, text=True)
    if done.returncode != 0:
        pytest.fail(f"scripts/{script} failed (its output is above)", pytrace=False)
    return done.stdout.strip()


def vllm_python() -> str:
    """The python of the cached vLLM environment."""
    return installed("install-vllm", "vLLM's CPU build")


def listening_port(pid: int) -> int | None:
    """The TCP port a process listens on, from /proc: the inodes of its sockets matched
    against the kernel's table of listening sockets."""
    try:
        inodes = {
            os.readlink(f"/proc/{pid}/fd/{fd}")[8:-1]
            for fd in os.listdir(f"/proc/{pid}/fd")
            if os.readlink(f"/proc/{pid}/fd/{fd}").startswith("socket:[")
        }
    except (FileNotFoundError, ProcessLookupError, PermissionError):
        return None
    for table in ("/proc/net/tcp", "/proc/net/tcp6"):
        for line in Path(table).read_text().splitlines()[1:]:
            fields = line.split()
            if fields[3] == "0A" and fields[9] in inodes:  # 0A: LISTEN
                return int(fields[1].rsplit(":", 1)[1], 16)
    return None


def launch(
    name: str,
    command: list[str],
    workdir: Path,
    flags: tuple[str, ...],
    timeout_s: float,
    env: dict[str, str] | None = None,
) -> Engine:
    """Start an engine in its own process group with its log in ``workdir``, and wait until
    the port it bound answers ``/health`` with 200 (503 while the model loads)."""
    log = workdir / f"{name}-{len(list(workdir.glob(f'{name}-*.log')))}.log"
    with log.open("wb") as out:
        process = subprocess.Popen(command, stdin=subprocess.DEVNULL, stdout=out,
                                   stderr=subprocess.STDOUT, env=env, cwd=workdir,
                                   start_new_session=True)  # fmt: skip
    engine = Engine("", process, log, flags)

    def ready() -> bool:
        if process.poll() is not None:
            pytest.fail(f"{name} exited with {process.returncode}:\n{engine.log_tail()}")
        port = listening_port(process.pid)
        if port is None:
            return False
        engine.url = f"http://127.0.0.1:{port}"
        return httpx.get(engine.url + "/health", timeout=5).status_code == 200

    try:
        wait_for(ready, f"{name} to serve (log: {log})", timeout_s, interval=0.2)
    except BaseException:
        stop(engine)
        raise
    return engine


def start_vllm(python: str, model: Path, workdir: Path, flags: tuple[str, ...]) -> Engine:
    command = [python, "-m", "vllm.entrypoints.openai.api_server", "--model", str(model),
               "--served-model-name", MODEL, "--load-format", "dummy",
               "--max-model-len", str(tinymodel.MAX_MODEL_LEN), "--host", "127.0.0.1",
               "--port", "0", *flags]  # fmt: skip
    env = {**os.environ, "VLLM_CPU_KVCACHE_SPACE": "1", "VLLM_NO_USAGE_STATS": "1",
           "DO_NOT_TRACK": "1", "HF_HUB_OFFLINE": "1"}  # fmt: skip
    return launch("vllm", command, workdir, flags, START_TIMEOUT_S, env)


def stop(engine: Engine) -> None:
    """SIGTERM to the whole process group, SIGKILL to what is left after a grace period."""
    try:
        os.killpg(engine.process.pid, signal.SIGTERM)
    except ProcessLookupError:
        return
    with contextlib.suppress(subprocess.TimeoutExpired):
        engine.process.wait(timeout=30)

    def gone() -> bool:
        try:
            os.killpg(engine.process.pid, 0)
        except ProcessLookupError:
            return True
        return False

    with contextlib.suppress(pytest.fail.Exception):  # children may outlive the leader
        wait_for(gone, "the engine's process group to end", 10, interval=0.2)
        return
    with contextlib.suppress(ProcessLookupError):
        os.killpg(engine.process.pid, signal.SIGKILL)
    engine.process.wait(timeout=10)


class ByFlags:
    """Engine processes by flags, each started on first use and shared by every test that asks
    for the same flags; ``close`` stops them all. ``start`` is given the flags."""

    def __init__(self, what: str, start: Callable[[tuple[str, ...]], Engine]) -> None:
        self._what = what
        self._start = start
        self._running: dict[tuple[str, ...], Engine] = {}

    def get(self, flags: tuple[str, ...]) -> Engine:
        if flags not in self._running:
            self._running[flags] = self._start(flags)
        engine = self._running[flags]
        if engine.process.poll() is not None:
            pytest.fail(f"{self._what} ({flags}) died:\n{engine.log_tail()}")
        return engine

    def restart(self, engine: Engine) -> Engine:
        """Stop an engine and start it again with the same flags (a new port)."""
        stop(engine)
        del self._running[engine.flags]
        return self.get(engine.flags)

    def close(self) -> None:
        for engine in self._running.values():
            stop(engine)


class Engines(ByFlags):
    """vLLM engines by flags; the environment and the tiny model are made on first use."""

    def __init__(self, workdir: Path) -> None:
        super().__init__("vLLM", self._start_vllm)
        self.workdir = workdir

    @functools.cached_property
    def _installed(self) -> tuple[str, Path]:
        return vllm_python(), tinymodel.write(self.workdir / "tiny-llama")

    def _start_vllm(self, flags: tuple[str, ...]) -> Engine:
        python, model = self._installed
        return start_vllm(python, model, self.workdir, flags)

    def vllm(self, *flags: str) -> Engine:
        return self.get(flags)


@pytest.fixture(scope="session")
def engines(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Engines]:
    running = Engines(tmp_path_factory.mktemp("realengine"))
    yield running
    running.close()
