"""--gpu specs through open_backend, and the MetricSource / ReadinessSource contracts."""

from __future__ import annotations

import asyncio
from pathlib import Path

import pytest

from inferwatch.exporters.collector import MetricSource, ReadinessSource
from inferwatch.exporters.gpu import GpuTelemetry, open_backend
from inferwatch.exporters.gpu.dcgm import DcgmTelemetry
from inferwatch.exporters.gpu.replay import ReplayTelemetry
from support.shared import shared_path

pytestmark = pytest.mark.unit

RECORDING = shared_path("fixtures/gpu/nvml-h200")


@pytest.mark.parametrize(
    ("spec", "message"),
    [
        ("gpu", "unknown backend 'gpu'"),
        ("dcgm=", r"dcgm needs an http\(s\) URL"),
        ("dcgm=localhost:9400", r"dcgm needs an http\(s\) URL"),
        ("replay=/nonexistent/recording", "no NVML recording"),
        ("none=1", "none takes no value"),
    ],
)
def test_bad_specs_are_one_line_value_errors(spec: str, message: str) -> None:
    with pytest.raises(ValueError, match=message) as raised:
        open_backend(spec)
    assert "\n" not in str(raised.value)


def test_replay_of_a_file_that_is_not_a_recording(tmp_path: Path) -> None:
    (tmp_path / "nvml-snapshot.json").write_text("{}")
    with pytest.raises(ValueError, match="not an NVML recording"):
        open_backend(f"replay={tmp_path}")


def test_specs_give_the_named_backend() -> None:
    replay = open_backend(f"replay={RECORDING}", watch_xids=False)
    dcgm = open_backend("dcgm=http://127.0.0.1:9/metrics")
    none = open_backend("none")
    auto = open_backend("auto")  # no NVIDIA driver on this machine: none, saying why
    try:
        assert isinstance(replay, ReplayTelemetry) and isinstance(dcgm, DcgmTelemetry)
        for backend in (replay, dcgm, none, auto):
            assert isinstance(backend, GpuTelemetry)
            assert isinstance(backend, MetricSource) and isinstance(backend, ReadinessSource)
        health = {
            s.name: (s.labels, s.value) for f in asyncio.run(none.collect()) for s in f.samples
        }
        assert health == {}  # no GPU configured is no GPU telemetry down
        replayed = {s.name: s for f in asyncio.run(replay.collect()) for s in f.samples}
        assert replayed["inferwatch_gpu_backend_up"].labels == {"backend": "replay"}
        assert "inferwatch_gpu_backend_error_info" not in replayed  # only while down
        assert auto.readiness()[0].ok and none.readiness()[0].ok
    finally:
        for backend in (replay, dcgm, none, auto):
            backend.close()
