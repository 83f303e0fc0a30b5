"""GPU reset on request: the node agent's half of the receiver's ``kubernetes_request_gpu_reset``.

The receiver cannot reset a GPU (that needs root on the node and the GPU idle), so it writes
the request on the node: the annotation ``gpu-reset.inferwatch.io/<GPU UUID>`` and the label
``inferwatch.io/gpu-reset-requested=true`` (``runbooks/actions/gpu_reset_request.py``). The
node agent carries it out, one GPU at a time:

1. drain: every replica the GPU was given is isolated through its sidecar's
   ``/admin/isolation`` (its ``/readyz`` fails, so routers stop sending it requests);
2. wait until no process holds the GPU (NVML's running compute processes); a request whose
   GPU is still held stays pending and is looked at again on the next pass;
3. reset it with ``nvidia-smi --gpu-reset -i <UUID>`` (NVML's Python binding has no reset);
4. verify through the GPU backend that it came back healthy (found again, no uncorrectable
   volatile ECC error, no failed row remap);
5. clear the request (the label too when it was the last), and lift the isolation it made.

Only a request that names a GPU of this node (a UUID its GPU backend lists) is carried out:
any other key under the prefix (``/0``, ``/all``, another node's GPU) is ignored, counted and
said in one line, once while it stays, and the node's real requests are handled in the same
pass; no such key ever reaches ``nvidia-smi -i``.

Guards: one reset at a time per node; a cooldown per GPU after each attempt, so a GPU whose
reset fails is not reset in a loop; dry-run (drain nothing, reset nothing: each decision is
only logged). Every decision is one audit line (``gpu reset``, JSON when not on a terminal).
A reset that fails, or a GPU that does not come back healthy, leaves the request in place
and the replicas isolated: that is for a person.

:data:`~inferwatch.nodeagent.kube_facts.GPU_RESET_RULES` is every Kubernetes API call the
agent makes, nothing more: the kit's ClusterRole for the node agent (``inferwatch generate
k8s``, ``automation.gpu_reset``) is generated from it.
"""

from __future__ import annotations

import asyncio
import json
import logging
import shutil
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any, Protocol

import httpx

from inferwatch.logs import log_event

logger = logging.getLogger("inferwatch.node_agent.reset")

#: the receiver's request, as runbooks/actions/gpu_reset_request.py writes it
PREFIX = "gpu-reset.inferwatch.io/"
REQUESTED = "inferwatch.io/gpu-reset-requested"
MERGE_PATCH = "application/merge-patch+json"
#: the label every pod with an inferwatch sidecar carries (inferwatch/k8s/inject.py, the kit)
SIDECAR_LABEL = "inferwatch.io/sidecar"
#: seconds between two looks at the node's requests
DEFAULT_INTERVAL_S = 10.0
#: seconds before a GPU may be reset again, after any attempt
DEFAULT_COOLDOWN_S = 600.0
#: seconds ``nvidia-smi --gpu-reset`` may take
RESET_TIMEOUT_S = 120.0
#: how much of nvidia-smi's output an audit line keeps
OUTPUT_LIMIT = 2000
#: how much of an ignored request's key a log line keeps
KEY_LIMIT = 100


class NodeRequests(Protocol):
    """The node's reset requests: read them, clear one."""

    def pending(self) -> dict[str, dict[str, Any]]:
        """GPU UUID -> the request (xid, reason, fingerprint, requested_at)."""
        ...

    def clear(self, gpu_uuid: str) -> None: ...


class Gpus(Protocol):
    """What the agent asks the GPU backend."""

    def uuids(self) -> set[str]:
        """The UUIDs of this node's GPUs: the only ones a request may name."""
        ...

    def holders(self, gpu_uuid: str) -> list[int]:
        """PIDs of the processes using the GPU."""
        ...

    def unhealthy(self, gpu_uuid: str) -> str:
        """Why the GPU is not healthy ("" when it is)."""
        ...


class Replicas(Protocol):
    """The sidecars of the replicas a GPU was given (their ``/admin/isolation`` URLs)."""

    def holding(self, gpu_uuid: str) -> list[str]: ...


class Allocations(Protocol):
    """The kubelet's PodResources client (``exporters/gpu/podresources.py``)."""

    def allocation(self, pod: str, namespace: str) -> Any: ...


class KubeletReplicas:
    """The replicas on this node that were given a GPU: the pods on the node labelled as
    carrying an inferwatch sidecar (Kubernetes API, ``pods`` list), each looked up in the
    kubelet's allocations; their sidecars listen on the pod's IP."""

    def __init__(self, api: Any, kubelet: Allocations, node: str, port: int = 9400) -> None:
        from kubernetes import client

        self._core = client.CoreV1Api(api)
        self._api = api
        self._kubelet = kubelet
        self.node = node
        self.port = port

    def holding(self, gpu_uuid: str) -> list[str]:
        listed = self._core.list_pod_for_all_namespaces(
            field_selector=f"spec.nodeName={self.node}", label_selector=f"{SIDECAR_LABEL}=true"
        )
        urls = []
        for pod in self._api.sanitize_for_serialization(listed).get("items", []):
            metadata, ip = pod["metadata"], (pod.get("status") or {}).get("podIP")
            allocation = self._kubelet.allocation(metadata["name"], metadata["namespace"])
            if gpu_uuid in allocation.device_ids and ip:
                urls.append(f"http://{ip}:{self.port}/admin/isolation")
        return sorted(urls)


def in_cluster() -> Any:
    """A Kubernetes API client with the pod's service account (``ValueError``: not in a pod)."""
    from kubernetes import client, config

    configuration = client.Configuration()
    try:
        config.load_incluster_config(client_configuration=configuration)  # type: ignore[no-untyped-call]
    except config.ConfigException as exc:
        raise ValueError(f"kubernetes client configuration: {exc}") from None
    return client.ApiClient(configuration)


class KubernetesNode:
    """The requests on one node, through the Kubernetes API (``nodes`` get and patch)."""

    def __init__(self, api: Any, node: str) -> None:
        from kubernetes import client

        self._core = client.CoreV1Api(api)
        self._api = api
        self.node = node

    def _metadata(self) -> dict[str, Any]:
        read = self._api.sanitize_for_serialization(self._core.read_node(self.node))
        metadata: dict[str, Any] = read.get("metadata") or {}
        return metadata

    def pending(self) -> dict[str, dict[str, Any]]:
        found = {}
        for key, value in (self._metadata().get("annotations") or {}).items():
            if key.startswith(PREFIX):
                try:
                    request = json.loads(value)
                except ValueError:
                    request = {}
                found[key.removeprefix(PREFIX)] = request if isinstance(request, dict) else {}
        return found

    def clear(self, gpu_uuid: str) -> None:
        metadata = self._metadata()
        others = [
            key for key in metadata.get("annotations") or {}
            if key.startswith(PREFIX) and key != PREFIX + gpu_uuid
        ]  # fmt: skip
        patch: dict[str, Any] = {
            "resourceVersion": metadata.get("resourceVersion"),
            "annotations": {PREFIX + gpu_uuid: None},
        }
        if not others:
            patch["labels"] = {REQUESTED: None}
        self._core.patch_node(self.node, {"metadata": patch}, _content_type=MERGE_PATCH)


class NvmlGpus:
    """The GPU backend's answers, from an NVML driver (``pynvml``, or the replay's fake)."""

    def __init__(self, nvml: Any) -> None:
        self._nvml = nvml

    def _handle(self, gpu_uuid: str) -> Any:
        return self._nvml.nvmlDeviceGetHandleByUUID(gpu_uuid)

    def uuids(self) -> set[str]:
        nvml = self._nvml
        handles = (nvml.nvmlDeviceGetHandleByIndex(i) for i in range(nvml.nvmlDeviceGetCount()))
        return {str(nvml.nvmlDeviceGetUUID(handle)) for handle in handles}

    def holders(self, gpu_uuid: str) -> list[int]:
        processes = self._nvml.nvmlDeviceGetComputeRunningProcesses(self._handle(gpu_uuid))
        return sorted(int(p.pid) for p in processes)

    def unhealthy(self, gpu_uuid: str) -> str:
        nvml = self._nvml
        try:
            handle = self._handle(gpu_uuid)
            ecc = nvml.nvmlDeviceGetTotalEccErrors(
                handle, nvml.NVML_MEMORY_ERROR_TYPE_UNCORRECTED, nvml.NVML_VOLATILE_ECC
            )
            failed_remap = nvml.nvmlDeviceGetRemappedRows(handle)[3]
        except nvml.NVMLError as exc:
            return f"not readable after the reset: {exc}"
        if ecc > 0:
            return f"{ecc} uncorrectable ECC errors since the reset"
        if failed_remap:
            return "a row remap failed"
        return ""


@dataclass
class Attempt:
    """What one pass did with one request (for the audit line and the tests)."""

    gpu_uuid: str
    decision: str  # reset, dry_run, waiting, cooldown, failed
    detail: str = ""


class ResetAgent:
    """Carries out the node's GPU reset requests, one at a time (see the module text)."""

    def __init__(
        self,
        node: str,
        requests: NodeRequests,
        gpus: Gpus,
        replicas: Replicas,
        sidecar_token: str,
        *,
        dry_run: bool = False,
        cooldown_s: float = DEFAULT_COOLDOWN_S,
        clock: Callable[[], float] = time.monotonic,
        timeout_s: float = RESET_TIMEOUT_S,
    ) -> None:
        self.node = node
        self.requests = requests
        self.gpus = gpus
        self.replicas = replicas
        self.dry_run = dry_run
        self.cooldown_s = cooldown_s
        self.clock = clock
        self.timeout_s = timeout_s
        self._token = sidecar_token
        self._last: dict[str, float] = {}  # GPU UUID -> when a reset was last tried
        self._busy = asyncio.Lock()
        self._ignoring: set[str] = set()  # keys naming no GPU here, said once while they stay
        #: requests ignored since start, each once while it stays (a metric)
        self.ignored_total = 0

    async def run_once(self) -> list[Attempt]:
        """One pass over the pending requests, oldest first; at most one reset runs."""
        if self._busy.locked():
            return []
        async with self._busy:
            pending = await asyncio.to_thread(self.requests.pending)
            ours = await asyncio.to_thread(self.gpus.uuids)
            self._ignore({key for key in pending if key not in ours})
            pending = {key: request for key, request in pending.items() if key in ours}
            order = sorted(pending, key=lambda u: (str(pending[u].get("requested_at", "")), u))
            attempts = []
            for gpu_uuid in order:
                attempt = await self._one(gpu_uuid, pending[gpu_uuid])
                self._audit(attempt, pending[gpu_uuid])
                attempts.append(attempt)
                if attempt.decision in ("reset", "failed"):
                    break  # one reset per pass: the next waits for the next pass
            return attempts

    def _ignore(self, foreign: set[str]) -> None:
        """Count and say each request for no GPU of this node, once while it stays."""
        for key in sorted(foreign - self._ignoring):
            self.ignored_total += 1
            log_event(
                logger, logging.WARNING, "gpu reset request ignored", node=self.node,
                gpu_uuid=key[:KEY_LIMIT], reason="not a GPU of this node",
            )  # fmt: skip
        self._ignoring = foreign

    async def _one(self, gpu_uuid: str, request: Mapping[str, Any]) -> Attempt:
        last = self._last.get(gpu_uuid)
        if last is not None and self.clock() - last < self.cooldown_s:
            ago = self.clock() - last
            return Attempt(gpu_uuid, "cooldown", f"tried {ago:.0f}s ago ({self.cooldown_s:g}s)")
        sidecars = await asyncio.to_thread(self.replicas.holding, gpu_uuid)
        if self.dry_run:
            return Attempt(gpu_uuid, "dry_run", f"would drain {sidecars} and reset")
        fingerprint = f"gpu-reset:{gpu_uuid}"
        drained = await self._isolate(sidecars, fingerprint, request)
        if drained:
            return Attempt(gpu_uuid, "failed", drained)
        holders = await asyncio.to_thread(self.gpus.holders, gpu_uuid)
        if holders:
            return Attempt(gpu_uuid, "waiting", f"held by PIDs {holders}")
        self._last[gpu_uuid] = self.clock()
        failed = await self._reset(gpu_uuid)
        if failed:
            return Attempt(gpu_uuid, "failed", failed)
        unhealthy = await asyncio.to_thread(self.gpus.unhealthy, gpu_uuid)
        if unhealthy:
            return Attempt(gpu_uuid, "failed", f"reset, but {unhealthy}")
        await asyncio.to_thread(self.requests.clear, gpu_uuid)
        lifted = await self._lift(sidecars, fingerprint)
        return Attempt(gpu_uuid, "reset", "healthy; request cleared" + lifted)

    async def _isolate(
        self, sidecars: Sequence[str], fingerprint: str, request: Mapping[str, Any]
    ) -> str:
        """Isolate every replica of the GPU; the first refusal, or ""."""
        reason = f"GPU reset requested: {request.get('reason', '')}"[:256]
        async with self._client() as http:
            for url in sidecars:
                try:
                    reply = await http.post(
                        url, json={"reason": reason, "fingerprint": fingerprint}
                    )
                except httpx.HTTPError as exc:
                    return f"cannot drain {url}: {type(exc).__name__}"
                if reply.status_code not in (200, 409):  # 409: isolated for another alert
                    return f"cannot drain {url}: HTTP {reply.status_code}"
        return ""

    async def _lift(self, sidecars: Sequence[str], fingerprint: str) -> str:
        """Lift the isolation this agent made; what could not be lifted, for the audit."""
        left = []
        async with self._client() as http:
            for url in sidecars:
                try:
                    reply = await http.delete(url, params={"fingerprint": fingerprint})
                    ok = reply.status_code in (200, 409)  # 409: another alert holds it
                except httpx.HTTPError:
                    ok = False
                if not ok:
                    left.append(url)
        return f"; still isolated: {left}" if left else ""

    def _client(self) -> httpx.AsyncClient:
        return httpx.AsyncClient(
            timeout=5.0, headers={"authorization": f"Bearer {self._token}"}
        )

    async def _reset(self, gpu_uuid: str) -> str:
        """Run ``nvidia-smi --gpu-reset -i UUID``; why it failed, or ""."""
        binary = shutil.which("nvidia-smi")
        if binary is None:
            return "nvidia-smi is not on the PATH"
        process = await asyncio.create_subprocess_exec(
            binary, "--gpu-reset", "-i", gpu_uuid,
            stdout=asyncio.subprocess.PIPE, stderr=asyncio.subprocess.STDOUT,
        )  # fmt: skip
        try:
            async with asyncio.timeout(self.timeout_s):
                output, _ = await process.communicate()
        except TimeoutError:
            process.kill()
            await process.wait()
            return f"nvidia-smi --gpu-reset did not finish in {self.timeout_s:g}s"
        if process.returncode != 0:
            shown = " ".join(output.decode(errors="replace").split())[:OUTPUT_LIMIT]
            return f"nvidia-smi --gpu-reset exited {process.returncode}: {shown}"
        return ""

    async def run(self, interval_s: float = DEFAULT_INTERVAL_S) -> None:
        """Look at the node's requests every ``interval_s``, until cancelled; a pass that
        fails (the API or the kubelet unreachable) is logged and the next one tries again."""
        while True:
            try:
                await self.run_once()
            except Exception as exc:  # any failure must cost one pass only
                log_event(
                    logger, logging.ERROR, "gpu reset pass failed", node=self.node,
                    error=f"{type(exc).__name__}: {exc}"[:OUTPUT_LIMIT],
                )  # fmt: skip
            await asyncio.sleep(interval_s)

    def _audit(self, attempt: Attempt, request: Mapping[str, Any]) -> None:
        level = logging.ERROR if attempt.decision == "failed" else logging.INFO
        log_event(
            logger, level, "gpu reset", node=self.node, gpu_uuid=attempt.gpu_uuid,
            decision=attempt.decision, detail=attempt.detail, dry_run=self.dry_run,
            fingerprint=request.get("fingerprint", ""), xid=request.get("xid", ""),
        )  # fmt: skip
