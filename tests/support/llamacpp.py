"""llama.cpp's own server for the ``realengine`` tier: ``llama-server --metrics`` on the tiny GGUF.

The same shape as ``support.realengine``: one server per set of flags, started on first use and
shared by the tests that ask for the same flags, stopped by process group at the end of the
session. llama-server binds port 0 itself and the port it got is read back from the kernel's
socket table, so no port is probed and bound later. Under CI a missing build is a failure
(``scripts/install-llamacpp`` builds it); elsewhere the tier skips and says how to install it.
"""

from __future__ import annotations

import functools
from collections.abc import Iterator
from pathlib import Path

import pytest

from support import gguf_model, tinymodel
from support.realengine import ByFlags, Engine, installed, launch

#: the name the server answers to (``--alias``), as vLLM's ``--served-model-name``
MODEL = "tiny"
#: loading a 3 MB model is quick; a busy machine is not
START_TIMEOUT_S = 120.0
#: the flags every server gets: the tiny model's whole context in one slot, two threads at most
BASE_FLAGS = ("--metrics", "--ctx-size", str(tinymodel.MAX_MODEL_LEN), "--parallel", "1",
              "--threads", "2", "--host", "127.0.0.1", "--port", "0")  # fmt: skip


def start(binary: str, model: Path, workdir: Path, flags: tuple[str, ...]) -> Engine:
    command = [binary, "--model", str(model), *BASE_FLAGS, *flags]
    return launch("llama-server", command, workdir, flags, START_TIMEOUT_S)


class LlamaCpp(ByFlags):
    """llama-server processes by flags; the build and the GGUF model are made on first use."""

    def __init__(self, workdir: Path) -> None:
        super().__init__("llama-server", self._start_server)
        self.workdir = workdir

    @functools.cached_property
    def _installed(self) -> tuple[str, Path]:
        binary = installed("install-llamacpp", "llama.cpp's server")
        return binary, gguf_model.write(self.workdir / "model")

    def _start_server(self, flags: tuple[str, ...]) -> Engine:
        binary, model = self._installed
        return start(binary, model, self.workdir, flags)

    def server(self, *flags: str) -> Engine:
        return self.get(flags)


@pytest.fixture(scope="session")
def llamacpp(tmp_path_factory: pytest.TempPathFactory) -> Iterator[LlamaCpp]:
    running = LlamaCpp(tmp_path_factory.mktemp("llamacpp"))
    yield running
    running.close()
