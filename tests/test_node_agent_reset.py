"""The node agent consumes the receiver's GPU reset request: drains the GPU's replicas through
their sidecars, resets it with ``nvidia-smi --gpu-reset -i UUID`` once no process holds it,
verifies it through the GPU backend, clears the request and lifts the isolation, guarded.

The node is the fake Kubernetes API's (the request written as the receiver's
``kubernetes_request_gpu_reset`` writes it), the GPU the H200 recording replayed by
``FakeNvml``, the sidecar a real one, and ``nvidia-smi`` a stand-in on the PATH that records
its arguments. No real GPU is touched.
"""

from __future__ import annotations

import asyncio
import json
import logging
import os
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pynvml
import pytest
from click.testing import CliRunner
from starlette.testclient import TestClient

from inferwatch.cli import main
from inferwatch.drill.kubefake import FakeKube
from inferwatch.exporters.gpu.fake_nvml import FakeNvml
from inferwatch.exporters.gpu.podresources import Allocation
from inferwatch.exporters.gpu.recording import Recording
from inferwatch.nodeagent import agent as node_agent
from inferwatch.nodeagent.gpu_reset import (
    PREFIX,
    REQUESTED,
    Attempt,
    KubeletReplicas,
    KubernetesNode,
    NvmlGpus,
    ResetAgent,
)
from inferwatch.nodeagent.kube_facts import GPU_RESET_RULES
from inferwatch.runbooks.actions.kubernetes_api import connect
from support.runbooks_harness import SIDECAR_TOKEN, Loop, SidecarUnderTest
from support.shared import shared_path
from support.wait import wait_for

pytestmark = pytest.mark.proc

RECORDING = shared_path("fixtures/gpu/nvml-h200")
NODE = "gpu-node-1"
IDLE_T, BUSY_T = 100.0, 60.0  # seconds into the recording: no process, and vLLM's PID 418
STAND_IN = '#!/bin/sh\necho "$@" >> "$NVIDIA_SMI_RECORD"\nexit "${NVIDIA_SMI_EXIT:-0}"\n'


@pytest.fixture
def nvml() -> Iterator[FakeNvml]:
    fake = FakeNvml(Recording.load(RECORDING), gpus=2)
    fake.nvmlInit()
    fake.seek(IDLE_T)
    yield fake
    fake.nvmlShutdown()


def uuid(nvml: FakeNvml, index: int = 0) -> str:
    return str(nvml.nvmlDeviceGetUUID(nvml.nvmlDeviceGetHandleByIndex(index)))


@pytest.fixture
def nvidia_smi(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    """The stand-in on the PATH; returns the file its calls are recorded in."""
    folder = tmp_path / "bin"
    folder.mkdir()
    script = folder / "nvidia-smi"
    script.write_text(STAND_IN)
    script.chmod(0o755)
    record = tmp_path / "nvidia-smi.calls"
    monkeypatch.setenv("PATH", f"{folder}{os.pathsep}{os.environ['PATH']}")
    monkeypatch.setenv("NVIDIA_SMI_RECORD", str(record))
    return record


def calls(record: Path) -> list[str]:
    return record.read_text().splitlines() if record.exists() else []


def request(fingerprint: str, at: str) -> str:
    return json.dumps({"xid": "48", "reason": "InferwatchGPUXidErrors: XID 48",
                       "fingerprint": fingerprint, "requested_at": at})  # fmt: skip


@pytest.fixture
def fake(nvml: FakeNvml) -> FakeKube:
    served = FakeKube()
    served.rules = GPU_RESET_RULES  # what the kit's ClusterRole grants the node agent, nothing more
    served.add_node(
        NODE,
        labels={REQUESTED: "true"},
        annotations={PREFIX + uuid(nvml): request("f1", "2026-12-01T08:00:00Z")},
    )
    return served


class Given:
    """The sidecars each GPU was given (the agent learns them from the kubelet)."""

    def __init__(self, sidecars: dict[str, list[str]]) -> None:
        self.sidecars = sidecars

    def holding(self, gpu_uuid: str) -> list[str]:
        return self.sidecars.get(gpu_uuid, [])


@pytest.fixture
def stack(fake: FakeKube, nvml: FakeNvml, runbook_loop: Loop) -> Iterator[dict[str, Any]]:
    sidecar = SidecarUnderTest(runbook_loop, "http://127.0.0.1:9", model="llama")
    with fake.serve() as url, connect(url) as api:
        yield {"api": api, "sidecar": sidecar,
               "given": Given({uuid(nvml): [sidecar.url + "/admin/isolation"]})}  # fmt: skip
    sidecar.served.stop()


def agent(stack: dict[str, Any], nvml: FakeNvml, **options: Any) -> ResetAgent:
    node = KubernetesNode(stack["api"], NODE)
    return ResetAgent(NODE, node, NvmlGpus(nvml), stack["given"], SIDECAR_TOKEN, **options)


def once(loop: Loop, reset: ResetAgent) -> list[Attempt]:
    result: list[Attempt] = loop.run(reset.run_once, timeout=60)
    return result


def metadata(fake: FakeKube) -> dict[str, Any]:
    node = fake.get("nodes", "", NODE)
    assert node is not None
    found: dict[str, Any] = node["metadata"]
    return found


def test_an_idle_gpu_is_drained_reset_verified_and_its_request_cleared(
    fake: FakeKube, nvml: FakeNvml, runbook_loop: Loop, stack: dict[str, Any], nvidia_smi: Path,
    caplog: pytest.LogCaptureFixture,
) -> None:  # fmt: skip
    isolations: list[bool] = []
    fake_holders = NvmlGpus.holders

    def holders(self: NvmlGpus, gpu_uuid: str) -> list[int]:
        isolations.append(bool(stack["sidecar"].state()["isolated"]))  # drained before this
        return fake_holders(self, gpu_uuid)

    reset = agent(stack, nvml)
    with pytest.MonkeyPatch.context() as patch, caplog.at_level(logging.INFO):
        patch.setattr(NvmlGpus, "holders", holders)
        (attempt,) = once(runbook_loop, reset)
    assert attempt.decision == "reset", attempt
    assert isolations == [True], "the replica is isolated before the GPU is checked"
    assert calls(nvidia_smi) == [f"--gpu-reset -i {uuid(nvml)}"]
    assert PREFIX + uuid(nvml) not in metadata(fake)["annotations"]
    assert REQUESTED not in metadata(fake)["labels"], "the last request takes the label along"
    assert stack["sidecar"].state()["isolated"] is False, "the agent lifts its own isolation"
    (line,) = [r for r in caplog.records if r.getMessage() == "gpu reset"]
    fields = line.__dict__["inferwatch_fields"]
    assert (fields["decision"], fields["gpu_uuid"], fields["fingerprint"], fields["node"]) == (
        "reset",
        uuid(nvml),
        "f1",
        NODE,
    )


def test_a_gpu_a_process_still_holds_is_drained_and_left_pending(
    fake: FakeKube, nvml: FakeNvml, runbook_loop: Loop, stack: dict[str, Any], nvidia_smi: Path
) -> None:
    nvml.seek(BUSY_T)
    (attempt,) = once(runbook_loop, agent(stack, nvml))
    assert attempt.decision == "waiting" and "418" in attempt.detail, attempt
    assert calls(nvidia_smi) == []
    assert PREFIX + uuid(nvml) in metadata(fake)["annotations"]
    assert stack["sidecar"].state()["isolated"] is True, "drained while it waits"
    nvml.seek(IDLE_T)  # the engine let go of the GPU: the next pass resets it
    (attempt,) = once(runbook_loop, agent(stack, nvml))
    assert attempt.decision == "reset" and len(calls(nvidia_smi)) == 1


def test_a_failed_reset_keeps_the_request_and_the_isolation_and_is_not_retried_in_cooldown(
    fake: FakeKube, nvml: FakeNvml, runbook_loop: Loop, stack: dict[str, Any], nvidia_smi: Path,
    monkeypatch: pytest.MonkeyPatch,
) -> None:  # fmt: skip
    monkeypatch.setenv("NVIDIA_SMI_EXIT", "3")
    reset = agent(stack, nvml)
    (attempt,) = once(runbook_loop, reset)
    assert attempt.decision == "failed" and "exited 3" in attempt.detail, attempt
    assert PREFIX + uuid(nvml) in metadata(fake)["annotations"]
    assert stack["sidecar"].state()["isolated"] is True
    (again,) = once(runbook_loop, reset)
    assert again.decision == "cooldown", again
    assert len(calls(nvidia_smi)) == 1


def test_a_gpu_that_does_not_come_back_healthy_keeps_its_request(
    fake: FakeKube, nvml: FakeNvml, runbook_loop: Loop, stack: dict[str, Any], nvidia_smi: Path
) -> None:
    nvml.inject("nvmlDeviceGetRemappedRows", pynvml.NVMLError(pynvml.NVML_ERROR_GPU_IS_LOST))
    (attempt,) = once(runbook_loop, agent(stack, nvml))
    assert attempt.decision == "failed" and "not readable after the reset" in attempt.detail
    assert len(calls(nvidia_smi)) == 1
    assert PREFIX + uuid(nvml) in metadata(fake)["annotations"]
    assert stack["sidecar"].state()["isolated"] is True


def test_dry_run_drains_nothing_and_resets_nothing(
    fake: FakeKube, nvml: FakeNvml, runbook_loop: Loop, stack: dict[str, Any], nvidia_smi: Path
) -> None:
    (attempt,) = once(runbook_loop, agent(stack, nvml, dry_run=True))
    assert attempt.decision == "dry_run", attempt
    assert calls(nvidia_smi) == []
    assert stack["sidecar"].state()["isolated"] is False
    assert PREFIX + uuid(nvml) in metadata(fake)["annotations"]


def test_one_reset_at_a_time_oldest_request_first(
    fake: FakeKube, nvml: FakeNvml, runbook_loop: Loop, stack: dict[str, Any], nvidia_smi: Path
) -> None:
    first, second = uuid(nvml, 0), uuid(nvml, 1)
    fake.add_node(
        NODE,
        labels={REQUESTED: "true"},
        annotations={PREFIX + second: request("f2", "2026-12-01T08:05:00Z"),
                     PREFIX + first: request("f1", "2026-12-01T08:00:00Z")},
    )  # fmt: skip
    reset = agent(stack, nvml)
    (attempt,) = once(runbook_loop, reset)
    assert attempt.gpu_uuid == first and calls(nvidia_smi) == [f"--gpu-reset -i {first}"]
    assert metadata(fake)["labels"].get(REQUESTED) == "true", "another request is pending"

    async def two_passes_at_once() -> list[list[Attempt]]:
        return list(await asyncio.gather(reset.run_once(), reset.run_once()))

    passes: list[list[Attempt]] = runbook_loop.run(two_passes_at_once, timeout=60)
    assert sorted(len(p) for p in passes) == [0, 1], "a pass while one runs does nothing"
    assert calls(nvidia_smi) == [f"--gpu-reset -i {first}", f"--gpu-reset -i {second}"]
    assert REQUESTED not in metadata(fake)["labels"]


#: annotations under the request prefix that name no GPU of this node
FOREIGN = ("0", "all", "GPU-00000000-0000-0000-0000-000000000000", "GPU-" + "f" * 40)


def test_a_request_for_no_gpu_of_this_node_is_ignored_counted_and_the_real_one_handled(
    fake: FakeKube, nvml: FakeNvml, runbook_loop: Loop, stack: dict[str, Any], nvidia_smi: Path,
    caplog: pytest.LogCaptureFixture,
) -> None:  # fmt: skip
    """``/0`` or ``/all`` (a typo, or a hand-written annotation) sorted first and failed every
    pass before the real request; a backend that took it could reset every GPU."""
    real = uuid(nvml)
    planted = {PREFIX + key: request("x", "2026-12-01T07:00:00Z") for key in FOREIGN}
    ours = {PREFIX + real: request("f1", "2026-12-01T08:00:00Z")}
    fake.add_node(NODE, labels={REQUESTED: "true"}, annotations={**planted, **ours})
    reset = agent(stack, nvml)
    served = node_agent.app(Allocations(), "agent-token", NODE, reset=reset)
    with caplog.at_level(logging.INFO):
        (attempt,) = once(runbook_loop, reset)
        assert (attempt.gpu_uuid, attempt.decision) == (real, "reset"), attempt
        assert once(runbook_loop, reset) == []  # the foreign ones again: nothing to do
    assert calls(nvidia_smi) == [f"--gpu-reset -i {real}"]
    ignored = [r.__dict__["inferwatch_fields"] for r in caplog.records
               if r.getMessage() == "gpu reset request ignored"]  # fmt: skip
    assert sorted(f["gpu_uuid"] for f in ignored) == sorted(FOREIGN), "one line each, once"
    assert all(f["node"] == NODE and "not a GPU of this node" in f["reason"] for f in ignored)
    assert set(planted) <= set(metadata(fake)["annotations"]), "ignored, not removed"
    with TestClient(served) as http:
        text = http.get("/metrics").text
    assert f"inferwatch_node_agent_gpu_reset_ignored_total {len(FOREIGN)}.0" in text.splitlines()


def test_the_replicas_of_a_gpu_are_the_sidecar_pods_on_the_node_the_kubelet_gave_it(
    nvml: FakeNvml, monkeypatch: pytest.MonkeyPatch
) -> None:
    from kubernetes import client

    asked: list[dict[str, str]] = []

    def listed(self: client.CoreV1Api, **selectors: str) -> client.V1PodList:
        asked.append(selectors)
        pods = [("serving", "llama-0", "10.1.0.7"), ("serving", "llama-1", "10.1.0.8"),
                ("serving", "pending", None)]  # fmt: skip
        return client.V1PodList(items=[
            client.V1Pod(metadata=client.V1ObjectMeta(name=name, namespace=namespace),
                         status=client.V1PodStatus(pod_ip=ip))
            for namespace, name, ip in pods
        ])  # fmt: skip

    class Kubelet:
        def allocation(self, pod: str, namespace: str) -> Allocation:
            given = {"llama-0": (uuid(nvml, 0),), "llama-1": (uuid(nvml, 1),),
                     "pending": (uuid(nvml, 0),)}  # fmt: skip
            return Allocation(pod, namespace, given[pod])

    monkeypatch.setattr(client.CoreV1Api, "list_pod_for_all_namespaces", listed)
    replicas = KubeletReplicas(client.ApiClient(), Kubelet(), NODE)
    assert replicas.holding(uuid(nvml, 0)) == ["http://10.1.0.7:9400/admin/isolation"]
    assert asked == [
        {"field_selector": f"spec.nodeName={NODE}", "label_selector": "inferwatch.io/sidecar=true"}
    ]


def test_the_node_agent_carries_out_requests_in_the_background(
    fake: FakeKube, nvml: FakeNvml, stack: dict[str, Any], nvidia_smi: Path
) -> None:
    served = node_agent.app(Allocations(), "agent-token", NODE, reset=agent(stack, nvml),
                            reset_interval_s=0.05)  # fmt: skip
    with TestClient(served):
        wait_for(
            lambda: PREFIX + uuid(nvml) not in metadata(fake)["annotations"] or None,
            "the request cleared", 30,
        )  # fmt: skip
    assert calls(nvidia_smi) == [f"--gpu-reset -i {uuid(nvml)}"]


class Allocations:
    def allocation(self, pod: str, namespace: str) -> Allocation:
        raise AssertionError("no sidecar asks in this test")


def test_gpu_reset_without_the_sidecars_token_is_one_line_and_exit_2(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.delenv("INFERWATCH_RUNBOOKS_SIDECAR_TOKEN", raising=False)
    monkeypatch.setenv("INFERWATCH_NODE_AGENT_TOKEN", "node-agent-token-0123456789")
    result = CliRunner().invoke(main, ["node-agent", "--node", NODE, "--gpu-reset"])
    assert result.exit_code == 2, result.output
    assert "--gpu-reset needs --sidecar-token-file" in result.output.splitlines()[-1]
