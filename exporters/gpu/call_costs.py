"""What each NVML call cost on the H200 the recording was made on, for cost benchmarks.

``FakeNvml(cost=recorded_costs(recording))`` spends, on every call, the median time the
recording measured for it, so that a benchmark of the NVML collector over the replay shows
what the same polling costs on the real GPU.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from typing import Any

import pynvml  # type: ignore[import-untyped]

from inferwatch.exporters.gpu.recording import Recording

#: Cost of a call the recording did not time (seconds); the cheap calls measured 1-6 us.
DEFAULT_COST_S = 2e-6
#: nvmlDeviceGetFieldValues for a handful of fields (reference notes, H200: 131-145 us).
FIELD_VALUES_COST_S = 140e-6

#: Seconds a call costs, given its name and arguments (after the handle).
CostModel = Callable[[str, tuple[Any, ...]], float]


def _cost_key(call: str, args: tuple[Any, ...]) -> str | None:
    """The snapshot entry that timed this call (some costs depend on the argument)."""
    by_arg: dict[str, dict[Any, str]] = {
        "nvmlDeviceGetClockInfo": {
            pynvml.NVML_CLOCK_SM: "clock_sm",
            pynvml.NVML_CLOCK_MEM: "clock_mem",
        },
        "nvmlDeviceGetMaxClockInfo": {
            pynvml.NVML_CLOCK_SM: "max_clock_sm",
            pynvml.NVML_CLOCK_MEM: "max_clock_mem",
        },
        "nvmlDeviceGetTemperatureThreshold": {
            pynvml.NVML_TEMPERATURE_THRESHOLD_SLOWDOWN: "temp_threshold_slowdown",
            pynvml.NVML_TEMPERATURE_THRESHOLD_SHUTDOWN: "temp_threshold_shutdown",
        },
    }
    if call in by_arg:
        return by_arg[call].get(args[0]) if args else None
    return _COST_KEYS.get(call)


_COST_KEYS = {
    "nvmlDeviceGetUUID": "uuid",
    "nvmlDeviceGetName": "name",
    "nvmlDeviceGetPciInfo": "pci_info",
    "nvmlDeviceGetUtilizationRates": "utilization",
    "nvmlDeviceGetMemoryInfo": "memory_info_v2",
    "nvmlDeviceGetPowerUsage": "power_usage_mw",
    "nvmlDeviceGetEnforcedPowerLimit": "enforced_power_limit_mw",
    "nvmlDeviceGetPowerManagementLimit": "power_limit_mw",
    "nvmlDeviceGetTotalEnergyConsumption": "total_energy_mj",
    "nvmlDeviceGetTemperature": "temp_gpu",
    "nvmlDeviceGetCurrentClocksEventReasons": "clocks_event_reasons",
    "nvmlDeviceGetSupportedClocksEventReasons": "supported_clocks_event_reasons",
    "nvmlDeviceGetPerformanceState": "performance_state",
    "nvmlDeviceGetEccMode": "ecc_mode",
    "nvmlDeviceGetTotalEccErrors": "ecc_corrected_volatile",
    "nvmlDeviceGetRemappedRows": "remapped_rows",
    "nvmlDeviceGetPcieReplayCounter": "pcie_replay_counter",
    "nvmlDeviceGetPcieThroughput": "pcie_tx_kbps",
    "nvmlDeviceGetCurrPcieLinkGeneration": "pcie_link_gen",
    "nvmlDeviceGetCurrPcieLinkWidth": "pcie_link_width",
    "nvmlDeviceGetComputeRunningProcesses": "compute_processes",
    "nvmlDeviceGetMigMode": "mig_mode",
    "nvmlDeviceGetPersistenceMode": "persistence_mode",
    "nvmlDeviceGetSupportedEventTypes": "supported_event_types",
}


def recorded_costs(recording: Recording) -> CostModel:
    """Per-call cost in seconds: the recording's median where it timed the call."""

    def cost(call: str, args: tuple[Any, ...]) -> float:
        if call == "nvmlDeviceGetFieldValues":
            return FIELD_VALUES_COST_S
        key = _cost_key(call, args)
        entry = recording.device.get(key) if key else None
        if entry and "us_median" in entry:
            return float(entry["us_median"]) * 1e-6
        return DEFAULT_COST_S

    return cost


def spin(seconds: float) -> None:
    """Busy-wait like a driver call does, rather than sleep (which rounds up to the tick)."""
    end = time.perf_counter() + seconds
    while time.perf_counter() < end:
        pass
