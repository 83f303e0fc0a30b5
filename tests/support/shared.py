"""The checkout, the shared captures beside it, and the external tools tests need."""

from __future__ import annotations

import os
import shutil
import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]
#: the shared folder beside the checkout: captures from public repositories and real hardware
#: (fixtures/) and research notes (reference/), read in place and never copied into the project
SHARED = REPO.parent / "shared"


def under_ci() -> bool:
    return os.environ.get("CI", "").lower() not in ("", "0", "false")


def find_tool(name: str) -> str | None:
    """An external tool on PATH, or one a test dependency installed beside the interpreter
    (kubectl comes as a wheel where the system has none)."""
    return shutil.which(name) or shutil.which(name, path=str(Path(sys.executable).parent))


def tool(name: str) -> str:
    """Path of an external tool; skipped locally when absent, a failure under CI."""
    path = find_tool(name)
    if path:
        return path
    if under_ci():
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
        if under_ci():
            pytest.fail(message, pytrace=False)
        pytest.skip(message, allow_module_level=True)
    path = SHARED / relative
    if not path.exists():
        pytest.fail(f"{path} is missing from the shared folder", pytrace=False)
    return path
