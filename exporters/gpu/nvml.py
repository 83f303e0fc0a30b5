"""GPU telemetry straight from the driver through NVML (``nvidia-ml-py``, module ``pynvml``).

Cost discipline, from calls timed on an H200 (see the GPU reference notes):

- static facts (identity, maximum clocks, thermal thresholds, supported reason masks, NVLink
  links) are read once when the GPU is discovered; ``nvmlDeviceGetMaxClockInfo`` alone costs
  ~1.4 ms per clock;
- cheap calls (1-25 us each) are made on every scrape;
- slow calls (total energy ~3 ms, PCIe replay counter, ECC and MIG mode, field values ~150 us
  each) run on their own cadence, ``slow_interval_s`` (60 s), and their last values are re-served;
- a call that answers NotSupported for a GPU is remembered and never made again for it.

Any call that fails otherwise is counted in ``inferwatch_gpu_nvml_errors_total`` and its metric
is left out of that scrape. ``GpuIsLost`` marks the GPU lost for good (readiness fails).
"""

from __future__ import annotations

import contextlib
import logging
import re
import threading
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from prometheus_client.core import Metric

from inferwatch import catalog
from inferwatch.exporters.gpu.base import BackendDown, GpuTelemetry
from inferwatch.exporters.gpu.cgroup import ProcessAttribution
from inferwatch.exporters.gpu.families import FamilySet, add_clock_events
from inferwatch.exporters.gpu.nvml_api import Nvml
from inferwatch.exporters.gpu.scope import GpuScope, ScopeUnknown
from inferwatch.exporters.gpu.xid import XidLog
from inferwatch.logs import log_event

logger = logging.getLogger("inferwatch.gpu.nvml")

Labels = dict[str, str]
#: A catalogue key, a value and its labels, kept between reads of a slow or static call.
KeyedValue = tuple[str, float, Labels]


def error_name(error: BaseException) -> str:
    """A label value for an error: ``NVMLError_GpuIsLost`` -> ``gpu_is_lost``."""
    name = type(error).__name__.removeprefix("NVMLError_")
    if name == "NVMLError":
        return f"nvml_error_{getattr(error, 'value', 'unknown')}"
    return re.sub(r"(?<=[a-z0-9])(?=[A-Z])", "_", name).lower()


#: nvml sources decoded by code of their own below rather than by the catalogue-driven
#: calls: identity and versions (read at discovery), memory (the v2 struct with a v1
#: fallback), the clock-event bitmask, per-process memory, per-link NVLink counters (the
#: links are found at discovery) and XIDs (an event thread).
DECODED_HERE = frozenset(
    {
        "nvmlDeviceGetUUID",
        "nvmlDeviceGetIndex",
        "nvmlDeviceGetPciInfo",
        "nvmlDeviceGetName",
        "nvmlSystemGetDriverVersion",
        "nvmlSystemGetCudaDriverVersion",
        "nvmlDeviceGetMemoryInfo",
        "nvmlDeviceGetCurrentClocksEventReasons",
        "nvmlDeviceGetComputeRunningProcesses",
        "nvmlDeviceGetNvLinkErrorCounter",
        "nvmlEventSetWait",
    }
)


@dataclass(frozen=True)
class NvmlCall:
    """One NVML call per GPU and the catalogue entries read off its answer."""

    call: str
    args: tuple[Any, ...]
    fields: tuple[tuple[str, catalog.Alias], ...]


def call_table(nvml: Nvml) -> dict[catalog.Cadence, list[NvmlCall]]:
    """The catalogue's ``nvml`` sources as calls, by cadence (constants looked up in ``nvml``).

    Sources that share a call and its arguments share one call (utilisation gives both the
    GPU and the memory ratio).
    """
    grouped: dict[tuple[catalog.Cadence, str, tuple[Any, ...]], list[tuple[str, catalog.Alias]]]
    grouped = {}
    for spec in catalog.load().with_source("nvml"):
        for alias in spec.sources["nvml"]:
            if alias.metric in DECODED_HERE:
                continue
            args = tuple(_constant(nvml, arg) for arg in alias.args)
            grouped.setdefault((alias.cadence, alias.metric, args), []).append((spec.key, alias))
    table: dict[catalog.Cadence, list[NvmlCall]] = {"once": [], "scrape": [], "slow": []}
    for (cadence, call, args), fields in grouped.items():
        table[cadence].append(NvmlCall(call, args, tuple(fields)))
    return table


def _constant(nvml: Nvml, arg: Any) -> Any:
    """A catalogue argument: a pynvml constant's name, a number, or a list of them."""
    if isinstance(arg, tuple):
        return tuple(_constant(nvml, one) for one in arg)
    return getattr(nvml, arg) if isinstance(arg, str) else arg


class _GpuLost(Exception):
    """Raised inside a device poll to abandon a GPU that NVML reports lost."""


@dataclass
class _Device:
    index: int
    handle: Any
    uuid: str
    pci_bus_id: str = ""
    name: str = ""
    supported_reasons: int = 0
    nvlinks: list[int] = field(default_factory=list)
    static: list[KeyedValue] = field(default_factory=list)
    slow: list[KeyedValue] = field(default_factory=list)
    slow_due: float = 0.0
    unsupported: set[tuple[str, tuple[Any, ...]]] = field(default_factory=set)
    lost: bool = False

    def labels(self, **extra: str) -> Labels:
        return {"gpu_uuid": self.uuid, **extra}


class XidWatch:
    """A thread that waits on an NVML event set and reports each critical XID.

    Same pattern as the NVIDIA device plugin's health check: register XID events on every
    GPU that supports them, then ``nvmlEventSetWait`` with a timeout in a loop. Any error other
    than the timeout ends the thread and leaves ``failure`` set; the collector restarts it.
    """

    def __init__(
        self,
        nvml: Nvml,
        handles: Mapping[str, Any],
        on_xid: Callable[[str, int], object],
        wait_ms: int = 1000,
    ) -> None:
        self.nvml = nvml
        self.handles = dict(handles)
        self.on_xid = on_xid
        self.wait_ms = wait_ms
        self.failure = ""
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, name="inferwatch-xid-watch", daemon=True)

    def start(self) -> None:
        self._thread.start()

    @property
    def alive(self) -> bool:
        return self._thread.is_alive()

    def stop(self) -> None:
        self._stop.set()
        if self._thread.is_alive():
            self._thread.join(timeout=self.wait_ms / 1000 + 1)

    def _run(self) -> None:
        nvml = self.nvml
        event_set = None
        try:
            event_set = nvml.nvmlEventSetCreate()
            if not self._register(event_set):
                self.failure = "not_supported"
                log_event(logger, logging.WARNING, "no gpu supports xid events")
                return
            while not self._stop.is_set():
                try:
                    event = nvml.nvmlEventSetWait(event_set, self.wait_ms)
                except nvml.NVMLError_Timeout:
                    continue
                if event.eventType & nvml.nvmlEventTypeXidCriticalError:
                    self.on_xid(self._uuid_of(event.device), int(event.eventData))
        except Exception as error:
            self.failure = error_name(error)
            log_event(logger, logging.ERROR, "xid watch stopped", error=self.failure)
        finally:
            if event_set is not None:
                try:
                    nvml.nvmlEventSetFree(event_set)
                except Exception as error:  # already broken; nothing left to release
                    log_event(logger, logging.DEBUG, "event set free failed", error=str(error))

    def _register(self, event_set: Any) -> int:
        nvml = self.nvml
        registered = 0
        for uuid, handle in self.handles.items():
            try:
                supported = nvml.nvmlDeviceGetSupportedEventTypes(handle)
                mask = supported & nvml.nvmlEventTypeXidCriticalError
                if mask:
                    nvml.nvmlDeviceRegisterEvents(handle, mask, event_set)
                    registered += 1
            except nvml.NVMLError_NotSupported:
                log_event(logger, logging.WARNING, "xid events not supported", gpu_uuid=uuid)
        return registered

    def _uuid_of(self, device: Any) -> str:
        try:
            return str(self.nvml.nvmlDeviceGetUUID(device))
        except Exception:
            return next(iter(self.handles)) if len(self.handles) == 1 else "unknown"


class NvmlTelemetry(GpuTelemetry):
    """The GPUs NVML can see that the scope covers, keyed by UUID.

    ``nvml`` is ``pynvml`` or a module shaped like it (``nvml_api.Nvml``). Every GPU is
    discovered (indices and UUIDs are needed to match the scope), but only those in scope are
    read each scrape. Which calls are made, and how their answers become catalogue values,
    comes from the catalogue's ``nvml`` sources (``call_table``).
    """

    backend = "nvml"

    def __init__(
        self,
        nvml: Nvml,
        *,
        slow_interval_s: float = 60.0,
        retry_init_s: float = 60.0,
        proc_root: Path | None = Path("/proc"),
        watch_xids: bool = True,
        xid_wait_ms: int = 1000,
        clock: Callable[[], float] = time.monotonic,
        scope: GpuScope | None = None,
        timeout_s: float = 2.0,
        stale_s: float = 60.0,
    ) -> None:
        super().__init__(scope=scope, timeout_s=timeout_s, stale_s=stale_s)
        self.nvml = nvml
        self._calls = call_table(nvml)
        self._memory_parts = [
            (spec.key, alias.part)
            for spec in catalog.load().with_source("nvml")
            for alias in spec.sources["nvml"]
            if alias.metric == "nvmlDeviceGetMemoryInfo"
        ]
        self.slow_interval_s = slow_interval_s
        self.retry_init_s = retry_init_s
        self.watch_xids = watch_xids
        self.xid_wait_ms = xid_wait_ms
        self.clock = clock
        self.xids = XidLog(self.faults)
        self.devices: list[_Device] = []
        self._attribution = ProcessAttribution(proc_root)
        self._versions: Labels = {}
        self._initialised = False
        self._init_error: BackendDown | None = None
        self._next_init = 0.0
        self._watch: XidWatch | None = None
        self._next_watch = 0.0
        self._errors: dict[tuple[str, str], int] = {}
        self._errors_lock = threading.Lock()
        self._seen_pids: set[int] = set()
        self._mig_lookups: dict[str, str] = {}

    # -- lifecycle ---------------------------------------------------------------------------

    def start(self) -> None:
        """Initialise NVML and discover GPUs now; raise ``BackendDown`` saying why not."""
        now = self.clock()
        try:
            self.nvml.nvmlInit()
        except Exception as error:
            self._next_init = now + self.retry_init_s
            self._init_error = BackendDown(error_name(error), f"nvmlInit: {error}")
            raise self._init_error from None
        try:
            self._discover()
        except Exception as error:
            self._next_init = now + self.retry_init_s
            self._init_error = BackendDown(error_name(error), f"GPU discovery: {error}")
            self.nvml.nvmlShutdown()
            raise self._init_error from None
        self._initialised = True
        self._init_error = None
        self._start_watch(now)

    def close(self) -> None:
        if self._watch is not None:
            self._watch.stop()
        if self._initialised:
            self._initialised = False
            try:
                self.nvml.nvmlShutdown()
            except Exception as error:
                log_event(logger, logging.DEBUG, "nvmlShutdown failed", error=str(error))
        super().close()

    def _discover(self) -> None:
        nvml = self.nvml
        self._versions = {
            "driver_version": str(nvml.nvmlSystemGetDriverVersion()),
            "cuda_version": _cuda_version(nvml.nvmlSystemGetCudaDriverVersion()),
        }
        devices = []
        for index in range(nvml.nvmlDeviceGetCount()):
            try:
                handle = nvml.nvmlDeviceGetHandleByIndex(index)
                device = _Device(index, handle, str(nvml.nvmlDeviceGetUUID(handle)))
            except nvml.NVMLError as error:
                log_event(logger, logging.ERROR, "gpu not usable", index=index, error=str(error))
                continue
            with contextlib.suppress(_GpuLost):  # kept, and reported lost
                self._read_static(device)
            devices.append(device)
        self.devices = devices

    def _start_watch(self, now: float) -> None:
        if not self.watch_xids or not self.devices:
            return
        handles = {d.uuid: d.handle for d in self.devices if not d.lost}
        self._watch = XidWatch(self.nvml, handles, self.xids.record, self.xid_wait_ms)
        self._watch.start()
        self._next_watch = now + self.retry_init_s

    # -- polling -----------------------------------------------------------------------------

    def poll(self) -> list[Metric]:
        now = self.clock()
        if not self._initialised:
            if self._init_error is not None and now < self._next_init:
                raise self._init_error
            self.start()
        families = FamilySet()
        families.add("gpu_driver_info", 1, dict(self._versions))
        self._seen_pids = set()
        scoped = self.in_scope({d.uuid: d.index for d in self.devices}, self._mig_parents_of())
        for device in self.devices:
            if device.uuid not in scoped:  # another replica's GPU: not read at all
                continue
            families.add(
                "gpu_info",
                1,
                device.labels(
                    index=str(device.index), pci_bus_id=device.pci_bus_id, name=device.name
                ),
            )
            if device.lost:
                continue
            try:
                if now >= device.slow_due:
                    device.slow = self._read_slow(device)
                    device.slow_due = now + self.slow_interval_s
                self._read_cheap(device, families)
            except _GpuLost:
                continue
            for key, value, labels in device.static + device.slow:
                families.add(key, value, labels)
        self._attribution.retain(self._seen_pids)
        self._keep_watch(now)
        self.xids.fill(families, scoped)
        self.faults.fill(families, scoped)
        with self._errors_lock:
            errors = dict(self._errors)
        for (call, error), count in sorted(errors.items()):
            families.add("gpu_nvml_errors", count, {"call": call, "error": error})
        if self.watch_xids:
            families.add("gpu_xid_watch_up", 1 if self.watching else 0, {})
        return families.families()

    def _mig_parents_of(self) -> dict[str, str]:
        """Parent GPU UUIDs of the MIG devices the scope names (looked up once each)."""
        try:
            selection = self.scope.selection()
        except ScopeUnknown:
            return {}
        nvml = self.nvml
        for mig in selection.migs if selection is not None else ():
            if mig in self._mig_lookups:
                continue
            try:
                handle = nvml.nvmlDeviceGetHandleByUUID(mig)
                parent = nvml.nvmlDeviceGetDeviceHandleFromMigDeviceHandle(handle)
                self._mig_lookups[mig] = str(nvml.nvmlDeviceGetUUID(parent))
            except nvml.NVMLError as error:
                self._mig_lookups[mig] = ""
                log_event(logger, logging.ERROR, "mig device not found", mig=mig, error=str(error))
        return {mig: parent for mig, parent in self._mig_lookups.items() if parent}

    @property
    def watching(self) -> bool:
        """True while the XID event thread is listening."""
        return self._watch is not None and self._watch.alive

    def _keep_watch(self, now: float) -> None:
        """Restart a failed XID thread, at most once per ``retry_init_s``."""
        if self._watch is None or self._watch.alive or now < self._next_watch:
            return
        if self._watch.failure == "not_supported":
            return
        log_event(logger, logging.INFO, "restarting xid watch", after=self._watch.failure)
        self._start_watch(now)

    def _call(self, device: _Device, call: str, *args: Any) -> Any:
        """One NVML call for one GPU; None when unsupported or failed (already accounted)."""
        nvml = self.nvml
        if (call, args) in device.unsupported:
            return None
        try:
            return getattr(nvml, call)(device.handle, *args)
        except (nvml.NVMLError_NotSupported, nvml.NVMLError_FunctionNotFound):
            device.unsupported.add((call, args))
        except nvml.NVMLError_GpuIsLost:
            device.lost = True
            if self.faults.mark(device.uuid, "lost", "GPU is lost (NVML), as after XID 79"):
                log_event(logger, logging.ERROR, "gpu lost", gpu_uuid=device.uuid, call=call)
            raise _GpuLost from None
        except Exception as error:
            name = error_name(error)
            with self._errors_lock:
                self._errors[call, name] = self._errors.get((call, name), 0) + 1
            log_event(
                logger,
                logging.WARNING,
                "nvml call failed",
                gpu_uuid=device.uuid,
                call=call,
                error=name,
                detail=str(error),
            )
        return None

    def _read_static(self, device: _Device) -> None:
        nvml, call = self.nvml, self._call
        device.name = _text(call(device, "nvmlDeviceGetName") or "")
        pci = call(device, "nvmlDeviceGetPciInfo")
        device.pci_bus_id = _text(pci.busId) if pci is not None else ""
        device.supported_reasons = call(device, "nvmlDeviceGetSupportedClocksEventReasons") or 0
        device.static = self._read_calls(device, "once")
        for link in range(nvml.NVML_NVLINK_MAX_LINKS):
            state = call(device, "nvmlDeviceGetNvLinkState", link)
            if state is None:
                break
            if state == nvml.NVML_FEATURE_ENABLED:
                device.nvlinks.append(link)

    def _read_calls(self, device: _Device, cadence: catalog.Cadence) -> list[KeyedValue]:
        """The catalogue-driven reads of one cadence, with the GPU fault rules applied."""
        read: list[KeyedValue] = []
        for nvml_call in self._calls[cadence]:
            answer = self._call(device, nvml_call.call, *nvml_call.args)
            if answer is None:
                continue
            for key, alias in nvml_call.fields:
                value = _convert(self.nvml, alias, answer)
                if value is None:
                    continue
                labels = device.labels(**alias.set)
                read.append((key, value, labels))
                self.check_faults(device.uuid, key, labels, value)
        return read

    def _read_cheap(self, device: _Device, out: FamilySet) -> None:
        for key, value, labels in self._read_calls(device, "scrape"):
            out.add(key, value, labels)
        self._read_memory(device, out)
        reasons = self._call(device, "nvmlDeviceGetCurrentClocksEventReasons")
        if reasons is not None:
            add_clock_events(out, device.uuid, reasons, device.supported_reasons)
        self._read_processes(device, out)

    def _read_memory(self, device: _Device, out: FamilySet) -> None:
        """The v2 struct (reserved apart from used); before it, v1, whose used includes reserved."""
        memory = self._call(device, "nvmlDeviceGetMemoryInfo", self.nvml.nvmlMemory_v2)
        if memory is None:
            memory = self._call(device, "nvmlDeviceGetMemoryInfo")
        if memory is None:
            return
        for key, part in self._memory_parts:
            if hasattr(memory, part):
                out.add(key, getattr(memory, part), device.labels())

    def _read_processes(self, device: _Device, out: FamilySet) -> None:
        processes = self._call(device, "nvmlDeviceGetComputeRunningProcesses")
        if processes is None:
            return
        pids: set[int] = set()
        for process in processes:
            pids.add(process.pid)
            if process.usedGpuMemory is None:  # not reported (e.g. without privileges)
                continue
            pod = self._attribution.lookup(process.pid)
            labels = device.labels(
                pid=str(process.pid), pod_uid=pod.pod_uid, container_id=pod.container_id
            )
            out.add("gpu_process_memory", process.usedGpuMemory, labels)
        self._seen_pids |= pids

    def _read_slow(self, device: _Device) -> list[KeyedValue]:
        nvml, labels = self.nvml, device.labels
        slow = self._read_calls(device, "slow")
        for link in device.nvlinks:
            for error, counter in (
                ("replay", nvml.NVML_NVLINK_ERROR_DL_REPLAY),
                ("recovery", nvml.NVML_NVLINK_ERROR_DL_RECOVERY),
                ("crc_flit", nvml.NVML_NVLINK_ERROR_DL_CRC_FLIT),
                ("crc_data", nvml.NVML_NVLINK_ERROR_DL_CRC_DATA),
            ):
                count = self._call(device, "nvmlDeviceGetNvLinkErrorCounter", link, counter)
                if count is not None:
                    slow.append(("gpu_nvlink_errors", count, labels(link=str(link), error=error)))
        return slow


def _text(value: str | bytes) -> str:
    return value.decode() if isinstance(value, bytes) else str(value)


def _cuda_version(driver_version: int) -> str:
    """13000 -> "13.0" (nvmlSystemGetCudaDriverVersion encodes major*1000 + minor*10)."""
    return f"{driver_version // 1000}.{driver_version % 1000 // 10}"


def _field_value(nvml: Nvml, field_value: Any) -> float | None:
    """The value of one ``nvmlFieldValue_t``, by its value type; None when it failed."""
    if field_value.nvmlReturn != nvml.NVML_SUCCESS:
        return None
    by_type = {
        getattr(nvml, f"NVML_VALUE_TYPE_{name}"): member
        for name, member in (
            ("DOUBLE", "dVal"),
            ("UNSIGNED_INT", "uiVal"),
            ("UNSIGNED_LONG", "ulVal"),
            ("UNSIGNED_LONG_LONG", "ullVal"),
            ("SIGNED_LONG_LONG", "sllVal"),
            ("SIGNED_INT", "siVal"),
            ("UNSIGNED_SHORT", "usVal"),
        )
    }
    return float(getattr(field_value.value, by_type.get(field_value.valueType, "ullVal")))


def _convert(nvml: Nvml, alias: catalog.Alias, answer: Any) -> float | None:
    """The value an NVML answer gives for one catalogue source (see ``catalog.Alias``)."""
    value = answer
    if alias.part:
        value = value[int(alias.part)] if alias.part.isdigit() else getattr(value, alias.part)
    if alias.convert == "flag":
        return float(bool(value))
    if alias.convert == "count":
        return float(len(value))
    if alias.convert == "enabled":
        return float(value == nvml.NVML_FEATURE_ENABLED)
    if alias.convert == "field_value":
        value = _field_value(nvml, value[0])
        if value is None:
            return None
    if alias.omit is not None and value == alias.omit:
        return None
    # dividing by the inverse keeps 690123 mW at exactly 690.123 W
    return float(value / (1 / alias.scale) if alias.scale < 1 else value * alias.scale)
