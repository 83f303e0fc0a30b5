"""The wheel ships every module: pyproject's explicit package list covers every folder.

A data tree (package data declared with a recursive ``**/`` pattern, the Kubernetes kit) is one
package: its folders are not code, and new ones (an overlay per site) need no listing."""

from __future__ import annotations

import re
import tomllib
from fnmatch import fnmatch
from pathlib import Path

import pytest

pytestmark = pytest.mark.unit

REPO = Path(__file__).resolve().parent.parent
PYPROJECT = tomllib.loads((REPO / "pyproject.toml").read_text(encoding="utf-8"))
DATA_TREES = {
    package
    for package, patterns in PYPROJECT["tool"]["setuptools"]["package-data"].items()
    if any(pattern.startswith("**/") for pattern in patterns)
}


def _tree_of(package: str) -> str | None:
    return next((t for t in DATA_TREES if package == t or package.startswith(t + ".")), None)


def test_every_code_or_data_folder_is_a_listed_package() -> None:
    roots = PYPROJECT["tool"]["setuptools"]["package-dir"]
    listed = set(PYPROJECT["tool"]["setuptools"]["packages"])
    found = set()
    for dotted, folder in roots.items():
        for path in (REPO / folder).rglob("*"):
            if path.suffix in (".py", ".yaml") and "__pycache__" not in path.parts:
                relative = path.parent.relative_to(REPO / folder)
                package = ".".join([dotted, *relative.parts])
                found.add(_tree_of(package) or package)
    assert found - listed == set(), "add these to [tool.setuptools] packages"


def test_every_data_file_is_declared() -> None:
    declared = PYPROJECT["tool"]["setuptools"]["package-data"]
    roots = PYPROJECT["tool"]["setuptools"]["package-dir"]
    for dotted, folder in roots.items():
        for path in (REPO / folder).rglob("*.yaml"):
            package = ".".join([dotted, *path.parent.relative_to(REPO / folder).parts])
            tree = _tree_of(package)
            if tree is not None:  # a nested file needs a recursive pattern
                nested = len(path.relative_to(REPO / roots[tree]).parts) > 1
                assert any(
                    fnmatch(path.name, pattern.removeprefix("**/"))
                    for pattern in declared[tree]
                    if pattern.startswith("**/") or not nested
                ), f"{path.relative_to(REPO)} is not package data of {tree}"
                continue
            patterns = declared.get(package, [])
            assert any(path.match(pattern) for pattern in patterns), (
                f"{path.relative_to(REPO)} is not package data of {package}"
            )


def test_every_test_runs_under_a_timeout_backstop(request: pytest.FixtureRequest) -> None:
    extras = PYPROJECT["project"]["optional-dependencies"]["test"]
    assert any(re.match(r"pytest-timeout>=[\d.]+,<\d+$", spec) for spec in extras)
    assert float(request.config.getini("timeout")) > 0  # the plugin is loaded and configured
