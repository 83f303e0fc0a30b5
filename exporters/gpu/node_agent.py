"""A replica's GPU allocation, asked of the node agent on its node (``inferwatch node-agent``).

Only the node agent, a DaemonSet in a namespace of its own, mounts the kubelet's PodResources
socket (a hostPath, which the Pod Security "baseline" level forbids in an inference pod). It
answers ``GET /v1/pods/NAMESPACE/POD/gpus`` with the device ids the kubelet allocated to that
pod, to callers that present the shared bearer token. The sidecar asks through a Service with
``internalTrafficPolicy: Local``, so the request stays on its node; the answer names the
node, and an answer from another node is refused (its devices would be another host's).

Everything is bounded: the connection and read time, the body's bytes, the number and length
of device ids. A wrong, late or malformed answer is a :class:`PodResourcesError` with a short
reason, which keeps the scope unknown and the GPU readiness condition failing (fail closed).
"""

from __future__ import annotations

import json
import re
from typing import Any

import httpx

from inferwatch.exporters.gpu.podresources import Allocation, PodResourcesError

__all__ = ["MAX_BODY_BYTES", "MAX_DEVICES", "NodeAgentClient", "allocation_path", "parse_answer"]

#: an answer for one pod: a few device ids and names
MAX_BODY_BYTES = 64 * 1024
#: more GPUs than any node holds, MIG slices and time-slicing replicas included
MAX_DEVICES = 256
MAX_DEVICE_ID = 128
#: a namespace is a DNS label, a pod name a DNS subdomain
NAMESPACE = re.compile(r"[a-z0-9]([-a-z0-9]{0,61}[a-z0-9])?")
POD = re.compile(r"[a-z0-9]([-a-z0-9.]{0,251}[a-z0-9])?")


def allocation_path(namespace: str, pod: str) -> str:
    """The agent's path for one pod's GPUs; ValueError for a name Kubernetes would refuse."""
    if not NAMESPACE.fullmatch(namespace) or not POD.fullmatch(pod):
        raise ValueError(f"{namespace!r}/{pod!r} is not a Kubernetes namespace and pod name")
    return f"/v1/pods/{namespace}/{pod}/gpus"


def parse_answer(body: Any, *, node: str, namespace: str, pod: str) -> Allocation:
    """The allocation in an agent's JSON answer, checked field by field."""
    if not isinstance(body, dict):
        raise PodResourcesError("bad_answer", "node agent: the answer is not a JSON object")
    if body.get("namespace") != namespace or body.get("pod") != pod:
        raise PodResourcesError(
            "bad_answer", f"node agent answered for {body.get('namespace')}/{body.get('pod')}"
        )
    if node and body.get("node") != node:
        raise PodResourcesError(
            "wrong_node",
            f"node agent on {body.get('node')!r} answered for a pod on {node!r} "
            "(its Service needs internalTrafficPolicy: Local)",
        )
    devices = body.get("device_ids")
    if (
        not isinstance(devices, list)
        or len(devices) > MAX_DEVICES
        or not all(isinstance(d, str) and 0 < len(d) <= MAX_DEVICE_ID for d in devices)
    ):
        raise PodResourcesError(
            "bad_answer",
            f"node agent: device_ids must be a list of at most {MAX_DEVICES} ids "
            f"of 1 to {MAX_DEVICE_ID} characters",
        )
    return Allocation(pod, namespace, tuple(devices))


class NodeAgentClient:
    """The same face as the kubelet's client (``allocation``), asking the node agent."""

    def __init__(
        self,
        url: str,
        token: str,
        node: str,
        *,
        timeout_s: float = 10.0,
        transport: httpx.BaseTransport | None = None,
    ) -> None:
        """``node`` is this pod's node (downward API); empty skips the node check."""
        self.url = url.rstrip("/")
        self.node = node
        self._headers = {"Authorization": f"Bearer {token}", "Accept": "application/json"}
        self._timeout = httpx.Timeout(timeout_s)
        self._transport = transport

    def allocation(self, pod: str, namespace: str) -> Allocation:
        """The pod's GPU device ids; ``PodResourcesError`` saying why when they cannot be read."""
        try:
            path = allocation_path(namespace, pod)
        except ValueError as exc:
            raise PodResourcesError("bad_pod", str(exc)) from None
        body = self._get(path)
        try:
            answer = json.loads(body)
        except ValueError:
            raise PodResourcesError("bad_answer", "node agent: the answer is not JSON") from None
        return parse_answer(answer, node=self.node, namespace=namespace, pod=pod)

    def _get(self, path: str) -> bytes:
        client = httpx.Client(
            timeout=self._timeout, transport=self._transport, follow_redirects=False
        )
        try:
            with client, client.stream("GET", self.url + path, headers=self._headers) as response:
                body = _read_bounded(response)
        except httpx.TimeoutException:
            raise PodResourcesError("timeout", f"node agent {self.url}: no answer") from None
        except httpx.HTTPError as exc:
            raise PodResourcesError("unreachable", f"node agent {self.url}: {exc}") from None
        if response.status_code != 200:
            raise PodResourcesError(_reason(response.status_code, body), _detail(response, body))
        return body


def _read_bounded(response: httpx.Response) -> bytes:
    chunks: list[bytes] = []
    size = 0
    for chunk in response.iter_bytes():
        size += len(chunk)
        if size > MAX_BODY_BYTES:
            raise PodResourcesError(
                "too_large", f"node agent: answer over the {MAX_BODY_BYTES}-byte cap"
            )
        chunks.append(chunk)
    return b"".join(chunks)


def _reason(status: int, body: bytes) -> str:
    """The agent's own reason where it gave one (``pod_not_found``, ``timeout``, ...)."""
    if status in (401, 403):
        return "unauthorized"
    try:
        reason = json.loads(body).get("reason")
    except (ValueError, AttributeError):
        reason = None
    if isinstance(reason, str) and re.fullmatch(r"[a-z_]{1,32}", reason):
        return reason
    return f"http_{status}"


def _detail(response: httpx.Response, body: bytes) -> str:
    text = body[:200].decode("utf-8", "replace").strip()
    return f"node agent {response.url.path}: HTTP {response.status_code} {text}"
