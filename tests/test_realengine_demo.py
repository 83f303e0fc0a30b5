"""``inferwatch demo --engine-url``: the whole stack in front of a real vLLM the user runs.

The demo runs as a user runs it (a subprocess, stdout on a pipe) for a short duration. The
checks are the ones the user relies on: the load reached the engine through the tenancy proxy
(the proxy's ok count for the engine's model, and vLLM's own finished-request counter rising
by at least as much), Prometheus scraped the sidecar's series labelled with the model vLLM
names on /v1/models, and the demo exits 0 having stopped every process it started (and not
the engine, which is the user's).
"""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import httpx
import pytest
from prometheus_client.parser import text_string_to_metric_families

from support.demo import Demo
from support.realengine import MODEL, Engines
from support.shared import tool
from support.wait import wait_for

pytestmark = pytest.mark.realengine

#: seconds the demo runs once up: long enough for a few scrapes and alert evaluations
DURATION_S = 25


def finished_requests(engine_url: str) -> float:
    """vLLM's own count of finished requests (every reason, every engine rank)."""
    page = httpx.get(engine_url + "/metrics", timeout=10).text
    return sum(
        sample.value
        for family in text_string_to_metric_families(page)
        if family.name == "vllm:request_success"
        for sample in family.samples
        if sample.name == "vllm:request_success_total"
    )


def query(prometheus: str, promql: str) -> float | None:
    """The sum of an instant query's values; None while it has no series."""
    response = httpx.get(prometheus + "/api/v1/query", params={"query": promql}, timeout=5)
    response.raise_for_status()
    result = response.json()["data"]["result"]
    return sum(float(series["value"][1]) for series in result) if result else None


def test_the_demo_stack_serves_a_real_vllm_and_prometheus_sees_its_model(
    engines: Engines, tmp_path: Path, haproxy_bin: str
) -> None:
    tool("prometheus")
    engine = engines.vllm()
    before = finished_requests(engine.url)
    argv = [sys.executable, "-P", "-m", "inferwatch", "demo", "--engine-url", engine.url,
            "--duration", str(DURATION_S), "--refresh", "5"]  # fmt: skip
    process = subprocess.Popen(
        argv, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, cwd=tmp_path
    )
    demo = Demo(process)
    try:
        demo.wait_line(rf"^  engine +engine-1 +{engine.url} .* model {MODEL}, max_model_len", 60)
        assert demo.up_at
        prometheus = demo.url("prometheus")
        ok = f'sum(inferwatch_tenancy_requests_total{{outcome="ok", model="{MODEL}"}})'
        proxied = wait_for(
            lambda: query(prometheus, ok), "Prometheus to count requests the proxy served", 30
        )
        sidecar = f'inferwatch_engine_up{{job="inferwatch-sidecar", model="{MODEL}"}}'
        up = wait_for(lambda: query(prometheus, sidecar), "Prometheus to scrape the sidecar", 30)
        assert up == 1.0, demo.output
        assert query(prometheus, f'inferwatch_engine_up{{model!="{MODEL}"}}') is None
        process.wait(DURATION_S + 60)
    finally:
        if process.poll() is None:
            process.kill()
            process.wait()
        demo.out.ended.wait(10)
    assert process.returncode == 0, demo.output
    # sidecar, the primary replica's two proxies, Redis, Prometheus, HAProxy, Alertmanager,
    # receiver, the advisor (which reads Prometheus); never the user's engine
    assert demo.wait_line(r"^stopped (\d+) processes", 5)[1][1] in ("7", "9"), demo.output
    assert engine.process.poll() is None
    assert finished_requests(engine.url) - before >= proxied > 0, demo.output
