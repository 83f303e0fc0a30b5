"""The sidecar in front of the simulator: engine, GPU and quality signals together.

The readiness conditions are the local isolation path, so each fault the simulator injects
must flip /readyz on the condition that owns it, and only that one.
"""

from __future__ import annotations

import asyncio
import json
import re
from collections.abc import Iterator
from typing import Any

import httpx
import pytest
from prometheus_client.parser import text_string_to_metric_families

from inferwatch import catalog
from inferwatch.alerts import config as alert_config
from inferwatch.dashboards import writer
from inferwatch.exporters import gpu
from inferwatch.exporters.engine.collector import EngineCollector
from inferwatch.exporters.sidecar import Sidecar
from inferwatch.probes import golden
from inferwatch.probes.client import Endpoint
from inferwatch.probes.runner import ProbeRunner, Schedule, Target
from inferwatch.probes.verdict import Policy
from inferwatch.serving.page_fetch import EngineScraper
from inferwatch.sim.server import SimHandle, run_in_thread
from inferwatch.sim.simulator import SimConfig

pytestmark = pytest.mark.unit

TOKEN = "admin-secret"


@pytest.fixture
def sim() -> Iterator[SimHandle]:
    with run_in_thread(SimConfig(port=0, speed=1000, admin_token=TOKEN, seed=7)) as handle:
        yield handle


def inject(sim: SimHandle, faults: dict[str, Any]) -> None:
    response = httpx.post(
        f"{sim.url}/admin/faults", json=faults, headers={"Authorization": f"Bearer {TOKEN}"}
    )
    response.raise_for_status()


class Replica:
    """A sidecar wired to the simulator the way ``inferwatch sidecar`` wires it."""

    def __init__(self, sim: SimHandle):
        self.gpu = gpu.open_backend(f"dcgm={sim.gpu_url}")
        self.target = Target("replica-0", Endpoint(sim.url), "direct", "v1")
        self.probes = ProbeRunner(
            golden.load("default"),
            [self.target],
            schedule=Schedule(cycle_s=0.01, jitter=0.0, timeout_s=5.0),
            policy=Policy(window_cycles=2, baseline_cycles=2),
        )
        engine = EngineCollector(EngineScraper(f"{sim.url}/metrics", timeout_s=2.0), {"pod": "r0"})
        self.engine = engine
        self.sidecar = Sidecar([engine, self.gpu, self.probes], readiness_max_age=0)

    async def __aenter__(self) -> Replica:
        return self

    async def __aexit__(self, *exc_info: object) -> None:
        await self.sidecar.aclose()

    async def get(self, path: str) -> httpx.Response:
        transport = httpx.ASGITransport(app=self.sidecar.app())
        async with httpx.AsyncClient(transport=transport, base_url="http://sidecar") as client:
            return await client.get(path)

    async def conditions(self) -> dict[str, dict[str, Any]]:
        response = await self.get("/readyz")
        body = json.loads(response.text)
        assert (response.status_code == 200) == body["ready"]
        return {c["name"]: c for c in body["conditions"]}

    async def probe_cycles(self, n: int) -> None:
        for _ in range(n):
            await self.probes.run_cycle(self.target)


def metric_names(text: str) -> set[str]:
    return {s.name for f in text_string_to_metric_families(text) for s in f.samples}


def test_one_page_carries_engine_gpu_and_quality_signals(sim: SimHandle) -> None:
    async def scenario() -> set[str]:
        async with Replica(sim) as replica:
            await replica.probe_cycles(1)
            return metric_names((await replica.get("/metrics")).text)

    names = asyncio.run(scenario())
    assert "inferwatch_engine_kv_cache_usage_ratio" in names
    assert "inferwatch_gpu_power_watts" in names
    assert any(name.startswith("inferwatch_probe_") for name in names)


def test_every_gpu_series_the_gpu_board_reads_from_dcgm_is_on_the_page(sim: SimHandle) -> None:
    """The simulator's dcgm-exporter page feeds every GPU panel a dcgm-exporter can: each
    GPU series the board reads whose catalogue entry has a dcgm source is served (NVML-only
    ones, such as per-process memory, cannot be). XID counts are series only once a GPU
    reported an XID: their labels are the XID and its action."""
    board = json.dumps(writer.dashboards(alert_config.load())["gpu"])
    specs = {spec.name: spec for spec in catalog.load().values()}
    wanted = {
        name for name in re.findall(r"inferwatch_gpu_\w+", board) if "dcgm" in specs[name].sources
    }
    assert {"inferwatch_gpu_clock_event_active", "inferwatch_gpu_power_limit_watts",
            "inferwatch_gpu_temperature_threshold_celsius",
            "inferwatch_gpu_nvlink_errors_total"} <= wanted  # fmt: skip

    async def scenario() -> str:
        async with Replica(sim) as replica:
            return (await replica.get("/metrics")).text

    page = asyncio.run(scenario())
    assert sorted(wanted - metric_names(page)) == ["inferwatch_gpu_xid_errors_total"]
    assert 'threshold="slowdown"' in page


def test_wrong_answers_fail_quality_and_nothing_else(sim: SimHandle) -> None:
    async def scenario() -> tuple[dict[str, Any], dict[str, Any]]:
        async with Replica(sim) as replica:
            await replica.probe_cycles(3)
            healthy = await replica.conditions()
            inject(sim, {"degenerate": "wrong_answer"})
            await replica.probe_cycles(3)
            return healthy, await replica.conditions()

    healthy, degraded = asyncio.run(scenario())
    assert all(c["ok"] for c in healthy.values()), healthy
    assert degraded["quality"]["ok"] is False
    assert degraded["engine"]["ok"] and degraded["gpu"]["ok"]


def test_a_reset_class_xid_fails_gpu_readiness(sim: SimHandle) -> None:
    async def scenario() -> dict[str, Any]:
        async with Replica(sim) as replica:
            await replica.get("/metrics")  # the GPU backend learns the healthy state first
            inject(sim, {"gpu": [{"index": 0, "xid": 79}]})
            await replica.get("/metrics")
            return await replica.conditions()

    conditions = asyncio.run(scenario())
    assert conditions["gpu"]["ok"] is False
    assert "79" in conditions["gpu"]["reason"]


def test_engine_version_and_model_are_read_from_the_engine(sim: SimHandle) -> None:
    async def scenario() -> list[dict[str, str]]:
        async with Replica(sim) as replica:
            await replica.get("/metrics")  # learns the engine; asks its /version meanwhile
            task = replica.engine._version_task
            assert task is not None
            await task
            text = (await replica.get("/metrics")).text
        return [
            s.labels
            for f in text_string_to_metric_families(text)
            for s in f.samples
            if s.name == "inferwatch_engine_up"
        ]

    (labels,) = asyncio.run(scenario())
    assert labels["engine"] == "vllm"
    assert labels["engine_version"] == "0.33.0"
    assert labels["model"] == "meta-llama/Llama-3.1-8B-Instruct"
