"""A fake NVML driver: a module shaped like ``pynvml`` answering from a real recording.

``FakeNvml`` answers the pynvml calls the NVML collector makes with the values recorded on an
NVIDIA H200: the snapshot supplies what does not change (identity, limits, thresholds, ECC
and MIG mode, the calls that answered NotSupported), the 5 Hz time series supplies what does
(utilisation, memory, power, temperatures, clocks, clock event reasons, processes, energy).
It keeps pynvml's contract: the same function names and argument order, the same ctypes
structs for results, ``NVMLError`` subclasses built from the NVML return codes, calls before
``nvmlInit`` raising ``Uninitialized``, per-field return codes from ``nvmlDeviceGetFieldValues``,
and ``nvmlEventSetWait`` raising ``Timeout`` when no event came. So the real collector code runs
unchanged in tests, in the simulator and on machines without a GPU.

The identity is the snapshot's GPU; ``nvml-phases.json`` was recorded on a second H200 of the
same SKU, driver and settings, and its readings are replayed under the snapshot's UUID.

Tests and the simulator inject faults with ``inject``, ``lose_gpu`` and ``emit_xid``. With a
``cost`` model (``call_costs``) each call spins for the time it took on the H200.
"""

from __future__ import annotations

import ast
import queue
import threading
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any

import pynvml  # type: ignore[import-untyped]

from inferwatch.exporters.gpu.call_costs import CostModel, spin
from inferwatch.exporters.gpu.recording import Recording, SeriesRow


@dataclass
class FakeHandle:
    """Stands in for a ``c_nvmlDevice_t``: an opaque device handle."""

    index: int


@dataclass
class FakeMigHandle:
    """Stands in for a MIG device handle: one GPU instance of the GPU at ``parent``."""

    parent: int
    uuid: str


@dataclass
class FakeEventData:
    """The fields of ``c_nvmlEventData_t`` (its ``device`` is a handle, as with pynvml)."""

    device: FakeHandle
    eventType: int
    eventData: int
    gpuInstanceId: int = 0xFFFFFFFF
    computeInstanceId: int = 0xFFFFFFFF


@dataclass
class _Injected:
    effect: BaseException | Callable[[], object]
    remaining: int | None


class FakeNvml:
    """A ``pynvml``-shaped module answering from a ``Recording`` (see the module docstring).

    Constants, structs and the ``NVMLError`` classes are pynvml's own; only the functions are
    replaced. ``gpus`` > 1 replays the same GPU several times under derived UUIDs and PCI bus
    ids (for multi-GPU tests and per-GPU cost figures); ``migs`` names MIG device UUIDs and
    the index of the GPU each is a slice of.
    """

    def __init__(
        self,
        recording: Recording,
        *,
        gpus: int = 1,
        migs: Mapping[str, int] | None = None,
        clock: Callable[[], float] = time.monotonic,
        cost: CostModel | None = None,
    ) -> None:
        self.recording = recording
        self.gpus = gpus
        self.migs = dict(migs or {})
        self._clock = clock
        self._start = clock()
        self._fixed_t: float | None = None
        self._cost = cost
        self._init_count = 0
        self._init_error: int | None = None
        self._lost: set[int] = set()
        self._injected: dict[str, _Injected] = {}
        self._events: queue.Queue[FakeEventData] = queue.Queue()
        self._lock = threading.Lock()
        self.calls: dict[str, int] = {}
        self._fields = _recorded_fields(recording.device)

    # -- driving the replay --------------------------------------------------------------------

    def seek(self, t: float | None) -> None:
        """Hold the replay at ``t`` seconds into the recording (None: follow the clock)."""
        self._fixed_t = t

    def now(self) -> float:
        return self._fixed_t if self._fixed_t is not None else self._clock() - self._start

    def fail_init(self, code: int | None) -> None:
        """Make ``nvmlInit`` raise ``NVMLError(code)`` (None: succeed again)."""
        self._init_error = code

    def inject(
        self, call: str, effect: BaseException | Callable[[], object], times: int | None = None
    ) -> None:
        """Raise ``effect`` (or run it, e.g. to hang) on the next ``times`` calls of ``call``."""
        if not hasattr(self, call):
            raise AttributeError(f"FakeNvml has no {call}")
        self._injected[call] = _Injected(effect, times)

    def clear(self, call: str) -> None:
        self._injected.pop(call, None)

    def lose_gpu(self, index: int = 0) -> None:
        """From now on every call for that GPU raises ``GpuIsLost`` (as after XID 79)."""
        self._lost.add(index)

    def emit_xid(self, xid: int, index: int = 0) -> None:
        self._events.put(
            FakeEventData(FakeHandle(index), pynvml.nvmlEventTypeXidCriticalError, xid)
        )

    # -- pynvml's constants, structs and errors ------------------------------------------------

    def __getattr__(self, name: str) -> Any:
        value = getattr(pynvml, name)
        if callable(value) and not isinstance(value, type) and name.startswith("nvml"):
            raise AttributeError(f"FakeNvml does not implement {name}")
        return value

    # -- plumbing ------------------------------------------------------------------------------

    def _enter(self, call: str, handle: FakeHandle | None, *args: Any) -> None:
        with self._lock:
            self.calls[call] = self.calls.get(call, 0) + 1
        if call not in ("nvmlInit", "nvmlShutdown") and self._init_count == 0:
            raise pynvml.NVMLError(pynvml.NVML_ERROR_UNINITIALIZED)
        injected = self._injected.get(call)
        if injected is not None:
            if injected.remaining is not None:
                injected.remaining -= 1
                if injected.remaining <= 0:
                    del self._injected[call]
            if isinstance(injected.effect, BaseException):
                raise injected.effect
            injected.effect()
        if handle is not None:
            if not isinstance(handle, FakeHandle) or not 0 <= handle.index < self.gpus:
                raise pynvml.NVMLError(pynvml.NVML_ERROR_INVALID_ARGUMENT)
            if handle.index in self._lost:
                raise pynvml.NVMLError(pynvml.NVML_ERROR_GPU_IS_LOST)
        if self._cost is not None:
            spin(self._cost(call, args))

    def _recorded(self, key: str) -> Any:
        """A snapshot value, or the NVMLError subclass the GPU answered with."""
        entry = self.recording.device[key]
        if "error" in entry:
            raise getattr(pynvml, entry["error"])()
        return entry["value"]

    def _reading(self) -> SeriesRow:
        return self.recording.at(self.now())

    def _uuid(self, index: int) -> str:
        uuid = str(self.recording.device["uuid"]["value"])
        return uuid if index == 0 else f"{uuid[:-2]}{index:02x}"

    # -- system --------------------------------------------------------------------------------

    def nvmlInit(self) -> None:
        self._enter("nvmlInit", None)
        if self._init_error is not None:
            raise pynvml.NVMLError(self._init_error)
        self._init_count += 1

    def nvmlShutdown(self) -> None:
        self._enter("nvmlShutdown", None)
        if self._init_count == 0:
            raise pynvml.NVMLError(pynvml.NVML_ERROR_UNINITIALIZED)
        self._init_count -= 1

    def nvmlSystemGetDriverVersion(self) -> str:
        self._enter("nvmlSystemGetDriverVersion", None)
        return str(self.recording.system["driver_version"])

    def nvmlSystemGetCudaDriverVersion(self) -> int:
        self._enter("nvmlSystemGetCudaDriverVersion", None)
        return int(self.recording.system["cuda_driver_version"])

    def nvmlDeviceGetCount(self) -> int:
        self._enter("nvmlDeviceGetCount", None)
        return self.gpus

    def nvmlDeviceGetHandleByIndex(self, index: int) -> FakeHandle:
        self._enter("nvmlDeviceGetHandleByIndex", None)
        if not 0 <= index < self.gpus:
            raise pynvml.NVMLError(pynvml.NVML_ERROR_INVALID_ARGUMENT)
        return FakeHandle(index)

    def nvmlDeviceGetHandleByUUID(self, uuid: str | bytes) -> FakeHandle | FakeMigHandle:
        self._enter("nvmlDeviceGetHandleByUUID", None)
        text = uuid.decode() if isinstance(uuid, bytes) else uuid
        if text in self.migs:
            return FakeMigHandle(self.migs[text], text)
        for index in range(self.gpus):
            if self._uuid(index) == text:
                return FakeHandle(index)
        raise pynvml.NVMLError(pynvml.NVML_ERROR_NOT_FOUND)

    def nvmlDeviceGetDeviceHandleFromMigDeviceHandle(self, handle: FakeMigHandle) -> FakeHandle:
        self._enter("nvmlDeviceGetDeviceHandleFromMigDeviceHandle", None)
        if not isinstance(handle, FakeMigHandle):
            raise pynvml.NVMLError(pynvml.NVML_ERROR_INVALID_ARGUMENT)
        return FakeHandle(handle.parent)

    # -- identity and static facts -------------------------------------------------------------

    def nvmlDeviceGetUUID(self, handle: FakeHandle) -> str:
        self._enter("nvmlDeviceGetUUID", handle)
        return self._uuid(handle.index)

    def nvmlDeviceGetName(self, handle: FakeHandle) -> str:
        self._enter("nvmlDeviceGetName", handle)
        return str(self._recorded("name"))

    def nvmlDeviceGetIndex(self, handle: FakeHandle) -> int:
        self._enter("nvmlDeviceGetIndex", handle)
        return handle.index

    def nvmlDeviceGetPciInfo(self, handle: FakeHandle) -> Any:
        self._enter("nvmlDeviceGetPciInfo", handle)
        recorded = self._recorded("pci_info")
        info = pynvml.nvmlPciInfo_t()
        info.domain = recorded["domain"]
        info.bus = recorded["bus"]
        info.device = recorded["device"] + handle.index
        info.pciDeviceId = recorded["pciDeviceId"]
        info.pciSubSystemId = recorded["pciSubSystemId"]
        bus_id = f"{info.domain:08X}:{info.bus:02X}:{info.device:02X}.0"
        info.busId = bus_id.encode()
        info.busIdLegacy = bus_id[4:].encode()
        return info

    def nvmlDeviceGetMaxClockInfo(self, handle: FakeHandle, type: int) -> int:
        self._enter("nvmlDeviceGetMaxClockInfo", handle, type)
        key = {
            pynvml.NVML_CLOCK_SM: "max_clock_sm",
            pynvml.NVML_CLOCK_MEM: "max_clock_mem",
            pynvml.NVML_CLOCK_GRAPHICS: "max_clock_graphics",
            pynvml.NVML_CLOCK_VIDEO: "max_clock_video",
        }.get(type)
        if key is None:
            raise pynvml.NVMLError(pynvml.NVML_ERROR_INVALID_ARGUMENT)
        return int(self._recorded(key))

    def nvmlDeviceGetTemperatureThreshold(self, handle: FakeHandle, threshold: int) -> int:
        self._enter("nvmlDeviceGetTemperatureThreshold", handle, threshold)
        key = {
            pynvml.NVML_TEMPERATURE_THRESHOLD_SLOWDOWN: "temp_threshold_slowdown",
            pynvml.NVML_TEMPERATURE_THRESHOLD_SHUTDOWN: "temp_threshold_shutdown",
            pynvml.NVML_TEMPERATURE_THRESHOLD_GPU_MAX: "temp_threshold_gpu_max",
            pynvml.NVML_TEMPERATURE_THRESHOLD_MEM_MAX: "temp_threshold_mem_max",
        }.get(threshold)
        if key is None:
            raise pynvml.NVMLError(pynvml.NVML_ERROR_NOT_SUPPORTED)
        return int(self._recorded(key))

    def nvmlDeviceGetSupportedClocksEventReasons(self, handle: FakeHandle) -> int:
        self._enter("nvmlDeviceGetSupportedClocksEventReasons", handle)
        return int(self._recorded("supported_clocks_event_reasons"))

    def nvmlDeviceGetSupportedEventTypes(self, handle: FakeHandle) -> int:
        self._enter("nvmlDeviceGetSupportedEventTypes", handle)
        return int(self._recorded("supported_event_types"))

    def nvmlDeviceGetEccMode(self, handle: FakeHandle) -> list[int]:
        self._enter("nvmlDeviceGetEccMode", handle)
        return list(self._recorded("ecc_mode"))

    def nvmlDeviceGetMigMode(self, handle: FakeHandle) -> list[int]:
        self._enter("nvmlDeviceGetMigMode", handle)
        return list(self._recorded("mig_mode"))

    def nvmlDeviceGetPersistenceMode(self, handle: FakeHandle) -> int:
        self._enter("nvmlDeviceGetPersistenceMode", handle)
        return int(self._recorded("persistence_mode"))

    def nvmlDeviceGetEnforcedPowerLimit(self, handle: FakeHandle) -> int:
        self._enter("nvmlDeviceGetEnforcedPowerLimit", handle)
        return int(self._recorded("enforced_power_limit_mw"))

    def nvmlDeviceGetPowerManagementLimit(self, handle: FakeHandle) -> int:
        self._enter("nvmlDeviceGetPowerManagementLimit", handle)
        return int(self._recorded("power_limit_mw"))

    def nvmlDeviceGetCurrPcieLinkGeneration(self, handle: FakeHandle) -> int:
        self._enter("nvmlDeviceGetCurrPcieLinkGeneration", handle)
        return int(self._recorded("pcie_link_gen"))

    def nvmlDeviceGetCurrPcieLinkWidth(self, handle: FakeHandle) -> int:
        self._enter("nvmlDeviceGetCurrPcieLinkWidth", handle)
        return int(self._recorded("pcie_link_width"))

    def nvmlDeviceGetPcieReplayCounter(self, handle: FakeHandle) -> int:
        self._enter("nvmlDeviceGetPcieReplayCounter", handle)
        return int(self._recorded("pcie_replay_counter"))

    def nvmlDeviceGetPcieThroughput(self, device: FakeHandle, counter: int) -> int:
        self._enter("nvmlDeviceGetPcieThroughput", device, counter)
        key = "pcie_tx_kbps" if counter == pynvml.NVML_PCIE_UTIL_TX_BYTES else "pcie_rx_kbps"
        return int(self._recorded(key))

    def nvmlDeviceGetRemappedRows(self, device: FakeHandle) -> tuple[int, int, int, int]:
        self._enter("nvmlDeviceGetRemappedRows", device)
        corrected, uncorrected, pending, failure = self._recorded("remapped_rows")
        return (corrected, uncorrected, pending, failure)

    def nvmlDeviceGetRetiredPages(self, device: FakeHandle, sourceFilter: int) -> list[int]:
        self._enter("nvmlDeviceGetRetiredPages", device, sourceFilter)
        key = (
            "retired_pages_sbe"
            if sourceFilter == pynvml.NVML_PAGE_RETIREMENT_CAUSE_MULTIPLE_SINGLE_BIT_ECC_ERRORS
            else "retired_pages_dbe"
        )
        return list(self._recorded(key))

    def nvmlDeviceGetRetiredPagesPendingStatus(self, device: FakeHandle) -> int:
        self._enter("nvmlDeviceGetRetiredPagesPendingStatus", device)
        return int(self._recorded("retired_pages_pending"))

    def nvmlDeviceGetNvLinkState(self, device: FakeHandle, link: int) -> int:
        self._enter("nvmlDeviceGetNvLinkState", device, link)
        return int(self._recorded("nvlink0_state"))

    def nvmlDeviceGetNvLinkErrorCounter(self, device: FakeHandle, link: int, counter: int) -> int:
        self._enter("nvmlDeviceGetNvLinkErrorCounter", device, link, counter)
        return int(self._recorded("nvlink0_replay_errors"))

    # -- readings that change ------------------------------------------------------------------

    def nvmlDeviceGetUtilizationRates(self, handle: FakeHandle) -> Any:
        self._enter("nvmlDeviceGetUtilizationRates", handle)
        reading = self._reading()
        util = pynvml.c_nvmlUtilization_t()
        util.gpu = reading.util_gpu
        util.memory = reading.util_memory
        return util

    def nvmlDeviceGetMemoryInfo(self, handle: FakeHandle, version: int | None = None) -> Any:
        self._enter("nvmlDeviceGetMemoryInfo", handle, version)
        memory = self._reading().memory
        if not version:  # v1 counts reserved memory as used (measured on the H200)
            v1 = pynvml.c_nvmlMemory_t()
            v1.total = memory["total"]
            v1.free = memory["free"]
            v1.used = memory["used"] + memory["reserved"]
            return v1
        v2 = pynvml.c_nvmlMemory_v2_t()
        v2.version = version
        for name in ("total", "reserved", "free", "used"):
            setattr(v2, name, memory[name])
        return v2

    def nvmlDeviceGetPowerUsage(self, handle: FakeHandle) -> int:
        self._enter("nvmlDeviceGetPowerUsage", handle)
        return self._reading().power_mw

    def nvmlDeviceGetTotalEnergyConsumption(self, handle: FakeHandle) -> int:
        self._enter("nvmlDeviceGetTotalEnergyConsumption", handle)
        return self.recording.energy_at(self.now())

    def nvmlDeviceGetTemperature(self, handle: FakeHandle, sensor: int) -> int:
        self._enter("nvmlDeviceGetTemperature", handle, sensor)
        if sensor != pynvml.NVML_TEMPERATURE_GPU:
            raise pynvml.NVMLError(pynvml.NVML_ERROR_INVALID_ARGUMENT)
        return self._reading().temp

    def nvmlDeviceGetClockInfo(self, handle: FakeHandle, type: int) -> int:
        self._enter("nvmlDeviceGetClockInfo", handle, type)
        reading = self._reading()
        if type == pynvml.NVML_CLOCK_SM:
            return reading.sm_mhz
        if type == pynvml.NVML_CLOCK_MEM:
            return reading.mem_mhz
        if type == pynvml.NVML_CLOCK_GRAPHICS:
            return reading.sm_mhz  # the H200 reported equal SM and graphics clocks
        return int(self._recorded("clock_video"))

    def nvmlDeviceGetCurrentClocksEventReasons(self, handle: FakeHandle) -> int:
        self._enter("nvmlDeviceGetCurrentClocksEventReasons", handle)
        return self._reading().reasons

    def nvmlDeviceGetPerformanceState(self, handle: FakeHandle) -> int:
        self._enter("nvmlDeviceGetPerformanceState", handle)
        return self._reading().pstate

    def nvmlDeviceGetTotalEccErrors(
        self,
        handle: FakeHandle,
        errorType: int,
        counterType: int,
    ) -> int:
        self._enter("nvmlDeviceGetTotalEccErrors", handle, errorType, counterType)
        corrected = errorType == pynvml.NVML_MEMORY_ERROR_TYPE_CORRECTED
        volatile = counterType == pynvml.NVML_VOLATILE_ECC
        reading = self._reading()
        if corrected and volatile and reading.ecc_corrected is not None:
            return reading.ecc_corrected
        key = (
            f"ecc_{'corrected' if corrected else 'uncorrected'}_"
            f"{'volatile' if volatile else 'aggregate'}"
        )
        return int(self._recorded(key))

    def nvmlDeviceGetComputeRunningProcesses(self, handle: FakeHandle) -> list[Any]:
        self._enter("nvmlDeviceGetComputeRunningProcesses", handle)
        return [
            pynvml.nvmlFriendlyObject(
                {
                    "pid": pid,
                    "usedGpuMemory": used,
                    "gpuInstanceId": 0xFFFFFFFF,
                    "computeInstanceId": 0xFFFFFFFF,
                }
            )
            for pid, used in self._reading().processes
        ]

    def nvmlDeviceGetFieldValues(self, handle: FakeHandle, fieldIds: Any) -> Any:
        self._enter("nvmlDeviceGetFieldValues", handle, tuple(fieldIds))
        values = (pynvml.c_nvmlFieldValue_t * len(fieldIds))()
        reading = self._reading()
        for i, field_id in enumerate(fieldIds):
            values[i].fieldId = field_id
            recorded = self._fields.get(field_id)
            if field_id == pynvml.NVML_FI_DEV_MEMORY_TEMP and reading.mem_temp is not None:
                recorded = {
                    "value": reading.mem_temp,
                    "valueType": pynvml.NVML_VALUE_TYPE_UNSIGNED_INT,
                }
            if recorded is None or "nvmlReturn" in recorded:
                values[i].nvmlReturn = (recorded or {}).get(
                    "nvmlReturn", pynvml.NVML_ERROR_NOT_SUPPORTED
                )
                continue
            values[i].nvmlReturn = pynvml.NVML_SUCCESS
            values[i].valueType = recorded["valueType"]
            member = {
                pynvml.NVML_VALUE_TYPE_DOUBLE: "dVal",
                pynvml.NVML_VALUE_TYPE_UNSIGNED_INT: "uiVal",
            }.get(recorded["valueType"], "ullVal")
            setattr(values[i].value, member, recorded["value"])
        return values

    # -- events --------------------------------------------------------------------------------

    def nvmlEventSetCreate(self) -> object:
        self._enter("nvmlEventSetCreate", None)
        return object()

    def nvmlDeviceRegisterEvents(
        self, handle: FakeHandle, eventTypes: int, eventSet: object
    ) -> None:
        self._enter("nvmlDeviceRegisterEvents", handle, eventTypes)
        if eventTypes & ~int(self._recorded("supported_event_types")):
            raise pynvml.NVMLError(pynvml.NVML_ERROR_NOT_SUPPORTED)

    def nvmlEventSetWait(self, eventSet: object, timeoutms: int) -> FakeEventData:
        self._enter("nvmlEventSetWait", None)
        try:
            return self._events.get(timeout=timeoutms / 1000)
        except queue.Empty:
            raise pynvml.NVMLError(pynvml.NVML_ERROR_TIMEOUT) from None

    def nvmlEventSetFree(self, eventSet: object) -> None:
        self._enter("nvmlEventSetFree", None)


def _recorded_fields(device: Mapping[str, Any]) -> dict[int, dict[str, Any]]:
    """The snapshot's field-value batch, by NVML field id (it was stored as a Python repr)."""
    raw = device.get("field_values", {}).get("value")
    if not raw:
        return {}
    by_name: dict[str, dict[str, Any]] = ast.literal_eval(raw)
    return {
        getattr(pynvml, name): value for name, value in by_name.items() if hasattr(pynvml, name)
    }
