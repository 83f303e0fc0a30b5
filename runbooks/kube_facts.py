"""What the receiver asks of Kubernetes, as plain data: the kit's RBAC is rendered from it.

This module imports nothing beyond the standard library, so that rendering the kit
(``inferwatch generate k8s``) needs neither the kubernetes client nor the receiver's code.
Each rule is every permission one part of the receiver uses, nothing more; the parts' tests
run against a fake API server that grants exactly these.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

Rule = Mapping[str, Any]

#: the Kubernetes actions (``actions/kubernetes_api.py``): node isolation and GPU reset
#: requests read and patch nodes; replica restart reads and deletes pods; route shifts read
#: and patch HTTPRoutes
ACTIONS_RULES: tuple[Rule, ...] = (
    {"apiGroups": [""], "resources": ["nodes"], "verbs": ["get", "patch"]},
    {"apiGroups": [""], "resources": ["pods"], "verbs": ["get", "delete"]},
    {
        "apiGroups": ["gateway.networking.k8s.io"],
        "resources": ["httproutes"],
        "verbs": ["get", "patch"],
    },
)
#: the inventory (``kube_inventory.py``): a model's pods and the GPU nodes, listed
INVENTORY_RULES: tuple[Rule, ...] = (
    {"apiGroups": [""], "resources": ["pods", "nodes"], "verbs": ["list"]},
)
#: the state store and the election (``kube_state.py``), in the receiver's own namespace
STATE_RULES: tuple[Rule, ...] = (
    {"apiGroups": [""], "resources": ["configmaps"], "verbs": ["get", "create", "update"]},
    {
        "apiGroups": ["coordination.k8s.io"],
        "resources": ["leases"],
        "verbs": ["get", "create", "update"],
    },
)
#: the receiver's ClusterRole (nodes are cluster-scoped, the pods in any namespace) and its
#: Role, in its own namespace
CLUSTER_RULES = ACTIONS_RULES + INVENTORY_RULES
NAMESPACE_RULES = STATE_RULES
