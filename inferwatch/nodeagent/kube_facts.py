"""What the node agent asks of Kubernetes, as plain data: the kit's RBAC and pod for its GPU
reset are rendered from it.

This module imports nothing beyond the standard library, so that rendering the kit
(``inferwatch generate k8s``) needs none of the exporters' dependencies.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

#: every Kubernetes API call the GPU reset (``gpu_reset.py``) makes, nothing more: the node's
#: requests (read, clear) and the pods on the node (the replicas to drain)
GPU_RESET_RULES: tuple[Mapping[str, Any], ...] = (
    {"apiGroups": [""], "resources": ["nodes"], "verbs": ["get", "patch"]},
    {"apiGroups": [""], "resources": ["pods"], "verbs": ["list"]},
)
#: the variable the node agent reads the sidecars' admin token from (``node_agent.py``), the
#: name the receiver reads it under
SIDECAR_TOKEN_ENV = "INFERWATCH_RUNBOOKS_SIDECAR_TOKEN"
