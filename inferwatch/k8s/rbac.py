"""The kit's RBAC: exactly the rules the receiver and the node agent declare they use.

The rules come from the components' data modules (``runbooks/kube_facts.py``,
``inferwatch/nodeagent/kube_facts.py``), which import nothing heavy, so rendering the kit
needs neither the kubernetes client nor the node agent's dependencies, and a rule changed
where it is used changes the kit's roles.
"""

from __future__ import annotations

from typing import Any

from inferwatch.k8s import inject
from inferwatch.k8s.site import MARKER, dump
from inferwatch.nodeagent import kube_facts as agent_facts
from inferwatch.runbooks import kube_facts as receiver_facts

#: the receiver's Service account, roles and bindings (base/receiver)
RECEIVER = "inferwatch-receiver"


def receiver_rbac() -> str:
    """The receiver's ClusterRole (its actions and inventory: nodes are cluster-scoped) and
    Role (the state store and the election, in its own namespace), with their bindings."""
    # the overlay's namespace transformer sets the account's and the Role's namespace
    subjects = [{"kind": "ServiceAccount", "name": RECEIVER, "namespace": "default"}]
    documents = []
    for kind, rules in (
        ("ClusterRole", receiver_facts.CLUSTER_RULES),
        ("Role", receiver_facts.NAMESPACE_RULES),
    ):
        documents.append({
            "apiVersion": "rbac.authorization.k8s.io/v1",
            "kind": kind,
            "metadata": {"name": RECEIVER},
            "rules": [dict(rule) for rule in rules],
        })  # fmt: skip
        documents.append({
            "apiVersion": "rbac.authorization.k8s.io/v1",
            "kind": f"{kind}Binding",
            "metadata": {"name": RECEIVER},
            "roleRef": {"apiGroup": "rbac.authorization.k8s.io", "kind": kind, "name": RECEIVER},
            "subjects": subjects,
        })  # fmt: skip
    header = (
        MARKER + "# from runbooks/kube_facts.py: the ClusterRole (the Kubernetes actions and the\n"
        "# inventory; nodes are cluster-scoped) and the Role (the state store and the election,\n"
        "# in the receiver's namespace): every API call the receiver makes, nothing more\n"
    )
    return header + "---\n".join(dump(document) for document in documents)


def gpu_reset_rbac() -> str:
    """The node agent's account, and a ClusterRole with exactly the rules its GPU reset
    declares: a ClusterRole, because nodes are cluster-scoped and the replicas it drains are
    in any namespace."""
    name = inject.NODE_AGENT
    meta = {"name": name, "namespace": inject.NODE_AGENT_NAMESPACE}
    role_ref = {"apiGroup": "rbac.authorization.k8s.io", "kind": "ClusterRole", "name": name}
    documents: list[dict[str, Any]] = [
        {"apiVersion": "v1", "kind": "ServiceAccount", "metadata": meta},
        {"apiVersion": "rbac.authorization.k8s.io/v1", "kind": "ClusterRole",
         "metadata": {"name": name},
         "rules": [dict(rule) for rule in agent_facts.GPU_RESET_RULES]},
        {"apiVersion": "rbac.authorization.k8s.io/v1", "kind": "ClusterRoleBinding",
         "metadata": {"name": name}, "roleRef": role_ref,
         "subjects": [{"kind": "ServiceAccount", **meta}]},
    ]  # fmt: skip
    header = (
        MARKER + "# the node agent's GPU reset (automation.gpu_reset), from GPU_RESET_RULES in\n"
        "# inferwatch/nodeagent/kube_facts.py: every API call it makes, nothing more\n"
    )
    return header + "---\n".join(dump(document) for document in documents)
