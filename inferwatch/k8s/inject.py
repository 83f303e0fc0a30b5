"""Injection: the sidecar and the tenancy proxy added to model servers a team already runs.

A site file's ``models`` entries name existing workloads (a Deployment, StatefulSet or
LeaderWorkerSet, by name and/or metadata labels) and their engine's port. ``generate k8s``
renders them into ``overlays/SITE/inject/``, a kustomize Component: one JSON patch per
workload kind that appends the two containers to the pod template (the leader's template of a
LeaderWorkerSet, the pod that serves the API) and labels it, plus per model a PodMonitor, a
Service for the proxy, and a NetworkPolicy that keeps the sidecar's and the tenant-metrics
ports to Prometheus and the receiver while every other port stays as open as it was. The
patches add no volume (identity comes from the downward API as environment, tokens from
Secrets), so they apply to any pod spec, and the injected containers pass Pod Security
"restricted" on their own. ``deploy/kubernetes/helm/inferwatch-post-renderer`` applies the
same Component to what ``helm install`` renders.
"""

from __future__ import annotations

import json
import re
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

from inferwatch.config.schema import Fields

__all__ = [
    "KINDS",
    "PORTS",
    "Model",
    "load_models",
    "render_component",
]

#: the group/version of each workload kind, and where its serving pod's template is
KINDS = {
    "Deployment": ("apps", "v1", "/spec/template"),
    "StatefulSet": ("apps", "v1", "/spec/template"),
    "LeaderWorkerSet": (
        "leaderworkerset.x-k8s.io",
        "v1",
        "/spec/leaderWorkerTemplate/leaderTemplate",
    ),
}
#: the injected containers' ports, by name (a port name is at most 15 characters)
PORTS = {"iw-metrics": 9400, "iw-tenants": 9402, "iw-proxy": 9403}
MODEL_LABEL = "inferwatch.io/model"
#: what the node agent's NetworkPolicy lets in
SIDECAR_LABEL = "inferwatch.io/sidecar"
#: the Secret of the token a sidecar's /admin/isolation asks for (the receiver's, and the
#: node agent's when it drains a GPU's replicas)
SIDECAR_ADMIN_SECRET = "inferwatch-sidecar-admin-token"
#: where the node agent runs (base/node-agent)
NODE_AGENT = "inferwatch-node-agent"
NODE_AGENT_NAMESPACE = "inferwatch-system"
NODE_AGENT_URL = f"http://{NODE_AGENT}.{NODE_AGENT_NAMESPACE}.svc:9406"
#: the NetworkPolicy rule that lets the node agent reach a sidecar's port (its admin
#: endpoint), to drain a GPU's replicas before a reset (a site's ``automation.gpu_reset``).
#: A ``matchExpressions`` selector, because the site overlay's ``monitoring_namespace``
#: replacement rewrites every ``matchLabels`` namespace of the kit model's NetworkPolicy and
#: would move this one.
NODE_AGENT_INGRESS = {
    "ports": [{"port": PORTS["iw-metrics"], "protocol": "TCP"}],
    "from": [{
        "namespaceSelector": {"matchExpressions": [{
            "key": "kubernetes.io/metadata.name", "operator": "In", "values": [NODE_AGENT_NAMESPACE]
        }]},
        "podSelector": {"matchLabels": {"app.kubernetes.io/name": NODE_AGENT}},
    }],
}  # fmt: skip
MAX_MODELS = 64
MAX_LABELS = 16
DNS_LABEL = re.compile(r"[a-z0-9]([-a-z0-9]{0,61}[a-z0-9])?")
DNS_SUBDOMAIN = re.compile(r"[a-z0-9]([-a-z0-9.]{0,251}[a-z0-9])?")
LABEL_NAME = r"[A-Za-z0-9]([-A-Za-z0-9_.]{0,61}[A-Za-z0-9])?"
LABEL_KEY = re.compile(rf"({DNS_SUBDOMAIN.pattern}/)?{LABEL_NAME}")
LABEL_VALUE = re.compile(f"({LABEL_NAME})?")
KEYS = {
    "name", "workload", "labels", "kind", "engine_port", "model_version", "prompt_version",
}  # fmt: skip
#: the measured sizes of base/model's containers (see its comments)
RESOURCES = {
    "inferwatch-sidecar": {
        "requests": {"cpu": "50m", "memory": "64Mi"},
        "limits": {"cpu": "500m", "memory": "128Mi"},
    },
    "inferwatch-proxy": {
        "requests": {"cpu": "200m", "memory": "64Mi"},
        "limits": {"cpu": "1", "memory": "256Mi"},
    },
}


@dataclass(frozen=True)
class Model:
    """One existing model server to inject into, as a site file names it."""

    name: str
    workload: str = ""
    labels: dict[str, str] = field(default_factory=dict)
    kinds: tuple[str, ...] = tuple(KINDS)
    engine_port: int = 8000
    model_version: str = ""
    prompt_version: str = ""


def load_models(top: Fields) -> tuple[Model, ...]:
    """The site file's ``models`` entries, each field checked; one-line errors."""
    models = []
    for entry in top.records("models"):
        entry.check_keys(KEYS, required={"name"})
        labels = entry.child("labels")
        if len(labels.raw) > MAX_LABELS:
            raise entry.error("labels", f"expected at most {MAX_LABELS} labels")
        for key in labels.raw:
            if not isinstance(key, str) or not LABEL_KEY.fullmatch(key) or len(key) > 317:
                raise labels.error(str(key), "is not a label key")
        kind = entry.choice("kind", "", ("", *KINDS))
        model = Model(
            name=entry.matching("name", "", DNS_LABEL, "a DNS label", 63),
            workload=entry.matching(
                "workload", "", re.compile(f"({DNS_SUBDOMAIN.pattern})?"), "a workload name", 253
            ),
            labels={
                str(k): labels.matching(str(k), "", LABEL_VALUE, "a label value", 63)
                for k in labels.raw
            },
            kinds=(kind,) if kind else tuple(KINDS),
            engine_port=entry.integer("engine_port", 8000, 1, 65535),
            model_version=entry.matching("model_version", "", LABEL_VALUE, "a label value", 63),
            prompt_version=entry.matching("prompt_version", "", LABEL_VALUE, "a label value", 63),
        )
        if not model.workload and not model.labels:
            raise entry.error("workload", "name the workload, its labels, or both")
        if model.engine_port in PORTS.values():
            raise entry.error(
                "engine_port", f"{model.engine_port} is a port the injected containers use"
            )
        models.append(model)
    if len(models) > MAX_MODELS:
        raise top.error("models", f"expected at most {MAX_MODELS} models")
    names = [m.name for m in models]
    for name in names:
        if names.count(name) > 1:
            raise top.error("models", f"{name!r} is named twice")
    return tuple(models)


def monitor_name(model: Model) -> str:
    """The model's PodMonitor: its series' ``job`` is ``NAMESPACE/<this>``."""
    return f"{model.name}-inferwatch"


def containers(model: Model, traced: Sequence[str] = ()) -> list[dict[str, Any]]:
    """The sidecar and the proxy as one replica of ``model`` runs them; ``traced``: the
    proxy's tracing flags (inferwatch/k8s/tracing.py)."""
    engine = f"http://127.0.0.1:{model.engine_port}"
    sidecar_args = [
        "sidecar",
        f"--engine-url={engine}",
        f"--listen=:{PORTS['iw-metrics']}",
        "--gpu=auto",
        "--gpu-scope=agent",
        f"--node-agent-url={NODE_AGENT_URL}",
    ]
    sidecar_args += [f"--model-version={model.model_version}"] if model.model_version else []
    sidecar_args += [f"--prompt-version={model.prompt_version}"] if model.prompt_version else []
    context = {
        # the pod's own securityContext is the team's: these hold without it
        "runAsNonRoot": True,
        "runAsUser": 65532,
        "runAsGroup": 65532,
        "seccompProfile": {"type": "RuntimeDefault"},
        "allowPrivilegeEscalation": False,
        "readOnlyRootFilesystem": True,
        "capabilities": {"drop": ["ALL"]},
    }
    ready = {
        "httpGet": {"path": "/readyz", "port": "iw-metrics"},
        "periodSeconds": 5,
        "failureThreshold": 2,
    }
    # the pod's identity from the downward API (the sidecar's labels, the spans' resource)
    identity = [
        {"name": "POD_NAME", "valueFrom": {"fieldRef": {"fieldPath": "metadata.name"}}},
        {"name": "POD_NAMESPACE", "valueFrom": {"fieldRef": {"fieldPath": "metadata.namespace"}}},
        {"name": "NODE_NAME", "valueFrom": {"fieldRef": {"fieldPath": "spec.nodeName"}}},
    ]
    sidecar = {
        "name": "inferwatch-sidecar",
        "image": "inferwatch:0.1.0",
        "args": sidecar_args,
        "env": [
            *identity,
            {"name": "NVIDIA_VISIBLE_DEVICES", "value": "all"},
            _secret_env("INFERWATCH_SIDECAR_ADMIN_TOKEN", SIDECAR_ADMIN_SECRET),
            _secret_env("INFERWATCH_SIDECAR_NODE_AGENT_TOKEN", "inferwatch-node-agent-token"),
        ],
        "ports": [{"name": "iw-metrics", "containerPort": PORTS["iw-metrics"]}],
        "readinessProbe": ready,
        "livenessProbe": {
            "httpGet": {"path": "/healthz", "port": "iw-metrics"},
            "periodSeconds": 10,
            "failureThreshold": 3,
        },
        "securityContext": context,
        "resources": RESOURCES["inferwatch-sidecar"],
    }
    proxy = {
        "name": "inferwatch-proxy",
        "image": "inferwatch:0.1.0",
        "args": [
            "proxy",
            f"--upstream={engine}",
            f"--listen=0.0.0.0:{PORTS['iw-proxy']}",
            f"--metrics-listen=0.0.0.0:{PORTS['iw-tenants']}",
            f"--probe-metrics=http://127.0.0.1:{PORTS['iw-metrics']}/metrics",
            *traced,
        ],
        "env": identity,
        "ports": [
            {"name": "iw-proxy", "containerPort": PORTS["iw-proxy"]},
            {"name": "iw-tenants", "containerPort": PORTS["iw-tenants"]},
        ],
        # the proxy takes traffic only while the sidecar says the replica is ready
        "readinessProbe": ready,
        "securityContext": context,
        "resources": RESOURCES["inferwatch-proxy"],
    }
    return [sidecar, proxy]


def _secret_env(name: str, secret: str) -> dict[str, Any]:
    return {"name": name, "valueFrom": {"secretKeyRef": {"name": secret, "key": "token"}}}


def patches(model: Model, traced: Sequence[str] = ()) -> list[dict[str, Any]]:
    """The kustomize patches that inject into ``model``'s workloads, one per kind."""
    found = []
    for kind in model.kinds:
        group, version, template = KINDS[kind]
        ops: list[dict[str, Any]] = [
            {
                "op": "add",
                "path": f"{template}/metadata/labels/{_pointer(MODEL_LABEL)}",
                "value": model.name,
            },
            {
                "op": "add",
                "path": f"{template}/metadata/labels/{_pointer(SIDECAR_LABEL)}",
                "value": "true",
            },
        ]
        ops += [
            {"op": "add", "path": f"{template}/spec/containers/-", "value": container}
            for container in containers(model, traced)
        ]
        target: dict[str, Any] = {"group": group, "version": version, "kind": kind}
        if model.workload:
            target["name"] = model.workload
        if model.labels:
            target["labelSelector"] = ",".join(f"{k}={v}" for k, v in model.labels.items())
        found.append({"target": target, "patch": json.dumps(ops)})
    return found


def _pointer(key: str) -> str:
    return key.replace("~", "~0").replace("/", "~1")


def objects(
    model: Model,
    release: str,
    cluster: str,
    monitoring: str,
    namespace: str,
    node_agent: bool = False,
) -> list[dict[str, Any]]:
    """The PodMonitor, proxy Service and NetworkPolicy of one injected model (``node_agent``:
    the node agent may reach the sidecar too, to drain it before a GPU reset)."""
    selector = {MODEL_LABEL: model.name}
    relabelings = [
        {"sourceLabels": ["__meta_kubernetes_pod_node_name"], "targetLabel": "node"},
        *([{"targetLabel": "cluster", "replacement": cluster}] if cluster else []),
    ]
    monitor = {
        "apiVersion": "monitoring.coreos.com/v1",
        "kind": "PodMonitor",
        "metadata": {"name": monitor_name(model), "labels": {"release": release}},
        "spec": {
            "selector": {"matchLabels": selector},
            "podMetricsEndpoints": [
                {
                    "port": port,
                    "path": "/metrics",
                    "interval": "15s",
                    "scrapeTimeout": "10s",
                    "relabelings": relabelings,
                }
                for port in ("iw-metrics", "iw-tenants")
            ],
        },
    }
    service = {
        "apiVersion": "v1",
        "kind": "Service",
        "metadata": {"name": f"{model.name}-inferwatch", "labels": selector},
        "spec": {
            "selector": selector,
            "ports": [{"name": "http", "port": 80, "targetPort": "iw-proxy"}],
        },
    }
    guarded = sorted(PORTS[p] for p in ("iw-metrics", "iw-tenants"))
    policy = {
        "apiVersion": "networking.k8s.io/v1",
        "kind": "NetworkPolicy",
        "metadata": {"name": f"{model.name}-inferwatch"},
        "spec": {
            "podSelector": {"matchLabels": selector},
            "policyTypes": ["Ingress"],
            "ingress": [
                # every port but the guarded ones stays open, as it was before this policy
                {"ports": _open_ranges(guarded)},
                {
                    "ports": [{"port": p, "protocol": "TCP"} for p in guarded],
                    "from": [
                        {
                            "namespaceSelector": {"matchLabels": {_NS: monitoring}},
                            "podSelector": {"matchLabels": {_NAME: "prometheus"}},
                        },
                        {
                            "namespaceSelector": {"matchLabels": {_NS: namespace}},
                            "podSelector": {"matchLabels": {_NAME: "inferwatch-receiver"}},
                        },
                    ],
                },
                *([NODE_AGENT_INGRESS] if node_agent else []),
            ],
        },
    }
    return [monitor, service, policy]


_NS = "kubernetes.io/metadata.name"
_NAME = "app.kubernetes.io/name"


def _open_ranges(closed: list[int]) -> list[dict[str, Any]]:
    """TCP and UDP port ranges covering 1-65535 except ``closed`` (sorted)."""
    ranges, low = [], 1
    for port in [*closed, 65536]:
        if low < port:
            ranges.append((low, port - 1))
        low = port + 1
    return [
        {"port": a, **({"endPort": b} if b > a else {}), "protocol": protocol}
        for protocol in ("TCP", "UDP")
        for a, b in ranges
    ]


def render_component(
    models: tuple[Model, ...],
    release: str,
    cluster: str,
    monitoring: str,
    namespace: str,
    image_tag: str,
    traced: Sequence[str] = (),
    node_agent: bool = False,
) -> dict[str, Any]:
    """The Component's kustomization and its objects document, as data (``node_agent``: see
    :func:`objects`)."""
    documents = [
        document
        for model in models
        for document in objects(model, release, cluster, monitoring, namespace, node_agent)
    ]
    kustomization = {
        "apiVersion": "kustomize.config.k8s.io/v1alpha1",
        "kind": "Component",
        "resources": ["models.yaml"],
        "images": [{"name": "inferwatch", "newTag": image_tag}],
        "patches": [p for model in models for p in patches(model, traced)],
    }
    return {"kustomization": kustomization, "documents": documents}
