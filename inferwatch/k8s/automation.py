"""The receiver mapping a site's kit runs: every alert with a safe action, mapped to it.

``inferwatch generate k8s`` renders it from the site file into the overlay, as the ConfigMap
the kit's receiver reads with ``--config``, so the receiver acts as shipped:

- the namespace allow-list is the site's inference namespace, and ``""`` for the targets
  that have none (the GPU nodes); the namespace checked is the inventory entry's, never a label's;
- the inventory (``runbooks/inventory.py``) lists the targets from the Kubernetes API: the
  replicas are the running pods in the site's namespace that carry a sidecar (the kit's
  model and every injected one, :data:`~inferwatch.k8s.inject.SIDECAR_LABEL`), less the
  canary (left to its readiness and its rollback), reached at the sidecar's port; the nodes
  are the ones the GPU node selector picks, so a control-plane node is never a target. The
  entries carry no ``model``: the inventory compares it with the alert's, the served name,
  which (``meta-llama/...``) cannot be a label value; the breaker's replica population is the
  pod's :data:`~inferwatch.k8s.inject.MODEL_LABEL` instead (the kit's model and each injected
  one), so one model's faults cannot use up another's share;
- the replica rules also match the models' scrape jobs only, so an alert of the node-wide GPU
  exporter or of the canary isolates nothing;
- GPU faults take the replica out through its sidecar and act on the node: a reset-class XID
  asks the node agent for a GPU reset, a reboot-class XID and an uncorrectable ECC error
  cordon and taint the node; an engine that is down or stalled takes its replica out until
  the alert resolves;
- a quality or capacity alert of the kit's own model moves its route's weight to the site's
  fallback (when it names one) and back once the alert resolves.

Dry-run until the receiver runs with ``--execute``, as the kit's comments say.
"""

from __future__ import annotations

import re
from typing import Any

from inferwatch.k8s import inject

#: the kit's own model: its HTTPRoute, route backend and PodMonitor (base/model/vllm.yaml)
ROUTE = "llama-8b"
KIT_MONITOR = "llama-8b-inferwatch"
#: the ConfigMap (generated with a content hash) and where the receiver reads it
CONFIGMAP = "inferwatch-receiver-mapping"
FILE = "receiver-mapping.yaml"
KEY = "actions.yaml"
#: the pods the replica inventory lists: every sidecar, not the canary's
REPLICA_SELECTOR = f"{inject.SIDECAR_LABEL}=true,inferwatch.io/track!=canary"
#: the GPU node selector a site's ``automation.gpu_node_selector`` defaults to (the node
#: agent's nodeSelector, set by NVIDIA's GPU feature discovery)
GPU_NODES = "nvidia.com/gpu.present=true"
#: at most half of a population out at once
MAX_FRACTION = 0.5
ISOLATE = {"admin_url": "http://{instance}/admin/isolation"}


def inventory(namespace: str, gpu_nodes: str) -> dict[str, Any]:
    """The receiver's inventory for a site: its sidecar pods and its GPU nodes."""
    replicas = {
        "namespace": namespace,
        "selector": REPLICA_SELECTOR,
        "port": inject.PORTS["iw-metrics"],
        # no pod label holds the served model name (see the module docstring)
        "model_label": "",
        "population_label": inject.MODEL_LABEL,
    }
    return {
        "replicas": {"kubernetes": replicas},
        "nodes": {"kubernetes": {"selector": gpu_nodes}},
    }


def mapping(
    namespace: str, models: tuple[inject.Model, ...], model: str, fallback: str, gpu_nodes: str
) -> dict[str, Any]:
    """The receiver's mapping document (``runbooks/config.py``) for one site; ``models`` are
    the injected ones, ``model`` the kit's as its series name it, ``fallback`` the Service its
    route shifts to ("": none), ``gpu_nodes`` the GPU node selector."""
    monitors = [KIT_MONITOR, *(inject.monitor_name(m) for m in models)]
    jobs = "|".join(re.escape(f"{namespace}/{name}") for name in sorted(monitors))
    replica = (f'job=~"{jobs}"',)

    def rule(
        name: str, alert: str, action: str, params: dict[str, str], matchers: tuple[str, ...] = (),
        **timing: str,
    ) -> dict[str, Any]:  # fmt: skip
        """One rule, every value its own copy (YAML would otherwise write anchors)."""
        selected = {"matchers": list(matchers)} if matchers else {}
        return {"name": name, "alertname": alert, **selected, "action": action,
                "params": dict(params), **timing}  # fmt: skip

    rules = [
        rule("isolate-replica-on-reset-class-xid", "InferwatchGPUXidErrors", "isolate_replica",
             ISOLATE, matchers=('severity="critical"', *replica), cooldown="30m"),
        # reset_gpu: a reset request the node agent carries out; reboot_node: cordon and taint
        rule("remediate-reset-class-xid", "InferwatchGPUXidErrors",
             "kubernetes_xid_remediation", {}, matchers=('severity="critical"',), cooldown="30m"),
        rule("isolate-replica-on-uncorrectable-ecc", "InferwatchGPUEccUncorrectable",
             "isolate_replica", ISOLATE, matchers=replica, cooldown="30m"),
        rule("isolate-node-on-uncorrectable-ecc", "InferwatchGPUEccUncorrectable",
             "kubernetes_isolate_node", {}, cooldown="30m"),
        rule("isolate-replica-on-engine-down", "InferwatchEngineDown", "isolate_replica",
             ISOLATE, matchers=replica, cooldown="30m", rollback_after="5m"),
        rule("isolate-replica-on-engine-stalled", "InferwatchEngineStalled", "isolate_replica",
             ISOLATE, matchers=replica, cooldown="30m", rollback_after="5m"),
    ]  # fmt: skip
    if fallback:
        shift = {"route": ROUTE, "backend": ROUTE, "fallback": fallback}
        own = (f'model="{model}"',)
        for name, alert in (
            ("fallback-on-degenerate-output", "InferwatchDegenerateOutputRising"),
            ("fallback-on-kv-cache-saturation", "InferwatchKVCacheSaturated"),
            ("fallback-on-replicas-not-ready", "InferwatchModelReplicasNotReady"),
        ):
            rules.append(rule(name, alert, "kubernetes_httproute_shift", shift, matchers=own,
                              cooldown="30m", rollback_after="10m"))  # fmt: skip
    return {
        "execute": False,
        # "": the GPU nodes, which have no namespace
        "namespaces": [namespace, ""],
        "breaker": {"max_fraction": MAX_FRACTION, "window": "1h"},
        "inventory": inventory(namespace, gpu_nodes),
        "actions": {"isolate_replica": {"timeout": 2.0}},
        "rules": rules,
    }
