"""Which GPUs the kubelet allocated to a pod, from its PodResources API (v1, gRPC).

The kubelet serves the API on a unix socket (``/var/lib/kubelet/pod-resources/kubelet.sock``;
mount the directory, not the socket, so that a kubelet restart does not leave a dead inode).
``Get`` returns one pod (kubelet 1.27+, on by default since 1.34); older kubelets answer
UNIMPLEMENTED and kubelets with the ``KubeletPodResourcesGet`` gate off answer "Get method
disabled", and then the pod is picked out of ``List``. The device ids of ``nvidia.com/gpu``
and ``nvidia.com/mig-*`` resources are what the NVIDIA device plugin allocated: GPU UUIDs
(``GPU-...``), MIG device UUIDs (``MIG-...``), with a ``::N`` suffix under time-slicing
replicas; the same rules dcgm-exporter's kubelet mapping uses.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass
from pathlib import Path

import grpc

from inferwatch.exporters.gpu import podresources_api_pb2 as api
from inferwatch.exporters.gpu.podresources_api_pb2_grpc import PodResourcesListerStub
from inferwatch.exporters.gpu.scope import KUBELET_SOCKET

#: List answers for every pod of the node; large nodes passed gRPC's 4 MiB default
#: (dcgm-exporter #509). Bounded all the same.
MAX_MESSAGE_BYTES = 16 * 1024 * 1024
GPU_RESOURCE = "nvidia.com/gpu"
MIG_RESOURCE_PREFIX = "nvidia.com/mig-"
_GET_DISABLED = "Get method disabled"


class PodResourcesError(Exception):
    """The allocation cannot be read now; ``reason`` is a short snake_case label value."""

    def __init__(self, reason: str, detail: str) -> None:
        super().__init__(detail)
        self.reason = reason
        self.detail = detail


@dataclass(frozen=True)
class Allocation:
    """The GPU device ids the kubelet allocated to one pod's containers, in kubelet order."""

    pod: str
    namespace: str
    device_ids: tuple[str, ...]


def is_gpu_resource(name: str, extra: Iterable[str] = ()) -> bool:
    return name == GPU_RESOURCE or name.startswith(MIG_RESOURCE_PREFIX) or name in extra


class PodResourcesClient:
    """One short gRPC call per lookup; the channel is not kept (lookups are rare)."""

    def __init__(
        self,
        socket: Path = KUBELET_SOCKET,
        *,
        timeout_s: float = 10.0,
        resource_names: Iterable[str] = (),
    ) -> None:
        """``resource_names`` adds GPU resources renamed by the device plugin's config."""
        self.socket = socket
        self.timeout_s = timeout_s
        self.resource_names = frozenset(resource_names)

    def allocation(self, pod: str, namespace: str) -> Allocation:
        """The pod's GPU devices; ``PodResourcesError`` saying why when they cannot be read."""
        if not self.socket.is_socket():
            raise PodResourcesError(
                "socket_absent",
                f"no kubelet PodResources socket at {self.socket} "
                "(mount the host's /var/lib/kubelet/pod-resources)",
            )
        options = [("grpc.max_receive_message_length", MAX_MESSAGE_BYTES)]
        with grpc.insecure_channel(f"unix://{self.socket}", options=options) as channel:
            stub = PodResourcesListerStub(channel)  # type: ignore[no-untyped-call]
            try:
                resources = self._get(stub, pod, namespace)
            except grpc.RpcError as error:
                raise _failure(error, pod, namespace) from None
        devices = tuple(
            device_id
            for container in resources.containers
            for devices in container.devices
            if is_gpu_resource(devices.resource_name, self.resource_names)
            for device_id in devices.device_ids
        )
        return Allocation(pod, namespace, devices)

    def _get(self, stub: PodResourcesListerStub, pod: str, namespace: str) -> api.PodResources:
        request = api.GetPodResourcesRequest(pod_name=pod, pod_namespace=namespace)
        try:
            response: api.GetPodResourcesResponse = stub.Get(request, timeout=self.timeout_s)
            return response.pod_resources
        except grpc.RpcError as error:
            if not _get_unavailable(error):
                raise
        listed: api.ListPodResourcesResponse = stub.List(
            api.ListPodResourcesRequest(), timeout=self.timeout_s
        )
        for resources in listed.pod_resources:
            if resources.name == pod and resources.namespace == namespace:
                return resources
        raise PodResourcesError("pod_not_found", f"kubelet lists no pod {namespace}/{pod}")


def _code(error: grpc.RpcError) -> grpc.StatusCode | None:
    return error.code() if isinstance(error, grpc.Call) else None


def _details(error: grpc.RpcError) -> str:
    return (error.details() or "") if isinstance(error, grpc.Call) else str(error)


def _get_unavailable(error: grpc.RpcError) -> bool:
    """Kubelets before 1.27 lack Get; with the feature gate off it says it is disabled."""
    code = _code(error)
    return code == grpc.StatusCode.UNIMPLEMENTED or (
        code == grpc.StatusCode.UNKNOWN and _GET_DISABLED in _details(error)
    )


def _failure(error: grpc.RpcError, pod: str, namespace: str) -> PodResourcesError:
    code, details = _code(error), _details(error)
    if code == grpc.StatusCode.DEADLINE_EXCEEDED:
        return PodResourcesError("timeout", f"kubelet PodResources: no answer ({details})")
    if code == grpc.StatusCode.UNKNOWN and "not found" in details:
        return PodResourcesError("pod_not_found", f"kubelet: {details}")
    name = code.name.lower() if code is not None else "error"
    return PodResourcesError(name, f"kubelet PodResources for {namespace}/{pod}: {details}")
