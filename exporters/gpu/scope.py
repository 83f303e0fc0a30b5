"""Which GPUs one replica's GPU series and readiness cover.

On a node with one replica per GPU, a fault on one GPU must take out only the replica that
uses it. The sidecar therefore scopes its GPU backend to the GPUs the engine was given:

    agent          this pod's allocation, asked of the node agent on its node (Kubernetes:
                   only the agent mounts the kubelet's socket, see ``node_agent.py``)
    kubelet        the kubelet's PodResources API for this pod (a pod that mounts its socket)
    DEVICES        an explicit list: GPU UUIDs (``GPU-...``, unique prefixes as CUDA accepts
                   them), MIG device UUIDs (``MIG-...``), indices (``0,1``), ``nvidiaN``;
                   the engine's ``CUDA_VISIBLE_DEVICES`` value can be passed as it is
    all            every GPU the sidecar sees, readiness gated (a host that runs one engine)
    node           every GPU, readiness never gated (node-wide reading, one per node)

Device ids come as the NVIDIA device plugin, CUDA and dcgm-exporter spell them: a ``::N``
time-slicing suffix is dropped, the pre-R470 ``MIG-GPU-<uuid>/<gi>/<ci>`` form and GKE's
``nvidia0/gi3`` name their parent GPU. Indices are NVML's order (PCI bus order, as
nvidia-smi numbers GPUs); CUDA numbers the same way only with CUDA_DEVICE_ORDER=PCI_BUS_ID,
so UUIDs are the safe spelling.
"""

from __future__ import annotations

import logging
import re
import threading
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING

from inferwatch.logs import log_event

if TYPE_CHECKING:  # gRPC is imported only by sidecars that ask the kubelet
    from inferwatch.exporters.gpu.node_agent import NodeAgentClient
    from inferwatch.exporters.gpu.podresources import PodResourcesClient

logger = logging.getLogger("inferwatch.gpu.scope")

KUBELET_SOCKET = Path("/var/lib/kubelet/pod-resources/kubelet.sock")
SCOPE_HELP = "agent, kubelet, all, node, or a device list (GPU-uuid, MIG-uuid, index, nvidiaN)"
_NVIDIA_N = re.compile(r"^nvidia(\d+)(?:/gi\d+)?(?:/vgpu\d+)?$")
_NO_DEVICES = frozenset({"", "none", "void", "-1"})


class ScopeUnknown(Exception):
    """The GPUs of this replica are not known yet (the kubelet did not answer)."""

    def __init__(self, reason: str, detail: str) -> None:
        super().__init__(detail)
        self.reason = reason
        self.detail = detail


@dataclass(frozen=True)
class Selection:
    """GPUs named by UUID (or unique UUID prefix), MIG device UUID or index."""

    uuids: tuple[str, ...] = ()
    migs: tuple[str, ...] = ()
    indices: frozenset[int] = frozenset()

    def covers(self, uuid: str, index: int | None, mig_parents: Mapping[str, str]) -> bool:
        """Whether the GPU ``uuid`` (at ``index``) is one of these; ``mig_parents`` maps the
        MIG device UUIDs a backend could resolve to their parent GPU's UUID."""
        return (
            any(uuid.startswith(prefix) for prefix in self.uuids)
            or (index is not None and index in self.indices)
            or any(mig_parents.get(mig) == uuid for mig in self.migs)
        )

    def __str__(self) -> str:
        names = [*self.uuids, *self.migs, *map(str, sorted(self.indices))]
        return ",".join(names) or "no GPU"


def parse_devices(text: str) -> Selection:
    """A device list as CUDA_VISIBLE_DEVICES, the device plugin or an operator writes it.

    ValueError (one line) for an entry that names no GPU.
    """
    if text.strip().lower() in _NO_DEVICES:
        return Selection()
    uuids: list[str] = []
    migs: list[str] = []
    indices: set[int] = set()
    for raw in text.split(","):
        entry = raw.strip().split("::", 1)[0]
        nvidia_n = _NVIDIA_N.match(entry)
        if entry.isascii() and entry.isdigit():
            indices.add(int(entry))
        elif nvidia_n:
            indices.add(int(nvidia_n[1]))
        elif entry.startswith("MIG-GPU-"):  # pre-R470: MIG-GPU-<uuid>/<gi>/<ci>
            uuids.append(entry.removeprefix("MIG-").split("/", 1)[0])
        elif entry.startswith("MIG-") and len(entry) > 4:
            migs.append(entry)
        elif entry.startswith("GPU-") and len(entry) > 4:
            uuids.append(entry)
        else:
            raise ValueError(f"{raw.strip()!r} names no GPU (expected {SCOPE_HELP})")
    return Selection(tuple(dict.fromkeys(uuids)), tuple(dict.fromkeys(migs)), frozenset(indices))


class GpuScope:
    """Every GPU the backend sees; ``gated`` says whether their faults fail /readyz."""

    def __init__(self, *, gated: bool = True, source: str = "all") -> None:
        self.gated = gated
        self.source = source

    def selection(self) -> Selection | None:
        """The GPUs in scope (None: every GPU); raises ``ScopeUnknown`` while not known."""
        return None

    def close(self) -> None:
        """Stop background work."""

    def __str__(self) -> str:
        return "every GPU" if self.gated else "every GPU (readiness not gated)"


class FixedScope(GpuScope):
    """The GPUs named on the command line or in the engine's CUDA_VISIBLE_DEVICES."""

    def __init__(self, selection: Selection, source: str = "flag") -> None:
        super().__init__(gated=True, source=source)
        self._selection = selection

    def selection(self) -> Selection:
        return self._selection

    def __str__(self) -> str:
        return str(self._selection)


@dataclass
class _Lookup:
    selection: Selection | None = None
    failure: ScopeUnknown = field(
        default_factory=lambda: ScopeUnknown("pending", "kubelet not asked yet")
    )


class KubeletScope(GpuScope):
    """This pod's GPUs as the kubelet allocated them, looked up on a thread of its own (from
    the kubelet itself or through the node agent: ``source`` says which).

    An allocation does not change during a pod's life, so one answer is kept for good; until
    then the lookup is retried every ``retry_s`` and the scope is unknown, which fails the GPU
    readiness condition (a sidecar that cannot tell its GPUs must not vouch for them).
    """

    def __init__(
        self,
        client: PodResourcesClient | NodeAgentClient,
        pod: str,
        namespace: str,
        *,
        retry_s: float = 15.0,
        source: str = "kubelet",
    ) -> None:
        super().__init__(gated=True, source=source)
        self.client = client
        self.pod = pod
        self.namespace = namespace
        self.retry_s = retry_s
        self._lookup = _Lookup()
        self._resolved = threading.Event()
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, name="inferwatch-gpu-scope", daemon=True)

    def start(self) -> KubeletScope:
        self._thread.start()
        return self

    def wait(self, timeout_s: float) -> bool:
        """Block until the allocation is known or ``timeout_s`` passed; True when known."""
        return self._resolved.wait(timeout_s)

    def selection(self) -> Selection:
        lookup = self._lookup
        if lookup.selection is None:
            raise ScopeUnknown(lookup.failure.reason, lookup.failure.detail)
        return lookup.selection

    def close(self) -> None:
        self._stop.set()

    def _run(self) -> None:
        from inferwatch.exporters.gpu.podresources import PodResourcesError

        last_reason = ""
        while not self._stop.is_set():
            try:
                allocation = self.client.allocation(self.pod, self.namespace)
                selection = parse_devices(",".join(allocation.device_ids))
            except Exception as error:  # a client bug must not leave the scope pending forever
                if isinstance(error, PodResourcesError):
                    reason = error.reason
                elif isinstance(error, ValueError):
                    reason = "bad_device_id"
                else:
                    reason = "error"
                    logger.exception("kubelet lookup failed")
                self._lookup = _Lookup(failure=ScopeUnknown(reason, str(error)))
                if reason != last_reason:
                    log_event(
                        logger,
                        logging.WARNING,
                        f"gpu allocation unknown; gpu readiness fails until the {self.source} "
                        "answers",
                        pod=f"{self.namespace}/{self.pod}",
                        reason=reason,
                        detail=str(error),
                    )
                    last_reason = reason
                self._stop.wait(self.retry_s)
                continue
            self._lookup = _Lookup(selection=selection)
            log_event(
                logger,
                logging.INFO,
                f"gpu allocation read from the {self.source}",
                pod=f"{self.namespace}/{self.pod}",
                devices=str(selection),
            )
            self._resolved.set()
            return

    def __str__(self) -> str:
        lookup = self._lookup
        found = str(lookup.selection) if lookup.selection is not None else "not read yet"
        via = "" if self.source == "kubelet" else f", through the node {self.source}"
        return f"kubelet allocation of {self.namespace}/{self.pod} ({found}{via})"


def covered(
    selection: Selection | None,
    devices: Iterable[tuple[str, int | None]],
    mig_parents: Mapping[str, str] | None = None,
) -> set[str]:
    """The UUIDs among ``devices`` (uuid, index) that ``selection`` covers (all for None)."""
    parents = mig_parents or {}
    return {
        uuid
        for uuid, index in devices
        if selection is None or selection.covers(uuid, index, parents)
    }


def resolve(
    value: str,
    *,
    pod: str,
    namespace: str,
    environ: Mapping[str, str],
    socket: Path = KUBELET_SOCKET,
    agent: NodeAgentClient | None = None,
) -> GpuScope:
    """The scope a ``--gpu-scope`` value names; ValueError (one line) when it is wrong.

    ``auto`` is, in a Kubernetes pod (``KUBERNETES_SERVICE_HOST`` set and the pod known from
    the downward API), the node agent's answer when ``agent`` is given, else the devices the
    NVIDIA device plugin gave this container (``NVIDIA_VISIBLE_DEVICES`` as a device list),
    else the kubelet's allocation; outside Kubernetes ``CUDA_VISIBLE_DEVICES`` when set, else
    every GPU the sidecar sees. GPU resources renamed in the device plugin's config are named
    in ``NVIDIA_RESOURCE_NAMES`` (comma-separated), as for dcgm-exporter.
    """
    value = value.strip()
    if value == "auto":
        plugin = environ.get("NVIDIA_VISIBLE_DEVICES", "").strip()
        if environ.get("KUBERNETES_SERVICE_HOST") and pod and namespace:
            if agent is not None:
                value = "agent"
            elif plugin and plugin.lower() != "all":
                return FixedScope(parse_devices(plugin), "device_plugin")
            else:
                value = "kubelet"
        elif "CUDA_VISIBLE_DEVICES" in environ:
            return FixedScope(parse_devices(environ["CUDA_VISIBLE_DEVICES"]), "visible_devices")
        else:
            value = "all"
    if value == "all":
        return GpuScope(gated=True, source="all")
    if value == "node":
        return GpuScope(gated=False, source="node")
    if value in ("kubelet", "agent") and (not pod or not namespace):
        raise ValueError(
            f"--gpu-scope {value} needs the pod's name and namespace "
            "(--pod/--namespace or the downward-API POD_NAME and POD_NAMESPACE)"
        )
    if value == "agent":
        if agent is None:
            raise ValueError(
                "--gpu-scope agent needs --node-agent-url and the node agent's token "
                "($INFERWATCH_SIDECAR_NODE_AGENT_TOKEN or --node-agent-token-file)"
            )
        return KubeletScope(agent, pod, namespace, source="agent").start()
    if value == "kubelet":
        from inferwatch.exporters.gpu.podresources import PodResourcesClient

        renamed = [name for name in environ.get("NVIDIA_RESOURCE_NAMES", "").split(",") if name]
        client = PodResourcesClient(socket, resource_names=renamed)
        return KubeletScope(client, pod, namespace).start()
    return FixedScope(parse_devices(value), "flag")
