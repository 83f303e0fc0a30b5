"""The demo's runbook receiver: its mapping config, its tokens and its command line.

The mapping is the shipped ``runbooks/actions.yaml`` fitted to the demo fleet. Its replica
isolation rules are kept, one copy per model narrowed to that model's replicas (the GPU
alerts carry the Prometheus target's ``replica`` label but no ``model``). The receiver's
inventory is the demo's topology: each replica's sidecar (its address, replica, model and
namespace), the replicas' nodes, and HAProxy's backends through its Runtime API; the circuit
breaker counts each model's replicas as a population of its own: at most half of them may be
taken out, so a second primary replica or the only fallback one is refused.
Two rules are the demo's own: degenerate output of one model version shifts that version's
traffic in HAProxy (``shift_traffic`` through its Runtime API, rolled back once the alert has
been resolved a while), and an engine that is down or stalled (it holds requests and makes no
token, while its /readyz still passes) is isolated like a broken GPU, until it is repaired. With a
Kubernetes API (the drill's fake one), a reset-class XID also becomes a GPU reset request on
the node. The namespace allow-list names the demo's namespace and ``""``, for the GPU alerts
that carry none.

Two tokens are written into the work directory: the one Alertmanager sends the receiver, and
the sidecars' admin token, which the receiver's isolation action sends the sidecars.
"""

from __future__ import annotations

import re
import secrets
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import yaml

from inferwatch.demo import topology
from inferwatch.demo.processes import INFERWATCH, Component
from inferwatch.demo.topology import Replica
from inferwatch.runbooks import config as mapping
from inferwatch.runbooks import local

#: file names in the work directory
CONFIG = "runbooks.yaml"
TOKEN = "runbooks.token"
SIDECAR_TOKEN = "sidecar-admin.token"
AUDIT_LOG = "runbooks-audit.jsonl"
#: the action the demo's isolation rules use
ACTION = "isolate_replica"
SHIFT = "shift_traffic"
XID = "kubernetes_xid_remediation"
#: the breaker's group of the fleet's GPUs (reset requests)
GPUS = "gpus"
#: how long a resolved degenerate-output alert waits before its traffic shift is undone
ROLLBACK_AFTER = "10s"
#: the share of a model's replicas the receiver may isolate within the breaker's window
MAX_FRACTION = 0.5


@dataclass(frozen=True)
class Settings:
    """What the demo's receiver is set up with: the mapping config (:func:`document`) and the
    receiver that is started on it (:func:`component`) take these same settings."""

    #: whether the receiver acts, or only says what it would do
    execute: bool
    #: HAProxy's Runtime API socket
    runtime: Path
    #: the fleet (a spare the scenario starts included)
    replicas: Sequence[Replica] = topology.REPLICAS
    #: each replica's sidecar port (a replica without one yet is not listed)
    sidecars: Mapping[str, int] | None = None
    #: a Kubernetes API (the drill's fake one): reset-class XIDs become GPU reset requests
    kube_host: str | None = None
    #: every rule's cooldown
    cooldown: str = "30m"


def document(sidecar_token: Path, settings: Settings) -> dict[str, Any]:
    """The demo's mapping config (see the module docstring and :class:`Settings`)."""
    base = local.shipped()
    models: dict[str, list[str]] = {}
    for replica in settings.replicas:
        models.setdefault(replica.model, []).append(replica.name)
    # (rule, the label that names the replica on its alert): GPU alerts carry the target's
    # ``replica``; the stalled-engine alert, summed per pod, carries ``pod`` (the replica's name)
    isolating = [(r, "replica") for r in base.get("rules") or [] if r["action"] == ACTION]
    for name, alertname, label in (
        ("isolate-replica-on-engine-down", "InferwatchEngineDown", "replica"),
        ("isolate-replica-on-stalled-engine", "InferwatchEngineStalled", "pod"),
    ):
        params = {"admin_url": "http://{instance}/admin/isolation"}
        isolating.append(({"name": name, "alertname": alertname, "action": ACTION,
                           "params": params}, label))  # fmt: skip
    rules = []
    for rule, label in isolating:
        for model, names in models.items():
            on_model = f'{label}=~"{"|".join(map(re.escape, names))}"'
            rules.append(
                {
                    **rule,
                    "name": f"{rule['name']}-{_slug(model)}",
                    "matchers": [*rule.get("matchers", []), on_model],
                    "params": rule.get("params", {}),
                    "cooldown": settings.cooldown,
                }
            )
    rules.append(
        {
            "name": "shift-traffic-off-a-degenerate-version",
            "alertname": "InferwatchDegenerateOutputRising",
            "action": SHIFT,
            "params": {"scope": "version", "steps": [0.5, 1.0], "step_interval": 1},
            "cooldown": settings.cooldown,
            "rollback_after": ROLLBACK_AFTER,
        }
    )
    actions: dict[str, Any] = {
        ACTION: {
            **(base.get("actions") or {}).get(ACTION, {}),
            "token_file": str(sidecar_token),
        },
        SHIFT: {"runtime": str(settings.runtime)},
    }
    listed = [
        {"instance": f"127.0.0.1:{port}", "replica": r.name, "pod": r.name, "model": r.model,
         "namespace": topology.NAMESPACE}
        for r in settings.replicas
        if (port := (settings.sidecars or {}).get(r.name))
    ]  # fmt: skip
    inventory: dict[str, Any] = {
        "replicas": {"static": listed},
        "gateway": {"haproxy": {"runtime": str(settings.runtime)}},
    }
    if settings.kube_host is not None:
        rules.append(
            {
                "name": "gpu-reset-request-on-reset-class-xid",
                "alertname": "InferwatchGPUXidErrors",
                "matchers": ['severity="critical"', 'action="reset_gpu"'],
                "action": XID,
                "params": {},
                "cooldown": settings.cooldown,
            }
        )
        actions[XID] = {"host": settings.kube_host}
        # one GPU per simulated replica, each on its own node
        inventory["nodes"] = {"static": [{"node": r.node, "pool": GPUS} for r in settings.replicas]}
    return {
        "execute": settings.execute,
        "namespaces": [topology.NAMESPACE, mapping.NO_NAMESPACE],
        "breaker": {**base["breaker"], "max_fraction": MAX_FRACTION},
        "inventory": inventory,
        "actions": actions,
        "rules": rules,
    }


def _slug(model: str) -> str:
    """``meta-llama/Llama-3.1-8B-Instruct`` -> ``llama-3.1-8b-instruct``."""
    return model.rsplit("/", 1)[-1].lower()


def write_tokens(workdir: Path) -> None:
    """A fresh random token in each of the two token files (owner-readable only)."""
    for name in (TOKEN, SIDECAR_TOKEN):
        path = workdir / name
        path.touch(mode=0o600)
        path.write_text(secrets.token_urlsafe(24) + "\n", encoding="utf-8")


def component(workdir: Path, port: int, settings: Settings) -> Component:
    """``inferwatch runbooks serve`` on loopback, with a config written into ``workdir``."""
    config = workdir / CONFIG
    chosen = document(workdir / SIDECAR_TOKEN, settings)
    mapping.parse(chosen, "the demo's runbook mapping")  # a bug here is caught before start
    config.write_text(yaml.safe_dump(chosen, sort_keys=False), encoding="utf-8")
    argv = [
        *INFERWATCH, "runbooks", "serve", "--config", str(config),
        "--listen", f"127.0.0.1:{port}", "--execute" if settings.execute else "--dry-run",
        "--token-file", str(workdir / TOKEN), "--audit-log", str(workdir / AUDIT_LOG),
    ]  # fmt: skip
    return Component("runbooks", "", topology.url(port), "/readyz", argv)


def webhook_url(port: int) -> str:
    return topology.url(port) + "/webhook"
