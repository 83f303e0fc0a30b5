"""Shared test fixtures and the import-mapping guard.

The code folders install under ``inferwatch.*``. If a test run ever imports one of them under
its bare folder name (``import alerts``), two copies of the module and of its registries
exist at once; the guard below fails the run when that happens.
"""

from __future__ import annotations

import contextlib
import gzip
import os
import shutil
import socket
import sys
import threading
import time
from collections.abc import Callable, Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parent.parent
#: the shared folder beside the checkout: captures from public repositories and real hardware
#: (fixtures/) and research notes (reference/), read in place and never copied into the project
SHARED = REPO.parent / "shared"
BARE_NAMES = ("exporters", "probes", "dashboards", "alerts", "runbooks")
#: the proxy tests' module-scoped loop / engine / stack / proxy fixtures (a module that defines
#: its own fixture of one of these names uses its own)
pytest_plugins = ["proxy_stack"]


def pytest_sessionfinish(session: pytest.Session, exitstatus: int) -> None:
    leaked = sorted(name for name in sys.modules if name.split(".")[0] in BARE_NAMES)
    if leaked:
        session.exitstatus = pytest.ExitCode.TESTS_FAILED
        print(f"\nimport-mapping guard: bare top-level modules were imported: {leaked}")


def pytest_addoption(parser: pytest.Parser) -> None:
    parser.addoption(
        "--update-goldens",
        action="store_true",
        help="rewrite golden files from the current output instead of comparing",
    )


def _under_ci() -> bool:
    return os.environ.get("CI", "").lower() not in ("", "0", "false")


def find_tool(name: str) -> str | None:
    """An external tool on PATH, or one a test dependency installed beside the interpreter
    (kubectl comes as a wheel where the system has none)."""
    return shutil.which(name) or shutil.which(name, path=str(Path(sys.executable).parent))


def _tool(name: str) -> str:
    """Path of an external tool; skipped locally when absent, a failure under CI."""
    path = find_tool(name)
    if path:
        return path
    if _under_ci():
        pytest.fail(f"{name} is required under CI (.ci/run installs it)")
    pytest.skip(f"{name} is not installed")


def shared_path(relative: str) -> Path:
    """A file or folder of ``../shared/`` (beside the checkout), e.g. ``fixtures/engines``.

    The project keeps no copies of material taken from public repositories: tests read the
    shared captures where they are. Call this at module level or in a test: when the shared
    folder is missing the module (or test) is skipped with the reason, and under CI
    (``CI=true``) that is a failure instead.
    """
    if not (SHARED / "fixtures").is_dir():
        message = (
            f"the shared folder is missing ({SHARED / 'fixtures'} not found): it must sit "
            "beside the checkout as ../shared/"
        )
        if _under_ci():
            pytest.fail(message, pytrace=False)
        pytest.skip(message, allow_module_level=True)
    path = SHARED / relative
    if not path.exists():
        pytest.fail(f"{path} is missing from the shared folder", pytrace=False)
    return path


@pytest.fixture(scope="session")
def promtool() -> str:
    return _tool("promtool")


@pytest.fixture(scope="session")
def prometheus_bin() -> str:
    return _tool("prometheus")


@pytest.fixture(scope="session")
def amtool() -> str:
    return _tool("amtool")


@pytest.fixture(scope="session")
def alertmanager_bin() -> str:
    """Debian names the binary prometheus-alertmanager; upstream's is alertmanager."""
    return shutil.which("alertmanager") or _tool("prometheus-alertmanager")


@pytest.fixture(scope="session")
def haproxy_bin() -> str:
    return _tool("haproxy")


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


class _PageHandler(BaseHTTPRequestHandler):
    """Serves engine pages the way real and broken engines do; see ``page_server``."""

    server: _PageServer

    def log_message(self, format: str, *args: object) -> None:  # keep test output clean
        pass

    def do_GET(self) -> None:
        self.server.hits[self.path] = self.server.hits.get(self.path, 0) + 1
        mode, _, rest = self.path.strip("/").partition("/")
        if mode == "fixture":
            name = rest.removesuffix("/metrics")
            self._send(200, (SHARED / "fixtures" / "engines" / f"{name}.prom").read_bytes())
        elif mode == "page":
            self._send(200, self.server.page)
        elif mode == "slow":
            time.sleep(float(rest.split("/")[0]))
            self._send(200, self.server.page)
        elif mode == "hang":  # headers, then silence until the test ends
            self.send_response(200)
            self.send_header("Content-Type", "text/plain; version=0.0.4")
            self.send_header("Content-Length", "100000")
            self.end_headers()
            self.server.release.wait(30)
        elif mode == "html":
            self._send(200, b"<html><body>502 Bad Gateway</body></html>", "text/html")
        elif mode == "html-as-text":
            self._send(200, b"<html><body>Loading model...</body></html>\n")
        elif mode == "error":
            self._send(500, b"Internal Server Error\n")
        elif mode == "empty":
            self._send(200, b"")
        elif mode == "huge":
            self._send(200, b"# padding\n" * 200_000)
        elif mode == "gzip":
            self._send(200, gzip.compress(self.server.page), encoding="gzip")
        else:
            self._send(404, b"not found\n")

    def _send(
        self,
        status: int,
        body: bytes,
        content_type: str = "text/plain; version=0.0.4",
        encoding: str | None = None,
    ) -> None:
        self.send_response(status)
        self.send_header("Content-Type", content_type)
        self.send_header("Content-Length", str(len(body)))
        if encoding:
            self.send_header("Content-Encoding", encoding)
        self.end_headers()
        with contextlib.suppress(OSError):
            self.wfile.write(body)


class _PageServer(ThreadingHTTPServer):
    daemon_threads = True

    def __init__(self) -> None:
        super().__init__(("127.0.0.1", 0), _PageHandler)
        self.hits: dict[str, int] = {}
        self.page = b""
        self.release = threading.Event()

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.server_address[1]}"


@pytest.fixture
def page_server() -> Iterator[_PageServer]:
    """A local HTTP server standing in for an engine (the one remote thing tests lack).

    Paths: /fixture/<name>/metrics serves the shared capture engines/<name>.prom; /page/metrics
    serves ``server.page``; /slow/<seconds>/metrics, /hang/metrics, /html/metrics,
    /html-as-text/metrics, /error/metrics, /empty/metrics, /huge/metrics (2 MB), and
    /gzip/metrics (``server.page`` gzip-encoded) behave as their names say.
    """
    server = _PageServer()
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    try:
        yield server
    finally:
        server.release.set()
        server.shutdown()
        server.server_close()


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


@pytest.fixture
def new_port() -> Callable[[], int]:
    """A factory of free loopback ports, for tests that start several servers."""
    return free_port


@pytest.fixture
def unused_port() -> int:
    """A loopback port nothing listens on (for 'engine down' and for servers under test)."""
    return free_port()
