"""A site's overlay (``overlays/NAME/``), rendered from its site file, the receiver's mapping
included (``inferwatch/k8s/automation.py``).

Every rule of the model's HTTPRoute removes the headers the pods' tenancy proxy takes from a
gateway (``ProxyConfig.gateway_headers``, read from the proxy config in the base, so a
renamed header is removed too) apart from the one it sets itself, the split: a client can
neither name the tenant that pays nor the version its tokens are charged to. The Gateway API
has no wildcard for this; the names are listed.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import TYPE_CHECKING, Any

from inferwatch import config as layer
from inferwatch import wire
from inferwatch.k8s import automation, autoscaling, components, inject, victoria
from inferwatch.k8s import tracing as k8s_tracing
from inferwatch.k8s.rbac import gpu_reset_rbac
from inferwatch.k8s.site import MARKER, Site, SiteError, dump
from inferwatch.proxy import config as proxy_config

if TYPE_CHECKING:
    from inferwatch.mixin.config import Config

#: the name of the ConfigMap that carries site values to kustomize's replacements; its
#: local-config annotation keeps it out of the rendered output
SITE_VALUES = "inferwatch-site"


def _replacement(source: str, targets: list[dict[str, Any]]) -> dict[str, Any]:
    return {
        "source": {"kind": "ConfigMap", "name": SITE_VALUES, "fieldPath": f"data.{source}"},
        "targets": targets,
    }


def _monitoring_objects(field_path: str, create: bool) -> list[dict[str, Any]]:
    kinds = ("PodMonitor", "ServiceMonitor", "PrometheusRule", "AlertmanagerConfig")
    return [
        {"select": {"kind": kind}, "fieldPaths": [field_path], "options": {"create": create}}
        for kind in kinds
    ]


#: where each site value lands in the base; kustomize fails the render when a path is gone
REPLACEMENTS = [
    _replacement("release", _monitoring_objects("metadata.labels.release", create=True)),
    _replacement(
        # the cluster label on every scraped series (empty: none); Prometheus' external
        # labels (prometheus-values.yaml) would add it only to what leaves the cluster
        "cluster",
        [
            {
                "select": {"kind": "PodMonitor"},
                "fieldPaths": [
                    "spec.podMetricsEndpoints.*.relabelings.[targetLabel=cluster].replacement"
                ],
            },
            {
                "select": {"kind": "ServiceMonitor"},
                "fieldPaths": ["spec.endpoints.*.relabelings.[targetLabel=cluster].replacement"],
            },
        ],
    ),
    _replacement(
        "monitoring_namespace",
        [
            {
                "select": {"kind": "NetworkPolicy"},
                # Redis answers the model's pods only, none in the monitoring namespace
                "reject": [{"name": "inferwatch-redis"}],
                "fieldPaths": [
                    "spec.ingress.*.from.*.namespaceSelector.matchLabels."
                    "kubernetes\\.io/metadata\\.name"
                ],
            }
        ],
    ),
    _replacement(
        "namespace",
        [
            {
                # http://inferwatch-receiver.NAMESPACE.svc:9405/webhook
                "select": {"kind": "AlertmanagerConfig"},
                "fieldPaths": ["spec.receivers.0.webhookConfigs.0.url"],
                "options": {"delimiter": ".", "index": 1},
            }
        ],
    ),
    _replacement(
        "gateway_class",
        [{"select": {"kind": "Gateway"}, "fieldPaths": ["spec.gatewayClassName"]}],
    ),
    _replacement(
        "hostname",
        [{"select": {"kind": "HTTPRoute"}, "fieldPaths": ["spec.hostnames.0"]}],
    ),
]


#: the file of the base holding the model's pods and their proxy's ConfigMap
PROXY_CONFIG_FILE = "base/model/vllm.yaml"
#: the headers the base's proxy config takes from a gateway when none is read
DEFAULT_PROXY_HEADERS = proxy_config.ProxyConfig().gateway_headers


def proxy_headers(kit: Path) -> tuple[str, ...]:
    """The headers the tenancy proxy of the kit's base takes from a gateway (its ConfigMap's
    ``proxy.yaml``, checked as the proxy checks it but for its ``shared_state``)."""
    path = kit / PROXY_CONFIG_FILE
    documents = layer.parse_all(layer.read_text(path, str(path), SiteError), str(path), SiteError)
    found = [
        d["data"]["proxy.yaml"]
        for d in documents
        if isinstance(d, dict) and d.get("kind") == "ConfigMap"
        and isinstance(d.get("data"), dict) and "proxy.yaml" in d["data"]
    ]  # fmt: skip
    if len(found) != 1:
        raise SiteError(f"{path}: expected one ConfigMap with a proxy.yaml, found {len(found)}")
    source = f"{path} (proxy.yaml)"
    document = layer.parse(found[0], source, SiteError)
    if isinstance(document, dict):
        # shared_state names the pod's own Secret mount and journal volume, which exist only
        # in the pod; the headers do not depend on it
        document.pop("shared_state", None)
    try:
        config = proxy_config.parse(document, source)
    except proxy_config.ConfigError as exc:
        raise SiteError(str(exc)) from None
    return config.gateway_headers


def _removed(headers: tuple[str, ...]) -> list[str]:
    """What a route rule removes: every header the proxy takes, but the split it sets."""
    return [name for name in headers if name != wire.SPLIT_HEADER]


def render_overlay(
    site: Site,
    scaled: autoscaling.Scaled,
    headers: tuple[str, ...] = DEFAULT_PROXY_HEADERS,
    monitors: tuple[victoria.Monitor, ...] = (),
    config: Config | None = None,
) -> dict[str, str]:
    """Relative path (under ``overlays/``) -> text, for one site (``scaled``: the kit's
    model Deployment; ``headers``: what its proxy takes from a gateway; ``monitors``: the
    base's, which a VictoriaMetrics site's vmagent scrapes as the operator would;
    ``config``: the alert config its autoscaler's targets come from, None for the shipped
    defaults)."""
    literals = [
        f"namespace={site.namespace}",
        f"release={site.release}",
        f"cluster={site.cluster}",
        f"monitoring_namespace={site.monitoring_namespace}",
        f"gateway_class={site.gateway_class}",
        f"hostname={site.hostname}",
    ]
    route_patch: list[dict[str, Any]] = [
        # the stable share: to the model's Service, or its pool when the site has a picker
        {"op": "replace", "path": "/spec/rules/1/backendRefs/0",
         "value": {**POOL_REF, "weight": 100 - site.canary_weight}}
        if site.endpoint_picker
        else {"op": "replace", "path": "/spec/rules/1/backendRefs/0/weight",
              "value": 100 - site.canary_weight},
        {"op": "replace", "path": "/spec/rules/1/backendRefs/1/weight",
         "value": site.canary_weight},
    ]  # fmt: skip
    for rule in (0, 1):
        route_patch.append(
            {"op": "add", "path": f"/spec/rules/{rule}/filters/0/requestHeaderModifier/remove",
             "value": _removed(headers)}
        )  # fmt: skip
    if site.fallback:
        # where the receiver's HTTPRoute shift moves the stable replicas' weight
        fallback = {"name": site.fallback, "port": site.fallback_port, "weight": 0}
        route_patch.append({"op": "add", "path": "/spec/rules/1/backendRefs/-", "value": fallback})
    if site.canary_users:
        route_patch.append(
            {"op": "add", "path": "/spec/rules/-", "value": user_rule(site.canary_users, headers)}
        )
    kustomization: dict[str, Any] = {
        "apiVersion": "kustomize.config.k8s.io/v1beta1",
        "kind": "Kustomization",
        "namespace": site.namespace,
        "resources": ["../../base"],
        "components": ["../../components/rules", "../../components/dashboards"],
        "images": [{"name": "inferwatch", "newTag": site.image_tag}],
        "configMapGenerator": [
            {
                "name": SITE_VALUES,
                "literals": literals,
                "options": {
                    "disableNameSuffixHash": True,
                    "annotations": {"config.kubernetes.io/local-config": "true"},
                },
            },
            {
                # the receiver's mapping, hashed into its name so a change rolls the receiver
                "name": automation.CONFIGMAP,
                "files": [f"{automation.KEY}={automation.FILE}"],
            },
        ],
        "replacements": REPLACEMENTS,
        "patches": [
            {
                "target": {"kind": "HTTPRoute", "name": "llama-8b"},
                "patch": json.dumps(route_patch),
            }
        ],
    }
    files: dict[str, str] = {}
    if site.endpoint_picker:
        kustomization["resources"].append(INFERENCE_POOL_FILE)
        files[f"{site.name}/{INFERENCE_POOL_FILE}"] = (
            MARKER + f"# from deploy/kubernetes/sites/{site.name}.yaml (gateway.endpoint_picker)\n"
            + dump(inference_pool(site))
        )
    if site.tracing:
        # both the stable and the canary Deployment (base/model and its -canary copy)
        kustomization["patches"].append({
            "target": {"kind": "Deployment", "labelSelector": "app.kubernetes.io/name=llama-8b"},
            "patch": json.dumps(k8s_tracing.model_patch(site.tracing)),
        })  # fmt: skip
    if site.gpu_reset:
        files[f"{site.name}/node-agent/{components.GPU_RESET_FILE}"] = gpu_reset_rbac()
        # the node agent drains a GPU's replicas through their sidecars' port
        kustomization["patches"].append({
            "target": {"kind": "NetworkPolicy", "name": "inferwatch-model-admin"},
            "patch": json.dumps([{"op": "add", "path": "/spec/ingress/-",
                                  "value": inject.NODE_AGENT_INGRESS}]),
        })  # fmt: skip
    agent = components.node_agent_overlay(site)
    if site.victoriametrics and site.tsdb == victoria.VICTORIA:
        files.update(components.victoria_overlay(site, kustomization, agent, monitors))
    header = (
        MARKER + f"# from deploy/kubernetes/sites/{site.name}.yaml; render with\n"
        f"#   kubectl kustomize deploy/kubernetes/overlays/{site.name}\n"
    )
    if site.autoscaling != "none":
        files.update(components.autoscaling_overlay(site, scaled, kustomization, config))
    files[f"{site.name}/kustomization.yaml"] = header + dump(kustomization)
    files[f"{site.name}/{automation.FILE}"] = (
        MARKER + f"# from deploy/kubernetes/sites/{site.name}.yaml: the receiver's mapping "
        "(inferwatch/k8s/automation.py),\n# the ConfigMap its --config reads; check it with\n"
        f"#   inferwatch runbooks check-config deploy/kubernetes/overlays/{site.name}/"
        f"{automation.FILE}\n" + dump(receiver_mapping(site, scaled))
    )
    if site.models:
        files.update(components.inject_component(site))
    files[f"{site.name}/node-agent/kustomization.yaml"] = (
        MARKER + f"# from deploy/kubernetes/sites/{site.name}.yaml: the node agent, in its own\n"
        f"# namespace ({inject.NODE_AGENT_NAMESPACE}); apply it before the site's overlay\n"
        f"#   kubectl apply -k deploy/kubernetes/overlays/{site.name}/node-agent\n" + dump(agent)
    )
    if site.cluster and site.tsdb == victoria.OPERATOR:
        files[f"{site.name}/prometheus-values.yaml"] = (
            MARKER
            + "# kube-prometheus-stack values for this cluster's Prometheus: the cluster label\n"
            "# on every series it sends, and the central store it sends them to\n"
            "#   helm upgrade kube-prometheus-stack prometheus-community/kube-prometheus-stack "
            f"-f deploy/kubernetes/overlays/{site.name}/prometheus-values.yaml\n"
            + dump(prometheus_values(site))
        )
    return files


def receiver_mapping(site: Site, scaled: autoscaling.Scaled) -> dict[str, Any]:
    """The mapping the site's receiver runs: its namespace, its models' pods and GPU nodes as
    the inventory, its fallback for the traffic shift."""
    return automation.mapping(
        site.namespace, site.models, scaled.model, site.fallback, site.gpu_node_selector
    )


#: the stable replicas as an Inference Extension pool, as the route names it
POOL_REF = {"group": "inference.networking.k8s.io", "kind": "InferencePool",
            "name": automation.ROUTE}  # fmt: skip
INFERENCE_POOL_FILE = "inferencepool.yaml"
#: the proxy's client port in the model pod (base/model/vllm.yaml, container port ``http``)
PROXY_PORT = 8080


def inference_pool(site: Site) -> dict[str, Any]:
    """The stable replicas as an InferencePool: the site's endpoint picker chooses among the
    ready pods, and the gateway keeps routing (to any of them) when the picker does not
    answer (``FailOpen``), rather than failing every request."""
    return {
        "apiVersion": "inference.networking.k8s.io/v1",
        "kind": "InferencePool",
        "metadata": {"name": automation.ROUTE, "labels": {"app.kubernetes.io/name": "llama-8b"}},
        "spec": {
            "selector": {"matchLabels": {"app.kubernetes.io/name": "llama-8b",
                                         "inferwatch.io/track": "stable"}},
            "targetPorts": [{"number": PROXY_PORT}],
            "endpointPickerRef": {
                "name": site.endpoint_picker,
                "port": {"number": site.endpoint_picker_port},
                "failureMode": "FailOpen",
            },
        },
    }  # fmt: skip


def user_rule(
    users: tuple[str, ...], headers: tuple[str, ...] = DEFAULT_PROXY_HEADERS
) -> dict[str, Any]:
    """The HTTPRoute rule that sends ``users`` to the canary, marked as the user split."""
    return {
        "matches": [
            {
                "path": {"type": "PathPrefix", "value": "/v1"},
                "headers": [{"type": "Exact", "name": wire.USER_HEADER, "value": user}],
            }
            for user in users
        ],
        "filters": [
            {
                "type": "RequestHeaderModifier",
                "requestHeaderModifier": {
                    "set": [{"name": wire.SPLIT_HEADER, "value": wire.USER}],
                    "remove": _removed(headers),
                },
            }
        ],
        "backendRefs": [{"name": "llama-8b-canary", "port": 80, "weight": 1}],
    }


def prometheus_values(site: Site) -> dict[str, Any]:
    """The kube-prometheus-stack ``prometheus.prometheusSpec`` for a site with a cluster."""
    spec: dict[str, Any] = {"externalLabels": {"cluster": site.cluster}}
    remote = site.remote_write
    if remote:
        # external labels go with every remote-written sample (the operator's field names)
        spec["remoteWrite"] = [
            {
                "url": remote.url,
                "queueConfig": {
                    "capacity": remote.capacity,
                    "maxShards": remote.max_shards,
                    "maxSamplesPerSend": remote.max_samples_per_send,
                    "batchSendDeadline": remote.batch_send_deadline,
                },
            }
        ]
    return {"prometheus": {"prometheusSpec": spec}}
