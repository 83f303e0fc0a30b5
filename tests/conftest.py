"""Shared test fixtures, and the plugins every test module runs under."""

from __future__ import annotations

import gc
import os
import shutil
import threading
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest

from support.pages import PageServer
from support.ports import refused_port
from support.shared import tool

#: the tier markers, their guard and the per-tier time table; the xdist workers' scheduling;
#: the import-mapping guard; the proxy tests' module-scoped loop / engine / stack / proxy
#: fixtures, the fleet tests' redis_server and the runbook tests' runbook_loop / sidecars (a
#: module that defines its own fixture of one of these names uses its own)
pytest_plugins = [
    "support.tiers",
    "support.parallel",
    "support.imports",
    "support.proxy_stack",
    "support.redis",
    "support.runbooks_harness",
    "support.realengine",
    "support.llamacpp",
    "pytester",
]


def pytest_runtest_setup(item: pytest.Item) -> None:
    """Under scripts/faketime-pytest, skip a test marked ``real_clock(reason)``: one that
    compares Python's clock with a process that cannot see the faked one."""
    marker = item.get_closest_marker("real_clock")
    if marker is not None and "libfaketime" in os.environ.get("LD_PRELOAD", ""):
        pytest.skip(f"under faketime: {marker.args[0]}")


@pytest.fixture(scope="module", autouse=True)
def _leaks_reported_by_their_module() -> Iterator[None]:
    """Collect the garbage when a module's tests end: a socket or file a module leaks is
    reported then (an unclosed-resource warning is an error), as that module's, not in
    whichever later test a garbage collection happens to run."""
    yield
    gc.collect()


def pytest_addoption(parser: pytest.Parser) -> None:
    parser.addoption(
        "--update-goldens",
        action="store_true",
        help="rewrite golden files from the current output instead of comparing",
    )


@pytest.fixture
def no_external_checkers(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """An empty PATH, so a generator runs its Python checks only (promtool, amtool and
    haproxy are processes, which a unit test does not start)."""
    empty = tmp_path / "empty-path"
    empty.mkdir()
    monkeypatch.setenv("PATH", str(empty))


@pytest.fixture(scope="session")
def promtool() -> str:
    return tool("promtool")


@pytest.fixture(scope="session")
def prometheus_bin() -> str:
    return tool("prometheus")


@pytest.fixture(scope="session")
def amtool() -> str:
    return tool("amtool")


@pytest.fixture(scope="session")
def alertmanager_bin() -> str:
    """Debian names the binary prometheus-alertmanager; upstream's is alertmanager."""
    return shutil.which("alertmanager") or tool("prometheus-alertmanager")


@pytest.fixture(scope="session")
def haproxy_bin() -> str:
    return tool("haproxy")


@pytest.fixture
def golden(request: pytest.FixtureRequest) -> Callable[[Path, str], None]:
    """Compare text with a committed golden file, or rewrite it under --update-goldens."""
    update = bool(request.config.getoption("--update-goldens"))

    def check(path: Path, actual: str) -> None:
        if update or not path.exists():
            path.parent.mkdir(parents=True, exist_ok=True)
            path.write_text(actual, encoding="utf-8")
            if not update:
                pytest.fail(f"{path} did not exist; written now, review and commit it")
        assert actual == path.read_text(encoding="utf-8"), (
            f"{path} is stale; rerun with --update-goldens and review the diff"
        )

    return check


@pytest.fixture
def page_server() -> Iterator[PageServer]:
    """A local HTTP server standing in for an engine (the one remote thing tests lack).

    Paths: /fixture/<name>/metrics serves the shared capture engines/<name>.prom; /page/metrics
    serves ``server.page``; /slow/<seconds>/metrics, /hang/metrics, /html/metrics,
    /html-as-text/metrics, /error/metrics, /empty/metrics, /huge/metrics (2 MB), and
    /gzip/metrics (``server.page`` gzip-encoded) behave as their names say.
    """
    server = PageServer()
    thread = threading.Thread(target=server.serve_forever, args=(0.05,), daemon=True)
    thread.start()
    try:
        yield server
    finally:
        server.release.set()
        server.shutdown()
        server.server_close()


@pytest.fixture
def unused_port() -> Iterator[int]:
    """A loopback port nothing listens on, held for the test: connecting to it is refused."""
    with refused_port() as port:
        yield port
