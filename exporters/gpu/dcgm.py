"""GPU telemetry from a running dcgm-exporter, mapped onto the same metrics as NVML.

Which DCGM field feeds which catalogue entry, its scale to base units and the fixed labels it
stands for (``DCGM_FI_DEV_SM_CLOCK`` is ``clock="sm"``) come from the catalogue's ``dcgm``
sources. It tolerates what real exporters do:

- label spellings across versions and scrape setups: ``UUID``/``uuid``, ``Hostname``/
  ``hostname``, ``pod``/``pod_name``/``exported_pod`` (and the same for namespace, container);
- fields that are absent (no data, never zero) and the not-supported sentinels old versions
  printed instead of omitting the series;
- MIG instances (``GPU_I_ID``): memory and profiling fields are kept per instance, device-wide
  fields once per GPU;
- the sticky last-XID gauge and the windowed XID counts, both turned into XID counts.
"""

from __future__ import annotations

import logging
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from typing import Any

import requests
from prometheus_client.core import Metric

from inferwatch import catalog
from inferwatch.exporters.gpu.base import BackendDown, GpuTelemetry
from inferwatch.exporters.gpu.families import CLOCK_EVENT_BITS, FamilySet, add_clock_events
from inferwatch.exporters.gpu.scope import GpuScope
from inferwatch.exporters.gpu.xid import XidLog
from inferwatch.logs import log_event
from inferwatch.serving.page_fetch import DEFAULT_MAX_BYTES, ScrapeFailure, fetch_with_requests
from inferwatch.serving.textformat import PageSample, parse

logger = logging.getLogger("inferwatch.gpu.dcgm")

#: Fields decoded here rather than copied: a bitmask and the two XID forms.
CLOCK_REASON_FIELDS = ("DCGM_FI_DEV_CLOCK_THROTTLE_REASONS", "DCGM_FI_DEV_CLOCKS_EVENT_REASONS")
XID_LAST = "DCGM_FI_DEV_XID_ERRORS"
XID_WINDOW = "DCGM_EXP_XID_ERRORS_COUNT"
_ALL_REASONS = sum(bit for _, bit in CLOCK_EVENT_BITS)

# Label spellings, preferred first.
_UUID = ("UUID", "uuid")
_POD = ("pod", "pod_name", "exported_pod")
_NAMESPACE = ("namespace", "pod_namespace", "exported_namespace")
_CONTAINER = ("container", "container_name", "exported_container")


def is_blank(value: float) -> bool:
    """DCGM's not-supported / blank sentinels (dcgm_structs.h), printed by old exporters.

    int64 blanks sit at 2^63-16 and above, fp64 blanks at 2^47 (+0..+15), int32 blanks at
    0x7ffffff0..0x7fffffff.
    """
    return (
        value >= 2**63 - 16
        or 2**47 <= value < 2**47 + 16
        or 0x7FFFFFF0 <= value <= 0x7FFFFFFF
        or value != value  # NaN
    )


def _first(labels: Mapping[str, str], names: Iterable[str]) -> str:
    return next((labels[n] for n in names if labels.get(n)), "")


@dataclass(frozen=True)
class _Field:
    key: str
    scale: float
    labels: Mapping[str, str]
    per_instance: bool


def _field_table() -> dict[str, _Field]:
    table = {}
    for spec in catalog.load().with_source("dcgm"):
        for alias in spec.sources["dcgm"]:
            if alias.metric in CLOCK_REASON_FIELDS or alias.metric in (XID_LAST, XID_WINDOW):
                continue
            table[alias.metric] = _Field(
                spec.key, alias.scale, alias.set, "mig_instance" in spec.labels
            )
    return table


class DcgmTelemetry(GpuTelemetry):
    """Scrapes one dcgm-exporter ``/metrics`` URL with ``requests``, under the page-fetch
    rules every scrape of someone else's page keeps (``page_fetch``)."""

    backend = "dcgm"

    def __init__(
        self,
        url: str,
        *,
        http_timeout_s: float = 1.5,
        max_bytes: int = DEFAULT_MAX_BYTES,
        session: requests.Session | None = None,
        scope: GpuScope | None = None,
        timeout_s: float = 2.0,
        stale_s: float = 60.0,
    ) -> None:
        super().__init__(scope=scope, timeout_s=timeout_s, stale_s=stale_s)
        self.url = url
        self.http_timeout_s = http_timeout_s
        self.max_bytes = max_bytes
        self._session = session or requests.Session()
        self._fields = _field_table()
        self.xids = XidLog(self.faults)
        self._last_xid: dict[str, int] = {}
        self._xid_window: dict[tuple[str, int], int] = {}
        self._seen: set[str] = set()

    def close(self) -> None:
        self._session.close()
        super().close()

    def poll(self) -> list[Metric]:
        samples = [s for family in self._fetch().values() for s in family.samples]
        families = FamilySet()
        if not self.scope_known():  # which GPUs are ours is not known: serve none of them
            return families.families()
        scoped = self._scoped(samples)
        present = self._map([s for s in samples if _first(s.labels, _UUID) in scoped], families)
        for uuid in sorted(self._seen - present):
            if self.faults.mark(uuid, "lost", "GPU disappeared from dcgm-exporter"):
                log_event(logger, logging.ERROR, "gpu lost", gpu_uuid=uuid, url=self.url)
        self._seen |= present
        self.xids.fill(families, self._seen)
        self.faults.fill(families, self._seen)
        return families.families()

    def _scoped(self, samples: list[PageSample]) -> set[str]:
        """UUIDs on the page that the scope covers.

        A dcgm-exporter page carries every GPU of the node, keyed by ``UUID`` and ``gpu``
        (index). MIG device UUIDs are not on it; a MIG slice is found through the pod
        labels dcgm-exporter's kubelet mapping (``-k``) puts on the slice's series.
        """
        devices: dict[str, int | None] = {}
        owned: set[str] = set()
        pod = (getattr(self.scope, "namespace", None), getattr(self.scope, "pod", None))
        for sample in samples:
            uuid = _first(sample.labels, _UUID)
            if not uuid or not sample.name.startswith("DCGM_"):
                continue
            index = sample.labels.get("gpu", "")
            devices.setdefault(uuid, int(index) if index.isascii() and index.isdigit() else None)
            if pod[1] and (_first(sample.labels, _NAMESPACE), _first(sample.labels, _POD)) == pod:
                owned.add(uuid)
        selection = self.scope.selection()
        return self.in_scope(devices, also=owned if selection and selection.migs else ())

    def _fetch(self) -> dict[str, Any]:
        try:
            body = fetch_with_requests(
                self._session,
                self.url,
                accept="text/plain;version=0.0.4",
                timeout_s=self.http_timeout_s,
                max_bytes=self.max_bytes,
            )
        except ScrapeFailure as failure:
            raise BackendDown(failure.reason, f"{self.url}: {failure.detail}") from None
        try:
            families = parse(body).families
        except ValueError as error:
            raise BackendDown("not_metrics", f"{self.url}: {error}") from None
        if not any(name.startswith(("DCGM_FI_", "DCGM_EXP_")) for name in families):
            raise BackendDown("not_metrics", f"{self.url}: no DCGM fields in the response")
        return families

    def _map(self, samples: list[PageSample], out: FamilySet) -> set[str]:
        """Fill ``out``; return the UUIDs present."""
        present: set[str] = set()
        memory: dict[tuple[str, str], dict[str, float]] = {}
        windowed = {_first(s.labels, _UUID) for s in samples if s.name == XID_WINDOW}
        for sample in samples:
            labels = sample.labels
            uuid = _first(labels, _UUID)
            if not uuid or not sample.name.startswith("DCGM_"):
                continue
            present.add(uuid)
            instance = labels.get("GPU_I_ID", "")
            self._identity(uuid, labels, instance, out)
            if is_blank(sample.value):
                continue
            if sample.name in CLOCK_REASON_FIELDS:
                add_clock_events(out, uuid, int(sample.value), _ALL_REASONS)
            elif sample.name == XID_WINDOW:
                self._xid_window_count(uuid, labels.get("xid", ""), int(sample.value))
            elif sample.name == XID_LAST and uuid not in windowed:
                self._xid_last(uuid, int(sample.value))
            field = self._fields.get(sample.name)
            if field is None:
                continue
            value = sample.value * field.scale
            extra = dict(field.labels)
            if field.per_instance:
                extra["mig_instance"] = instance
                if field.key.startswith("gpu_memory_"):
                    memory.setdefault((uuid, instance), {})[field.key] = value
            out.add(field.key, value, {"gpu_uuid": uuid, **extra})
            self.check_faults(uuid, field.key, extra, value)
        for (uuid, instance), parts in memory.items():
            keys = ("gpu_memory_used", "gpu_memory_free", "gpu_memory_reserved")
            if "gpu_memory_total" not in parts and all(k in parts for k in keys):
                total = sum(parts[k] for k in keys)
                out.add("gpu_memory_total", total, {"gpu_uuid": uuid, "mig_instance": instance})
        return present

    def _identity(
        self, uuid: str, labels: Mapping[str, str], instance: str, out: FamilySet
    ) -> None:
        if not instance:
            out.add(
                "gpu_info",
                1,
                {
                    "gpu_uuid": uuid,
                    "index": labels.get("gpu", ""),
                    "pci_bus_id": labels.get("pci_bus_id", ""),
                    "name": labels.get("modelName", ""),
                },
            )
        driver = labels.get("DCGM_FI_DRIVER_VERSION")
        if driver:
            out.add("gpu_driver_info", 1, {"driver_version": driver})
        pod = _first(labels, _POD)
        if pod:
            out.add(
                "gpu_pod_info",
                1,
                {
                    "gpu_uuid": uuid,
                    "pod": pod,
                    "namespace": _first(labels, _NAMESPACE),
                    "container": _first(labels, _CONTAINER),
                },
            )

    def _xid_last(self, uuid: str, xid: int) -> None:
        """The last-XID gauge is sticky: count an XID when the value changes to it."""
        if xid and self._last_xid.get(uuid) != xid:
            self.xids.record(uuid, xid)
        self._last_xid[uuid] = xid

    def _xid_window_count(self, uuid: str, xid_label: str, count: int) -> None:
        """Windowed counts: a rise is that many new XIDs (a fall is the window sliding)."""
        if not (xid_label.isascii() and xid_label.isdigit()):
            return
        xid = int(xid_label)
        before = self._xid_window.get((uuid, xid), 0)
        if count > before:
            self.xids.record(uuid, xid, count - before)
        self._xid_window[uuid, xid] = count
