"""PID -> pod attribution from /proc/<pid>/cgroup, in the shapes kubelets really write."""

from __future__ import annotations

from pathlib import Path

import pytest

from inferwatch.exporters.gpu.cgroup import NOT_IN_A_POD, PodRef, ProcessAttribution, parse_cgroup

pytestmark = pytest.mark.unit

UID = "0b7632a2-a56e-4278-987a-22de18008dbe"
CID = "0bc5eac79e3ae7a0c2651f14722aa10fa333eb2325c2ca97da33aa284cda81b0"
SYSTEMD_UID = UID.replace("-", "_")

V1_CGROUPFS = (
    "\n".join(
        f"{n}:{controller}:/kubepods/burstable/pod{UID}/{CID}"
        for n, controller in [
            (12, "hugetlb"),
            (11, "memory"),
            (10, "devices"),
            (9, "pids"),
            (4, "cpu,cpuacct"),
            (1, "name=systemd"),
        ]
    )
    + "\n0::/\n"
)


@pytest.mark.parametrize(
    ("text", "expected"),
    [
        (V1_CGROUPFS, PodRef(UID, CID)),
        (
            f"11:memory:/kubepods.slice/kubepods-burstable.slice/kubepods-burstable-pod"
            f"{SYSTEMD_UID}.slice/docker-{CID}.scope\n",
            PodRef(UID, CID),
        ),
        (
            f"0::/kubepods.slice/kubepods-besteffort.slice/kubepods-besteffort-pod{SYSTEMD_UID}"
            f".slice/cri-containerd-{CID}.scope\n",
            PodRef(UID, CID),
        ),
        (
            f"0::/kubepods.slice/kubepods-pod{SYSTEMD_UID}.slice/crio-{CID}.scope\n",
            PodRef(UID, CID),
        ),  # Guaranteed QoS: no QoS level in the path
        (f"0::/kubepods/besteffort/pod{UID}/{CID}\n", PodRef(UID, CID)),  # v2, cgroupfs
        (
            f"0::/system.slice/containerd.service/kubepods-burstable-pod{SYSTEMD_UID}.slice"
            f":cri-containerd:{CID}\n",
            PodRef(UID, CID),
        ),
        (
            f"0::/kubelet.slice/kubelet-kubepods.slice/kubelet-kubepods-besteffort.slice/"
            f"kubelet-kubepods-besteffort-pod{SYSTEMD_UID}.slice/cri-containerd-{CID}.scope\n",
            PodRef(UID, CID),
        ),  # kind
        (
            f"0::/kubepods.slice/kubepods-burstable.slice/kubepods-burstable-pod{SYSTEMD_UID}"
            f".slice/crio-conmon-{CID}.scope\n",
            PodRef(UID, ""),
        ),  # conmon, not the container
        (
            f"0::/kubepods.slice/kubepods-burstable.slice/kubepods-burstable-pod{SYSTEMD_UID}"
            ".slice\n",
            PodRef(UID, ""),
        ),
        ("0::/init.scope\n", NOT_IN_A_POD),
        (f"0::/system.slice/docker-{CID}.scope\n", NOT_IN_A_POD),  # a container, not a pod
        ("0::/\n", NOT_IN_A_POD),
        ("", NOT_IN_A_POD),
    ],
    ids=[
        "v1-cgroupfs",
        "v1-systemd-docker",
        "v2-systemd-containerd",
        "v2-guaranteed-crio",
        "v2-cgroupfs",
        "containerd-systemd-colon",
        "kind",
        "crio-conmon",
        "pod-only",
        "host",
        "plain-docker",
        "namespaced-root",
        "empty",
    ],
)
def test_parse_cgroup(text: str, expected: PodRef) -> None:
    assert parse_cgroup(text) == expected


def test_lookup_caches_and_forgets_gone_pids(tmp_path: Path) -> None:
    (tmp_path / "7").mkdir()
    cgroup = tmp_path / "7" / "cgroup"
    cgroup.write_text(f"0::/kubepods/besteffort/pod{UID}/{CID}\n")
    attribution = ProcessAttribution(tmp_path)
    assert attribution.lookup(7) == PodRef(UID, CID)
    cgroup.write_text("0::/init.scope\n")  # PID reused by a host process
    assert attribution.lookup(7) == PodRef(UID, CID)  # cached while still listed
    attribution.retain(set())
    assert attribution.lookup(7) == NOT_IN_A_POD
    assert attribution.lookup(8) == NOT_IN_A_POD  # no such process (or no hostPID)
    assert ProcessAttribution(None).lookup(7) == NOT_IN_A_POD
