"""The dcgm-exporter collector against a real local HTTP server serving real scrapes."""

from __future__ import annotations

import asyncio
import re
import subprocess
import threading
from collections.abc import Callable, Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path

import pytest
from prometheus_client.core import Metric

from inferwatch.exporters.gpu.dcgm import DcgmTelemetry, is_blank
from inferwatch.exporters.gpu.fake_nvml import FakeNvml
from inferwatch.exporters.gpu.recording import Recording
from inferwatch.exporters.gpu.replay import ReplayTelemetry
from inferwatch.serving.endpoints import text as exposition
from support.shared import shared_path

pytestmark = pytest.mark.proc

FIXTURES = shared_path("fixtures/gpu")
GOLDEN = Path(__file__).parent / "golden" / "gpu"
SCRAPES = sorted(p.stem for p in (FIXTURES / "dcgm").glob("*.prom"))
RTX = (FIXTURES / "dcgm" / "dcgm-rtx4000ada-k8s-pod.prom").read_text()
RTX_UUID = "GPU-a8394b51-c086-568a-9f1a-c1e1c934c44c"


class Exporter:
    """A stand-in dcgm-exporter: http.server on 127.0.0.1 answering /metrics with ``body``."""

    def __init__(self) -> None:
        self.body = RTX.encode()
        self.status = 200
        self.delay = threading.Event()  # set: hold the response until `release`
        self.release = threading.Event()
        self.encoding = ""  # a Content-Encoding to declare for `body`
        self.trickle_s = 0.0  # > 0: send the body in 1 KiB pieces this far apart
        exporter = self

        class Handler(BaseHTTPRequestHandler):
            def do_GET(self) -> None:
                if exporter.delay.is_set():
                    exporter.release.wait(5)
                self.send_response(exporter.status)
                self.send_header("Content-Type", "text/plain; version=0.0.4")
                self.send_header("Content-Length", str(len(exporter.body)))
                if exporter.encoding:
                    self.send_header("Content-Encoding", exporter.encoding)
                self.end_headers()
                if not exporter.trickle_s:
                    self.wfile.write(exporter.body)
                    return
                for start in range(0, len(exporter.body), 1024):
                    if exporter.release.wait(exporter.trickle_s):
                        return
                    self.wfile.write(exporter.body[start : start + 1024])
                    self.wfile.flush()

            def log_message(self, *args: object) -> None:
                pass

        self.server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.server.daemon_threads = True
        self.url = f"http://127.0.0.1:{self.server.server_address[1]}/metrics"
        self.thread = threading.Thread(target=self.server.serve_forever, args=(0.05,), daemon=True)
        self.thread.start()

    def stop(self) -> None:
        self.release.set()
        self.server.shutdown()
        self.server.server_close()


@pytest.fixture
def exporter() -> Iterator[Exporter]:
    server = Exporter()
    yield server
    server.stop()


@pytest.fixture
def dcgm(exporter: Exporter) -> Iterator[DcgmTelemetry]:
    telemetry = DcgmTelemetry(exporter.url, http_timeout_s=0.5, timeout_s=2.0)
    yield telemetry
    telemetry.close()


def collect(telemetry: DcgmTelemetry | ReplayTelemetry) -> list[Metric]:
    return asyncio.run(telemetry.collect())


def samples(families: list[Metric], name: str) -> dict[frozenset[tuple[str, str]], float]:
    return {
        frozenset(s.labels.items()): s.value for f in families for s in f.samples if s.name == name
    }


def one(families: list[Metric], name: str, **labels: str) -> float:
    found = [v for k, v in samples(families, name).items() if set(labels.items()) <= k]
    assert len(found) == 1, (name, labels, samples(families, name))
    return found[0]


@pytest.mark.parametrize("scrape", SCRAPES)
def test_fixture_golden_is_promtool_clean(
    scrape: str,
    exporter: Exporter,
    dcgm: DcgmTelemetry,
    promtool: str,
    golden: Callable[[Path, str], None],
) -> None:
    exporter.body = (FIXTURES / "dcgm" / f"{scrape}.prom").read_bytes()
    text = exposition(collect(dcgm))
    golden(GOLDEN / f"{scrape}.prom", text)
    checked = subprocess.run(
        [promtool, "check", "metrics"], input=text.encode(), capture_output=True, check=False
    )
    assert checked.returncode == 0, checked.stderr.decode() + checked.stdout.decode()


def test_units_and_pod_attribution(dcgm: DcgmTelemetry) -> None:
    families = collect(dcgm)
    assert one(families, "inferwatch_gpu_power_watts") == pytest.approx(40.979)
    assert one(families, "inferwatch_gpu_clock_hertz", clock="sm") == 2310e6
    assert one(families, "inferwatch_gpu_energy_joules_total") == pytest.approx(455497.156)
    free = one(families, "inferwatch_gpu_memory_free_bytes")
    used = one(families, "inferwatch_gpu_memory_used_bytes")
    reserved = one(families, "inferwatch_gpu_memory_reserved_bytes")
    assert one(families, "inferwatch_gpu_memory_total_bytes") == free + used + reserved
    assert free % (1024 * 1024) == 0
    assert (
        one(
            families,
            "inferwatch_gpu_pod_info",
            pod="cuda-75454ffb9f-8ljq7",
            namespace="default",
            container="cuda",
        )
        == 1
    )
    assert one(families, "inferwatch_gpu_driver_info", driver_version="580.95.05") == 1
    # XID gauge 0 means no error: nothing counted, GPU in service
    assert samples(families, "inferwatch_gpu_xid_errors_total") == {}
    assert dcgm.readiness()[0].ok


def test_omitted_fields_are_absent_not_zero(exporter: Exporter, dcgm: DcgmTelemetry) -> None:
    exporter.body = (FIXTURES / "dcgm" / "dcgm-l4-kops-gpu-operator.prom").read_bytes()
    families = collect(dcgm)
    names = {f.name for f in families}
    assert "inferwatch_gpu_ecc_errors_total" not in names  # not in the default counters
    assert "inferwatch_gpu_pod_info" not in names  # no workload on that GPU
    assert one(families, "inferwatch_gpu_activity_ratio", activity="tensor") == 0


def _respell(text: str, mapping: dict[str, str]) -> str:
    for old, new in mapping.items():
        text = re.sub(rf"([{{,]){old}=", rf"\g<1>{new}=", text)
    return text


@pytest.mark.parametrize(
    "spelling",
    [
        {"UUID": "uuid", "Hostname": "hostname"},
        {"pod": "pod_name", "namespace": "pod_namespace", "container": "container_name"},
        {
            "pod": "exported_pod",
            "namespace": "exported_namespace",
            "container": "exported_container",
        },
    ],
    ids=["lowercase", "old-namespace", "honor-labels-false"],
)
def test_label_spellings_give_the_same_metrics(
    spelling: dict[str, str], exporter: Exporter, dcgm: DcgmTelemetry
) -> None:
    reference = exposition(collect(dcgm))
    exporter.body = _respell(RTX, spelling).encode()
    assert exposition(collect(dcgm)) == reference


def test_not_supported_sentinels_are_missing_values(
    exporter: Exporter, dcgm: DcgmTelemetry
) -> None:
    exporter.body = RTX.replace('pod_uid=""} 40.979000', 'pod_uid=""} 9223372036854775794').encode()
    families = collect(dcgm)
    assert "inferwatch_gpu_power_watts" not in {f.name for f in families}
    assert is_blank(140737488355328.0) and is_blank(2147483632) and not is_blank(700.0)


def test_mig_instances_keep_memory_per_instance(exporter: Exporter, dcgm: DcgmTelemetry) -> None:
    whole = [line for line in RTX.splitlines() if line.startswith(("DCGM_FI_DEV_FB_", "# "))]
    per_instance = [
        line.replace('modelName="', f'GPU_I_PROFILE="1g.5gb",GPU_I_ID="{gi}",modelName="')
        for gi in ("1", "2")
        for line in RTX.splitlines()
        if line.startswith(("DCGM_FI_DEV_FB_", "DCGM_FI_DEV_GPU_TEMP"))
    ]
    exporter.body = "\n".join([*whole, *per_instance, ""]).encode()
    families = collect(dcgm)
    used = samples(families, "inferwatch_gpu_memory_used_bytes")
    assert sorted(dict(k)["mig_instance"] for k in used) == ["", "1", "2"]
    assert len(samples(families, "inferwatch_gpu_temperature_celsius")) == 1
    assert len(samples(families, "inferwatch_gpu_info")) == 1


def test_xid_gauge_counts_changes_and_fails_readiness_on_fatal(
    exporter: Exporter, dcgm: DcgmTelemetry
) -> None:
    def with_xid(xid: int) -> bytes:
        return re.sub(r"(DCGM_FI_DEV_XID_ERRORS\{.*\}) 0", rf"\g<1> {xid}", RTX).encode()

    exporter.body = with_xid(31)
    collect(dcgm)
    collect(dcgm)  # the gauge is sticky: the same value is not a new XID
    assert dcgm.readiness()[0].ok
    exporter.body = with_xid(95)
    families = collect(dcgm)
    assert one(families, "inferwatch_gpu_xid_errors_total", xid="31", action="restart_app") == 1
    assert one(families, "inferwatch_gpu_xid_errors_total", xid="95", action="reset_gpu") == 1
    assert not dcgm.readiness()[0].ok


def test_windowed_xid_counts_become_a_counter(exporter: Exporter, dcgm: DcgmTelemetry) -> None:
    line = (
        'DCGM_EXP_XID_ERRORS_COUNT{{gpu="0",UUID="{u}",device="nvidia0",modelName="x",'
        'window_size_in_ms="300000",xid="{x}"}} {n}'
    )

    def body(n: int) -> bytes:
        return (RTX + line.format(u=RTX_UUID, x=43, n=n) + "\n").encode()

    for count in (2, 3, 1, 1):  # rises count; a fall is the window sliding
        exporter.body = body(count)
        families = collect(dcgm)
    assert one(families, "inferwatch_gpu_xid_errors_total", xid="43", action="ignore") == 3
    assert dcgm.readiness()[0].ok


def test_dbe_row_remap_failure_and_vanished_gpu_fail_readiness(
    exporter: Exporter, dcgm: DcgmTelemetry
) -> None:
    exporter.body = re.sub(r"(DCGM_FI_DEV_ROW_REMAP_FAILURE\{.*\}) 0", r"\g<1> 1", RTX).encode()
    collect(dcgm)
    assert "row remapping failed" in dcgm.readiness()[0].reason
    fresh = DcgmTelemetry(exporter.url)
    try:
        exporter.body = RTX.encode()
        collect(fresh)
        exporter.body = (FIXTURES / "dcgm" / "dcgm-l4-kops-gpu-operator.prom").read_bytes()
        families = collect(fresh)
    finally:
        fresh.close()
    assert one(families, "inferwatch_gpu_healthy", gpu_uuid=RTX_UUID) == 0
    assert one(families, "inferwatch_gpu_fault_active", gpu_uuid=RTX_UUID, reason="lost") == 1


@pytest.mark.parametrize(
    ("breakage", "reason"),
    [
        ("down", "connect"),
        ("slow", "timeout"),
        ("garbage", "not_metrics"),
        ("html", "not_metrics"),
        ("500", "http_status"),
    ],
)
def test_exporter_failures_become_a_reason(
    breakage: str, reason: str, exporter: Exporter, dcgm: DcgmTelemetry
) -> None:
    if breakage == "down":
        exporter.stop()
    elif breakage == "slow":
        exporter.delay.set()
    elif breakage == "garbage":
        exporter.body = b"\x00\xff{{{ not metrics"
    elif breakage == "html":
        exporter.body = b"<html><body>404 page not found</body></html>"
    else:
        exporter.status = 500
    families = collect(dcgm)
    assert one(families, "inferwatch_gpu_backend_up", backend="dcgm") == 0
    assert one(families, "inferwatch_gpu_backend_error_info", reason=reason) == 1


def test_failed_scrape_serves_last_good_values_while_fresh(
    exporter: Exporter, dcgm: DcgmTelemetry
) -> None:
    good = collect(dcgm)
    exporter.status = 503
    families = collect(dcgm)
    assert samples(families, "inferwatch_gpu_power_watts") == samples(
        good, "inferwatch_gpu_power_watts"
    )
    dcgm.stale_s = 0
    assert "inferwatch_gpu_power_watts" not in {f.name for f in collect(dcgm)}


def test_nvml_and_dcgm_carry_shared_facts_under_the_same_names(dcgm: DcgmTelemetry) -> None:
    """Memory, power, temperature, utilisation, ECC and XID: same names, labels and units."""
    fake = FakeNvml(Recording.load(FIXTURES / "nvml-h200"))
    fake.seek(60.0)
    replay = ReplayTelemetry(FIXTURES / "nvml-h200", fake=fake, watch_xids=False)
    replay.start()
    nvml_families = collect(replay)
    replay.close()
    dcgm_families = collect(dcgm)
    shared = [
        "inferwatch_gpu_memory_used_bytes",
        "inferwatch_gpu_memory_free_bytes",
        "inferwatch_gpu_memory_reserved_bytes",
        "inferwatch_gpu_memory_total_bytes",
        "inferwatch_gpu_power_watts",
        "inferwatch_gpu_temperature_celsius",
        "inferwatch_gpu_utilization_ratio",
        "inferwatch_gpu_energy_joules_total",
        "inferwatch_gpu_clock_hertz",
        "inferwatch_gpu_remapped_rows_total",
    ]
    for name in shared:
        from_nvml, from_dcgm = samples(nvml_families, name), samples(dcgm_families, name)
        assert from_nvml and from_dcgm, name
        assert {tuple(sorted(dict(k))) for k in from_nvml} == {
            tuple(sorted(dict(k))) for k in from_dcgm
        }, name
    # same units: an H200 and an RTX 4000 land on comparable scales
    assert 0 <= one(dcgm_families, "inferwatch_gpu_utilization_ratio") <= 1
    assert 0 <= one(nvml_families, "inferwatch_gpu_utilization_ratio") <= 1
    assert 10 < one(dcgm_families, "inferwatch_gpu_power_watts") < 1000
    assert 10 < one(nvml_families, "inferwatch_gpu_power_watts") < 1000
    for families in (nvml_families, dcgm_families):
        assert 1e9 < one(families, "inferwatch_gpu_memory_total_bytes") < 1e12
    # ECC and XID: one entry each, fed by both sources in the catalogue
    from inferwatch import catalog

    for key in ("gpu_ecc_errors", "gpu_xid_errors", "gpu_memory_used", "gpu_temperature"):
        assert {"nvml", "dcgm"} <= set(catalog.load()[key].sources), key


def test_field_labels_match_catalogue_entries() -> None:
    from inferwatch import catalog

    fixed = {
        alias.metric: (alias.set, spec)
        for spec in catalog.load().with_source("dcgm")
        for alias in spec.sources["dcgm"]
        if alias.set
    }
    assert "DCGM_FI_DEV_SM_CLOCK" in fixed
    for field, (labels, spec) in fixed.items():
        assert set(labels) <= set(spec.labels), field
    broken = catalog.load()["gpu_clock"]
    text = f"""
identity: {{gpu: [gpu_uuid]}}
metrics:
  - {{key: k, name: inferwatch_k, type: gauge, help: h, collector: gpu, labels: [clock],
     sources: {{dcgm: [{{metric: {broken.sources["dcgm"][0].metric}, set: {{sensor: x}}}}]}}}}
"""
    with pytest.raises(catalog.CatalogError, match="sets labels"):
        catalog.parse(text)


def test_the_exporter_page_is_read_under_the_page_fetch_rules(exporter: Exporter) -> None:
    """The same rules as for engine pages: gzip is undone with the size cap holding for the
    inflated body, an encoding that cannot be undone is named, and the whole answer has a
    deadline even when every read arrives within requests' per-read timeout."""
    import gzip

    capped = DcgmTelemetry(exporter.url, http_timeout_s=1.0, max_bytes=len(RTX) + 1024)
    try:
        exporter.body, exporter.encoding = gzip.compress(RTX.encode()), "gzip"
        assert one(collect(capped), "inferwatch_gpu_backend_up", backend="dcgm") == 1
        exporter.body = gzip.compress(RTX.encode() * 4)  # small as sent, over the cap inflated
        assert one(collect(capped), "inferwatch_gpu_backend_error_info", reason="too_large") == 1
        exporter.encoding = "br"
        assert one(collect(capped), "inferwatch_gpu_backend_error_info", reason="encoding") == 1
    finally:
        capped.close()
    slow = DcgmTelemetry(exporter.url, http_timeout_s=0.5, timeout_s=30.0)
    try:
        exporter.body, exporter.encoding, exporter.trickle_s = RTX.encode(), "", 0.2
        families = collect(slow)  # ~2 s to send in full; each piece within the read timeout
        assert one(families, "inferwatch_gpu_backend_error_info", reason="timeout") == 1
    finally:
        exporter.release.set()
        slow.close()
