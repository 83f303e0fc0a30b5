"""XID classification against NVIDIA's catalogue, and which XIDs take a GPU out of service."""

from __future__ import annotations

import pytest

from inferwatch.exporters.gpu.families import FamilySet
from inferwatch.exporters.gpu.faults import FaultBook
from inferwatch.exporters.gpu.xid import ACTIONS, XidLog, catalogue, classify

pytestmark = pytest.mark.unit

# Every row of the reference table (GPU reference notes, section 3): XID -> (NVIDIA's
# immediate bucket, our action).
REFERENCE = {
    8: ("RESTART_APP", "restart_app"),
    13: ("RESTART_APP", "restart_app"),
    31: ("RESTART_APP", "restart_app"),
    32: ("RESTART_APP", "restart_app"),
    43: ("IGNORE", "ignore"),
    45: ("WORKFLOW_XID_45", "ignore"),
    46: ("RESET_GPU", "reset_gpu"),
    48: ("WORKFLOW_XID_48", "reset_gpu"),
    54: ("CHECK_MECHANICALS", "check_hardware"),
    61: ("CONTACT_SUPPORT", "contact_support"),
    62: ("RESET_GPU", "reset_gpu"),
    63: ("IGNORE", "ignore"),
    64: ("RESET_GPU", "reset_gpu"),
    68: ("RESTART_APP", "restart_app"),
    74: ("WORKFLOW_NVLINK_ERR", "reset_gpu"),
    79: ("RESTART_BM", "reboot_node"),
    92: ("IGNORE", "ignore"),
    94: ("RESTART_APP", "restart_app"),
    95: ("RESET_GPU", "reset_gpu"),
    109: ("RESET_GPU", "reset_gpu"),
    110: ("RESET_GPU", "reset_gpu"),
    119: ("RESET_GPU", "reset_gpu"),
    120: ("RESET_GPU", "reset_gpu"),
    121: ("IGNORE", "ignore"),
    136: ("RESET_GPU", "reset_gpu"),
    137: ("IGNORE", "ignore"),
    140: ("RESET_GPU", "reset_gpu"),
    143: ("RESET_GPU", "reset_gpu"),
    **{x: ("WORKFLOW_NVLINK5_ERR", "reset_gpu") for x in range(144, 151)},
    151: ("RESTART_VM", "reboot_node"),
    154: ("XID_154", "ignore"),
    155: ("RESET_GPU", "reset_gpu"),
    156: ("RESET_GPU", "reset_gpu"),
    157: ("IGNORE", "ignore"),
    158: ("RESET_GPU", "reset_gpu"),
    159: ("CHECK_UVM", "check_app"),
}
APPLICATION_XIDS = (13, 31, 43, 45)


@pytest.mark.parametrize(("xid", "expected"), sorted(REFERENCE.items()))
def test_every_reference_xid_is_classified(xid: int, expected: tuple[str, str]) -> None:
    info = classify(xid)
    assert (info.bucket, info.action) == expected
    assert info.mnemonic != "UNKNOWN"


def test_catalogue_has_exactly_the_reference_rows() -> None:
    assert set(catalogue()) == set(REFERENCE)
    assert {info.action for info in catalogue().values()} <= set(ACTIONS)


def test_unknown_xid_is_counted_but_not_fatal() -> None:
    info = classify(999)
    assert info.action == "unknown" and not info.out_of_service


@pytest.mark.parametrize("xid", sorted(REFERENCE))
def test_readiness_fails_exactly_on_reset_and_reboot_xids(xid: int) -> None:
    faults = FaultBook()
    log = XidLog(faults, wall_clock=lambda: 1_800_000_000.0)
    log.record("GPU-1", xid)
    ready = faults.condition().ok
    assert ready == (REFERENCE[xid][1] not in ("reset_gpu", "reboot_node"))
    if xid in APPLICATION_XIDS:
        assert ready


def test_counts_and_last_time_are_exposed() -> None:
    faults = FaultBook()
    log = XidLog(faults, wall_clock=lambda: 1_800_000_000.0)
    log.record("GPU-1", 31)
    log.record("GPU-1", 31, count=2)
    log.record("GPU-1", 79)
    families = FamilySet()
    log.fill(families, {"GPU-1"})
    got = {
        (s.name, tuple(sorted(s.labels.items()))): s.value
        for f in families.families()
        for s in f.samples
    }
    assert (
        got[
            (
                "inferwatch_gpu_xid_errors_total",
                (("action", "restart_app"), ("gpu_uuid", "GPU-1"), ("xid", "31")),
            )
        ]
        == 3
    )
    assert (
        got[
            (
                "inferwatch_gpu_xid_errors_total",
                (("action", "reboot_node"), ("gpu_uuid", "GPU-1"), ("xid", "79")),
            )
        ]
        == 1
    )
    assert got[("inferwatch_gpu_xid_last_timestamp_seconds", (("gpu_uuid", "GPU-1"),))] == (
        1_800_000_000.0
    )
    condition = faults.condition()
    assert not condition.ok and condition.reason == (
        "GPU-1: XID 79 GPU_HAS_FALLEN_OFF_THE_BUS: reboot_node"
    )
