"""XID remediation: the catalogue's action class of an XID picks the Kubernetes action.

``restart_app`` → :class:`PodRestart` (the GPU is fine, the engine restarts);
``reset_gpu`` → :class:`GpuResetRequest` (the GPU must be reset before it serves again);
``reboot_node`` → :class:`NodeIsolation` (the node must be rebooted: cordon and taint it).
Every other class (ignore, check_app, check_hardware, contact_support, unknown) is for a
person, so planning refuses with the reason. The class is the alert's ``action`` label (as
the XID metric carries it), else the catalogue's class of its ``xid`` label. The steps are
the chosen action's, with its name, so they apply, verify and revert through it.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from functools import cached_property
from typing import Any, ClassVar

from inferwatch.exporters.gpu.xid import ACTIONS, Action, classify
from inferwatch.runbooks.actions.base import ActionError, Alert, Outcome, Step
from inferwatch.runbooks.actions.gpu_reset_request import GpuResetRequest
from inferwatch.runbooks.actions.kubernetes_api import KubernetesAction, check_params
from inferwatch.runbooks.actions.node_isolation import NodeIsolation
from inferwatch.runbooks.actions.pod_restart import PodRestart

REMEDIATION: Mapping[Action, str] = {
    "restart_app": PodRestart.name,
    "reset_gpu": GpuResetRequest.name,
    "reboot_node": NodeIsolation.name,
}


def xid_class(alert: Alert) -> Action:
    """The XID action class of ``alert`` (see the module docstring)."""
    label = alert.labels.get("action")
    if label is not None:
        for known in ACTIONS:
            if label == known:
                return known
        raise ActionError(f"alert label action {label!r} is not one of {', '.join(ACTIONS)}")
    xid = alert.labels.get("xid", "")
    if not (xid.isascii() and xid.isdigit() and len(xid) <= 4):
        raise ActionError(f"alert needs an action or xid label, got xid={xid!r}")
    return classify(int(xid)).action


class XidRemediation(KubernetesAction):
    """Dispatch an XID alert to the remediation its class calls for."""

    name: ClassVar[str] = "kubernetes_xid_remediation"
    PARAMS: ClassVar[frozenset[str]] = (
        PodRestart.PARAMS | GpuResetRequest.PARAMS | NodeIsolation.PARAMS
    )

    @cached_property
    def _actions(self) -> dict[str, PodRestart | GpuResetRequest | NodeIsolation]:
        api, retries = self._api, self._retries
        return {
            PodRestart.name: PodRestart(api, retries=retries),
            GpuResetRequest.name: GpuResetRequest(api, retries=retries),
            NodeIsolation.name: NodeIsolation(api, retries=retries),
        }

    def plan(self, alert: Alert, params: Mapping[str, Any]) -> Sequence[Step]:
        check_params(params, self.PARAMS, self.name)
        action = xid_class(alert)
        chosen = REMEDIATION.get(action)
        if chosen is None:
            xid = alert.labels.get("xid", "?")
            raise ActionError(f"XID {xid} is class {action}: no automatic remediation")
        delegate = self._actions[chosen]
        return delegate.plan(alert, {k: v for k, v in params.items() if k in delegate.PARAMS})

    def _for(self, step: Step) -> PodRestart | GpuResetRequest | NodeIsolation:
        try:
            return self._actions[step.action]
        except KeyError:
            raise ActionError(f"{step.action} is not an XID remediation") from None

    async def apply(self, step: Step) -> Outcome:
        return await self._for(step).apply(step)

    async def verify(self, step: Step) -> Outcome:
        return await self._for(step).verify(step)

    async def revert(self, step: Step) -> Outcome:
        return await self._for(step).revert(step)
