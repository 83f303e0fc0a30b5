"""A sidecar without an engine: node-wide GPU telemetry for a DaemonSet, readiness not gated.

The GPUs are the H200 NVML recording replayed as four GPUs; the fault is XID 79 (fallen off
the bus), which fails /readyz of a replica whose engine uses that GPU, and must not fail a
GPU-only sidecar's, whose readiness means only that it serves.
"""

from __future__ import annotations

import asyncio
import os
import signal
import subprocess
import sys
from pathlib import Path

import httpx
import pytest
from click.testing import CliRunner
from prometheus_client.parser import text_string_to_metric_families

from inferwatch.cli import main
from inferwatch.exporters.gpu.fake_nvml import FakeNvml
from inferwatch.exporters.gpu.recording import Recording
from inferwatch.exporters.gpu.replay import ReplayTelemetry
from inferwatch.exporters.gpu.scope import resolve
from inferwatch.exporters.sidecar import Sidecar
from support.ports import announced_url
from support.shared import shared_path
from support.wait import wait_for, wait_until

pytestmark = pytest.mark.proc

RECORDING = shared_path("fixtures/gpu/nvml-h200")
INFERWATCH = Path(sys.executable).parent / "inferwatch"
GPUS = 4
TOKEN = "0123456789abcdef-token"


def names(text: str) -> set[str]:
    return {s.name for family in text_string_to_metric_families(text) for s in family.samples}


def check_metrics(promtool: str, text: str) -> None:
    result = subprocess.run(
        [promtool, "check", "metrics"], input=text, capture_output=True, text=True, timeout=60
    )
    assert result.returncode == 0, result.stdout + result.stderr


def node_backend(fake: FakeNvml) -> ReplayTelemetry:
    """The backend as ``--gpu replay=...`` opens it in GPU-only mode (``--gpu-scope node``)."""
    scope = resolve("node", pod="", namespace="", environ={})
    return ReplayTelemetry(RECORDING, fake=fake, scope=scope, xid_wait_ms=50)


def test_gpu_only_sidecar_serves_gpu_series_and_stays_ready_through_xid_79(
    promtool: str,
) -> None:
    fake = FakeNvml(Recording.load(RECORDING), gpus=GPUS)
    backend = node_backend(fake)
    sidecar = Sidecar([backend])

    async def scenario() -> tuple[httpx.Response, httpx.Response, str, httpx.Response]:
        transport = httpx.ASGITransport(app=sidecar.app())
        async with httpx.AsyncClient(transport=transport, base_url="http://sidecar") as client:
            first = await client.get("/metrics")
            assert backend.watching
            fake.emit_xid(79, index=2)
            await wait_until(
                lambda: backend.xids.total() >= 1, "the XID counted", 20, interval=0.02
            )
            after = await client.get("/metrics")
            ready = await client.get("/readyz")
            await sidecar.aclose()
            return first, after, after.text, ready

    first, after, text, ready = asyncio.run(scenario())
    assert first.status_code == after.status_code == 200
    check_metrics(promtool, first.text)
    check_metrics(promtool, text)
    served = names(text)
    assert "inferwatch_gpu_info" in served and "inferwatch_gpu_power_watts" in served
    assert text.count("inferwatch_gpu_info{") == GPUS, "node-wide: every GPU of the node"
    assert not {n for n in served if n.startswith("inferwatch_engine_")}
    assert 'collector="engine"' not in text
    assert "inferwatch_replica_ready" not in served, "a GPU-only sidecar is no replica"
    # the fault is seen and counted, and does not gate readiness
    assert 'xid="79"' in text
    assert ready.status_code == 200, ready.text
    assert [c["name"] for c in ready.json()["conditions"]] == ["isolated"]


def test_a_replica_scoped_to_the_same_gpu_does_fail_readiness() -> None:
    """The other side of the test above: the fault it survives is a real readiness fault."""
    fake = FakeNvml(Recording.load(RECORDING), gpus=GPUS)
    scope = resolve("2", pod="", namespace="", environ={})
    backend = ReplayTelemetry(RECORDING, fake=fake, scope=scope, xid_wait_ms=50)
    try:
        asyncio.run(backend.collect())
        fake.emit_xid(79, index=2)
        wait_for(lambda: backend.xids.total() >= 1, "the XID counted", 20, interval=0.02)
        assert not all(c.ok for c in backend.readiness())
    finally:
        backend.close()


@pytest.mark.parametrize(
    ("args", "env", "message"),
    [
        (["--probes", "default"], {}, "--probes needs --engine-url"),
        (["--gpu-scope", "0"], {}, "--gpu-scope 0 needs --engine-url"),
        (["--gpu-scope", "kubelet"], {}, "--gpu-scope kubelet needs --engine-url"),
        (["--gpu-scope", "all"], {}, "--gpu-scope all needs --engine-url"),
        (["--gpu", "none"], {}, "--gpu none without --engine-url leaves nothing to serve"),
        ([], {"INFERWATCH_SIDECAR_ADMIN_TOKEN": TOKEN}, "an admin token needs --engine-url"),
    ],
)
def test_flags_that_need_an_engine_are_one_line_usage_errors(
    args: list[str], env: dict[str, str], message: str
) -> None:
    result = CliRunner().invoke(
        main, ["sidecar", f"--gpu=replay={RECORDING}", *args], env={"NODE_NAME": "n1", **env}
    )
    assert result.exit_code == 2, result.output
    errors = [line for line in result.output.splitlines() if line.startswith("Error:")]
    assert len(errors) == 1 and message in errors[0], result.output
    assert "Traceback" not in result.output


def test_admin_token_file_without_engine_is_refused(tmp_path: Path) -> None:
    token = tmp_path / "token"
    token.write_text(TOKEN + "\n")
    result = CliRunner().invoke(
        main, ["sidecar", f"--gpu=replay={RECORDING}", f"--admin-token-file={token}"]
    )
    assert result.exit_code == 2 and "no replica to isolate" in result.output


def test_cli_without_engine_url_runs_in_gpu_only_mode(promtool: str, tmp_path: Path) -> None:
    log = tmp_path / "sidecar.log"
    with log.open("w") as out:
        process = subprocess.Popen(
            [
                str(INFERWATCH),
                "sidecar",
                f"--gpu=replay={RECORDING}",
                "--listen=127.0.0.1:0",
                "--pod-labels=emit",
            ],
            stdout=out,
            stderr=subprocess.STDOUT,
            env={"PATH": os.environ.get("PATH", "/usr/bin:/bin"), "NODE_NAME": "gpu-node-1"},
        )
    try:
        url = announced_url(process, log, "the sidecar")
        wait_for(lambda: httpx.get(f"{url}/healthz").status_code == 200, "the sidecar")
        metrics = httpx.get(f"{url}/metrics", timeout=30)
        ready = httpx.get(f"{url}/readyz", timeout=30)
    finally:
        process.terminate()
        code = process.wait(10)
    output = log.read_text()
    assert code in (0, -signal.SIGTERM), output
    assert metrics.status_code == 200 and ready.status_code == 200, output
    check_metrics(promtool, metrics.text)
    served = names(metrics.text)
    assert "inferwatch_gpu_info" in served
    assert not {n for n in served if n.startswith("inferwatch_engine_")}
    start = [line for line in output.splitlines() if "sidecar starting" in line]
    assert len(start) == 1 and "GPU-only mode" in start[0], output
    assert "readiness not gated" in start[0], start[0]
