"""The NVML collector against a real NVIDIA GPU (skipped where there is no driver)."""

from __future__ import annotations

import asyncio

import pynvml
import pytest

from inferwatch.exporters.gpu.nvml import NvmlTelemetry


def _driver_present() -> bool:
    try:
        pynvml.nvmlInit()
    except pynvml.NVMLError:
        return False
    pynvml.nvmlShutdown()
    return True


pytestmark = [
    pytest.mark.gpu,
    pytest.mark.skipif(not _driver_present(), reason="no NVIDIA driver (nvmlInit failed)"),
]


def test_real_gpus_report_identity_memory_and_health() -> None:
    telemetry = NvmlTelemetry(pynvml, proc_root=None)
    telemetry.start()
    try:
        families = asyncio.run(telemetry.collect())
    finally:
        telemetry.close()
    by_name = {f.name: f.samples for f in families}
    assert by_name["inferwatch_gpu_backend_up"][0].value == 1
    uuids = {s.labels["gpu_uuid"] for s in by_name["inferwatch_gpu_info"]}
    assert uuids and all(u.startswith(("GPU-", "MIG-")) for u in uuids)
    for sample in by_name["inferwatch_gpu_memory_total_bytes"]:
        assert sample.value > 1e9
    assert {s.labels["gpu_uuid"] for s in by_name["inferwatch_gpu_healthy"]} == uuids
    assert telemetry.readiness()[0].ok
