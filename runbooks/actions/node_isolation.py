"""Node isolation: cordon, taint and annotate a node whose GPU fault needs the node rebooted.

What inferwatch added is recorded on the node itself, in the annotation :data:`ISOLATION`
(JSON): the taints it added, whether it cordoned, and the alerts (fingerprint → reason) that
want the node isolated. A taint or cordon that was there before is never recorded, so revert
removes exactly what inferwatch added and leaves an operator's own alone; the node is released
only when the last alert that isolated it is reverted. An unreadable record counts as owning
nothing (a taint may then be left behind, never an operator's removed).
"""

from __future__ import annotations

import json
import re
from collections.abc import Mapping, Sequence
from typing import Any, ClassVar

import kubernetes  # noqa: F401  the kubernetes extra: without it this module does not import

from inferwatch.runbooks.actions.base import ActionError, Alert, Outcome, Step
from inferwatch.runbooks.actions.kubernetes_api import NodeAction, Obj, annotations_of

TAINT_KEY = "inferwatch.io/gpu-fault"
ISOLATION = "inferwatch.io/isolation"
_LABEL_KEY = re.compile(
    r"^([a-z0-9]([-a-z0-9]*[a-z0-9])?(\.[a-z0-9]([-a-z0-9]*[a-z0-9])?)*/)?"
    r"[A-Za-z0-9]([-A-Za-z0-9_.]{0,61}[A-Za-z0-9])?$"
)
_LABEL_VALUE = re.compile(r"^([A-Za-z0-9]([-A-Za-z0-9_.]{0,61}[A-Za-z0-9])?)?$")


def _flag(params: Mapping[str, Any], name: str, default: bool) -> bool:
    value = params.get(name, default)
    if not isinstance(value, bool):
        raise ActionError(f"parameter {name} must be true or false, got {value!r}")
    return value


def _same(a: Mapping[str, Any], b: Mapping[str, Any]) -> bool:
    """Kubernetes allows one taint per (key, effect)."""
    return a.get("key") == b.get("key") and a.get("effect") == b.get("effect")


def _record(node: Obj) -> dict[str, Any]:
    empty: dict[str, Any] = {"alerts": {}, "taints": [], "cordoned": False}
    try:
        record = json.loads(annotations_of(node).get(ISOLATION, ""))
    except ValueError:
        return empty
    if not isinstance(record, dict):
        return empty
    alerts, taints = record.get("alerts"), record.get("taints")
    return {
        "alerts": dict(alerts) if isinstance(alerts, dict) else {},
        "taints": [t for t in taints if isinstance(t, dict)] if isinstance(taints, list) else [],
        "cordoned": record.get("cordoned") is True,
    }


def _observed(node: Obj) -> dict[str, Any]:
    spec = node.get("spec") or {}
    return {
        "unschedulable": bool(spec.get("unschedulable", False)),
        "taints": list(spec.get("taints") or []),
        "isolation": _record(node),
        "resourceVersion": node["metadata"]["resourceVersion"],
    }


def _isolate(desired: Mapping[str, Any]) -> Any:
    def change(node: Obj) -> Obj | None:
        spec = node.get("spec") or {}
        taints = list(spec.get("taints") or [])
        record = _record(node)
        missing = [t for t in desired["taints"] if not any(_same(t, have) for have in taints)]
        cordon = desired["cordon"] and not spec.get("unschedulable", False)
        fingerprint = desired["fingerprint"]
        if not missing and not cordon and fingerprint in record["alerts"]:
            return None
        owned = record["taints"] + [
            t for t in missing if not any(_same(t, o) for o in record["taints"])
        ]
        record = {
            "alerts": {**record["alerts"], fingerprint: desired["reason"]},
            "taints": owned,
            "cordoned": record["cordoned"] or cordon,
        }
        patch: Obj = {"metadata": {"annotations": {ISOLATION: json.dumps(record, sort_keys=True)}}}
        spec_patch: Obj = {}
        if missing:
            spec_patch["taints"] = taints + [dict(t) for t in missing]
        if cordon:
            spec_patch["unschedulable"] = True
        if spec_patch:
            patch["spec"] = spec_patch
        return patch

    return change


def _release(fingerprint: str) -> Any:
    def change(node: Obj) -> Obj | None:
        record = _record(node)
        if fingerprint not in record["alerts"]:
            return None
        remaining = {fp: why for fp, why in record["alerts"].items() if fp != fingerprint}
        if remaining:
            kept = json.dumps({**record, "alerts": remaining}, sort_keys=True)
            return {"metadata": {"annotations": {ISOLATION: kept}}}
        spec = node.get("spec") or {}
        taints = [
            t
            for t in spec.get("taints") or []
            if not any(_same(t, o) and t.get("value") == o.get("value") for o in record["taints"])
        ]
        spec_patch: Obj = {"taints": taints or None}
        if record["cordoned"] and spec.get("unschedulable", False):
            spec_patch["unschedulable"] = None
        return {"metadata": {"annotations": {ISOLATION: None}}, "spec": spec_patch}

    return change


class NodeIsolation(NodeAction):
    """Cordon a node, taint it ``NoSchedule`` (and ``NoExecute`` if asked), annotate why.

    Parameters: ``cordon`` (default true), ``no_execute`` (default false: evicting running
    pods is a drain, which a person or a drainer with PodDisruptionBudgets should own),
    ``taint_key`` (default :data:`TAINT_KEY`), ``taint_value`` (default ``true``).
    The node comes from the alert's ``node`` label.
    """

    name: ClassVar[str] = "kubernetes_isolate_node"
    PARAMS: ClassVar[frozenset[str]] = frozenset(
        {"cordon", "no_execute", "taint_key", "taint_value"}
    )

    def plan(self, alert: Alert, params: Mapping[str, Any]) -> Sequence[Step]:
        node = self._node_of(alert, params)
        key = params.get("taint_key", TAINT_KEY)
        value = params.get("taint_value", "true")
        if not isinstance(key, str) or not _LABEL_KEY.match(key):
            raise ActionError(f"parameter taint_key must be a label key, got {key!r}")
        if not isinstance(value, str) or not _LABEL_VALUE.match(value):
            raise ActionError(f"parameter taint_value must be a label value, got {value!r}")
        effects = ["NoSchedule"] + (["NoExecute"] if _flag(params, "no_execute", False) else [])
        fields = {
            "cordon": _flag(params, "cordon", True),
            "taints": [{"key": key, "value": value, "effect": effect} for effect in effects],
        }
        return [self._step(alert, node, f"node {node}", "node", "nodes", fields)]

    async def apply(self, step: Step) -> Outcome:
        def describe(changed: bool, node: Obj) -> str:
            return "isolated" if changed else "already isolated"

        return await self._change_node(step, _isolate(step.desired), describe, _observed)

    async def verify(self, step: Step) -> Outcome:
        def judge(node: Obj) -> Outcome:
            observed = _observed(node)
            lacking = [
                f"taint {t['key']}:{t['effect']}"
                for t in step.desired["taints"]
                if not any(_same(t, have) for have in observed["taints"])
            ]
            if step.desired["cordon"] and not observed["unschedulable"]:
                lacking.append("cordon")
            if step.desired["fingerprint"] not in observed["isolation"]["alerts"]:
                lacking.append(f"annotation {ISOLATION}")
            if lacking:
                return Outcome(False, False, f"{step.target}: lacks {', '.join(lacking)}", observed)
            return Outcome(True, False, f"{step.target}: isolated", observed)

        return await self._check_node(step, judge)

    async def revert(self, step: Step) -> Outcome:
        def describe(changed: bool, node: Obj) -> str:
            if not changed:
                return "not isolated for this alert"
            return "kept isolated for other alerts" if _record(node)["alerts"] else "released"

        release = _release(step.desired["fingerprint"])
        return await self._change_node(step, release, describe, _observed)
