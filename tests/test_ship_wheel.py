"""The wheel as a platform team installs it: built from the checkout, installed with pip into a
fresh virtual environment outside it, and run from an empty folder.

The core install stays lean (the extras hold the rest), every command a deployment needs works
from there (generators write into the current folder, the sidecar and the receiver log the
port they really bound), a command whose extra is missing stops with one line, and nothing
under site-packages changes while they run.
"""

from __future__ import annotations

import csv
import hashlib
import os
import re
import subprocess
import sys
import zipfile
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import httpx
import pytest

from inferwatch.proxy.usagelog import UsageLog
from support.ports import ON_PORT_0, announced_url
from support.shared import REPO

pytestmark = pytest.mark.proc

#: the issue's bound on a plain ``pip install inferwatch``, pip included (10^6 bytes)
LIMIT_BYTES = 90_000_000
#: what only an extra may bring (matplotlib: snapshot; rich: console; redis: redis; ...)
EXTRA_ONLY = ("matplotlib", "numpy", "PIL", "rich", "pygments", "kubernetes", "tokenizers", "redis")
TOKEN = "wheel-test-token"


@dataclass(frozen=True)
class Install:
    python: Path
    inferwatch: Path
    site: Path
    #: an empty folder outside the checkout, the commands' working directory
    work: Path


@pytest.fixture(scope="module")
def wheel(tmp_path_factory: pytest.TempPathFactory) -> Path:
    out = tmp_path_factory.mktemp("dist")
    built = subprocess.run(
        [sys.executable, "-m", "pip", "wheel", "--no-deps", "--quiet", "-w", str(out), str(REPO)],
        capture_output=True,
        text=True,
    )
    assert built.returncode == 0, built.stderr[-3000:]
    (path,) = out.glob("inferwatch-*.whl")
    return path


@pytest.fixture(scope="module")
def install(wheel: Path, tmp_path_factory: pytest.TempPathFactory) -> Install:
    root = tmp_path_factory.mktemp("fresh")
    assert REPO not in root.parents
    venv = root / "venv"
    subprocess.run([sys.executable, "-m", "venv", str(venv)], check=True)
    python = venv / "bin" / "python"
    # Python 3.11's venv also seeds setuptools (3.12's no longer does); inferwatch does not
    # need it at run time, so it leaves, and the figure is the same on every Python.
    pip = [str(python), "-m", "pip", "--disable-pip-version-check", "--quiet"]
    subprocess.run([*pip, "uninstall", "--yes", "setuptools"], check=True)
    done = subprocess.run([*pip, "install", str(wheel)], capture_output=True, text=True)
    assert done.returncode == 0, done.stderr[-3000:]
    (site,) = (venv / "lib").glob("python3*/site-packages")
    work = root / "work"
    work.mkdir()
    return Install(python, venv / "bin" / "inferwatch", site, work)


def tree_digest(folder: Path) -> str:
    digest = hashlib.sha256()
    for path in sorted(folder.rglob("*")):
        digest.update(str(path.relative_to(folder)).encode())
        if path.is_file():
            digest.update(path.read_bytes())
    return digest.hexdigest()


def site_bytes(folder: Path) -> int:
    return sum(path.lstat().st_size for path in folder.rglob("*") if path.is_file())


def run(install: Install, *args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [str(install.inferwatch), *args],
        cwd=install.work,
        capture_output=True,
        text=True,
        timeout=120,
    )


@pytest.fixture
def server(install: Install) -> Iterator[list[subprocess.Popen[bytes]]]:
    """Processes a test starts from the install, stopped at the end."""
    started: list[subprocess.Popen[bytes]] = []
    yield started
    for process in started:
        process.terminate()
        try:
            process.wait(timeout=20)
        except subprocess.TimeoutExpired:
            process.kill()
            process.wait()


def start(install: Install, started: list[subprocess.Popen[bytes]], log: Path, *args: str) -> str:
    """Start ``inferwatch --log-format json ARGS`` and return the address it logs."""
    with log.open("w") as out:
        process = subprocess.Popen(
            [str(install.inferwatch), "--log-format", "json", *args],
            cwd=install.work,
            stdout=out,
            stderr=subprocess.STDOUT,
            env={
                **os.environ,
                "INFERWATCH_RUNBOOKS_TOKEN": TOKEN,
                "INFERWATCH_RUNBOOKS_SIDECAR_TOKEN": TOKEN,
            },
        )
    started.append(process)
    return announced_url(process, log, args[0])


def test_the_wheel_holds_the_licence_the_runbook_pages_and_the_kit(wheel: Path) -> None:
    names = set(zipfile.ZipFile(wheel).namelist())
    (info,) = {name.split("/")[0] for name in names if ".dist-info/" in name}
    licence = zipfile.ZipFile(wheel).read(f"{info}/licenses/LICENSE").decode()
    assert licence == (REPO / "LICENSE").read_text(encoding="utf-8")
    assert "Apache License" in licence and "END OF TERMS AND CONDITIONS" in licence
    assert f"{info}/licenses/NOTICE" in names
    pages = {f"inferwatch/runbooks/{p.name}" for p in (REPO / "runbooks").glob("*.md")}
    assert pages and pages <= names
    kit = {
        "inferwatch/k8s/deploy/" + str(p.relative_to(REPO / "deploy" / "kubernetes"))
        for p in (REPO / "deploy" / "kubernetes").rglob("*.yaml")
    }
    assert kit and kit <= names
    assert re.fullmatch(
        r'"""[^\n]*"""\n\nCOMMIT = "[0-9a-f]{40}(-dirty)?"\n',
        zipfile.ZipFile(wheel).read("inferwatch/_build.py").decode(),
    )


def test_the_core_install_is_lean(install: Install) -> None:
    size = site_bytes(install.site)
    print(f"\nsite-packages of a fresh venv with pip and inferwatch: {size / 1e6:.1f} MB")
    installed = {path.name for path in install.site.iterdir()}
    assert sorted(set(EXTRA_ONLY) & installed) == []
    assert size <= LIMIT_BYTES, f"{size / 1e6:.1f} MB"


def test_a_command_whose_extra_is_missing_says_which_before_it_starts(install: Install) -> None:
    for command, extra in (("drill", "console,kubernetes,redis"), ("snapshot", "snapshot")):
        result = run(install, command, "--help")
        assert result.returncode == 3, result.stderr
        assert result.stderr.strip().splitlines() == [
            f"Error: inferwatch {command} needs inferwatch[{extra}], which is not installed: "
            f"pip install 'inferwatch[{extra}]'"
        ]
    listed = run(install, "--help")
    assert listed.returncode == 0, listed.stderr
    assert "Needs inferwatch[snapshot]" in listed.stdout


def test_the_deployment_commands_work_from_the_wheel_in_an_empty_folder(
    install: Install, tmp_path: Path, server: list[subprocess.Popen[bytes]]
) -> None:
    before = tree_digest(install.site)

    version = run(install, "--version")
    assert re.fullmatch(r"inferwatch \S+ \(commit [0-9a-f]{40}(-dirty)?\)\n", version.stdout)

    for command, out, expect in (
        ("alerts", "rules", "alertmanager/alertmanager.yaml"),
        ("dashboards", "boards", "fleet.json"),
        ("k8s", "kit", "overlays/single-cluster/kustomization.yaml"),
        ("k8s", "kit", "components/rules/prometheusrule.yaml"),
    ):
        result = run(install, "generate", command, "--out", out)
        assert result.returncode == 0, result.stderr
        assert (install.work / out / expect).is_file()
        assert run(install, "generate", command, "--out", out, "--check").returncode == 0
    defaulted = run(install, "generate", "alerts")
    assert defaulted.returncode == 0, defaulted.stderr
    assert (install.work / "generated" / "alerts" / "recording.yaml").is_file()

    sidecar = start(install, server, tmp_path / "sidecar.log", *ON_PORT_0["sidecar"][0])
    assert not sidecar.endswith(":0")
    assert "inferwatch_engine_up" in httpx.get(sidecar + "/metrics", timeout=10).text

    proxy = start(install, server, tmp_path / "proxy.log", *ON_PORT_0["proxy"][0])
    assert httpx.get(proxy + "/healthz", timeout=10).status_code == 200

    receiver = start(
        install,
        server,
        tmp_path / "receiver.log",
        *ON_PORT_0["runbooks serve"][0],
        "--audit-log",
        str(tmp_path / "audit.jsonl"),
    )
    page = httpx.get(receiver + "/runbooks/InferwatchEngineDown", timeout=10)
    assert page.status_code == 200 and page.headers["content-type"].startswith("text/html")
    assert "<h1>InferwatchEngineDown</h1>" in page.text
    source = httpx.get(
        receiver + "/runbooks/InferwatchEngineDown",
        headers={"accept": "text/markdown"},
        timeout=10,
    )
    assert source.text.startswith("# InferwatchEngineDown\n")

    for process in server:
        process.terminate()
        process.wait(timeout=20)
    assert tree_digest(install.site) == before, "site-packages changed while commands ran"


def test_the_usage_report_works_from_the_wheel_in_an_empty_folder(
    install: Install, tmp_path: Path
) -> None:
    """A core install totals the usage log a proxy writes (the proxy's own writer made it),
    writes the report whole to a file, and names the extra a Parquet report needs."""
    logs = tmp_path / "usage"
    log = UsageLog(str(logs))
    for tenant, prompt in (("acme", 1000), ("acme", 500), ("globex", 200)):
        log.write(
            dict(ts=1_767_225_600 + 60, tenant=tenant, model="m", model_version="v1",
                 prompt_tokens=prompt, cached_prompt_tokens=0, completion_tokens=100,
                 request_id="r", price_prompt=1.0, price_cached_prompt=0.5,
                 price_completion=2.0, busy_s=0.5)
        )  # fmt: skip
    log.flush()
    window = ["--from", "2026-01-01T00:00:00Z", "--to", "2026-01-02T00:00:00Z"]
    done = run(install, "report", "usage", "--log-dir", str(logs), *window, "--out", "usage.csv")
    assert done.returncode == 0, done.stderr
    text = (install.work / "usage.csv").read_text()
    table = csv.DictReader(line for line in text.splitlines() if not line.startswith("#"))
    rows = {row["tenant"]: row for row in table}
    assert (rows["acme"]["prompt_tokens"], rows["globex"]["prompt_tokens"]) == ("1500", "200")
    assert "# totals requests=3 " in text
    parquet = run(install, "report", "usage", "--log-dir", str(logs), *window, "--format",
                  "parquet", "--out", "usage.parquet")  # fmt: skip
    assert parquet.returncode == 3, parquet.stderr
    assert "inferwatch[parquet]" in parquet.stderr
    assert not (install.work / "usage.parquet").exists()
