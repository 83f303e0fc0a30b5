"""Which Kubernetes pod and container a host process belongs to, from /proc/<pid>/cgroup.

NVML lists the processes holding GPU memory by host PID. The kubelet puts every container in
a cgroup whose path carries the pod UID and the container id, in one of these shapes:

    cgroup v1/v2, cgroupfs driver   .../kubepods/burstable/pod<uid>/<container id>
    cgroup v1/v2, systemd driver    .../kubepods-burstable-pod<uid_with_underscores>.slice/
                                        cri-containerd-<id>.scope  (or docker-, crio-)
    containerd, systemd cgroups     .../kubepods-besteffort-pod<uid>.slice:cri-containerd:<id>

Guaranteed pods have no QoS level in the path. Paths may sit under a prefix (kind's
kubelet.slice, a nested /docker/<id>/). The sidecar needs hostPID to see these files.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from pathlib import Path

_POD = re.compile(
    r"pod(?P<uid>[0-9a-f]{8}[-_][0-9a-f]{4}[-_][0-9a-f]{4}[-_][0-9a-f]{4}[-_][0-9a-f]{12})"
    r"(?:\.slice)?(?P<rest>[/:].*)?$"
)
_CONTAINER = re.compile(
    r"^(?:(?:cri-containerd|docker|crio|cri-o|containerd)[-:])?(?P<id>[0-9a-f]{64})(?:\.scope)?$"
)


@dataclass(frozen=True)
class PodRef:
    pod_uid: str
    container_id: str = ""


NOT_IN_A_POD = PodRef("", "")


def parse_cgroup(text: str) -> PodRef:
    """The pod and container of the first kubepods line in a /proc/<pid>/cgroup file."""
    for line in text.splitlines():
        parts = line.split(":", 2)
        if len(parts) != 3 or "kubepods" not in parts[2]:
            continue
        match = _POD.search(parts[2])
        if match is None:
            continue
        uid = match["uid"].replace("_", "-")
        return PodRef(uid, _container_id(match["rest"] or ""))
    return NOT_IN_A_POD


def _container_id(rest: str) -> str:
    """The container id after the pod segment; empty for the pod's own cgroup or conmon."""
    segments = [s for s in rest.split("/") if s]
    if not segments:
        return ""
    last = segments[-1]
    if last.startswith(":"):  # "...pod<uid>.slice:cri-containerd:<id>"
        last = last[1:]
    match = _CONTAINER.match(last)
    return match["id"] if match else ""


class ProcessAttribution:
    """PID -> pod lookups with a cache that forgets PIDs no longer holding GPU memory.

    ``proc_root`` None turns attribution off (replayed PIDs belong to another machine).
    """

    def __init__(self, proc_root: Path | None = Path("/proc")) -> None:
        self.proc_root = proc_root
        self._cache: dict[int, PodRef] = {}

    def lookup(self, pid: int) -> PodRef:
        cached = self._cache.get(pid)
        if cached is not None:
            return cached
        ref = NOT_IN_A_POD
        if self.proc_root is not None:
            try:
                text = (self.proc_root / str(pid) / "cgroup").read_text(encoding="utf-8")
            except OSError:  # gone already, or not visible without hostPID
                return NOT_IN_A_POD
            ref = parse_cgroup(text)
        self._cache[pid] = ref
        return ref

    def retain(self, pids: set[int]) -> None:
        """Drop cached PIDs that are gone, so a reused PID is looked up afresh."""
        for pid in self._cache.keys() - pids:
            del self._cache[pid]
