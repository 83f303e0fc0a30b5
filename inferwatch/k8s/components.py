"""The kit's components, and what a site's overlay adds of each: the generated rules and
dashboards, the injection of existing model servers, the node agent, the autoscaler and the
VictoriaMetrics scrape and rules.
"""

from __future__ import annotations

import json
from typing import TYPE_CHECKING, Any

from inferwatch.k8s import autoscaling, inject, victoria
from inferwatch.k8s import tracing as k8s_tracing
from inferwatch.k8s.site import MARKER, Site, dump
from inferwatch.mixin import files as generated
from inferwatch.nodeagent.kube_facts import SIDECAR_TOKEN_ENV

if TYPE_CHECKING:
    from inferwatch.mixin.config import Config


def render_components(config: Config) -> dict[str, str]:
    """Relative path (under ``components/``) -> text: the PrometheusRule of the alert rules
    and a ConfigMap per dashboard, built from ``config``, each folder a kustomize Component
    that lists what it holds. They are rendered here, not copied from the generators'
    folders, so that the kit holds the only copy and needs no file outside its folder; the
    PrometheusRule's groups also become vmalert's rules."""
    # here, not at the top: the boards import the Grafana SDK, which an overlay does not need
    from inferwatch.alerts import writer as rules
    from inferwatch.dashboards import writer as boards

    resources = {
        "rules": {"prometheusrule.yaml": rules.prometheus_rule(config)},
        "dashboards": {f"{name}.yaml": m for name, m in sorted(boards.config_maps(config).items())},
    }
    files: dict[str, str] = {}
    for component, documents in resources.items():
        kustomization = {
            "apiVersion": "kustomize.config.k8s.io/v1alpha1",
            "kind": "Component",
            "resources": list(documents),
        }
        files[f"{component}/kustomization.yaml"] = MARKER + dump(kustomization)
        for name, document in documents.items():
            files[f"{component}/{name}"] = MARKER + generated.dump(document)
    rule = resources["rules"]["prometheusrule.yaml"]
    files.update(victoria.rules_component(rule["spec"]["groups"], MARKER))
    return files


def _injection(site: Site) -> dict[str, Any]:
    return inject.render_component(
        site.models, site.release, site.cluster, site.monitoring_namespace, site.namespace,
        site.image_tag, k8s_tracing.args(site.tracing) if site.tracing else (), site.gpu_reset,
    )  # fmt: skip


def _injected(site: Site) -> list[dict[str, Any]]:
    """The objects of the site's injection Component, its PodMonitors included."""
    documents: list[dict[str, Any]] = _injection(site)["documents"]
    return documents


def inject_component(site: Site) -> dict[str, str]:
    """The site's injection Component (``inject/``), for the models its file names (on a
    VictoriaMetrics site without PodMonitors: its vmagent scrapes the models)."""
    rendered = _injection(site)
    documents = rendered["documents"]
    if site.tsdb == victoria.VICTORIA:
        documents = victoria.split_monitors(documents, site.namespace)[0]
    folder = f"deploy/kubernetes/overlays/{site.name}/inject"
    header = (
        MARKER + f"# from the models of deploy/kubernetes/sites/{site.name}.yaml: add it to the\n"
        "# kustomization that holds those workloads, or pass it to Helm:\n"
        f"#   components: [<path to>/{folder}]\n"
        f"#   helm install ... --post-renderer deploy/kubernetes/helm/inferwatch-post-renderer "
        f"--post-renderer-args {folder}\n"
    )
    objects = "---\n".join(dump(document) for document in documents)
    return {
        f"{site.name}/inject/kustomization.yaml": header + dump(rendered["kustomization"]),
        f"{site.name}/inject/models.yaml": MARKER + objects,
    }


#: the NVIDIA container runtime's RuntimeClass (the GPU operator's name for it)
NVIDIA_RUNTIME_CLASS = "nvidia"
GPU_RESET_FILE = "gpu-reset.yaml"
_AGENT = "/spec/template/spec"
_CONTAINER = f"{_AGENT}/containers/0"
#: what ``--gpu-reset`` needs of the node agent's pod: the Kubernetes API (its own account),
#: every GPU of the node with NVML and nvidia-smi (the NVIDIA runtime mounts both, for the
#: ``utility`` capability, and the device nodes of ``NVIDIA_VISIBLE_DEVICES``), privilege
#: (a reset writes to the GPU's device as root), and the sidecars' admin token to drain them
GPU_RESET_PATCH: list[dict[str, Any]] = [
    {"op": "add", "path": f"{_AGENT}/serviceAccountName", "value": inject.NODE_AGENT},
    {"op": "replace", "path": f"{_AGENT}/automountServiceAccountToken", "value": True},
    {"op": "add", "path": f"{_AGENT}/runtimeClassName", "value": NVIDIA_RUNTIME_CLASS},
    {"op": "add", "path": f"{_CONTAINER}/args/-", "value": "--gpu-reset"},
    *(
        {"op": "add", "path": f"{_CONTAINER}/env/-", "value": variable}
        for variable in (
            {"name": "NVIDIA_VISIBLE_DEVICES", "value": "all"},
            {"name": "NVIDIA_DRIVER_CAPABILITIES", "value": "utility"},
            {"name": SIDECAR_TOKEN_ENV, "valueFrom": {"secretKeyRef": {
                "name": inject.SIDECAR_ADMIN_SECRET, "key": "token"}}},
        )
    ),
    {"op": "replace", "path": f"{_CONTAINER}/securityContext",
     "value": {"privileged": True, "readOnlyRootFilesystem": True}},
    # the Kubernetes client and NVML take the agent from 56 to 78 MB resident after import
    # (measured), and nvidia-smi runs in the same cgroup
    {"op": "replace", "path": f"{_CONTAINER}/resources/requests/memory", "value": "96Mi"},
    {"op": "replace", "path": f"{_CONTAINER}/resources/limits/memory", "value": "256Mi"},
]  # fmt: skip


def node_agent_overlay(site: Site) -> dict[str, Any]:
    """The node agent's kustomization for a site: its image, the site's inference namespace
    as the only one whose sidecars its NetworkPolicy lets in, and the site's Prometheus."""
    selector = "/spec/ingress/0/from/{}/namespaceSelector/matchLabels/kubernetes.io~1metadata.name"
    policy = [
        {"op": "replace", "path": selector.format(0), "value": site.namespace},
        {"op": "replace", "path": selector.format(1), "value": site.monitoring_namespace},
    ]
    monitor = [
        {"op": "replace", "path": "/metadata/labels/release", "value": site.release},
        *(
            [{"op": "add", "path": "/spec/podMetricsEndpoints/0/relabelings/-",
              "value": {"targetLabel": "cluster", "replacement": site.cluster}}]
            if site.cluster
            else []
        ),
    ]  # fmt: skip
    kustomization: dict[str, Any] = {
        "apiVersion": "kustomize.config.k8s.io/v1beta1",
        "kind": "Kustomization",
        "resources": ["../../../base/node-agent"],
        "images": [{"name": "inferwatch", "newTag": site.image_tag}],
        "patches": [
            {
                "target": {"kind": "NetworkPolicy", "name": "inferwatch-node-agent"},
                "patch": json.dumps(policy),
            },
            {
                "target": {"kind": "PodMonitor", "name": "inferwatch-node-agent"},
                "patch": json.dumps(monitor),
            },
        ],
    }
    if site.gpu_reset:
        kustomization["resources"].append(GPU_RESET_FILE)
        kustomization["patches"].append({
            "target": {"kind": "DaemonSet", "name": inject.NODE_AGENT},
            "patch": json.dumps(GPU_RESET_PATCH),
        })  # fmt: skip
    return kustomization


def autoscaling_overlay(
    site: Site, scaled: autoscaling.Scaled, kustomization: dict[str, Any], config: Config | None
) -> dict[str, str]:
    """Add the site's autoscaling component and bounds to ``kustomization``; returns the
    prometheus-adapter values file an HPA site also needs (``config``: the alert config of
    its targets, None for the shipped defaults)."""
    from inferwatch.mixin import config as alert_config

    config = config or alert_config.load()
    url = (
        site.victoriametrics.read_url
        if site.victoriametrics and site.tsdb == victoria.VICTORIA
        else autoscaling.prometheus_url(site.release, site.monitoring_namespace)
    )
    component = autoscaling.COMPONENT[site.autoscaling]
    kustomization["components"].append(f"../../components/{component}")
    kustomization["patches"] += autoscaling.overlay_patches(
        site.autoscaling, scaled, site.min_replicas, site.max_replicas, url,
        len(config.autoscaling["targets"]),
    )  # fmt: skip
    if site.autoscaling != "hpa":
        return {}
    values = autoscaling.adapter_values(config, scaled, url)
    return {
        f"{site.name}/prometheus-adapter-values.yaml": MARKER
        + "# prometheus-adapter values: the external metrics this site's HPA reads\n"
        "#   helm upgrade --install prometheus-adapter prometheus-community/prometheus-adapter "
        f"-n {site.monitoring_namespace} "
        f"-f deploy/kubernetes/overlays/{site.name}/prometheus-adapter-values.yaml\n"
        + dump(values)
    }


def victoria_overlay(
    site: Site,
    kustomization: dict[str, Any],
    agent: dict[str, Any],
    monitors: tuple[victoria.Monitor, ...],
) -> dict[str, str]:
    """Make the site's and its node agent's kustomizations the VictoriaMetrics ones; the
    files they add. vmagent scrapes what the base's and the injected models' monitors
    select."""
    assert site.victoriametrics is not None
    scraped = (*monitors, *victoria.split_monitors(_injected(site), site.namespace)[1])
    added = victoria.overlay(
        site.victoriametrics, kustomization, scraped, site.namespace, site.cluster,
        site.monitoring_namespace, MARKER,
    )  # fmt: skip
    for name, text in victoria.node_agent(
        agent, scraped, site.namespace, inject.NODE_AGENT_NAMESPACE, MARKER
    ).items():
        added[f"node-agent/{name}"] = text
    return {f"{site.name}/{name}": text for name, text in added.items()}
