"""The NVML collector, run against FakeNvml fed by the real H200 recording."""

from __future__ import annotations

import asyncio
import threading
from collections.abc import Callable, Iterator
from pathlib import Path

import pynvml
import pytest
from prometheus_client.core import Metric

from inferwatch.exporters.gpu import open_backend
from inferwatch.exporters.gpu.fake_nvml import FakeNvml
from inferwatch.exporters.gpu.nvml import NvmlTelemetry, error_name
from inferwatch.exporters.gpu.recording import Recording
from inferwatch.exporters.gpu.replay import ReplayTelemetry
from inferwatch.serving.endpoints import text as exposition
from support.shared import shared_path
from support.wait import wait_for

pytestmark = pytest.mark.proc

RECORDING = shared_path("fixtures/gpu/nvml-h200")
GOLDEN = Path(__file__).parent / "golden" / "gpu"
UUID = "GPU-00b2b091-2154-3d4b-55dd-be43b60b9d6a"
LOAD_T = 60.0  # seconds into nvml-phases.json: bf16 matmuls at the 700 W power cap


@pytest.fixture(scope="module")
def recording() -> Recording:
    return Recording.load(RECORDING)


@pytest.fixture
def fake(recording: Recording) -> FakeNvml:
    fake = FakeNvml(recording)
    fake.seek(LOAD_T)
    return fake


@pytest.fixture
def make(fake: FakeNvml) -> Iterator[Callable[..., NvmlTelemetry]]:
    made: list[NvmlTelemetry] = []

    def build(**options: object) -> NvmlTelemetry:
        options.setdefault("proc_root", None)
        telemetry = NvmlTelemetry(fake, **options)  # type: ignore[arg-type]
        made.append(telemetry)
        return telemetry

    yield build
    for telemetry in made:
        telemetry.close()


def collect(telemetry: NvmlTelemetry) -> list[Metric]:
    return asyncio.run(telemetry.collect())


def values(families: list[Metric], name: str) -> dict[tuple[tuple[str, str], ...], float]:
    return {
        tuple(sorted(s.labels.items())): s.value
        for family in families
        for s in family.samples
        if s.name == name
    }


def value(families: list[Metric], name: str, **labels: str) -> float:
    matches = [v for key, v in values(families, name).items() if set(labels.items()) <= set(key)]
    assert len(matches) == 1, (name, labels, values(families, name))
    return matches[0]


def test_replay_golden_is_promtool_clean(
    fake: FakeNvml, golden: Callable[[Path, str], None], promtool: str, tmp_path: Path
) -> None:
    import subprocess

    telemetry = ReplayTelemetry(RECORDING, fake=fake)
    telemetry.start()
    try:
        text = exposition(collect(telemetry))
    finally:
        telemetry.close()
    golden(GOLDEN / "nvml-h200-replay.prom", text)
    checked = subprocess.run(
        [promtool, "check", "metrics"], input=text.encode(), capture_output=True, check=False
    )
    assert checked.returncode == 0, checked.stderr.decode() + checked.stdout.decode()


def test_units_are_converted_from_the_recorded_reading(
    make: Callable[..., NvmlTelemetry], recording: Recording
) -> None:
    families = collect(make())
    row = recording.at(LOAD_T)
    assert value(families, "inferwatch_gpu_power_watts") == row.power_mw / 1000
    assert value(families, "inferwatch_gpu_utilization_ratio") == row.util_gpu / 100
    assert value(families, "inferwatch_gpu_clock_hertz", clock="sm") == row.sm_mhz * 1e6
    assert value(families, "inferwatch_gpu_memory_used_bytes") == row.memory["used"]
    assert value(families, "inferwatch_gpu_memory_reserved_bytes") == 644_939_776
    assert value(families, "inferwatch_gpu_temperature_celsius", sensor="memory") == row.mem_temp
    assert (
        value(families, "inferwatch_gpu_temperature_threshold_celsius", threshold="slowdown") == 89
    )
    assert (
        value(families, "inferwatch_gpu_energy_joules_total") == recording.energy_at(LOAD_T) / 1000
    )
    # bit 0x4 (SwPowerCap) is set at ~690 of 700 W in the recording
    assert row.reasons == 4
    assert value(families, "inferwatch_gpu_clock_event_active", reason="power_cap") == 1
    assert value(families, "inferwatch_gpu_clock_event_active", reason="gpu_idle") == 0
    assert value(families, "inferwatch_gpu_process_memory_bytes", pid="418") > 0


def test_v1_only_driver_still_reports_memory(
    make: Callable[..., NvmlTelemetry], fake: FakeNvml
) -> None:
    fake.inject("nvmlDeviceGetMemoryInfo", pynvml.NVMLError(pynvml.NVML_ERROR_NOT_SUPPORTED), 1)
    families = collect(make())
    assert "inferwatch_gpu_memory_reserved_bytes" not in {f.name for f in families}
    assert value(families, "inferwatch_gpu_memory_total_bytes") == 150_754_820_096


def test_static_once_slow_on_cadence_cheap_every_scrape(
    make: Callable[..., NvmlTelemetry], fake: FakeNvml
) -> None:
    now = [0.0]
    telemetry = make(clock=lambda: now[0], slow_interval_s=15.0, watch_xids=False)
    for step in range(4):  # scrapes at 0, 5, 10, 15 s
        now[0] = step * 5.0
        collect(telemetry)
    assert fake.calls["nvmlDeviceGetMaxClockInfo"] == 2  # sm + memory, once
    assert fake.calls["nvmlDeviceGetTotalEnergyConsumption"] == 2  # at 0 s and 15 s
    assert fake.calls["nvmlDeviceGetPowerUsage"] == 4
    # between slow reads the energy counter is still served
    now[0] = 20.0
    assert value(collect(telemetry), "inferwatch_gpu_energy_joules_total") > 0


def test_not_supported_is_remembered_per_gpu(
    make: Callable[..., NvmlTelemetry], fake: FakeNvml
) -> None:
    now = [0.0]
    telemetry = make(clock=lambda: now[0], slow_interval_s=1.0, watch_xids=False)
    for step in range(3):
        now[0] = step * 2.0
        families = collect(telemetry)
    # retired pages and NVLink answered NotSupported on the H200: asked once, never again
    assert fake.calls["nvmlDeviceGetRetiredPages"] == 2  # sbe + dbe, first slow read only
    assert fake.calls["nvmlDeviceGetRetiredPagesPendingStatus"] == 1
    assert fake.calls["nvmlDeviceGetNvLinkState"] == 1
    assert "nvmlDeviceGetNvLinkErrorCounter" not in fake.calls
    assert values(families, "inferwatch_gpu_retired_pages") == {}
    assert values(families, "inferwatch_gpu_nvml_errors_total") == {}


def test_unexpected_errors_are_counted_and_the_rest_still_reported(
    make: Callable[..., NvmlTelemetry], fake: FakeNvml
) -> None:
    fake.inject("nvmlDeviceGetPowerUsage", pynvml.NVMLError(pynvml.NVML_ERROR_UNKNOWN))
    fake.inject("nvmlDeviceGetTemperature", RuntimeError("driver returned garbage"))
    families = collect(make(watch_xids=False))
    names = {f.name for f in families}
    assert "inferwatch_gpu_power_watts" not in names
    assert value(families, "inferwatch_gpu_utilization_ratio") > 0
    errors = values(families, "inferwatch_gpu_nvml_errors_total")
    assert errors == {
        (("call", "nvmlDeviceGetPowerUsage"), ("error", "unknown")): 1,
        (("call", "nvmlDeviceGetTemperature"), ("error", "runtime_error")): 1,
    }
    assert value(families, "inferwatch_gpu_backend_up", backend="nvml") == 1


def test_auto_without_a_driver_serves_no_gpu_series(fake: FakeNvml) -> None:
    fake.fail_init(pynvml.NVML_ERROR_LIBRARY_NOT_FOUND)
    assert asyncio.run(open_backend("auto", nvml=fake).collect()) == []


def test_nvml_init_failure_reports_why_and_retries(
    make: Callable[..., NvmlTelemetry], fake: FakeNvml
) -> None:
    now = [0.0]
    fake.fail_init(pynvml.NVML_ERROR_DRIVER_NOT_LOADED)
    telemetry = make(clock=lambda: now[0], retry_init_s=60.0, watch_xids=False)
    families = collect(telemetry)
    assert value(families, "inferwatch_gpu_backend_up") == 0
    assert value(families, "inferwatch_gpu_backend_error_info", reason="driver_not_loaded") == 1
    assert telemetry.readiness()[0].ok  # no GPU telemetry is not a GPU fault
    fake.fail_init(None)
    now[0] = 30.0
    collect(telemetry)
    assert fake.calls["nvmlInit"] == 1  # not retried before retry_init_s
    now[0] = 61.0
    families = collect(telemetry)
    assert value(families, "inferwatch_gpu_backend_up") == 1
    assert "inferwatch_gpu_backend_error_info" not in {f.name for f in families}
    assert value(families, "inferwatch_gpu_power_watts") > 0


def test_gpu_lost_mid_run_fails_readiness_and_stops_polling_it(
    make: Callable[..., NvmlTelemetry], fake: FakeNvml
) -> None:
    telemetry = make(watch_xids=False)
    collect(telemetry)
    assert telemetry.readiness()[0].ok
    fake.lose_gpu()
    families = collect(telemetry)
    condition = telemetry.readiness()[0]
    assert not condition.ok and UUID in condition.reason and "lost" in condition.reason
    assert value(families, "inferwatch_gpu_healthy") == 0
    assert value(families, "inferwatch_gpu_fault_active", reason="lost") == 1
    assert "inferwatch_gpu_power_watts" not in {f.name for f in families}
    calls = dict(fake.calls)
    collect(telemetry)
    assert fake.calls.get("nvmlDeviceGetUtilizationRates") == calls.get(
        "nvmlDeviceGetUtilizationRates"
    )


def test_one_lost_gpu_does_not_hide_the_others(recording: Recording) -> None:
    fake = FakeNvml(recording, gpus=2)
    fake.seek(LOAD_T)
    telemetry = NvmlTelemetry(fake, proc_root=None, watch_xids=False)
    try:
        collect(telemetry)
        fake.lose_gpu(1)
        families = collect(telemetry)
    finally:
        telemetry.close()
    powers = values(families, "inferwatch_gpu_power_watts")
    assert [dict(k)["gpu_uuid"] for k in powers] == [UUID]
    healthy = values(families, "inferwatch_gpu_healthy")
    assert sorted(healthy.values()) == [0, 1]


def test_a_hung_nvml_call_never_stalls_the_scrape(
    make: Callable[..., NvmlTelemetry], fake: FakeNvml
) -> None:
    release = threading.Event()
    telemetry = make(timeout_s=0.2, watch_xids=False)
    good = collect(telemetry)
    returned = threading.Event()

    def hang() -> None:
        release.wait(5)
        returned.set()

    fake.inject("nvmlDeviceGetPowerUsage", hang, 1)
    families = collect(telemetry)
    came_back_while_hung = not returned.is_set()
    release.set()
    assert came_back_while_hung, "the scrape waited for the hung NVML call"
    assert value(families, "inferwatch_gpu_backend_up") == 0
    assert value(families, "inferwatch_gpu_backend_error_info", reason="timeout") == 1
    # the last good values are still served while fresh
    assert values(families, "inferwatch_gpu_power_watts") == values(
        good, "inferwatch_gpu_power_watts"
    )


def test_the_scrape_deadline_bounds_the_wait_for_a_hung_nvml_call(
    make: Callable[..., NvmlTelemetry], fake: FakeNvml
) -> None:
    release = threading.Event()
    telemetry = make(timeout_s=30.0, watch_xids=False)
    returned = threading.Event()

    def hang() -> None:
        release.wait(30)
        returned.set()

    fake.inject("nvmlDeviceGetPowerUsage", hang, 1)
    families = asyncio.run(telemetry.collect(0.2))
    came_back_while_hung = not returned.is_set()
    release.set()
    assert came_back_while_hung, "the scrape waited past its deadline for the hung NVML call"
    assert value(families, "inferwatch_gpu_backend_up") == 0
    assert value(families, "inferwatch_gpu_backend_error_info", reason="timeout") == 1


def test_critical_xid_events_are_counted_and_classified(
    make: Callable[..., NvmlTelemetry], fake: FakeNvml
) -> None:
    telemetry = make(xid_wait_ms=20)
    collect(telemetry)
    fake.emit_xid(13)  # application error: counted, GPU stays in service
    wait_for(lambda: telemetry.xids.total() >= 1, "an XID counted", 5, interval=0.005)
    assert telemetry.readiness()[0].ok
    fake.emit_xid(79)  # fallen off the bus: reboot the node
    wait_for(lambda: telemetry.xids.total() >= 2, "a second XID counted", 5, interval=0.005)
    families = collect(telemetry)
    assert value(families, "inferwatch_gpu_xid_errors_total", xid="13") == 1
    assert value(families, "inferwatch_gpu_xid_errors_total", xid="13", action="restart_app") == 1
    assert value(families, "inferwatch_gpu_xid_errors_total", xid="79", action="reboot_node") == 1
    assert value(families, "inferwatch_gpu_xid_last_timestamp_seconds") > 1e9
    condition = telemetry.readiness()[0]
    assert not condition.ok and "XID 79" in condition.reason


def test_event_thread_failure_is_reported_and_restarted(
    make: Callable[..., NvmlTelemetry], fake: FakeNvml
) -> None:
    now = [0.0]
    fake.inject("nvmlEventSetWait", pynvml.NVMLError(pynvml.NVML_ERROR_UNKNOWN), 1)
    telemetry = make(clock=lambda: now[0], xid_wait_ms=20, retry_init_s=10.0)
    telemetry.start()
    wait_for(
        lambda: not telemetry.watching, "the watcher to end", 5, interval=0.005
    )  # the injected error ended the thread
    assert fake.calls["nvmlEventSetFree"] == 1
    families = collect(telemetry)
    assert value(families, "inferwatch_gpu_xid_watch_up") == 0
    assert value(families, "inferwatch_gpu_power_watts") > 0  # scrape unaffected
    now[0] = 11.0
    collect(telemetry)  # restarts the watch
    wait_for(lambda: telemetry.watching, "the watcher to start again", 5, interval=0.005)
    fake.emit_xid(48)
    wait_for(
        lambda: telemetry.xids.total() >= 1, "an XID counted after the restart", 5, interval=0.005
    )
    assert not telemetry.readiness()[0].ok


def test_uncorrectable_ecc_and_row_remap_failure_fail_readiness(
    make: Callable[..., NvmlTelemetry], fake: FakeNvml
) -> None:
    telemetry = make(watch_xids=False)
    collect(telemetry)
    assert telemetry.readiness()[0].ok
    original = fake.nvmlDeviceGetRemappedRows
    fake.nvmlDeviceGetRemappedRows = lambda handle: (0, 2, 0, 1)  # type: ignore[method-assign]
    try:
        families = collect(telemetry)
    finally:
        fake.nvmlDeviceGetRemappedRows = original  # type: ignore[method-assign]
    assert value(families, "inferwatch_gpu_row_remap_failed") == 1
    assert value(families, "inferwatch_gpu_remapped_rows_total", error="uncorrected") == 2
    assert "row remapping failed" in telemetry.readiness()[0].reason

    fresh = make(watch_xids=False)
    fake.nvmlDeviceGetTotalEccErrors = (  # type: ignore[method-assign]
        lambda handle, error_type, counter: 3 if error_type == 1 and counter == 0 else 0
    )
    families = collect(fresh)
    assert (
        value(families, "inferwatch_gpu_ecc_errors_total", error="uncorrected", scope="volatile")
        == 3
    )
    assert value(families, "inferwatch_gpu_healthy") == 0
    assert value(families, "inferwatch_gpu_fault_active", reason="ecc_uncorrected") == 1
    assert value(families, "inferwatch_gpu_fault_active", reason="xid") == 0
    assert not fresh.readiness()[0].ok


def test_process_memory_is_charged_to_the_pod(
    make: Callable[..., NvmlTelemetry], tmp_path: Path
) -> None:
    container = "5f3bd2c3a1e04d0e8f7a9b6c5d4e3f2a1b0c9d8e7f6a5b4c3d2e1f0a9b8c7d6e"
    (tmp_path / "418").mkdir()
    (tmp_path / "418" / "cgroup").write_text(
        "0::/kubepods.slice/kubepods-burstable.slice/"
        "kubepods-burstable-pod1c178021_5860_4495_a1ab_f9ac17877672.slice/"
        f"cri-containerd-{container}.scope\n"
    )
    families = collect(make(proc_root=tmp_path, watch_xids=False))
    assert (
        value(
            families,
            "inferwatch_gpu_process_memory_bytes",
            pid="418",
            pod_uid="1c178021-5860-4495-a1ab-f9ac17877672",
            container_id=container,
        )
        > 0
    )


def test_fake_behaves_like_pynvml(fake: FakeNvml) -> None:
    with pytest.raises(pynvml.NVMLError_Uninitialized):
        fake.nvmlDeviceGetCount()
    fake.nvmlInit()
    handle = fake.nvmlDeviceGetHandleByIndex(0)
    with pytest.raises(pynvml.NVMLError_NotSupported) as raised:
        fake.nvmlDeviceGetRetiredPages(
            handle, pynvml.NVML_PAGE_RETIREMENT_CAUSE_DOUBLE_BIT_ECC_ERROR
        )
    assert raised.value.value == pynvml.NVML_ERROR_NOT_SUPPORTED
    assert str(raised.value) == "Not Supported"
    with pytest.raises(pynvml.NVMLError_InvalidArgument):
        fake.nvmlDeviceGetHandleByIndex(1)
    with pytest.raises(pynvml.NVMLError_Timeout):
        fake.nvmlEventSetWait(fake.nvmlEventSetCreate(), 1)
    memory = fake.nvmlDeviceGetMemoryInfo(handle, version=pynvml.nvmlMemory_v2)
    legacy = fake.nvmlDeviceGetMemoryInfo(handle)
    assert isinstance(memory, pynvml.c_nvmlMemory_v2_t)
    assert legacy.used == memory.used + memory.reserved  # v1 counts reserved as used
    fields = fake.nvmlDeviceGetFieldValues(
        handle, [pynvml.NVML_FI_DEV_MEMORY_TEMP, pynvml.NVML_FI_DEV_RETIRED_PENDING]
    )
    assert fields[0].nvmlReturn == pynvml.NVML_SUCCESS
    assert fields[1].nvmlReturn == pynvml.NVML_ERROR_NOT_SUPPORTED
    assert fake.NVML_CLOCK_SM == pynvml.NVML_CLOCK_SM
    assert fake.NVMLError_GpuIsLost is pynvml.NVMLError_GpuIsLost
    with pytest.raises(AttributeError, match="does not implement"):
        fake.nvmlDeviceGetFanSpeed  # noqa: B018
    assert error_name(pynvml.NVMLError(pynvml.NVML_ERROR_GPU_IS_LOST)) == "gpu_is_lost"


def test_nvml_calls_named_in_the_catalogue_exist_in_pynvml() -> None:
    from inferwatch import catalog

    for spec in catalog.load().with_source("nvml"):
        for alias in spec.sources["nvml"]:
            assert callable(getattr(pynvml, alias.metric)), (spec.key, alias.metric)


def test_load_series_recording_replays_too(tmp_path: Path) -> None:
    recording = Recording.load(RECORDING / "nvml-load-series.json")
    under_load = recording.at(15.0)
    assert under_load.util_gpu == 100
    assert under_load.memory["used"] + under_load.memory["reserved"] == 21_839_609_856


def test_a_gpu_field_is_read_from_its_catalogue_entry_alone(recording: Recording) -> None:
    """Retired pages (pre-Ampere; NotSupported on the H200) are named by no collector code:
    their calls, arguments, conversion and labels come from the catalogue's nvml sources."""
    older_gpu = Recording(
        recording.system,
        {
            **recording.device,
            "retired_pages_sbe": {"value": [0x1000, 0x2000]},
            "retired_pages_dbe": {"value": [0x3000]},
            "retired_pages_pending": {"value": 1},
        },
        recording.readings,
        recording.hz,
    )
    telemetry = NvmlTelemetry(FakeNvml(older_gpu), proc_root=None, watch_xids=False)
    try:
        families = collect(telemetry)
    finally:
        telemetry.close()
    assert value(families, "inferwatch_gpu_retired_pages", cause="sbe") == 2
    assert value(families, "inferwatch_gpu_retired_pages", cause="dbe") == 1
    assert value(families, "inferwatch_gpu_retired_pages_pending") == 1


def test_every_nvml_source_in_the_catalogue_is_read() -> None:
    from inferwatch import catalog
    from inferwatch.exporters.gpu.nvml import DECODED_HERE, call_table

    table = call_table(pynvml)
    driven = [(key, alias) for calls in table.values() for c in calls for key, alias in c.fields]
    for spec in catalog.load().with_source("nvml"):
        for alias in spec.sources["nvml"]:
            assert alias.metric in DECODED_HERE or (spec.key, alias) in driven, spec.key
    named = {a.metric for s in catalog.load().with_source("nvml") for a in s.sources["nvml"]}
    assert named >= DECODED_HERE  # no decoder for a call the catalogue does not list
