"""The receiver mapping a site's kit runs: every alert with a safe action, mapped to it.

``inferwatch generate k8s`` renders it from the site file into the overlay, as the ConfigMap
the kit's receiver reads with ``--config``, so the receiver acts as shipped:

- the namespace allow-list is the site's inference namespace;
- the breaker's populations are the site's models' replicas, each keyed by the scrape job
  its PodMonitor gives the replica's series (``NAMESPACE/NAME-inferwatch``), and the site's
  GPU nodes and their GPUs; the replica rules match those jobs only, so an alert from the
  node-wide GPU exporter or the one-replica canary (left to its readiness and its rollback)
  isolates nothing;
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
from dataclasses import dataclass
from typing import Any

from inferwatch.k8s import inject

#: the kit's own model: its HTTPRoute, route backend and PodMonitor (base/model/vllm.yaml)
ROUTE = "llama-8b"
KIT_MONITOR = "llama-8b-inferwatch"
#: the ConfigMap (generated with a content hash) and where the receiver reads it
CONFIGMAP = "inferwatch-receiver-mapping"
FILE = "receiver-mapping.yaml"
KEY = "actions.yaml"
#: the receiver's default groups for node isolation and GPU reset requests
NODES, GPUS = "nodes", "gpus"
#: at most half of a population out at once: a model with two replicas keeps one serving
MAX_FRACTION = 0.5
ISOLATE = {"admin_url": "http://{instance}/admin/isolation", "group": "{job}"}


@dataclass(frozen=True)
class Fleet:
    """What the breaker counts, from the site: replicas per scrape job, GPU nodes and GPUs."""

    replicas: dict[str, int]
    gpu_nodes: int
    gpus_per_node: int


def fleet(
    namespace: str, kit_replicas: int, models: tuple[inject.Model, ...], gpu_nodes: int,
    gpus_per_node: int,
) -> Fleet:  # fmt: skip
    """The populations of a site: the kit's model (``kit_replicas``) and each injected one."""
    replicas = {f"{namespace}/{KIT_MONITOR}": kit_replicas}
    for model in models:
        replicas[f"{namespace}/{inject.monitor_name(model)}"] = model.replicas
    return Fleet(replicas, gpu_nodes, gpus_per_node)


def mapping(namespace: str, population: Fleet, model: str, fallback: str) -> dict[str, Any]:
    """The receiver's mapping document (``runbooks/config.py``) for one site; ``model`` is the
    kit's model as its series name it, ``fallback`` the Service its route shifts to ("": none).
    """
    jobs = "|".join(re.escape(job) for job in sorted(population.replicas))
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
    populations: dict[str, int] = {
        **population.replicas,
        NODES: population.gpu_nodes,
        GPUS: population.gpu_nodes * population.gpus_per_node,
    }
    return {
        "execute": False,
        "namespaces": [namespace],
        "breaker": {"max_fraction": MAX_FRACTION, "window": "1h", "populations": populations},
        "actions": {"isolate_replica": {"timeout": 2.0}},
        "rules": rules,
    }
