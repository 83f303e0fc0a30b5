"""The import-mapping guard.

The code folders install under ``inferwatch.*``. If a test run ever imports one of them under
its bare folder name (``import alerts``), two copies of the module and of its registries
exist at once; the guard fails the run when that happens, on whichever process ran the tests.
"""

from __future__ import annotations

import sys
from typing import Any

import pytest

BARE_NAMES = ("exporters", "probes", "dashboards", "alerts", "runbooks")
#: where an xdist worker leaves the bare modules it imported, for the controller to judge
LEAKED = "bare_modules_imported"
_LEAKED_ON_WORKERS = pytest.StashKey[set[str]]()


def pytest_sessionfinish(session: pytest.Session, exitstatus: int) -> None:
    leaked = {name for name in sys.modules if name.split(".")[0] in BARE_NAMES}
    workeroutput = getattr(session.config, "workeroutput", None)
    if workeroutput is not None:  # an xdist worker: the controller judges the run
        workeroutput[LEAKED] = sorted(leaked)
        return
    leaked |= session.config.stash.get(_LEAKED_ON_WORKERS, set())
    if leaked:
        session.exitstatus = pytest.ExitCode.TESTS_FAILED
        print(f"\nimport-mapping guard: bare top-level modules were imported: {sorted(leaked)}")


@pytest.hookimpl(optionalhook=True)
def pytest_testnodedown(node: Any, error: object) -> None:
    """An xdist worker ended: keep what the guard found there."""
    found = node.workeroutput.get(LEAKED, []) if hasattr(node, "workeroutput") else []
    node.config.stash.setdefault(_LEAKED_ON_WORKERS, set()).update(found)
