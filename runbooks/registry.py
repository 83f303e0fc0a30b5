"""Every runbook action by the name the mapping config uses for it.

Adding an action is one module under ``actions/`` and one line here. Modules are imported
only when a config uses them, so the receiver does not load the Kubernetes client to isolate
a replica.
"""

from __future__ import annotations

import importlib
from collections.abc import Mapping
from typing import Any

from inferwatch.runbooks.actions.base import Action


class MissingExtra(ValueError):
    """An action whose client library is not installed: the host must change, not the config."""


# name -> (module, class)
ACTIONS: dict[str, tuple[str, str]] = {
    "isolate_replica": ("inferwatch.runbooks.actions.isolate_replica", "IsolateReplica"),
    "shift_traffic": ("inferwatch.runbooks.actions.haproxy", "ShiftTraffic"),
    "kubernetes_xid_remediation": ("inferwatch.runbooks.actions.kubernetes_xid", "XidRemediation"),
    "kubernetes_isolate_node": ("inferwatch.runbooks.actions.node_isolation", "NodeIsolation"),
    "kubernetes_request_gpu_reset": (
        "inferwatch.runbooks.actions.gpu_reset_request",
        "GpuResetRequest",
    ),
    "kubernetes_restart_pod": ("inferwatch.runbooks.actions.pod_restart", "PodRestart"),
    "kubernetes_httproute_shift": ("inferwatch.runbooks.actions.httproute", "HTTPRouteShift"),
}


def create(name: str, settings: Mapping[str, Any]) -> Action:
    """An instance of the action called ``name``, built with its config settings.

    Raises ``ValueError`` (one line) when the settings do not fit the action, and its
    :class:`MissingExtra` when the action's client library is not installed.
    """
    module_name, attribute = ACTIONS[name]
    try:
        module = importlib.import_module(module_name)
    except ImportError as exc:  # an optional client, e.g. the kubernetes extra
        raise MissingExtra(
            f"actions.{name}: needs {exc.name or exc}; install inferwatch[kubernetes]"
        ) from None
    cls = getattr(module, attribute)
    try:
        action: Action = cls(**settings)
    except TypeError as exc:
        raise ValueError(f"actions.{name}: {exc}") from None
    return action
