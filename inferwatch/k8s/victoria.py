"""A site's VictoriaMetrics path (``tsdb: victoriametrics``): vmagent and vmalert as plain
manifests in place of the Prometheus operator's objects, for a cluster without its CRDs.

vmagent's scrape jobs are translated from the kit's own PodMonitors and ServiceMonitors (the
base's, the canary's copy, the injected models'), the way the operator turns them into
Prometheus jobs: the same pods and ports, interval, timeout, relabelings, and the labels it
adds (``namespace``, ``pod``, ``container``, ``endpoint``, ``job``), so alerts and boards see
the same series on either path. vmagent runs as a StatefulSet so that each shard takes its
``-promscrape.cluster.memberNum`` from its pod's ordinal; its account may list and watch only
what its service discovery reads, in the namespaces it scrapes. vmalert loads the rule
groups of the generated PrometheusRule (``components/vmalert-rules``), writes the recording
rules and alert state back, and notifies the site's Alertmanager.
"""

from __future__ import annotations

import json
import re
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import yaml

from inferwatch import config as layer
from inferwatch.config.schema import Fields
from inferwatch.mixin import validate

__all__ = [
    "KEYS", "KINDS", "OPERATOR", "TSDBS", "VICTORIA", "Monitor", "Victoria", "kit_monitors",
    "load", "node_agent", "overlay", "rules_component", "scrape_config", "split_monitors",
]  # fmt: skip

OPERATOR, VICTORIA = "prometheus-operator", "victoriametrics"
TSDBS = (OPERATOR, VICTORIA)
KEYS = {"url", "read_url", "alertmanager_url", "shards", "image_tag"}
#: the release whose images the kit runs unless the site names another (its flags are 1.79's)
IMAGE_TAG = "v1.102.1"
URL = re.compile(r"https?://[^\s/@]+(/[^\s@]*)?")
IMAGE = re.compile(r"[A-Za-z0-9_][A-Za-z0-9_.-]{0,127}")
MAX_URL = 253
MAX_SHARDS = 64

VMAGENT, VMALERT = "inferwatch-vmagent", "inferwatch-vmalert"
#: the files a VictoriaMetrics site's overlay adds, and the rules component
OBJECTS_FILE = "victoriametrics.yaml"
SCRAPE_FILE = "vmagent-scrape.yaml"
NODE_AGENT_RBAC_FILE = "vmagent-rbac.yaml"
RULES_COMPONENT = "vmalert-rules"
RULES_FILE = "rules.yaml"
#: vmagent reads the scrape config and vmalert the rules as files, each checked by the real
#: binary before it is written (``vmagent -dryRun``, ``vmalert -dryRun``)
VMALERT_RULES = validate.Kind(validate.RULES.check, validate.Tool(("vmalert", "-dryRun", "-rule")))
KINDS = {
    f"overlays/*/{SCRAPE_FILE}": validate.SCRAPE_CONFIG,
    f"components/{RULES_COMPONENT}/{RULES_FILE}": VMALERT_RULES,
}
_OPERATOR_KINDS = {
    "PodMonitor": "monitoring.coreos.com/v1",
    "ServiceMonitor": "monitoring.coreos.com/v1",
    "AlertmanagerConfig": "monitoring.coreos.com/v1alpha1",
}
#: what the operator path's replacements fill in (the generated PrometheusRule included)
_OPERATOR_ONLY = (*_OPERATOR_KINDS, "PrometheusRule")
_NAME, _NS = "app.kubernetes.io/name", "kubernetes.io/metadata.name"
#: the peer that scrapes a pod's metrics port, on this path: vmagent, in the site's namespace
SCRAPER = {"podSelector": {"matchLabels": {_NAME: VMAGENT}}}
#: the peer the base's NetworkPolicies name for kube-prometheus-stack's Prometheus
PROMETHEUS = {_NAME: "prometheus"}


@dataclass(frozen=True)
class Victoria:
    """Where a site's series go and are read, and where its alerts are sent."""

    url: str
    read_url: str
    alertmanager_url: str
    shards: int = 1
    image_tag: str = IMAGE_TAG


def load(fields: Fields) -> Victoria:
    """The ``victoriametrics`` section (the store's URL and the Alertmanager's required)."""
    fields.check_keys(KEYS, required={"url", "alertmanager_url"})
    url = fields.matching("url", "", URL, "an http(s) URL without user:password@", MAX_URL)
    return Victoria(
        url=url.rstrip("/"),
        # a single-node server is read where it is written; a cluster's vmselect elsewhere
        read_url=fields.matching(
            "read_url", url, URL, "an http(s) URL without user:password@", MAX_URL
        ).rstrip("/"),
        alertmanager_url=fields.matching(
            "alertmanager_url", "", URL, "an http(s) URL without user:password@", MAX_URL
        ).rstrip("/"),
        shards=fields.integer("shards", 1, 1, MAX_SHARDS),
        image_tag=fields.matching("image_tag", IMAGE_TAG, IMAGE, "an image tag", 128),
    )


@dataclass(frozen=True)
class Monitor:
    """A PodMonitor or ServiceMonitor of the kit and the namespace its pods run in."""

    namespace: str
    document: Mapping[str, Any]


#: the kit's folder whose monitors run in the node agent's namespace, and that namespace
NODE_AGENT_BASE = "base/node-agent"


def kit_monitors(kit: Path, node_agent_namespace: str) -> tuple[Monitor, ...]:
    """Every monitor of the kit's base, with the copies its kustomizations make of them (the
    canary: a name suffix, and the track label in the selector); ``""`` as the namespace of
    those in the site's namespace."""
    base, found = kit / "base", []
    for path in sorted(base.rglob("*.yaml")):
        documents = layer.parse_all(layer.read_text(path, str(path)), str(path))
        folder = path.parent.relative_to(kit).as_posix()
        namespace = node_agent_namespace if folder == NODE_AGENT_BASE else ""
        if path.name == "kustomization.yaml":
            found += _copies(path, documents[0] if documents else None, namespace)
            continue
        found += [
            Monitor(namespace, d) for d in documents if isinstance(d, dict) and _is_monitor(d)
        ]
    return tuple(found)


def _is_monitor(document: Mapping[str, Any]) -> bool:
    return document.get("kind") in ("PodMonitor", "ServiceMonitor")


def _copies(path: Path, kustomization: Any, namespace: str) -> list[Monitor]:
    """The monitors a kustomization that renames the base's (``nameSuffix``) makes of them."""
    if not isinstance(kustomization, dict) or "nameSuffix" not in kustomization:
        return []
    labels = {k: v for entry in kustomization.get("labels", []) for k, v in entry["pairs"].items()}
    copies = []
    for resource in kustomization.get("resources", []):
        for source in sorted((path.parent / resource).resolve().glob("*.yaml")):
            documents = layer.parse_all(layer.read_text(source, str(source)), str(source))
            for document in documents:
                if isinstance(document, dict) and _is_monitor(document):
                    copy = json.loads(json.dumps(document))
                    copy["metadata"]["name"] += kustomization["nameSuffix"]
                    copy["spec"]["selector"]["matchLabels"].update(labels)
                    copies.append(Monitor(namespace, copy))
    return copies


def split_monitors(
    documents: Iterable[Mapping[str, Any]], namespace: str
) -> tuple[list[Mapping[str, Any]], list[Monitor]]:
    """Objects the operator path renders (the injected models'), without their monitors, and
    the monitors; a NetworkPolicy peer naming Prometheus names vmagent instead."""
    peer = _scraper_in(namespace)

    def rescraped(node: dict[str, Any]) -> dict[str, Any]:
        return peer if node.get("podSelector") == {"matchLabels": PROMETHEUS} else node

    kept, monitors = [], []
    for document in documents:
        if _is_monitor(document):
            monitors.append(Monitor(namespace, document))
        else:
            kept.append(json.loads(json.dumps(document), object_hook=rescraped))
    return kept, monitors


def _scraper_in(namespace: str) -> dict[str, Any]:
    """vmagent as a NetworkPolicy peer of a pod in another namespace."""
    return {"namespaceSelector": {"matchLabels": {_NS: namespace}}, **SCRAPER}


# -- scrape jobs ----------------------------------------------------------------------------

#: the operator's relabeling fields -> the Prometheus config's (vmagent reads the latter)
_RELABEL_FIELDS = {
    "sourceLabels": "source_labels", "separator": "separator", "targetLabel": "target_label",
    "regex": "regex", "modulus": "modulus", "replacement": "replacement", "action": "action",
}  # fmt: skip
_ENDPOINT_FIELDS = {"port", "path", "interval", "scrapeTimeout", "relabelings"}
#: what each service-discovery role lists and watches
ROLE_RESOURCES = {
    "pod": (("", "pods"),),
    "endpointslice": (("", "pods"), ("", "services"), ("discovery.k8s.io", "endpointslices")),
}


def _meta(name: str) -> str:
    return re.sub(r"[^a-zA-Z0-9_]", "_", name)


def _literal(value: str) -> str:
    return re.sub(r"([\\.+*?()|\[\]{}^$])", r"\\\1", value)


def _relabel(relabeling: Mapping[str, Any], where: str) -> dict[str, Any]:
    unknown = sorted(set(relabeling) - set(_RELABEL_FIELDS))
    if unknown:
        raise layer.ConfigError(f"{where}: relabeling field {unknown[0]} is not translated")
    return {_RELABEL_FIELDS[key]: value for key, value in relabeling.items()}


def scrape_jobs(monitor: Monitor, namespace: str) -> list[dict[str, Any]]:
    """vmagent's jobs for one monitor's endpoints, as the operator writes Prometheus' (the
    ``cluster`` relabeling is left out: vmagent's external label adds it to every series)."""
    document, ns = monitor.document, monitor.namespace or namespace
    kind, name = document["kind"], document["metadata"]["name"]
    where = f"{kind}/{name}"
    spec = document["spec"]
    if set(spec["selector"]) != {"matchLabels"}:
        raise layer.ConfigError(f"{where}: only a matchLabels selector is translated")
    pod = kind == "PodMonitor"
    role, subject = ("pod", "pod") if pod else ("endpointslice", "service")
    keep = [
        {"action": "keep", "regex": f"({_literal(str(value))});true",
         "source_labels": [f"__meta_kubernetes_{subject}_label_{_meta(label)}",
                           f"__meta_kubernetes_{subject}_labelpresent_{_meta(label)}"]}
        for label, value in sorted(spec["selector"]["matchLabels"].items())
    ]  # fmt: skip
    port_name = "__meta_kubernetes_pod_container_port_name" if pod else (
        "__meta_kubernetes_endpointslice_port_name")  # fmt: skip
    endpoints = spec["podMetricsEndpoints" if pod else "endpoints"]
    jobs = []
    for index, endpoint in enumerate(endpoints):
        unknown = sorted(set(endpoint) - _ENDPOINT_FIELDS)
        if unknown:
            raise layer.ConfigError(f"{where}: endpoint field {unknown[0]} is not translated")
        # the operator's job label: the monitor's namespace and name, or the Service's name
        job = (
            {"target_label": "job", "replacement": f"{ns}/{name}"}
            if pod
            else {"source_labels": ["__meta_kubernetes_service_name"], "target_label": "job"}
        )
        labels = [
            *keep,
            {"action": "drop", "regex": "(Failed|Succeeded)",
             "source_labels": ["__meta_kubernetes_pod_phase"]},
            {"action": "keep", "regex": _literal(endpoint["port"]), "source_labels": [port_name]},
            {"source_labels": ["__meta_kubernetes_namespace"], "target_label": "namespace"},
            *([] if pod else [{"source_labels": ["__meta_kubernetes_service_name"],
                               "target_label": "service"}]),
            {"source_labels": ["__meta_kubernetes_pod_name"], "target_label": "pod"},
            {"source_labels": ["__meta_kubernetes_pod_container_name"],
             "target_label": "container"},
            job,
            {"target_label": "endpoint", "replacement": endpoint["port"]},
            *(_relabel(r, where) for r in endpoint.get("relabelings", [])
              if r.get("targetLabel") != "cluster"),
        ]  # fmt: skip
        jobs.append({
            "job_name": f"{kind[0].lower()}{kind[1:]}/{ns}/{name}/{index}",
            "kubernetes_sd_configs": [{"role": role, "namespaces": {"names": [ns]}}],
            **({"scrape_interval": endpoint["interval"]} if "interval" in endpoint else {}),
            **({"scrape_timeout": endpoint["scrapeTimeout"]} if "scrapeTimeout" in endpoint
               else {}),
            "metrics_path": endpoint.get("path", "/metrics"),
            "relabel_configs": labels,
        })  # fmt: skip
    return jobs


def scrape_config(monitors: Sequence[Monitor], namespace: str, cluster: str) -> dict[str, Any]:
    """vmagent's ``-promscrape.config``: a job per monitor endpoint, and the cluster (when
    the site has one) as the external label of every series it sends."""
    return {
        **({"global": {"external_labels": {"cluster": cluster}}} if cluster else {}),
        "scrape_configs": [job for m in monitors for job in scrape_jobs(m, namespace)],
    }


def _rbac_rules(jobs: Sequence[Mapping[str, Any]]) -> list[dict[str, Any]]:
    """List and watch, on exactly what the jobs' discovery roles read (vmagent makes no other
    API call)."""
    wanted = sorted({r for j in jobs for sd in j["kubernetes_sd_configs"]
                     for r in ROLE_RESOURCES[sd["role"]]})  # fmt: skip
    groups = sorted({group for group, _ in wanted})
    return [
        {"apiGroups": [group], "resources": [r for g, r in wanted if g == group],
         "verbs": ["list", "watch"]}
        for group in groups
    ]  # fmt: skip


def _role(
    jobs: Sequence[Mapping[str, Any]], namespace: str, account_namespace: str
) -> list[dict[str, Any]]:
    """A Role in ``namespace`` with the rules of the jobs that discover there, bound to
    vmagent's account (in ``account_namespace``)."""
    meta = {"name": VMAGENT, "namespace": namespace}
    mine = [j for j in jobs if j["kubernetes_sd_configs"][0]["namespaces"]["names"] == [namespace]]
    return [
        {"apiVersion": "rbac.authorization.k8s.io/v1", "kind": "Role", "metadata": meta,
         "rules": _rbac_rules(mine)},
        {"apiVersion": "rbac.authorization.k8s.io/v1", "kind": "RoleBinding", "metadata": meta,
         "roleRef": {"apiGroup": "rbac.authorization.k8s.io", "kind": "Role", "name": VMAGENT},
         "subjects": [{"kind": "ServiceAccount", "name": VMAGENT,
                       "namespace": account_namespace}]},
    ]  # fmt: skip


# -- objects --------------------------------------------------------------------------------

_POD_SECURITY = {"runAsNonRoot": True, "runAsUser": 65534, "runAsGroup": 65534,
                 "seccompProfile": {"type": "RuntimeDefault"}}  # fmt: skip
_CONTAINER_SECURITY = {"allowPrivilegeEscalation": False, "readOnlyRootFilesystem": True,
                       "capabilities": {"drop": ["ALL"]}}  # fmt: skip
VMAGENT_PORT, VMALERT_PORT = 8429, 8880
#: how often vmalert evaluates the rules (kube-prometheus-stack's Prometheus default)
EVALUATION_INTERVAL = "30s"
#: vmagent's on-disk queue while the store does not answer (an emptyDir, bounded)
QUEUE_DIR, QUEUE_BYTES, QUEUE_VOLUME = "/var/lib/vmagent", "1GB", "2Gi"


def _container(
    name: str, image: str, args: list[str], port: int, mounts: list[dict[str, Any]],
    resources: dict[str, Any], env: list[dict[str, Any]] | None = None,
) -> dict[str, Any]:  # fmt: skip
    probe = {"httpGet": {"path": "/health", "port": "http"}, "periodSeconds": 10}
    return {
        "name": name, "image": image, "args": args, **({"env": env} if env else {}),
        "ports": [{"name": "http", "containerPort": port}],
        "readinessProbe": probe, "livenessProbe": {**probe, "failureThreshold": 6},
        "securityContext": _CONTAINER_SECURITY, "resources": resources, "volumeMounts": mounts,
    }  # fmt: skip


def _service(name: str, port: int, headless: bool = False) -> dict[str, Any]:
    return {
        "apiVersion": "v1", "kind": "Service",
        "metadata": {"name": name, "labels": {_NAME: name}},
        "spec": {**({"clusterIP": "None"} if headless else {}), "selector": {_NAME: name},
                 "ports": [{"name": "http", "port": port, "targetPort": "http"}]},
    }  # fmt: skip


def _vmagent(victoria: Victoria) -> list[dict[str, Any]]:
    """vmagent's account, headless Service and StatefulSet (the ordinal is the shard)."""
    args = [
        "-promscrape.config=/etc/vmagent/scrape.yaml",
        f"-remoteWrite.url={victoria.url}/api/v1/write",
        f"-remoteWrite.tmpDataPath={QUEUE_DIR}",
        f"-remoteWrite.maxDiskUsagePerURL={QUEUE_BYTES}",
        f"-httpListenAddr=:{VMAGENT_PORT}",
    ]
    env = None
    if victoria.shards > 1:
        # vmagent reads the member number from the StatefulSet pod's name (NAME-ORDINAL)
        args += [f"-promscrape.cluster.membersCount={victoria.shards}",
                 "-promscrape.cluster.memberNum=$(POD_NAME)"]  # fmt: skip
        env = [{"name": "POD_NAME", "valueFrom": {"fieldRef": {"fieldPath": "metadata.name"}}}]
    container = _container(
        "vmagent", f"victoriametrics/vmagent:{victoria.image_tag}", args, VMAGENT_PORT,
        [{"name": "config", "mountPath": "/etc/vmagent", "readOnly": True},
         {"name": "queue", "mountPath": QUEUE_DIR}],
        {"requests": {"cpu": "100m", "memory": "256Mi"}, "limits": {"cpu": "1", "memory": "1Gi"}},
        env,
    )  # fmt: skip
    labels = {_NAME: VMAGENT}
    statefulset = {
        "apiVersion": "apps/v1", "kind": "StatefulSet",
        "metadata": {"name": VMAGENT, "labels": labels},
        "spec": {
            "serviceName": VMAGENT, "replicas": victoria.shards,
            # every shard starts at once: none waits for another's targets
            "podManagementPolicy": "Parallel",
            "selector": {"matchLabels": labels},
            "template": {"metadata": {"labels": labels}, "spec": {
                "serviceAccountName": VMAGENT, "automountServiceAccountToken": True,
                "securityContext": _POD_SECURITY, "containers": [container],
                "volumes": [
                    {"name": "config", "configMap": {"name": f"{VMAGENT}-config"}},
                    {"name": "queue", "emptyDir": {"sizeLimit": QUEUE_VOLUME}},
                ],
            }},
        },
    }  # fmt: skip
    account = {"apiVersion": "v1", "kind": "ServiceAccount", "metadata": {"name": VMAGENT}}
    return [account, _service(VMAGENT, VMAGENT_PORT, headless=True), statefulset]


def _vmalert(victoria: Victoria) -> list[dict[str, Any]]:
    """vmalert's Deployment and Service: one replica (two would write each recording rule
    twice), no API token."""
    args = [
        f"-rule=/etc/vmalert/{RULES_FILE}",
        f"-datasource.url={victoria.read_url}",
        f"-remoteWrite.url={victoria.url}",
        # alert state (the `for:` timers) is restored from the store after a restart
        f"-remoteRead.url={victoria.read_url}",
        f"-notifier.url={victoria.alertmanager_url}",
        f"-evaluationInterval={EVALUATION_INTERVAL}",
        # Prometheus adds no group label: the recorded series keep the rules' own labels
        "-disableAlertgroupLabel",
        f"-httpListenAddr=:{VMALERT_PORT}",
    ]
    container = _container(
        "vmalert", f"victoriametrics/vmalert:{victoria.image_tag}", args, VMALERT_PORT,
        [{"name": "rules", "mountPath": "/etc/vmalert", "readOnly": True}],
        {"requests": {"cpu": "50m", "memory": "128Mi"},
         "limits": {"cpu": "500m", "memory": "512Mi"}},
    )  # fmt: skip
    labels = {_NAME: VMALERT}
    deployment = {
        "apiVersion": "apps/v1", "kind": "Deployment",
        "metadata": {"name": VMALERT, "labels": labels},
        "spec": {
            "replicas": 1, "selector": {"matchLabels": labels},
            "template": {"metadata": {"labels": labels}, "spec": {
                "automountServiceAccountToken": False, "securityContext": _POD_SECURITY,
                "containers": [container],
                "volumes": [{"name": "rules", "configMap": {"name": f"{VMALERT}-rules"}}],
            }},
        },
    }  # fmt: skip
    return [deployment, _service(VMALERT, VMALERT_PORT)]


# -- the overlay ----------------------------------------------------------------------------


def _delete(kind: str) -> dict[str, Any]:
    """A patch removing every object of an operator kind from the base."""
    patch = {"$patch": "delete", "apiVersion": _OPERATOR_KINDS[kind], "kind": kind,
             "metadata": {"name": "any"}}  # fmt: skip
    return {"target": {"kind": kind}, "patch": json.dumps(patch)}


#: the Prometheus peer of each base NetworkPolicy: (policy, JSON pointer of the peer)
SCRAPED_POLICIES = (
    ("inferwatch-model-admin", "/spec/ingress/1/from/0"),
    ("inferwatch-gpu-exporter", "/spec/ingress/0/from/0"),
    ("inferwatch-receiver", "/spec/ingress/0/from/1"),
)
#: the receiver's Alertmanager peer, whose namespace the site's monitoring namespace is
ALERTMANAGER_PEER = "/spec/ingress/0/from/0"


def _policy_patches(monitoring_namespace: str) -> list[dict[str, Any]]:
    """vmagent in place of Prometheus as the peer that reaches metrics ports (each op first
    tests that the peer is Prometheus', so a reordered policy fails to render)."""
    patches = []
    for name, peer in SCRAPED_POLICIES:
        ops = [
            {"op": "test", "path": f"{peer}/podSelector/matchLabels", "value": PROMETHEUS},
            {"op": "replace", "path": peer, "value": SCRAPER},
        ]
        if name == "inferwatch-receiver":
            ops.append({"op": "replace", "value": monitoring_namespace,
                        "path": f"{ALERTMANAGER_PEER}/namespaceSelector/matchLabels/"
                                "kubernetes.io~1metadata.name"})  # fmt: skip
        patches.append({"target": {"kind": "NetworkPolicy", "name": name},
                        "patch": json.dumps(ops)})  # fmt: skip
    return patches


def overlay(
    victoria: Victoria, kustomization: dict[str, Any], monitors: Sequence[Monitor],
    namespace: str, cluster: str, monitoring_namespace: str, marker: str,
) -> dict[str, str]:  # fmt: skip
    """Turn a site's kustomization (built for the operator) into the VictoriaMetrics one; the
    files it adds (names relative to the overlay's folder)."""
    kustomization["resources"].append(OBJECTS_FILE)
    kustomization["components"] = [
        f"../../components/{RULES_COMPONENT}" if c == "../../components/rules" else c
        for c in kustomization["components"]
    ]
    kustomization["configMapGenerator"].append(
        # hashed into its name, so that a changed config rolls the shards
        {"name": f"{VMAGENT}-config", "files": [f"scrape.yaml={SCRAPE_FILE}"]}
    )
    # the operator's objects go, and so do the replacements that fill only them in; the
    # policy patches set the monitoring namespace
    kustomization["replacements"] = [
        r for r in kustomization["replacements"]
        if r["source"]["fieldPath"] != "data.monitoring_namespace"
        and any(t["select"]["kind"] not in _OPERATOR_ONLY for t in r["targets"])
    ]  # fmt: skip
    kustomization["patches"] += [
        *(_delete(kind) for kind in _OPERATOR_KINDS),
        *_policy_patches(monitoring_namespace),
    ]
    config = scrape_config(monitors, namespace, cluster)
    jobs = config["scrape_configs"]
    objects = [*_vmagent(victoria), *_role(jobs, namespace, namespace), *_vmalert(victoria)]
    return {
        SCRAPE_FILE: marker + "# vmagent's -promscrape.config, from the kit's PodMonitors and "
        "ServiceMonitors (inferwatch/k8s/victoria.py)\n" + _dump(config),
        OBJECTS_FILE: marker + "# vmagent and vmalert in place of the Prometheus operator "
        "(tsdb: victoriametrics)\n" + "---\n".join(_dump(d) for d in objects),
    }


def node_agent(
    kustomization: dict[str, Any], monitors: Sequence[Monitor], namespace: str,
    node_agent_namespace: str, marker: str,
) -> dict[str, str]:  # fmt: skip
    """The node agent's kustomization without its PodMonitor, vmagent (from the site's
    namespace) let in where Prometheus was, and vmagent's Role in the agent's namespace."""
    peer = "/spec/ingress/0/from/1"
    patches = []
    for patch in kustomization["patches"]:
        if patch["target"]["kind"] == "PodMonitor":
            continue  # the monitor goes (below)
        if patch["target"] == {"kind": "NetworkPolicy", "name": "inferwatch-node-agent"}:
            ops = [op for op in json.loads(patch["patch"]) if not op["path"].startswith(peer)]
            ops += [
                {"op": "test", "path": f"{peer}/podSelector/matchLabels", "value": PROMETHEUS},
                {"op": "replace", "path": peer, "value": _scraper_in(namespace)},
            ]
            patch = {**patch, "patch": json.dumps(ops)}
        patches.append(patch)
    kustomization["patches"] = [*patches, _delete("PodMonitor")]
    kustomization["resources"].append(NODE_AGENT_RBAC_FILE)
    jobs = scrape_config(monitors, namespace, "")["scrape_configs"]
    documents = _role(jobs, node_agent_namespace, namespace)
    return {
        NODE_AGENT_RBAC_FILE: marker + "# the site's vmagent may list and watch the node "
        "agent's pods, nothing more\n" + "---\n".join(_dump(d) for d in documents)
    }


def rules_component(groups: list[dict[str, Any]], marker: str) -> dict[str, str]:
    """``components/vmalert-rules``: the generated PrometheusRule's groups as vmalert's rule
    file, in a ConfigMap whose hashed name rolls vmalert when a rule changes."""
    kustomization = {
        "apiVersion": "kustomize.config.k8s.io/v1alpha1",
        "kind": "Component",
        "configMapGenerator": [{"name": f"{VMALERT}-rules", "files": [RULES_FILE]}],
    }
    return {
        f"{RULES_COMPONENT}/kustomization.yaml": marker + _dump(kustomization),
        f"{RULES_COMPONENT}/{RULES_FILE}": marker + "# the groups of components/rules/"
        "prometheusrule.yaml, as vmalert's -rule file\n"
        + _dump({"groups": groups}),
    }


class _Dumper(yaml.SafeDumper):
    """Writes a list that several jobs share in full each time, never as a YAML alias."""

    def ignore_aliases(self, data: Any) -> bool:
        return True


def _dump(document: Any) -> str:
    return yaml.dump(document, Dumper=_Dumper, sort_keys=False, width=100)
