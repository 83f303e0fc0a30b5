"""An NVML recording: the snapshot of one real GPU and the time series recorded on it.

The snapshot (``nvml-snapshot.json``) holds what does not change (identity, limits,
thresholds, ECC and MIG mode, the calls that answered NotSupported, what each call cost); the
5 Hz series (``nvml-phases.json`` or ``nvml-load-series.json``) holds what does. ``FakeNvml``
(``fake_nvml``) answers pynvml calls from it.
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

SNAPSHOT = "nvml-snapshot.json"
SERIES = ("nvml-phases.json", "nvml-load-series.json")


@dataclass(frozen=True)
class SeriesRow:
    """One row of the time series, in NVML's own units."""

    t: float
    util_gpu: int
    util_memory: int
    memory: Mapping[str, int]
    power_mw: int
    temp: int
    sm_mhz: int
    mem_mhz: int
    reasons: int
    pstate: int
    processes: tuple[tuple[int, int], ...] = ()
    mem_temp: int | None = None
    energy_mj: int | None = None
    ecc_corrected: int | None = None


@dataclass(frozen=True)
class Recording:
    """An NVML recording: the snapshot of one GPU and its time series."""

    system: Mapping[str, Any]
    device: Mapping[str, Any]
    readings: tuple[SeriesRow, ...]
    hz: float

    @property
    def duration_s(self) -> float:
        return self.readings[-1].t + 1 / self.hz

    @classmethod
    def load(cls, path: Path) -> Recording:
        """A recording directory, or a series file with the snapshot next to it."""
        if path.is_dir():
            snapshot_path = path / SNAPSHOT
            series_path = next((path / n for n in SERIES if (path / n).exists()), None)
        else:
            snapshot_path = path.with_name(SNAPSHOT)
            series_path = None if path.name == SNAPSHOT else path
        snapshot = json.loads(snapshot_path.read_text(encoding="utf-8"))
        system = {k: v.get("value") for k, v in snapshot["system"].items()}
        device = snapshot["devices"][0]
        reserved = device["memory_info_v2"]["value"]["reserved"]
        readings: tuple[SeriesRow, ...] = ()
        hz = 5.0
        if series_path is not None:
            series = json.loads(series_path.read_text(encoding="utf-8"))
            hz = float(series.get("hz", hz))
            readings = tuple(_reading(row, reserved) for row in series["series"])
        if not readings:
            readings = (_snapshot_reading(device),)
        return cls(system, device, readings, hz)

    def at(self, t: float) -> SeriesRow:
        """The row in effect at ``t`` seconds into the recording, looping at the end."""
        t %= self.duration_s
        current = self.readings[0]
        for reading in self.readings:
            if reading.t > t:
                break
            current = reading
        return current

    def energy_at(self, t: float) -> int:
        """The last energy counter read at or before ``t`` (it was read at a slower rate)."""
        t %= self.duration_s
        energy = int(self.device["total_energy_mj"]["value"])
        for reading in self.readings:
            if reading.t > t:
                break
            if reading.energy_mj is not None:
                energy = reading.energy_mj
        return energy


def _reading(row: Mapping[str, Any], reserved: int) -> SeriesRow:
    if "util" in row:  # nvml-phases.json: v2 memory, processes with PIDs, memory temperature
        return SeriesRow(
            t=row["t"],
            util_gpu=row["util"]["gpu"],
            util_memory=row["util"]["memory"],
            memory=row["mem"],
            power_mw=row["power_mw"],
            temp=row["temp"],
            sm_mhz=row["sm_mhz"],
            mem_mhz=row["mem_mhz"],
            reasons=row["reasons"],
            pstate=row["pstate"],
            processes=tuple((p["pid"], p["used"]) for p in row["procs"]),
            mem_temp=row.get("mem_temp"),
            energy_mj=row.get("energy_mj"),
            ecc_corrected=row.get("ecc_corr"),
        )
    # nvml-load-series.json: v1 memory (used includes reserved); processes were not kept
    v1 = row["memory_info"]
    memory = {
        "total": v1["total"],
        "reserved": reserved,
        "used": v1["used"] - reserved,
        "free": v1["free"],
    }
    return SeriesRow(
        t=row["t"],
        util_gpu=row["utilization"]["gpu"],
        util_memory=row["utilization"]["memory"],
        memory=memory,
        power_mw=row["power_usage_mw"],
        temp=row["temp_gpu"],
        sm_mhz=row["clock_sm"],
        mem_mhz=row["clock_mem"],
        reasons=row["clocks_throttle_reasons"],
        pstate=row["performance_state"],
        energy_mj=row.get("total_energy_mj"),
    )


def _snapshot_reading(device: Mapping[str, Any]) -> SeriesRow:
    def value(key: str) -> Any:
        return device[key]["value"]

    return SeriesRow(
        t=0.0,
        util_gpu=value("utilization")["gpu"],
        util_memory=value("utilization")["memory"],
        memory=value("memory_info_v2"),
        power_mw=value("power_usage_mw"),
        temp=value("temp_gpu"),
        sm_mhz=value("clock_sm"),
        mem_mhz=value("clock_mem"),
        reasons=value("clocks_event_reasons"),
        pstate=value("performance_state"),
    )
