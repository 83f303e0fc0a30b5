"""Captures stay where they came from: tests read ../shared/ in place and keep no copies."""

from __future__ import annotations

import hashlib
from pathlib import Path

import pytest

import support.shared
from support.shared import REPO, SHARED, shared_path

pytestmark = pytest.mark.unit


def digests(folder: Path) -> dict[str, Path]:
    return {
        hashlib.sha256(path.read_bytes()).hexdigest(): path
        for path in folder.rglob("*")
        if path.is_file() and path.stat().st_size > 0
    }


def test_the_project_carries_no_copy_of_a_shared_file() -> None:
    shared = digests(shared_path("fixtures")) | digests(shared_path("reference"))
    copies = {
        str(path.relative_to(REPO)): str(shared[digest].relative_to(SHARED))
        for digest, path in digests(REPO / "tests").items()
        if digest in shared
    }
    assert copies == {}


def test_a_missing_shared_folder_skips_with_the_reason_and_fails_under_ci(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(support.shared, "SHARED", tmp_path / "shared")
    monkeypatch.delenv("CI", raising=False)
    with pytest.raises(pytest.skip.Exception, match=r"shared folder is missing .*\.\./shared/"):
        shared_path("fixtures/engines")
    monkeypatch.setenv("CI", "true")
    with pytest.raises(pytest.fail.Exception, match=r"shared folder is missing"):
        shared_path("fixtures/engines")


def test_a_missing_capture_is_a_failure_naming_it() -> None:
    with pytest.raises(pytest.fail.Exception, match=r"no-such-capture\.prom"):
        shared_path("fixtures/engines/no-such-capture.prom")
