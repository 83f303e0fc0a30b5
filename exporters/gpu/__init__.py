"""GPU telemetry: NVML, dcgm-exporter and recorded replays behind one interface.

``open_backend(spec)`` turns the sidecar's ``--gpu`` value into a ``GpuTelemetry``:

    auto          NVML when a driver answers ``nvmlInit``, else none (with the reason)
    nvml          NVML; if it cannot start, GPU metrics are absent, the health metric says why,
                  and initialisation is retried every minute
    dcgm=URL      scrape a running dcgm-exporter (http://host:9400/metrics)
    replay=PATH   play back an NVML recording (a directory or its series file)
    none          no GPU telemetry (a CPU-only replica: no GPU series at all)

The ``scope`` option (a ``GpuScope``, see ``scope``) says which of the GPUs a backend sees
belong to this replica: only their series are served and only their faults fail readiness.
"""

from __future__ import annotations

import logging
from pathlib import Path
from typing import Any
from urllib.parse import urlparse

from inferwatch.exporters.gpu.base import BackendDown, GpuTelemetry, NoGpuTelemetry
from inferwatch.logs import log_event

__all__ = ["BackendDown", "GpuTelemetry", "open_backend"]

logger = logging.getLogger("inferwatch.gpu")

SPEC_HELP = "auto, nvml, dcgm=URL, replay=PATH or none"


def open_backend(spec: str, **options: Any) -> GpuTelemetry:
    """The backend for a ``--gpu`` value; ValueError (one line) when the value is wrong.

    ``options`` go to the backend's constructor (timeouts, cadences).
    """
    kind, _, argument = spec.strip().partition("=")
    if kind in ("auto", "nvml", "none") and argument:
        raise ValueError(f"--gpu {spec!r}: {kind} takes no value (expected {SPEC_HELP})")
    if kind == "none":
        return NoGpuTelemetry()
    if kind in ("auto", "nvml"):
        return _open_nvml(required=kind == "nvml", **options)
    if kind == "dcgm":
        url = urlparse(argument)
        if url.scheme not in ("http", "https") or not url.netloc:
            raise ValueError(
                f"--gpu {spec!r}: dcgm needs an http(s) URL, e.g. "
                "dcgm=http://127.0.0.1:9400/metrics"
            )
        from inferwatch.exporters.gpu.dcgm import DcgmTelemetry

        return DcgmTelemetry(argument, **options)
    if kind == "replay":
        from inferwatch.exporters.gpu.replay import ReplayTelemetry

        path = Path(argument)
        if not argument or not path.exists():
            raise ValueError(f"--gpu {spec!r}: no NVML recording at {argument!r}")
        try:
            replay = ReplayTelemetry(path, **options)
        except (OSError, ValueError, KeyError, IndexError) as error:
            raise ValueError(f"--gpu {spec!r}: not an NVML recording ({error})") from None
        replay.start()
        return replay
    raise ValueError(f"--gpu {spec!r}: unknown backend {kind!r} (expected {SPEC_HELP})")


def _open_nvml(required: bool, **options: Any) -> GpuTelemetry:
    from inferwatch.exporters.gpu.nvml import NvmlTelemetry

    nvml = options.pop("nvml", None)
    if nvml is None:
        import pynvml  # type: ignore[import-untyped]

        nvml = pynvml
    telemetry = NvmlTelemetry(nvml, **options)
    try:
        telemetry.start()
    except BackendDown as down:
        if required:  # keep it: it retries, and its health metric says why meanwhile
            log_event(
                logger, logging.WARNING, "nvml unavailable", reason=down.reason, detail=down.detail
            )
            return telemetry
        telemetry.close()
        log_event(
            logger,
            logging.INFO,
            "no NVIDIA driver; gpu telemetry off",
            reason=down.reason,
            detail=down.detail,
        )
        return NoGpuTelemetry()
    return telemetry
