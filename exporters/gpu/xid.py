"""XID errors classified with NVIDIA's XID catalogue (``xid.yaml``).

An XID is the driver's error code for a GPU fault. Whether it means "the application crashed"
or "this GPU must be reset before it serves again" depends on the code, so every XID that
inferwatch sees is labelled with the catalogue's recommended action, and the actions that take
the GPU out of service fail the sidecar's ``/readyz`` at once.
"""

from __future__ import annotations

import functools
import logging
import threading
import time
from collections.abc import Callable, Collection, Mapping
from dataclasses import dataclass
from importlib import resources
from typing import Literal, get_args

from inferwatch import config as layer
from inferwatch.exporters.gpu.families import FamilySet
from inferwatch.exporters.gpu.faults import FaultBook
from inferwatch.logs import log_event

logger = logging.getLogger("inferwatch.gpu.xid")

Action = Literal[
    "ignore",
    "restart_app",
    "check_app",
    "reset_gpu",
    "reboot_node",
    "check_hardware",
    "contact_support",
    "unknown",
]
ACTIONS: tuple[Action, ...] = get_args(Action)
#: Actions after which the GPU must not take traffic until it is reset or the node rebooted.
OUT_OF_SERVICE: frozenset[Action] = frozenset({"reset_gpu", "reboot_node"})


@dataclass(frozen=True)
class XidInfo:
    xid: int
    mnemonic: str
    bucket: str
    action: Action
    note: str = ""

    @property
    def out_of_service(self) -> bool:
        return self.action in OUT_OF_SERVICE


@functools.cache
def catalogue() -> Mapping[int, XidInfo]:
    """The shipped XID catalogue, by XID number (read once per process)."""
    text = resources.files(__package__).joinpath("xid.yaml").read_text(encoding="utf-8")
    entries = layer.parse(text, "xid.yaml")["xids"]
    table: dict[int, XidInfo] = {}
    for xid, raw in entries.items():
        action = raw["action"]
        if action not in ACTIONS:
            raise ValueError(f"xid.yaml: XID {xid}: action {action!r} is not one of {ACTIONS}")
        table[int(xid)] = XidInfo(
            int(xid), str(raw["mnemonic"]), str(raw["bucket"]), action, str(raw.get("note", ""))
        )
    return table


def classify(xid: int) -> XidInfo:
    """The catalogue entry for ``xid``; codes the catalogue lacks get action ``unknown``.

    Unknown codes are counted and logged but do not fail readiness: taking a replica out of
    service needs the catalogue's word that the GPU is broken.
    """
    known = catalogue().get(xid)
    return known if known is not None else XidInfo(xid, "UNKNOWN", "UNKNOWN", "unknown")


class XidLog:
    """XIDs seen per GPU: counts by code, the time of the last one, and faults for readiness.

    Written by the NVML event thread or the DCGM poll, read by the scrape.
    """

    def __init__(self, faults: FaultBook, wall_clock: Callable[[], float] = time.time) -> None:
        self._faults = faults
        self._wall_clock = wall_clock
        self._lock = threading.Lock()
        self._counts: dict[tuple[str, int], int] = {}
        self._last: dict[str, float] = {}

    def record(self, gpu_uuid: str, xid: int, count: int = 1) -> XidInfo:
        info = classify(xid)
        with self._lock:
            self._counts[gpu_uuid, xid] = self._counts.get((gpu_uuid, xid), 0) + count
            self._last[gpu_uuid] = self._wall_clock()
        log_event(
            logger,
            logging.ERROR if info.out_of_service else logging.WARNING,
            "gpu xid",
            gpu_uuid=gpu_uuid,
            xid=xid,
            mnemonic=info.mnemonic,
            action=info.action,
        )
        if info.out_of_service:
            self._faults.mark(gpu_uuid, "xid", f"XID {xid} {info.mnemonic}: {info.action}")
        return info

    def total(self) -> int:
        with self._lock:
            return sum(self._counts.values())

    def fill(self, families: FamilySet, gpu_uuids: Collection[str]) -> None:
        """The XID series of ``gpu_uuids`` (the GPUs in scope)."""
        with self._lock:
            counts = {key: n for key, n in self._counts.items() if key[0] in gpu_uuids}
            last = {uuid: t for uuid, t in self._last.items() if uuid in gpu_uuids}
        for (uuid, xid), count in sorted(counts.items()):
            labels = {"gpu_uuid": uuid, "xid": str(xid), "action": classify(xid).action}
            families.add("gpu_xid_errors", count, labels)
        for uuid, when in sorted(last.items()):
            families.add("gpu_xid_last", when, {"gpu_uuid": uuid})
