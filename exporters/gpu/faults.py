"""What makes a GPU unhealthy, and why: one set of rules for every GPU backend.

A backend reads values by catalogue key (NVML calls and dcgm-exporter fields land on the same
keys), so the rules are written against keys and labels: an uncorrectable volatile ECC count
above zero, or a failed row remap, takes the GPU out of service. XIDs (see ``xid``) and a GPU
that vanishes (the backend notices) are the other reasons. ``FaultBook`` latches them.
"""

from __future__ import annotations

import threading
from collections.abc import Callable, Iterable, Mapping

from inferwatch.exporters.gpu.families import FamilySet
from inferwatch.serving.readiness import Condition

#: Why a GPU is out of service: one ``inferwatch_gpu_fault_active`` series each, always
#: present, so that a fault flips a value and never starts a new series.
FAULT_REASONS = ("xid", "ecc_uncorrected", "row_remap_failed", "lost")


def fault_in(key: str, labels: Mapping[str, str], value: float) -> tuple[str, str] | None:
    """The fault a reading shows, as (reason, detail); None for a reading of a healthy GPU."""
    if value <= 0:
        return None
    if key == "gpu_ecc_errors" and (labels.get("error"), labels.get("scope")) == (
        "uncorrected",
        "volatile",
    ):
        return "ecc_uncorrected", f"{value:.0f} uncorrectable ECC errors since the driver loaded"
    if key == "gpu_row_remap_failed":
        return "row_remap_failed", "row remapping failed"
    return None


class FaultBook:
    """GPU faults that take a GPU out of service, latched until the process restarts.

    A GPU that needed a reset or a node reboot stays unready after the symptom fades (the
    volatile ECC count does not drop, an XID is an event): only the repair, which restarts
    the pods on the node, clears it. Written from poll and event threads, read by /readyz.
    """

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._faults: dict[str, dict[str, str]] = {}

    def mark(self, gpu_uuid: str, reason: str, detail: str) -> bool:
        """Record a fault; True when it is new (so the caller logs it once)."""
        if reason not in FAULT_REASONS:
            raise ValueError(f"fault reason {reason!r} is not one of {FAULT_REASONS}")
        with self._lock:
            reasons = self._faults.setdefault(gpu_uuid, {})
            if reason in reasons:
                return False
            reasons[reason] = detail
            return True

    def faults(self) -> dict[str, dict[str, str]]:
        with self._lock:
            return {uuid: dict(reasons) for uuid, reasons in self._faults.items()}

    def fill(self, families: FamilySet, gpu_uuids: Iterable[str]) -> None:
        """``inferwatch_gpu_healthy`` and the per-reason fault series for ``gpu_uuids``."""
        faults = self.faults()
        for uuid in sorted(set(gpu_uuids)):
            reasons = faults.get(uuid, {})
            families.add("gpu_healthy", 0 if reasons else 1, {"gpu_uuid": uuid})
            for reason in FAULT_REASONS:
                labels = {"gpu_uuid": uuid, "reason": reason}
                families.add("gpu_fault", int(reason in reasons), labels)

    def condition(self, in_scope: Callable[[str], bool] = lambda uuid: True) -> Condition:
        """Not ok while a GPU in scope has a fault."""
        faults = {uuid: r for uuid, r in self.faults().items() if in_scope(uuid)}
        if not faults:
            return Condition(name="gpu", ok=True)
        reason = "; ".join(
            f"{uuid}: {detail}"
            for uuid, reasons in sorted(faults.items())
            for _, detail in sorted(reasons.items())
        )
        return Condition(name="gpu", ok=False, reason=reason)
