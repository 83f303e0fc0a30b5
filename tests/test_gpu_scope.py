"""A replica's GPU series and readiness cover exactly the GPUs its engine uses.

The node is replayed from real captures: the H200 NVML recording as four GPUs (FakeNvml
derives their UUIDs), and dcgm-exporter pages with each real scrape's GPU repeated four
times. One GPU breaks; only the replica scoped to it goes unready.
"""

from __future__ import annotations

import asyncio
import re
from collections.abc import Callable, Iterator
from typing import Any

import httpx
import pytest
from click.testing import CliRunner
from hypothesis import given
from hypothesis import strategies as st
from prometheus_client.core import Metric

from inferwatch.cli import main
from inferwatch.exporters.engine.collector import EngineCollector
from inferwatch.exporters.gpu.base import GpuTelemetry
from inferwatch.exporters.gpu.dcgm import DcgmTelemetry
from inferwatch.exporters.gpu.fake_nvml import FakeNvml
from inferwatch.exporters.gpu.recording import Recording
from inferwatch.exporters.gpu.replay import ReplayTelemetry
from inferwatch.exporters.gpu.scope import (
    FixedScope,
    GpuScope,
    KubeletScope,
    ScopeUnknown,
    Selection,
    parse_devices,
    resolve,
)
from inferwatch.exporters.sidecar import Sidecar
from inferwatch.exporters.sidecar_cli import emits_pod_labels
from inferwatch.serving.page_fetch import EngineScraper
from support.shared import shared_path
from support.wait import wait_for

pytestmark = pytest.mark.unit

SHARED = shared_path("fixtures/gpu")
RECORDING = SHARED / "nvml-h200"
GPUS = 4


def collect(telemetry: GpuTelemetry) -> list[Metric]:
    return asyncio.run(telemetry.collect())


def uuids(families: list[Metric], name: str = "inferwatch_gpu_info") -> set[str]:
    return {s.labels["gpu_uuid"] for f in families for s in f.samples if s.name == name}


def ready(telemetry: GpuTelemetry) -> bool:
    return all(condition.ok for condition in telemetry.readiness())


# -- device lists ------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("text", "expected"),
    [
        ("0,1", Selection(indices=frozenset({0, 1}))),
        (" 3 ", Selection(indices=frozenset({3}))),
        ("GPU-8f1c2a7e", Selection(uuids=("GPU-8f1c2a7e",))),  # a unique prefix, as CUDA takes
        ("GPU-aa::2,GPU-aa::3", Selection(uuids=("GPU-aa",))),  # time-slicing replicas
        ("MIG-5b1e6f0a-93c2", Selection(migs=("MIG-5b1e6f0a-93c2",))),
        ("MIG-GPU-aa/1/0", Selection(uuids=("GPU-aa",))),  # pre-R470 MIG names
        ("nvidia2", Selection(indices=frozenset({2}))),  # device-name ids
        ("nvidia0/gi3", Selection(indices=frozenset({0}))),  # GKE MIG ids
        ("", Selection()),
        ("none", Selection()),
        ("-1", Selection()),
    ],
)
def test_device_lists_in_every_spelling(text: str, expected: Selection) -> None:
    assert parse_devices(text) == expected


@pytest.mark.parametrize("text", ["all", "GPU-", "gpu0", "0,,1", "cuda:0"])
def test_entries_that_name_no_gpu_are_a_clear_error(text: str) -> None:
    with pytest.raises(ValueError, match="names no GPU"):
        parse_devices(text)


@given(st.text(max_size=60))
def test_any_text_parses_or_says_why(text: str) -> None:
    try:
        selection = parse_devices(text)
    except ValueError as error:
        assert "\n" not in str(error)
    else:
        assert all(u.startswith("GPU-") for u in selection.uuids)
        assert all(m.startswith("MIG-") for m in selection.migs)


def test_auto_picks_kubelet_then_visible_devices_then_all() -> None:
    k8s = resolve(
        "auto",
        pod="p",
        namespace="n",
        environ={"KUBERNETES_SERVICE_HOST": "10.0.0.1", "CUDA_VISIBLE_DEVICES": "0"},
    )
    try:
        assert isinstance(k8s, KubeletScope) and k8s.gated
    finally:
        k8s.close()
    visible = resolve("auto", pod="", namespace="", environ={"CUDA_VISIBLE_DEVICES": "GPU-aa,1"})
    assert isinstance(visible, FixedScope) and visible.source == "visible_devices"
    assert visible.selection() == Selection(uuids=("GPU-aa",), indices=frozenset({1}))
    every = resolve("auto", pod="p", namespace="n", environ={})
    assert every.selection() is None and every.gated and every.source == "all"
    node = resolve("node", pod="", namespace="", environ={})
    assert node.selection() is None and not node.gated


def test_kubelet_scope_needs_the_pod() -> None:
    with pytest.raises(ValueError, match="POD_NAME"):
        resolve("kubelet", pod="", namespace="serving", environ={})


# -- NVML: four replayed H200s -----------------------------------------------------------------


@pytest.fixture(scope="module")
def recording() -> Recording:
    return Recording.load(RECORDING)


@pytest.fixture
def node(recording: Recording) -> Iterator[Callable[..., ReplayTelemetry]]:
    """Sidecars on one node: each built with its own scope (and its own FakeNvml if given)."""
    shared = FakeNvml(recording, gpus=GPUS)
    shared.seek(60.0)
    made: list[ReplayTelemetry] = []

    def sidecar(
        scope: GpuScope, fake: FakeNvml | None = None, **options: object
    ) -> ReplayTelemetry:
        options.setdefault("watch_xids", False)
        telemetry = ReplayTelemetry(RECORDING, fake=fake or shared, scope=scope, **options)  # type: ignore[arg-type]
        made.append(telemetry)
        return telemetry

    sidecar.fake = shared  # type: ignore[attr-defined]
    yield sidecar
    for telemetry in made:
        telemetry.close()


def uuid_of(fake: FakeNvml, index: int) -> str:
    return str(fake.nvmlDeviceGetUUID(fake.nvmlDeviceGetHandleByIndex(index)))


def test_a_lost_gpu_takes_out_only_the_replica_that_uses_it(
    node: Callable[..., ReplayTelemetry],
) -> None:
    fake: FakeNvml = node.fake  # type: ignore[attr-defined]
    fake.nvmlInit()
    gpu = [uuid_of(fake, index) for index in range(GPUS)]
    broken = gpu[2]
    replicas = {index: node(FixedScope(parse_devices(str(index)))) for index in range(GPUS)}
    by_uuid = node(FixedScope(parse_devices(broken)))
    daemonset = node(GpuScope(gated=False, source="node"))
    for replica in [*replicas.values(), by_uuid, daemonset]:
        collect(replica)
    fake.lose_gpu(2)
    seen = {index: collect(replica) for index, replica in replicas.items()}
    assert [ready(replicas[i]) for i in range(GPUS)] == [True, True, False, True]
    assert uuids(collect(by_uuid)) == {broken} and not ready(by_uuid)
    for index, families in seen.items():
        assert uuids(families) == {gpu[index]}  # its own GPU's series only
        assert uuids(families, "inferwatch_gpu_healthy") == {gpu[index]}
    daemon = collect(daemonset)
    assert uuids(daemon) == set(gpu)
    assert daemonset.readiness() == []  # node-wide reading never gates
    healthy = {s.labels["gpu_uuid"]: s.value for f in daemon for s in f.samples
               if s.name == "inferwatch_gpu_healthy"}  # fmt: skip
    assert healthy[broken] == 0 and sum(healthy.values()) == GPUS - 1


def test_an_xid_on_one_gpu_fails_only_its_replica(recording: Recording) -> None:
    """Each sidecar has its own NVML event set; the driver reports the XID to each of them."""
    fakes = [FakeNvml(recording, gpus=GPUS) for _ in range(2)]
    replicas = [
        ReplayTelemetry(
            RECORDING, fake=fake, scope=FixedScope(parse_devices(str(i))), xid_wait_ms=50
        )
        for i, fake in zip((1, 3), fakes, strict=True)
    ]
    try:
        for replica in replicas:
            collect(replica)
            assert replica.watching
        for fake in fakes:
            fake.emit_xid(79, index=3)
        wait_for(lambda: not ready(replicas[1]), "the XID to fail replica 1", 10, interval=0.02)
        assert "XID 79" in replicas[1].readiness()[0].reason
        for fake in fakes:  # both watchers have taken their event off the queue
            wait_for(fake._events.empty, "the watcher to take its event", 10, interval=0.02)
        waits = [fake.calls["nvmlEventSetWait"] for fake in fakes]
        # and handled it: each has gone back to waiting for the next one
        wait_for(
            lambda: all(f.calls["nvmlEventSetWait"] > n for f, n in zip(fakes, waits, strict=True)),
            "both watchers to wait for the next event",
            10,
            interval=0.02,
        )
        assert ready(replicas[0])
        families = collect(replicas[0])
        assert "inferwatch_gpu_xid_errors_total" not in {
            s.name for f in families for s in f.samples
        }
    finally:
        for replica in replicas:
            replica.close()


def test_mig_devices_resolve_to_their_parent_gpu(recording: Recording) -> None:
    mig = "MIG-5b1e6f0a-93c2-5f4e-8d71-2a9c0b3d4e5f"
    fake = FakeNvml(recording, gpus=2, migs={mig: 1})
    telemetry = ReplayTelemetry(
        RECORDING, fake=fake, scope=FixedScope(parse_devices(mig)), watch_xids=False
    )
    try:
        assert uuids(collect(telemetry)) == {uuid_of(fake, 1)}
    finally:
        telemetry.close()


class Pending(GpuScope):
    """A kubelet scope that has not had an answer."""

    def __init__(self) -> None:
        super().__init__(gated=True, source="kubelet")

    def selection(self) -> Selection:
        raise ScopeUnknown("socket_absent", "no kubelet PodResources socket")


def test_unknown_allocation_fails_readiness_and_serves_no_gpu(
    node: Callable[..., ReplayTelemetry],
) -> None:
    telemetry = node(Pending())
    families = collect(telemetry)
    assert uuids(families) == set()
    known = [s for f in families for s in f.samples if s.name == "inferwatch_gpu_scope_known"]
    assert [(s.labels, s.value) for s in known] == [({"source": "kubelet", "gated": "true"}, 0)]
    (condition,) = telemetry.readiness()
    assert not condition.ok and "GPU allocation unknown" in condition.reason


# -- DCGM: one page with every GPU of the node -------------------------------------------------


SCRAPES = {path.stem: path.read_text() for path in sorted((SHARED / "dcgm").glob("*.prom"))}


def node_page(scrape: str, faulty: int | None = None) -> str:
    """A real scrape with each GPU sample repeated for GPUs 0-3 (derived UUIDs, pods)."""
    text = SCRAPES[scrape]
    (uuid,) = set(re.findall(r'UUID="(GPU-[^"]+)"', text))
    lines = []
    for line in text.splitlines():
        if line.startswith("#") or uuid not in line:
            lines.append(line)
            continue
        for index in range(GPUS):
            copy = line.replace(uuid, dcgm_uuid(index)).replace('gpu="0"', f'gpu="{index}"')
            copy = re.sub(r'pod="[^"]*"', f'pod="llama-{index}"', copy)
            if index == faulty and copy.startswith("DCGM_FI_DEV_ROW_REMAP_FAILURE"):
                copy = re.sub(r" \S+$", " 1", copy)
            lines.append(copy)
    return "\n".join(lines) + "\n"


def dcgm_uuid(index: int) -> str:
    return f"GPU-a8394b51-c086-568a-9f1a-c1e1c934c4{index:02x}"


@pytest.fixture(params=sorted(SCRAPES))
def dcgm_node(
    request: pytest.FixtureRequest, page_server: Any
) -> Iterator[Callable[[GpuScope], DcgmTelemetry]]:
    page_server.page = node_page(request.param, faulty=1).encode()
    made: list[DcgmTelemetry] = []

    def sidecar(scope: GpuScope) -> DcgmTelemetry:
        telemetry = DcgmTelemetry(f"{page_server.url}/page/metrics", scope=scope)
        made.append(telemetry)
        return telemetry

    yield sidecar
    for telemetry in made:
        telemetry.close()


def test_dcgm_pages_are_scoped_by_uuid_and_index(
    dcgm_node: Callable[[GpuScope], DcgmTelemetry],
) -> None:
    by_index = [dcgm_node(FixedScope(parse_devices(str(i)))) for i in range(GPUS)]
    by_uuid = dcgm_node(FixedScope(parse_devices(dcgm_uuid(1))))
    whole = dcgm_node(GpuScope(gated=False, source="node"))
    for index, replica in enumerate(by_index):
        assert uuids(collect(replica)) == {dcgm_uuid(index)}
    collect(by_uuid)
    assert [ready(r) for r in by_index] == [True, False, True, True]
    assert not ready(by_uuid) and "row remapping failed" in by_uuid.readiness()[0].reason
    assert uuids(collect(whole)) == {dcgm_uuid(i) for i in range(GPUS)}
    assert whole.readiness() == []


@pytest.mark.parametrize("dcgm_node", ["dcgm-rtx4000ada-k8s-pod"], indirect=True)  # pod labels
def test_dcgm_mig_slices_are_found_by_the_pods_labels(
    dcgm_node: Callable[[GpuScope], DcgmTelemetry],
) -> None:
    mig = parse_devices("MIG-5b1e6f0a-93c2-5f4e-8d71-2a9c0b3d4e5f")

    class OnGpu2(FixedScope):
        pod, namespace = "llama-2", "default"

    class OnGpu1(FixedScope):  # GPU 1 has the failed row remap
        pod, namespace = "llama-1", "default"

    healthy, broken = dcgm_node(OnGpu2(mig)), dcgm_node(OnGpu1(mig))
    assert uuids(collect(healthy)) == {dcgm_uuid(2)} and ready(healthy)
    assert uuids(collect(broken)) == {dcgm_uuid(1)} and not ready(broken)


# -- the sidecar's flags -----------------------------------------------------------------------


@pytest.mark.parametrize(
    ("args", "message"),
    [
        (["--gpu-scope", "cuda:0"], "names no GPU"),
        (["--gpu-scope", "kubelet", "--pod", ""], "needs the pod's name"),
    ],
)
def test_a_wrong_gpu_scope_is_one_clear_line(args: list[str], message: str) -> None:
    result = CliRunner().invoke(
        main,
        [
            "sidecar",
            "--engine-url",
            "http://127.0.0.1:9",
            "--gpu",
            "dcgm=http://127.0.0.1:9/m",
            *args,
        ],
        env={"POD_NAME": "", "POD_NAMESPACE": "serving"},
    )
    assert result.exit_code == 2 and message in result.output
    assert "Traceback" not in result.output


def test_pod_labels_are_left_to_service_discovery_in_kubernetes() -> None:
    k8s = {"KUBERNETES_SERVICE_HOST": "10.96.0.1"}
    assert not emits_pod_labels("auto", k8s) and emits_pod_labels("emit", k8s)
    assert emits_pod_labels("auto", {}) and not emits_pod_labels("omit", {})


def test_readyz_of_the_replica_on_the_lost_gpu_fails_and_no_other(
    recording: Recording, page_server: Any
) -> None:
    """Two whole sidecars on one node (one engine page, four GPUs): GPU 3 falls off the bus."""
    vllm = SHARED.parent / "engines" / "vllm-generated-0.33.0-1engine.prom"
    page_server.page = vllm.read_bytes()
    fake = FakeNvml(recording, gpus=GPUS)
    sidecars = {}
    for index in (1, 3):
        backend = ReplayTelemetry(
            RECORDING, fake=fake, scope=FixedScope(parse_devices(str(index))), watch_xids=False
        )
        engine = EngineCollector(
            EngineScraper(f"{page_server.url}/page/metrics", timeout_s=2.0), {}
        )
        sidecars[index] = Sidecar([engine, backend])

    async def node() -> tuple[str, httpx.Response, httpx.Response]:
        clients = {
            index: httpx.AsyncClient(
                transport=httpx.ASGITransport(app=sidecar.app()), base_url="http://sidecar"
            )
            for index, sidecar in sidecars.items()
        }
        try:
            for client in clients.values():
                assert (await client.get("/readyz")).status_code == 200
                await client.get("/metrics")  # discovers the node's GPUs
            fake.lose_gpu(3)
            metrics = (await clients[1].get("/metrics")).text
            await clients[3].get("/metrics")
            return metrics, await clients[1].get("/readyz"), await clients[3].get("/readyz")
        finally:
            for client in clients.values():
                await client.aclose()
            for sidecar in sidecars.values():
                await sidecar.aclose()

    metrics, healthy, broken = asyncio.run(node())
    assert healthy.status_code == 200, healthy.text
    assert broken.status_code == 503
    (gpu_condition,) = [c for c in broken.json()["conditions"] if c["name"] == "gpu"]
    assert "lost" in gpu_condition["reason"]
    assert metrics.count("inferwatch_gpu_healthy{") == 1  # its own GPU only
