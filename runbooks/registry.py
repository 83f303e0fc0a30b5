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

# name -> (module, class)
ACTIONS: dict[str, tuple[str, str]] = {
    "isolate_replica": ("inferwatch.runbooks.actions.isolate_replica", "IsolateReplica"),
    "shift_traffic": ("inferwatch.runbooks.actions.haproxy", "ShiftTraffic"),
}


def create(name: str, settings: Mapping[str, Any]) -> Action:
    """An instance of the action called ``name``, built with its config settings.

    Raises ``ValueError`` (one line) when the settings do not fit the action.
    """
    module_name, attribute = ACTIONS[name]
    cls = getattr(importlib.import_module(module_name), attribute)
    try:
        action: Action = cls(**settings)
    except TypeError as exc:
        raise ValueError(f"actions.{name}: {exc}") from None
    return action
