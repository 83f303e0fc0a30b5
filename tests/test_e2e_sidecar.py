"""End to end: the real ``inferwatch sidecar`` process scraped by a real Prometheus."""

from __future__ import annotations

import signal
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest

from inferwatch import catalog
from inferwatch.exporters.engine import adapters as engines
from inferwatch.serving import textformat
from support.ports import announced_url
from support.prometheus_process import running_prometheus
from support.shared import shared_path
from support.wait import wait_for

pytestmark = pytest.mark.e2e

FIXTURE = "vllm-generated-0.33.0-specdec-lora"
PAGE = shared_path(f"fixtures/engines/{FIXTURE}.prom")
INFERWATCH = Path(sys.executable).parent / "inferwatch"


@pytest.fixture
def sidecar_url(page_server: Any, tmp_path: Path) -> Iterator[str]:
    log_path = tmp_path / "sidecar.log"
    with log_path.open("w") as log:
        process = subprocess.Popen(
            [
                str(INFERWATCH),
                "sidecar",
                f"--engine-url={page_server.url}/fixture/{FIXTURE}/metrics",
                "--listen=127.0.0.1:0",
                "--gpu=none",
                "--model-version=v1",
            ],
            stdout=log,
            stderr=subprocess.STDOUT,
            env={"INFERWATCH_SIDECAR_POD": "replica-0", "PATH": "/usr/bin:/bin"},
        )
    try:
        url = announced_url(process, log_path, "the sidecar")
        wait_for(lambda: httpx.get(f"{url}/healthz").status_code == 200, "the sidecar")
        yield url
    finally:
        process.terminate()
        # uvicorn shuts down gracefully, then re-raises SIGTERM as its exit status
        assert process.wait(10) in (0, -signal.SIGTERM), log_path.read_text()
        assert "Traceback" not in log_path.read_text()


@pytest.fixture
def prometheus_url(prometheus_bin: str, sidecar_url: str, tmp_path: Path) -> Iterator[str]:
    scrape = (
        "  - job_name: inferwatch\n"
        f"    static_configs: [{{targets: ['{sidecar_url.removeprefix('http://')}']}}]\n"
    )
    with running_prometheus(prometheus_bin, scrape, tmp_path) as url:
        yield url


def query(prometheus_url: str, promql: str) -> list[Any]:
    response = httpx.get(f"{prometheus_url}/api/v1/query", params={"query": promql})
    response.raise_for_status()
    result: list[Any] = response.json()["data"]["result"]
    return result


def expected_signals() -> list[str]:
    """The canonical names the fixture feeds, by the unit-tested adapter (the oracle here)."""
    page = PAGE.read_bytes()
    families = engines.normalize(textformat.parse(page), "vllm", {})
    return sorted({family.name for family in families})


def test_prometheus_scrapes_every_canonical_signal(prometheus_url: str) -> None:
    wait_for(
        lambda: query(prometheus_url, "inferwatch_engine_up == 1"),
        "a successful scrape",
        ignore=(httpx.HTTPError, KeyError, IndexError),
    )
    signals = expected_signals()
    cat = catalog.load()
    assert len(signals) >= 10, signals
    missing = []
    for name in signals:
        spec = cat.by_name(name) or cat.by_name(name + "_total")
        assert spec is not None, f"{name} is not a catalogue metric"
        series = f"{spec.name}_bucket" if spec.type == "histogram" else spec.name
        result = query(prometheus_url, f'{series}{{engine="vllm",model_version="v1"}}')
        if not result:
            missing.append(series)
    assert not missing, f"no data in Prometheus for {missing}"
    up = query(prometheus_url, "inferwatch_engine_up")
    assert up[0]["metric"]["pod"] == "replica-0"
