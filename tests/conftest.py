"""Shared test fixtures and the import-mapping guard.

The code folders install under ``inferwatch.*``. If a test run ever imports one of them under
its bare folder name (``import alerts``), two copies of the module and of its registries
exist at once; the guard below fails the run when that happens.
"""

from __future__ import annotations

import os
import shutil
import sys
from collections.abc import Callable
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parent.parent
FIXTURES = Path(__file__).resolve().parent / "fixtures"
BARE_NAMES = ("exporters", "probes", "dashboards", "alerts", "runbooks")


def pytest_sessionfinish(session: pytest.Session, exitstatus: int) -> None:
    leaked = sorted(
        name for name in sys.modules if name.split(".")[0] in BARE_NAMES
    )
    if leaked:
        session.exitstatus = pytest.ExitCode.TESTS_FAILED
        print(f"\nimport-mapping guard: bare top-level modules were imported: {leaked}")


def pytest_addoption(parser: pytest.Parser) -> None:
    parser.addoption(
        "--update-goldens",
        action="store_true",
        help="rewrite golden files from the current output instead of comparing",
    )


def _tool(name: str) -> str:
    """Path of an external tool; skipped locally when absent, a failure under CI."""
    path = shutil.which(name)
    if path:
        return path
    if os.environ.get("CI"):
        pytest.fail(f"{name} is required under CI (.ci/run installs it)")
    pytest.skip(f"{name} is not installed")


@pytest.fixture(scope="session")
def promtool() -> str:
    return _tool("promtool")


@pytest.fixture(scope="session")
def prometheus_bin() -> str:
    return _tool("prometheus")


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
