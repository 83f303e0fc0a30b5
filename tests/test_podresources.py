"""The kubelet PodResources client against a real gRPC server on a unix socket.

The server implements the v1 service from the same published proto, and answers the way
kubelets do: Get and List (1.27+ with the gate on), List only (older kubelets: Get is
UNIMPLEMENTED), Get disabled by the feature gate (UNKNOWN "PodResources API Get method
disabled"), an unknown pod (UNKNOWN "pod X in namespace Y not found"), and a kubelet that
does not answer.
"""

from __future__ import annotations

import subprocess
import sys
import threading
from collections.abc import Iterator
from concurrent import futures
from pathlib import Path

import grpc
import pytest

from inferwatch.exporters.gpu import podresources_api_pb2 as api
from inferwatch.exporters.gpu import podresources_api_pb2_grpc as api_grpc
from inferwatch.exporters.gpu.podresources import PodResourcesClient, PodResourcesError
from inferwatch.exporters.gpu.scope import KubeletScope, ScopeUnknown, resolve
from support.wait import wait_for

pytestmark = pytest.mark.proc

REPO = Path(__file__).resolve().parent.parent
GPU_A = "GPU-8f1c2a7e-3b4d-4e5f-9a0b-1c2d3e4f5a6b"
GPU_B = "GPU-00b2b091-2154-3d4b-55dd-be43b60b9d6a"
MIG = "MIG-5b1e6f0a-93c2-5f4e-8d71-2a9c0b3d4e5f"


def pod(name: str, namespace: str, *containers: api.ContainerResources) -> api.PodResources:
    return api.PodResources(name=name, namespace=namespace, containers=list(containers))


def container(name: str, **devices: list[str]) -> api.ContainerResources:
    """``devices`` by resource name, with ``_`` for ``.`` and ``__`` for ``/``."""
    return api.ContainerResources(
        name=name,
        devices=[
            api.ContainerDevices(
                resource_name=resource.replace("__", "/").replace("_", "."), device_ids=ids
            )
            for resource, ids in devices.items()
        ],
    )


NODE = [
    pod(
        "llama-0",
        "serving",
        container("vllm", nvidia_com__gpu=[GPU_A, GPU_B]),
        container("inferwatch-sidecar"),
    ),
    pod("llama-1", "serving", container("vllm", **{"nvidia_com__mig-1g_10gb": [MIG]})),
    pod("nic-user", "net", container("app", example_com__nic=["eth7"])),
    pod("odd", "serving", container("vllm", nvidia_com__gpu=["gpu-0x1f"])),
    pod("renamed", "serving", container("vllm", example_com__gpu=[GPU_B])),
]


class Kubelet(api_grpc.PodResourcesListerServicer):
    """The kubelet side of the API, in one of the behaviours listed in the module docstring."""

    def __init__(self, mode: str) -> None:
        self.mode = mode
        self.calls: list[str] = []
        self.release = threading.Event()

    def List(
        self, request: api.ListPodResourcesRequest, context: grpc.ServicerContext
    ) -> api.ListPodResourcesResponse:
        self.calls.append("List")
        if self.mode == "hang":
            self.release.wait(10)
        if self.mode == "huge":  # a node with more pods than any answer should carry
            crowd = [pod(f"p-{i}-{'x' * 20_000}", "crowd") for i in range(900)]
            return api.ListPodResourcesResponse(pod_resources=[*NODE, *crowd])
        return api.ListPodResourcesResponse(pod_resources=NODE)

    def Get(
        self, request: api.GetPodResourcesRequest, context: grpc.ServicerContext
    ) -> api.GetPodResourcesResponse:
        self.calls.append("Get")
        if self.mode in ("list-only", "huge"):  # a kubelet before 1.27 has no Get
            return super().Get(request, context)  # type: ignore[no-any-return]
        if self.mode == "gate-off":
            context.abort(grpc.StatusCode.UNKNOWN, "PodResources API Get method disabled")
        if self.mode == "hang":
            self.release.wait(10)
        for resources in NODE:
            if (resources.name, resources.namespace) == (request.pod_name, request.pod_namespace):
                return api.GetPodResourcesResponse(pod_resources=resources)
        context.abort(
            grpc.StatusCode.UNKNOWN,
            f"pod {request.pod_name} in namespace {request.pod_namespace} not found",
        )
        raise AssertionError("abort raises")


class Server:
    def __init__(self, socket: Path, mode: str) -> None:
        self.socket = socket
        self.kubelet = Kubelet(mode)
        self.server = grpc.server(futures.ThreadPoolExecutor(max_workers=4))
        api_grpc.add_PodResourcesListerServicer_to_server(self.kubelet, self.server)  # type: ignore[no-untyped-call]
        self.server.add_insecure_port(f"unix://{socket}")

    def start(self) -> Server:
        self.server.start()
        return self

    def stop(self) -> None:
        self.kubelet.release.set()
        self.server.stop(grace=None)


@pytest.fixture
def socket(tmp_path: Path) -> Path:
    return tmp_path / "pod-resources" / "kubelet.sock"


@pytest.fixture
def kubelet(request: pytest.FixtureRequest, socket: Path) -> Iterator[Server]:
    socket.parent.mkdir()
    server = Server(socket, getattr(request, "param", "full")).start()
    yield server
    server.stop()


@pytest.mark.parametrize("kubelet", ["full", "list-only", "gate-off"], indirect=True)
def test_the_pods_gpu_devices_whatever_the_kubelet_version(kubelet: Server, socket: Path) -> None:
    client = PodResourcesClient(socket, timeout_s=5)
    allocation = client.allocation("llama-0", "serving")
    assert allocation.device_ids == (GPU_A, GPU_B)
    assert client.allocation("llama-1", "serving").device_ids == (MIG,)  # nvidia.com/mig-*
    assert client.allocation("nic-user", "net").device_ids == ()  # not a GPU resource
    expected = ["Get"] * 3 if kubelet.kubelet.mode == "full" else ["Get", "List"] * 3
    assert kubelet.kubelet.calls == expected


def test_renamed_gpu_resources_are_counted_when_named(kubelet: Server, socket: Path) -> None:
    client = PodResourcesClient(socket, timeout_s=5, resource_names=["example.com/nic"])
    assert client.allocation("nic-user", "net").device_ids == ("eth7",)


@pytest.mark.parametrize("kubelet", ["full", "list-only"], indirect=True)
def test_a_pod_the_kubelet_does_not_know(kubelet: Server, socket: Path) -> None:
    with pytest.raises(PodResourcesError) as failure:
        PodResourcesClient(socket, timeout_s=5).allocation("gone-7", "serving")
    assert failure.value.reason == "pod_not_found"
    assert "gone-7" in failure.value.detail


def test_no_socket_says_what_to_mount(socket: Path) -> None:
    with pytest.raises(PodResourcesError) as failure:
        PodResourcesClient(socket).allocation("llama-0", "serving")
    assert failure.value.reason == "socket_absent"
    assert "/var/lib/kubelet/pod-resources" in failure.value.detail


@pytest.mark.parametrize("kubelet", ["hang"], indirect=True)
def test_a_kubelet_that_does_not_answer_times_out(kubelet: Server, socket: Path) -> None:
    with pytest.raises(PodResourcesError) as failure:
        PodResourcesClient(socket, timeout_s=0.3).allocation("llama-0", "serving")
    assert failure.value.reason == "timeout"


def test_kubelet_scope_is_unknown_until_the_kubelet_answers(socket: Path) -> None:
    scope = KubeletScope(
        PodResourcesClient(socket, timeout_s=5), "llama-0", "serving", retry_s=0.05
    )
    scope.start()
    server = None
    try:
        with pytest.raises(ScopeUnknown) as unknown:
            scope.selection()
        assert unknown.value.reason in ("pending", "socket_absent")
        socket.parent.mkdir()
        server = Server(socket, "full").start()
        assert scope.wait(10), "the scope never resolved once the kubelet answered"
        assert scope.selection().uuids == (GPU_A, GPU_B)
    finally:
        scope.close()
        if server is not None:
            server.stop()


def test_committed_stubs_match_the_proto() -> None:
    checked = subprocess.run(
        [sys.executable, str(REPO / "scripts" / "generate-podresources"), "--check"],
        capture_output=True,
        text=True,
        check=False,
    )
    assert checked.returncode == 0, checked.stderr


def test_a_device_id_that_names_no_gpu_keeps_the_scope_unknown(
    kubelet: Server, socket: Path
) -> None:
    """Fail closed: readiness must not pass on GPUs the sidecar could not identify."""
    scope = KubeletScope(PodResourcesClient(socket, timeout_s=5), "odd", "serving", retry_s=0.05)
    scope.start()
    try:
        calls = kubelet.kubelet.calls
        wait_for(
            lambda: calls.count("Get") >= 2, "the scope to ask the kubelet again", 10, interval=0.01
        )
        with pytest.raises(ScopeUnknown) as unknown:
            scope.selection()
        assert unknown.value.reason == "bad_device_id" and "gpu-0x1f" in unknown.value.detail
    finally:
        scope.close()


def test_resources_renamed_in_the_device_plugin_come_from_the_environment(
    kubelet: Server, socket: Path
) -> None:
    environ = {"NVIDIA_RESOURCE_NAMES": "example.com/gpu", "KUBERNETES_SERVICE_HOST": "10.0.0.1"}
    scope = resolve("auto", pod="renamed", namespace="serving", environ=environ, socket=socket)
    try:
        assert isinstance(scope, KubeletScope) and scope.wait(10)
        assert scope.selection().uuids == (GPU_B,)
    finally:
        scope.close()


@pytest.mark.parametrize("kubelet", ["huge"], indirect=True)
def test_an_oversized_answer_is_refused_with_a_reason(kubelet: Server, socket: Path) -> None:
    with pytest.raises(PodResourcesError) as failure:
        PodResourcesClient(socket, timeout_s=10).allocation("llama-0", "serving")
    assert failure.value.reason == "resource_exhausted"
