"""End to end: labels that join, as a real Prometheus stores them.

Two real sidecar processes are scraped the way a PodMonitor scrapes them (target labels
``namespace`` and ``pod``, ``honor_labels: false``): the one that runs "in Kubernetes" leaves
those labels to the target and they arrive as given, while one told to emit them shows the
collision the convention avoids (``exported_pod``). An unknown model version is stored as
``unknown``.
"""

from __future__ import annotations

import signal
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest

from support.ports import announced_url
from support.prometheus_process import running_prometheus
from support.shared import shared_path
from support.wait import wait_for

pytestmark = pytest.mark.e2e

INFERWATCH = Path(sys.executable).parent / "inferwatch"
PAGE = shared_path("fixtures/engines/vllm-generated-0.33.0-1engine.prom")


@pytest.fixture
def sidecars(page_server: Any, tmp_path: Path) -> Iterator[dict[str, str]]:
    """``in-kubernetes`` (auto: labels left to discovery) and ``emitting`` sidecars."""
    if not PAGE.exists():
        pytest.skip(f"shared fixture {PAGE} not found")
    page_server.page = PAGE.read_bytes()
    started: list[tuple[subprocess.Popen[bytes], Path]] = []
    addresses = {}
    kinds: list[tuple[str, dict[str, str], list[str]]] = [
        ("in-kubernetes", {"KUBERNETES_SERVICE_HOST": "10.96.0.1"}, []),
        ("emitting", {}, ["--pod-labels=emit"]),
    ]
    for name, extra_env, flags in kinds:
        log = tmp_path / f"{name}.log"
        with log.open("w") as out:
            process = subprocess.Popen(
                [
                    str(INFERWATCH),
                    "sidecar",
                    f"--engine-url={page_server.url}/page/metrics",
                    "--listen=127.0.0.1:0",
                    "--gpu=none",
                    f"--pod={name}-0",
                    "--namespace=serving",
                    *flags,
                ],
                stdout=out,
                stderr=subprocess.STDOUT,
                env={"PATH": "/usr/bin:/bin", **extra_env},
            )
        started.append((process, log))
    try:
        for (name, _, _), (process, log) in zip(kinds, started, strict=True):
            addresses[name] = announced_url(process, log, name).removeprefix("http://")
        for address in addresses.values():
            wait_for(lambda a=address: httpx.get(f"http://{a}/healthz").status_code == 200, address)
        yield addresses
    finally:
        for process, log in started:
            process.terminate()
            assert process.wait(10) in (0, -signal.SIGTERM), log.read_text()


@pytest.fixture
def prometheus(prometheus_bin: str, sidecars: dict[str, str], tmp_path: Path) -> Iterator[str]:
    targets = "".join(
        f"      - {{targets: ['{address}'], labels: {{pod: {name}-0, namespace: serving}}}}\n"
        for name, address in sidecars.items()
    )
    scrape = f"  - job_name: podmonitor\n    honor_labels: false\n    static_configs:\n{targets}"
    with running_prometheus(prometheus_bin, scrape, tmp_path) as url:
        yield url


def series(prometheus: str, promql: str) -> list[dict[str, str]]:
    response = httpx.get(f"{prometheus}/api/v1/query", params={"query": promql})
    response.raise_for_status()
    return [item["metric"] for item in response.json()["data"]["result"]]


def test_target_labels_arrive_as_given_and_unknown_versions_are_spelled_out(
    prometheus: str,
) -> None:
    found = wait_for(
        lambda: (
            len(series(prometheus, "inferwatch_engine_up == 1")) == 2
            and series(prometheus, "inferwatch_engine_up")
        ),
        "both sidecars scraped",
    )
    by_target = {labels["pod"]: labels for labels in found}
    in_kubernetes = by_target["in-kubernetes-0"]
    assert "exported_pod" not in in_kubernetes and "exported_namespace" not in in_kubernetes
    assert in_kubernetes["namespace"] == "serving"
    assert in_kubernetes["model_version"] == "unknown"  # no --model-version given
    emitting = by_target["emitting-0"]
    assert emitting["exported_pod"] == "emitting-0"  # what the convention avoids
    rows = series(prometheus, 'inferwatch_engine_requests_running{pod="in-kubernetes-0"}')
    assert rows and all("exported_pod" not in labels for labels in rows)
