"""GPU reset request: ask the node's GPU agent to reset one GPU, through node metadata.

A reset needs the GPU idle and root on the node, which the receiver has neither of; so the
request is written where an agent on the node (an operator's script, an NVSentinel-style
janitor) watches for it: the annotation ``gpu-reset.inferwatch.io/<GPU UUID>`` (JSON: xid,
reason, fingerprint, requested_at) plus the label :data:`REQUESTED` = ``true`` so the agent
can select the nodes with a label selector. The agent drains the GPU, resets it and deletes
the annotation (and the label when no request remains). Meanwhile the sidecar's ``/readyz``
already fails for that GPU and the device plugin marks it unhealthy, so no traffic or new pod
reaches it. A request already pending for the GPU (from any alert) makes apply a no-op; revert
withdraws only a request this alert made and the agent has not yet consumed.
"""

from __future__ import annotations

import json
import re
from collections.abc import Mapping, Sequence
from typing import Any, ClassVar

import kubernetes  # noqa: F401  the kubernetes extra: without it this module does not import

from inferwatch.runbooks.actions.base import ActionError, Alert, Outcome, Step
from inferwatch.runbooks.actions.kubernetes_api import NodeAction, Obj, annotations_of

PREFIX = "gpu-reset.inferwatch.io/"
REQUESTED = "inferwatch.io/gpu-reset-requested"
#: NVML's GPU and MIG UUIDs; short enough to be the name part of an annotation key
_UUID = re.compile(r"^(GPU|MIG)-[0-9A-Fa-f-]{8,56}$")


def _pending(node: Obj) -> dict[str, str]:
    return {k: v for k, v in annotations_of(node).items() if k.startswith(PREFIX)}


def _request(desired: Mapping[str, Any]) -> Any:
    key = PREFIX + desired["gpu_uuid"]

    def change(node: Obj) -> Obj | None:
        labelled = ((node.get("metadata") or {}).get("labels") or {}).get(REQUESTED) == "true"
        if key in _pending(node) and labelled:
            return None
        value = json.dumps(
            {k: desired[k] for k in ("xid", "reason", "fingerprint", "requested_at")},
            sort_keys=True,
        )
        metadata: Obj = {"labels": {REQUESTED: "true"}}
        if key not in _pending(node):
            metadata["annotations"] = {key: value}
        return {"metadata": metadata}

    return change


def _withdraw(desired: Mapping[str, Any]) -> Any:
    key = PREFIX + desired["gpu_uuid"]

    def change(node: Obj) -> Obj | None:
        pending = _pending(node)
        try:
            ours = json.loads(pending.get(key, "")).get("fingerprint") == desired["fingerprint"]
        except (ValueError, AttributeError):
            ours = False
        if not ours:
            return None
        metadata: Obj = {"annotations": {key: None}}
        if len(pending) == 1:
            metadata["labels"] = {REQUESTED: None}
        return {"metadata": metadata}

    return change


class GpuResetRequest(NodeAction):
    """Request a reset of the alert's GPU (labels ``node``, ``gpu_uuid``; ``xid`` if known)."""

    name: ClassVar[str] = "kubernetes_request_gpu_reset"
    PARAMS: ClassVar[frozenset[str]] = frozenset()

    def plan(self, alert: Alert, params: Mapping[str, Any]) -> Sequence[Step]:
        node = self._node_of(alert, params)
        gpu = alert.labels.get("gpu_uuid", "")
        if not _UUID.match(gpu):
            raise ActionError(f"alert label gpu_uuid must be an NVML GPU UUID, got {gpu!r}")
        fields = {
            "gpu_uuid": gpu,
            "xid": alert.labels.get("xid", ""),
            "requested_at": alert.starts_at,
        }
        return [self._step(alert, node, f"gpu {gpu} on node {node}", "gpu", "gpus", fields)]

    async def apply(self, step: Step) -> Outcome:
        def describe(changed: bool, node: Obj) -> str:
            return "reset requested" if changed else "reset already requested"

        return await self._change_node(step, _request(step.desired), describe, _pending)

    async def verify(self, step: Step) -> Outcome:
        def judge(node: Obj) -> Outcome:
            pending = _pending(node)
            if PREFIX + step.desired["gpu_uuid"] in pending:
                return Outcome(True, False, f"{step.target}: reset requested", pending)
            return Outcome(False, False, f"{step.target}: no reset request pending", pending)

        return await self._check_node(step, judge)

    async def revert(self, step: Step) -> Outcome:
        def describe(changed: bool, node: Obj) -> str:
            return "request withdrawn" if changed else "no request of this alert pending"

        return await self._change_node(step, _withdraw(step.desired), describe, _pending)
