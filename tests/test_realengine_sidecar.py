"""The sidecar's warm-up, start-up phases, probes and engine scrape against a real vLLM.

A relay in front of the engine stands for what the network does to the sidecar's connections:
it can drop a kept-alive connection as a request arrives on it (what uvicorn does when its
idle timer fires at that moment), and stop listening while the engine restarts on a new port,
so that the sidecar sees the engine go away and come back at the address it was given.
"""

from __future__ import annotations

import asyncio
import json
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest
from prometheus_client.parser import text_string_to_metric_families

from inferwatch.exporters.startup.warmup import Warmup, WarmupFailure, WarmupPlan
from inferwatch.probes import golden
from inferwatch.probes.client import Endpoint
from inferwatch.probes.runner import ProbeRunner, Schedule, Target
from inferwatch.serving.page_fetch import EngineScraper
from support import tinymodel
from support.realengine import MODEL, Engines
from support.relay import Relay, port_of
from support.wait import wait_for

pytestmark = pytest.mark.realengine

INFERWATCH = Path(sys.executable).parent / "inferwatch"


@pytest.fixture
def relay(engines: Engines) -> Iterator[Relay]:
    relay = Relay(port_of(engines.vllm().url))
    yield relay
    relay.close()


def families(page: str) -> dict[str, Any]:
    return {family.name: family for family in text_string_to_metric_families(page)}


def engine_successes(url: str) -> float:
    page = httpx.get(url + "/metrics", timeout=30).text
    samples = families(page)["vllm:request_success"].samples
    return sum(s.value for s in samples if s.name.endswith("_total"))


def test_warmup_fits_the_models_context_and_says_the_engines_refusal(engines: Engines) -> None:
    engine = engines.vllm()
    plan = WarmupPlan(batch_sizes=(1,))  # the default lengths: 16 and 1024 words
    assert max(plan.prompt_tokens) >= tinymodel.MAX_MODEL_LEN

    async def rounds() -> tuple[Warmup, WarmupFailure]:
        fitted = Warmup(plan, engine.url, None)
        wrong = Warmup(plan, engine.url, "no-such-model")
        try:
            await fitted.round()
            with pytest.raises(WarmupFailure) as refused:
                await wrong.round()
            return fitted, refused.value
        finally:
            await fitted.aclose()
            await wrong.aclose()

    warmup, refused = asyncio.run(rounds())
    assert warmup.outcomes == {"ok": 2} and warmup.context == tinymodel.MAX_MODEL_LEN
    # the long prompt was fitted to the context (its answer included), not cut to nothing
    assert warmup.tokens["prompt"] > tinymodel.MAX_MODEL_LEN / 2
    assert "HTTP 404" in refused.detail and "no-such-model" in refused.detail
    assert len(refused.detail) < 400


def test_probes_carry_the_deployments_version_and_skip_what_the_engine_cannot_run(
    engines: Engines, tmp_path: Path
) -> None:
    engine = engines.vllm()
    goldens = tmp_path / "goldens.yaml"
    goldens.write_text(
        "name: real\n"
        "probes:\n"
        "  - {id: plain, prompt: What is 17 + 25? Reply with the number only., answer: '42',"
        " check: numeric, max_tokens: 4}\n"
        "  - id: tool\n"
        "    prompt: What is the weather in Paris? Use the get_weather tool.\n"
        "    tools: [{type: function, function: {name: get_weather, parameters:"
        " {type: object, properties: {city: {type: string}}, required: [city]}}}]\n"
        "    tool_call: {name: get_weather, arguments: {city: Paris}}\n"
        "    max_tokens: 8\n"
        "    check: {tool_call: {match: [city]}}\n"
        f"  - {{id: long, prompt: '{'hello ' * 1100}', answer: 'x', check: contains,"
        " max_tokens: 4}\n"
    )
    target = Target("replica", Endpoint(engine.url, MODEL))
    runner = ProbeRunner(golden.load(str(goldens)), [target], schedule=Schedule(0, 0, 60))
    before = engine_successes(engine.url)

    async def cycle() -> None:
        try:
            await runner.run_cycle(target)
        finally:
            await runner.aclose()

    asyncio.run(cycle())
    runs = runner.metrics.runs
    # the version is the deployment's (none given: unknown), never vLLM's system_fingerprint
    assert {labels[3] for labels in runs} == {"unknown"}, runs
    assert {labels[5] for labels in runs} == {"plain"}
    assert runner.metrics.refused == {
        ("replica", "tool"): "tool_calling_off",
        ("replica", "long"): "context_too_short",
    }
    assert runner.verdicts.golden_ids == {"plain"}
    # what the start-up tracker subtracts as the sidecar's own is what the engine counted
    assert engine_successes(engine.url) - before == sum(runs.values())
    page = "".join(f.name for f in runner.families() if f.samples)
    assert "inferwatch_probe_not_applicable" in page


def test_a_dropped_keepalive_connection_is_no_engine_down(relay: Relay) -> None:
    relay.drop_reused = True

    async def scrapes() -> None:
        scraper = EngineScraper(relay.url + "/metrics", timeout_s=30)
        try:
            for _ in range(3):
                page = await scraper.fetch()
                assert b"vllm:" in page.body
        finally:
            await scraper.aclose()

    asyncio.run(scrapes())
    assert relay.dropped >= 2  # each reused connection was dropped, and each GET went again


def sidecar_port(log: Path) -> int | None:
    for line in log.read_text().splitlines():
        if line.startswith("{") and json.loads(line).get("msg") == "sidecar starting":
            return int(json.loads(line)["listen"].rsplit(":", 1)[1])
    return None


def scrape(url: str) -> dict[str, Any]:
    return families(httpx.get(url + "/metrics", timeout=30).text)


def value(found: dict[str, Any], name: str, **labels: str) -> float | None:
    for family in found.values():
        for sample in family.samples:
            if sample.name == name and labels.items() <= sample.labels.items():
                return float(sample.value)
    return None


def phase(url: str) -> str:
    found = scrape(url)["inferwatch_replica_startup_phase"]
    return next(s.labels["phase"] for s in found.samples if s.value == 1)


def test_sidecar_on_a_cpu_replica_through_an_engine_restart(
    engines: Engines, relay: Relay, tmp_path: Path
) -> None:
    log = tmp_path / "sidecar.log"
    command = [str(INFERWATCH), "sidecar", f"--engine-url={relay.url}", "--listen=127.0.0.1:0",
               "--gpu=none", "--warmup-batch-sizes=1", "--warmup-deadline=300"]  # fmt: skip
    with log.open("w") as out:
        process = subprocess.Popen(command, stdout=out, stderr=subprocess.STDOUT)
    try:
        port = wait_for(lambda: sidecar_port(log), "the sidecar's start line")
        url = f"http://127.0.0.1:{port}"
        ready = wait_for(
            lambda: httpx.get(url + "/readyz").status_code == 200, "warm-up to pass", 300
        )
        assert ready, log.read_text()
        found = scrape(url)
        # no GPU configured: no GPU backend series, so InferwatchGPUTelemetryDown cannot fire
        assert not any(name.startswith("inferwatch_gpu_") for name in found), sorted(found)
        prompt = "inferwatch_engine_prompt_tokens_total"
        before = value(found, prompt)
        assert before is not None and before > 0

        relay.pause()
        went = time.time()
        wait_for(lambda: phase(url) == "process_start", "the sidecar to see the engine go", 60)
        wait_for(lambda: value(scrape(url), "inferwatch_engine_up") == 0, "engine_up 0", 30)
        engine = engines.restart(engines.vllm())
        relay.resume(port_of(engine.url))
        wait_for(lambda: httpx.get(url + "/readyz").status_code == 200, "the engine back", 300)
        found = scrape(url)
        assert value(found, "inferwatch_engine_up") == 1
        stamps = "inferwatch_replica_startup_phase_timestamp_seconds"
        for name in ("process_start", "engine_reachable", "engine_healthy", "warmup_done"):
            at = value(found, stamps, phase=name)
            assert at is not None and at >= went, (name, at, went)
        after = value(found, prompt)
        assert after is not None and after > before  # monotonic: the new warm-up adds on
    finally:
        process.terminate()
        process.wait(30)
    assert "Traceback" not in log.read_text()
