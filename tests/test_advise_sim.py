"""End to end: advice computed from a poorly set simulated replica's Prometheus data, applied,
meets the TTFT SLO the poor settings miss, by the same recorded SLO error ratio.

Each phase is one simulated vLLM replica (Llama 3.1 8B on an H100) behind a real sidecar,
scraped by a real Prometheus that evaluates the generated recording rules, under the same
fixed Poisson load; a phase's Prometheus starts empty, so its ratio is its own settings'.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import subprocess
import sys
import threading
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest

from inferwatch.demo.loadgen import LoadGenerator
from inferwatch.demo.topology import Tenant
from support.ports import announced_url
from support.prometheus_process import running_prometheus
from support.shared import REPO
from support.wait import wait_for

pytestmark = [pytest.mark.e2e, pytest.mark.long]

INFERWATCH = Path(sys.executable).parent / "inferwatch"
MODEL = "meta-llama/Llama-3.1-8B-Instruct"
RULES = REPO / "alerts" / "generated" / "recording.yaml"
#: requests a second: about twice what two sequences at a time serve
RATE = 4.0
TENANT = Tenant("acme", "sk-acme", "primary", 1.0, (20, 40), (100, 140))
SLO_TTFT = 2.5  # the generated rules' TTFT threshold (inferwatch/mixin/config.yaml)
BUDGET = 0.01  # 1 - the TTFT objective 0.99
RATIO = "model_version:inferwatch_engine_time_to_first_token_seconds:slo_error_ratio_rate5m"
COUNTED = "sum(increase(inferwatch_engine_time_to_first_token_seconds_count[5m]))"


def _process(
    argv: list[str], log: Path, env: dict[str, str] | None = None
) -> subprocess.Popen[bytes]:
    with log.open("w") as out:
        return subprocess.Popen(argv, stdout=out, stderr=subprocess.STDOUT, env=env)


def _stop(process: subprocess.Popen[bytes]) -> None:
    process.terminate()
    try:
        process.wait(10)
    except subprocess.TimeoutExpired:
        process.kill()
        process.wait()


@contextlib.contextmanager
def _load(url: str) -> Iterator[LoadGenerator]:
    """The fixed load, sent from its own thread's event loop for the length of a ``with``."""
    loop = asyncio.new_event_loop()
    stop = asyncio.Event()
    generator: list[LoadGenerator] = []

    async def send() -> None:
        async with httpx.AsyncClient(timeout=120) as client:
            generator.append(LoadGenerator(client, url, {"primary": MODEL}, [TENANT], RATE, 7))
            task = asyncio.create_task(generator[0].run())
            await stop.wait()
            task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await task

    thread = threading.Thread(target=loop.run_until_complete, args=(send(),), daemon=True)
    thread.start()
    try:
        yield wait_for(lambda: generator and generator[0], "the load to start", 10)
    finally:
        loop.call_soon_threadsafe(stop.set)
        thread.join(30)
        loop.close()


@contextlib.contextmanager
def replica(prometheus_bin: str, workdir: Path, *flags: str) -> Iterator[str]:
    """A simulated replica with ``flags``, its sidecar and a Prometheus under the load;
    yields the Prometheus URL."""
    workdir.mkdir()
    ready = workdir / "sim.json"
    sim = _process(
        [str(INFERWATCH), "sim", "--port", "0", "--gpu-port", "0", "--ready-file", str(ready),
         "--model", MODEL, "--gpu", "H100", *flags],
        workdir / "sim.log",
    )  # fmt: skip
    processes = [sim]
    try:
        urls = wait_for(
            lambda: ready.exists() and json.loads(ready.read_text()), "the simulator", 60
        )
        sidecar_log = workdir / "sidecar.log"
        processes.append(
            _process(
                [str(INFERWATCH), "sidecar", f"--engine-url={urls['url']}",
                 f"--gpu=dcgm={urls['gpu_url']}", "--listen=127.0.0.1:0", "--model-version=v1"],
                sidecar_log,
                env={"INFERWATCH_SIDECAR_POD": "replica-0", "PATH": "/usr/bin:/bin"},
            )
        )  # fmt: skip
        sidecar = announced_url(processes[-1], sidecar_log, "the sidecar")
        scrape = (
            "  - job_name: inferwatch\n"
            f"    static_configs: [{{targets: ['{sidecar.removeprefix('http://')}']}}]\n"
        )
        with (
            running_prometheus(prometheus_bin, scrape, workdir, [RULES]) as url,
            _load(urls["url"]),
        ):
            yield url
    finally:
        for process in reversed(processes):
            _stop(process)


def _value(prometheus: str, expr: str) -> float | None:
    response = httpx.get(f"{prometheus}/api/v1/query", params={"query": expr}, timeout=10)
    response.raise_for_status()
    result = response.json()["data"]["result"]
    return float(result[0]["value"][1]) if result else None


def _measured(prometheus: str, wanted: Any) -> tuple[float, float] | None:
    """(the recorded TTFT SLO error ratio, requests it counts) once ``wanted`` holds and at
    least 100 requests are counted."""
    ratio, counted = _value(prometheus, RATIO), _value(prometheus, COUNTED)
    if ratio is None or counted is None or counted < 100 or not wanted(ratio):
        return None
    return ratio, counted


def advise(prometheus: str, *args: str) -> subprocess.CompletedProcess[str]:
    argv = [str(INFERWATCH), "advise", "--prometheus", prometheus, "--model", MODEL, *args]
    return subprocess.run(argv, capture_output=True, text=True, timeout=120)


def _enough_traffic(prometheus: str) -> bool:
    counted = _value(prometheus, "sum(increase(inferwatch_engine_requests_finished_total[1m]))")
    return counted is not None and counted >= 80


def test_applied_advice_meets_the_ttft_slo_the_poor_settings_miss(
    prometheus_bin: str, tmp_path: Path
) -> None:
    with replica(prometheus_bin, tmp_path / "poor", "--max-num-seqs", "2") as prometheus:
        missed = wait_for(
            lambda: _measured(prometheus, lambda ratio: ratio > BUDGET),
            "the poor replica to miss its TTFT SLO",
            180,
        )
        wait_for(lambda: _enough_traffic(prometheus), "a minute of traffic to advise on", 120)
        done = advise(prometheus, "--window", "1m", "--slo-ttft", str(SLO_TTFT), "--json")
        assert done.returncode == 0, done.stderr
        advice = json.loads(done.stdout)
        table = advise(prometheus, "--window", "1m", "--slo-ttft", str(SLO_TTFT))
        assert table.returncode == 0 and "--max-num-seqs" in table.stdout, table.stderr
    proposed = {p["setting"]: p for p in advice["proposals"]}
    assert advice["engine"] == "vllm" and advice["replicas"] == 1, advice
    assert proposed["max_num_seqs"]["value"] > 2
    assert "batch limit" in proposed["max_num_seqs"]["finding"], proposed["max_num_seqs"]
    queue = {e["signal"]: e for e in proposed["max_num_seqs"]["evidence"]}["queue_mean"]
    assert queue["value"] >= 0.1 * SLO_TTFT and "queue_duration" in queue["series"], queue
    flags = [
        str(part)
        for p in advice["proposals"]
        if p["flag"]
        for part in (p["flag"], f"{p['value']:g}")
    ]
    with replica(prometheus_bin, tmp_path / "advised", *flags) as prometheus:
        met = wait_for(
            lambda: _measured(prometheus, lambda ratio: ratio <= BUDGET),
            "the advised replica to meet its TTFT SLO",
            180,
        )
    assert missed[0] > BUDGET >= met[0], (missed, met, flags)
    print(
        f"poor: ratio {missed[0]:.3f} of {missed[1]:.0f}; "
        f"advised {flags}: ratio {met[0]:.3f} of {met[1]:.0f}"
    )
