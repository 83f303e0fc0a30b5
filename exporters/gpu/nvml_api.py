"""The part of pynvml the NVML collector names in its code, as a Protocol.

``pynvml`` (``nvidia-ml-py``) satisfies it, and so does the replay's ``FakeNvml``; the collector
is typed against this, not against either. The per-field reads the catalogue lists (its
``nvml`` sources) are looked up by name and are not spelled here.
"""

from __future__ import annotations

from typing import Any, Protocol


class Nvml(Protocol):
    """Errors, constants and calls of ``pynvml`` used by name (handles are opaque)."""

    NVMLError: type[Exception]
    NVMLError_NotSupported: type[Exception]
    NVMLError_FunctionNotFound: type[Exception]
    NVMLError_GpuIsLost: type[Exception]
    NVMLError_Timeout: type[Exception]

    NVML_SUCCESS: int
    NVML_FEATURE_ENABLED: int
    NVML_NVLINK_MAX_LINKS: int
    NVML_NVLINK_ERROR_DL_REPLAY: int
    NVML_NVLINK_ERROR_DL_RECOVERY: int
    NVML_NVLINK_ERROR_DL_CRC_FLIT: int
    NVML_NVLINK_ERROR_DL_CRC_DATA: int
    nvmlEventTypeXidCriticalError: int
    nvmlMemory_v2: int

    def nvmlInit(self) -> None: ...
    def nvmlShutdown(self) -> None: ...
    def nvmlSystemGetDriverVersion(self) -> str: ...
    def nvmlSystemGetCudaDriverVersion(self) -> int: ...
    def nvmlDeviceGetCount(self) -> int: ...
    def nvmlDeviceGetHandleByIndex(self, index: int, /) -> Any: ...
    def nvmlDeviceGetHandleByUUID(self, uuid: str, /) -> Any: ...
    def nvmlDeviceGetDeviceHandleFromMigDeviceHandle(self, handle: Any, /) -> Any: ...
    def nvmlDeviceGetUUID(self, handle: Any, /) -> str: ...
    def nvmlDeviceGetSupportedEventTypes(self, handle: Any, /) -> int: ...
    def nvmlDeviceRegisterEvents(
        self, handle: Any, event_types: int, event_set: Any, /
    ) -> None: ...
    def nvmlEventSetCreate(self) -> Any: ...
    def nvmlEventSetWait(self, event_set: Any, timeout_ms: int, /) -> Any: ...
    def nvmlEventSetFree(self, event_set: Any, /) -> None: ...
