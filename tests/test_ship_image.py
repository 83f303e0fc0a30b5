"""The container recipe, checked cheaply (the image build itself is ``scripts/build-image``,
too slow for the suite): hadolint passes with no ignore pragma, the image runs the console
script as uid 65532 from a venv, and the lock file it installs pins every core dependency
within pyproject's ranges."""

from __future__ import annotations

import json
import re
import subprocess
import tomllib
from typing import Any

import pytest
from packaging.requirements import Requirement
from packaging.utils import canonicalize_name

from support.shared import REPO, tool

pytestmark = pytest.mark.proc

DOCKERFILE = REPO / "Dockerfile"


def test_hadolint_passes_without_ignore_pragmas() -> None:
    text = DOCKERFILE.read_text(encoding="utf-8")
    assert "hadolint" not in text.lower()
    result = subprocess.run(
        [tool("hadolint"), "--format", "json", str(DOCKERFILE)], capture_output=True, text=True
    )
    assert json.loads(result.stdout or "[]") == []
    assert result.returncode == 0, result.stderr


def test_the_image_runs_the_console_script_as_65532() -> None:
    text = DOCKERFILE.read_text(encoding="utf-8")
    assert re.search(r"^ARG BASE=\S+$", text, re.M)
    assert len(re.findall(r"^FROM \$\{BASE\}", text, re.M)) == 2  # build stage, run stage
    assert re.findall(r"^USER (\S+)$", text, re.M) == ["65532:65532"]
    assert re.findall(r"^ENTRYPOINT (.+)$", text, re.M) == ['["inferwatch"]']  # no shell
    assert "--requirement requirements.lock" in text and "--no-index" in text
    for label in ("version", "revision", "source", "licenses"):
        assert f"org.opencontainers.image.{label}=" in text


def image_requirements(project: dict[str, Any]) -> list[Requirement]:
    """The core dependencies and those of the ``image`` extra, its own extras expanded."""
    extras = project["optional-dependencies"]
    found = list(map(Requirement, project["dependencies"]))
    wanted, seen = ["image"], set()
    while wanted:
        extra = wanted.pop()
        seen.add(extra)
        for requirement in map(Requirement, extras[extra]):
            if canonicalize_name(requirement.name) == "inferwatch":
                wanted += [e for e in requirement.extras if e not in seen]
            else:
                found.append(requirement)
    return found


def test_the_lock_pins_every_core_and_image_dependency_within_its_range() -> None:
    """The image carries what the kit's containers run: the receiver's and the node agent's
    Kubernetes client, the proxies' Redis client, their OpenTelemetry exporter."""
    project = tomllib.loads((REPO / "pyproject.toml").read_text(encoding="utf-8"))["project"]
    pinned = {}
    for line in (REPO / "requirements.lock").read_text(encoding="utf-8").splitlines():
        if line and not line.startswith("#"):
            name, _, version = line.partition("==")
            pinned[canonicalize_name(name)] = version
    required = image_requirements(project)
    assert {"kubernetes", "redis", "opentelemetry-sdk"} <= {
        canonicalize_name(r.name) for r in required
    }
    for dependency in required:
        name = canonicalize_name(dependency.name)
        assert name in pinned, f"{name} is not in requirements.lock (scripts/build-image --lock)"
        assert dependency.specifier.contains(pinned[name]), f"{name}=={pinned[name]}"
