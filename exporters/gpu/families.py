"""Collecting GPU samples by catalogue key, so NVML and DCGM share names, labels and order."""

from __future__ import annotations

from collections.abc import Mapping

from prometheus_client.core import Metric

from inferwatch import catalog


class FamilySet:
    """Samples added by catalogue key and label names; families come out in catalogue order.

    The first sample for a label set wins: dcgm-exporter repeats device-wide fields on each
    MIG instance's series, and those repeats must not become duplicate samples.
    """

    def __init__(self) -> None:
        self._catalog = catalog.load()
        self._families: dict[str, Metric] = {}
        self._seen: set[tuple[str, tuple[str, ...]]] = set()

    def add(self, key: str, value: float, labels: Mapping[str, str]) -> None:
        spec = self._catalog[key]
        unknown = set(labels) - set(spec.label_names)
        if unknown:
            raise ValueError(f"{key}: labels {sorted(unknown)} are not in the catalogue entry")
        values = tuple(labels.get(name, "") for name in spec.label_names)
        if (key, values) in self._seen:
            return
        self._seen.add((key, values))
        family = self._families.get(key)
        if family is None:
            family = self._families[key] = spec.new_family()
        family.add_metric(list(values), float(value))  # type: ignore[attr-defined]

    def families(self) -> list[Metric]:
        return [self._families[key] for key in self._catalog if key in self._families]


#: Clock event reason bits (nvmlClocksEventReason*; DCGM's throttle-reasons field uses the same).
CLOCK_EVENT_BITS: tuple[tuple[str, int], ...] = (
    ("gpu_idle", 0x1),
    ("applications_clocks_setting", 0x2),
    ("power_cap", 0x4),
    ("hw_slowdown", 0x8),
    ("sync_boost", 0x10),
    ("sw_thermal", 0x20),
    ("hw_thermal", 0x40),
    ("hw_power_brake", 0x80),
    ("display_clocks", 0x100),
)


def add_clock_events(families: FamilySet, gpu_uuid: str, mask: int, supported: int) -> None:
    """One 0/1 sample per named reason the GPU can report."""
    for reason, bit in CLOCK_EVENT_BITS:
        if supported & bit:
            labels = {"gpu_uuid": gpu_uuid, "reason": reason}
            families.add("gpu_clock_event", 1 if mask & bit else 0, labels)
