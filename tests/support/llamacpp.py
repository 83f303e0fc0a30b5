"""llama.cpp's own server for the ``realengine`` tier: ``llama-server --metrics`` on the tiny GGUF.

The same shape as ``support.realengine``: one server per set of flags, started on first use and
shared by the tests that ask for the same flags, stopped by process group at the end of the
session. llama-server binds port 0 itself and the port it got is read back from the kernel's
socket table, so no port is probed and bound later. Under CI a missing build is a failure
(``scripts/install-llamacpp`` builds it); elsewhere the tier skips and says how to build it.
"""

from __future__ import annotations

import subprocess
from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest

from support import gguf_model, tinymodel
from support.realengine import Engine, listening_port, stop
from support.shared import REPO, under_ci
from support.wait import wait_for

#: the name the server answers to (``--alias``), as vLLM's ``--served-model-name``
MODEL = "tiny"
#: loading a 3 MB model is quick; a busy machine is not
START_TIMEOUT_S = 120.0
#: the flags every server gets: the tiny model's whole context in one slot, two threads at most
BASE_FLAGS = ("--metrics", "--ctx-size", str(tinymodel.MAX_MODEL_LEN), "--parallel", "1",
              "--threads", "2", "--host", "127.0.0.1", "--port", "0")  # fmt: skip


def llama_server() -> str:
    """The cached llama-server binary, built on demand under CI."""
    installer = REPO / "scripts" / "install-llamacpp"
    if not under_ci():
        found = subprocess.run([str(installer), "--print-only"], capture_output=True, text=True)
        if found.returncode != 0:
            pytest.skip("llama.cpp's server is not built (scripts/install-llamacpp builds it)")
        return found.stdout.strip()
    done = subprocess.run([str(installer)], stdout=subprocess.PIPE, text=True)
    if done.returncode != 0:
        pytest.fail("scripts/install-llamacpp failed (its output is above)", pytrace=False)
    return done.stdout.strip()


def start(binary: str, model: Path, workdir: Path, flags: tuple[str, ...]) -> Engine:
    log = workdir / f"llama-server-{len(list(workdir.glob('llama-server-*.log')))}.log"
    command = [binary, "--model", str(model), *BASE_FLAGS, *flags]
    with log.open("wb") as out:
        process = subprocess.Popen(command, stdin=subprocess.DEVNULL, stdout=out,
                                   stderr=subprocess.STDOUT, cwd=workdir,
                                   start_new_session=True)  # fmt: skip
    engine = Engine("", process, log, flags)

    def ready() -> bool:
        if process.poll() is not None:
            pytest.fail(f"llama-server exited with {process.returncode}:\n{engine.log_tail()}")
        port = listening_port(process.pid)
        if port is None:
            return False
        engine.url = f"http://127.0.0.1:{port}"
        # 503 while the model loads, 200 once a slot can take a request
        return httpx.get(engine.url + "/health", timeout=5).status_code == 200

    try:
        wait_for(ready, f"llama-server to serve (log: {log})", START_TIMEOUT_S, interval=0.2)
    except BaseException:
        stop(engine)
        raise
    return engine


class LlamaCpp:
    """llama-server processes by flags, each started once."""

    def __init__(self, workdir: Path) -> None:
        self.workdir = workdir
        self._binary: str | None = None
        self._model: Path | None = None
        self._running: dict[tuple[str, ...], Engine] = {}

    def server(self, *flags: str) -> Engine:
        if flags not in self._running:
            if self._binary is None:
                self._binary = llama_server()
                self._model = gguf_model.write(self.workdir / "model")
            assert self._model is not None
            self._running[flags] = start(self._binary, self._model, self.workdir, flags)
        engine = self._running[flags]
        if engine.process.poll() is not None:
            pytest.fail(f"llama-server ({flags}) died:\n{engine.log_tail()}")
        return engine

    def close(self) -> None:
        for engine in self._running.values():
            stop(engine)


@pytest.fixture(scope="session")
def llamacpp(tmp_path_factory: pytest.TempPathFactory) -> Iterator[LlamaCpp]:
    running = LlamaCpp(tmp_path_factory.mktemp("llamacpp"))
    yield running
    running.close()
