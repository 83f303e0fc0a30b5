"""A site on VictoriaMetrics (``tsdb: victoriametrics``): the kit's vmagent and vmalert.

The rendered scrape config and rule file pass the real ``vmagent -dryRun`` and ``vmalert
-dryRun`` with the flags the manifests give them; vmagent's jobs, run through their
relabeling against the kit's own pods, select exactly what the operator site's monitors
select, with the labels the operator adds; its account may list and watch only what its
discovery reads. The manifests' schema, Pod Security and secret checks are those of every
overlay (tests/test_k8s.py, tests/test_k8s_pss.py).
"""

from __future__ import annotations

import re
import shutil
import subprocess
from pathlib import Path
from typing import Any

import pytest
import yaml

from inferwatch.k8s import inject, victoria
from inferwatch.k8s import kit as k8s
from inferwatch.k8s.site import SiteError, load_site
from support.k8s import KIT, render
from support.shared import tool

pytestmark = pytest.mark.proc

SITE = "victoriametrics-west"
#: the operator site switched to VictoriaMetrics: its injected models are scraped too
SWITCHED = "single-cluster"
VICTORIA = {
    "url": "http://victoria-metrics.monitoring.svc:8428",
    "alertmanager_url": "http://alertmanager.monitoring.svc:9093",
}


@pytest.fixture(scope="module")
def kubectl() -> str:
    return tool("kubectl")


def _one(documents: Any, kind: str, name: str) -> dict[str, Any]:
    (found,) = [d for d in documents if d["kind"] == kind and d["metadata"]["name"] == name]
    return dict(found)


def _config_map(documents: Any, prefix: str) -> dict[str, Any]:
    (found,) = [
        d for d in documents
        if d["kind"] == "ConfigMap" and d["metadata"]["name"].startswith(f"{prefix}-")
    ]  # fmt: skip
    return dict(found)


def _args(workload: dict[str, Any]) -> list[str]:
    (container,) = workload["spec"]["template"]["spec"]["containers"]
    return list(container["args"])


def _flag(args: list[str], name: str) -> str:
    (value,) = [a.split("=", 1)[1] for a in args if a.startswith(f"-{name}=")]
    return value


def _dry_run(binary: str, args: list[str], replaced: dict[str, str]) -> subprocess.CompletedProcess:
    """The binary with the manifest's flags, file flags pointed at local copies, -dryRun."""
    argv = [binary, "-dryRun"]
    for arg in args:
        name = arg.split("=", 1)[0].lstrip("-")
        argv.append(f"-{name}={replaced[name]}" if name in replaced else arg)
    return subprocess.run(argv, capture_output=True, text=True, timeout=60, check=False)


def test_vmagent_accepts_the_rendered_scrape_config_with_the_manifests_flags(
    kubectl: str, tmp_path: Path
) -> None:
    documents = render(kubectl, SITE)
    agent = _one(documents, "StatefulSet", victoria.VMAGENT)
    config = tmp_path / "scrape.yaml"
    config.write_text(_config_map(documents, f"{victoria.VMAGENT}-config")["data"]["scrape.yaml"])
    args = _args(agent)
    # the ordinal of the StatefulSet's second pod (Kubernetes expands $(POD_NAME))
    replaced = {
        "promscrape.config": str(config),
        "promscrape.cluster.memberNum": f"{victoria.VMAGENT}-1",
        "remoteWrite.tmpDataPath": str(tmp_path / "queue"),
    }
    checked = _dry_run(tool("vmagent"), args, replaced)
    assert checked.returncode == 0, checked.stderr[-2000:]
    # the check can fail: a field vmagent does not know
    config.write_text(config.read_text() + "  no_such_field: 1\n")
    assert _dry_run(tool("vmagent"), args, replaced).returncode != 0


def test_vmalert_accepts_the_rendered_rules_with_the_manifests_flags(
    kubectl: str, tmp_path: Path
) -> None:
    documents = render(kubectl, SITE)
    rules = tmp_path / victoria.RULES_FILE
    rules.write_text(_config_map(documents, f"{victoria.VMALERT}-rules")["data"]["rules.yaml"])
    args = _args(_one(documents, "Deployment", victoria.VMALERT))
    checked = _dry_run(tool("vmalert"), args, {"rule": str(rules)})
    assert checked.returncode == 0, checked.stderr[-2000:]
    assert "alert:" in rules.read_text() and "record:" in rules.read_text()
    rules.write_text(rules.read_text().replace("expr: ", "expr: sum(", 1))
    assert _dry_run(tool("vmalert"), args, {"rule": str(rules)}).returncode != 0


def test_the_site_sets_where_series_go_are_read_and_alerts_are_sent(kubectl: str) -> None:
    site = load_site(KIT / "sites" / f"{SITE}.yaml")
    assert site.victoriametrics is not None and site.victoriametrics.shards > 1
    store = site.victoriametrics
    documents = render(kubectl, SITE)
    agent = _one(documents, "StatefulSet", victoria.VMAGENT)
    args = _args(agent)
    assert _flag(args, "remoteWrite.url") == f"{store.url}/api/v1/write"
    assert agent["spec"]["replicas"] == int(_flag(args, "promscrape.cluster.membersCount"))
    assert _flag(args, "promscrape.cluster.memberNum") == "$(POD_NAME)"
    (container,) = agent["spec"]["template"]["spec"]["containers"]
    assert container["env"] == [
        {"name": "POD_NAME", "valueFrom": {"fieldRef": {"fieldPath": "metadata.name"}}}
    ]
    scrape = yaml.safe_load(
        _config_map(documents, f"{victoria.VMAGENT}-config")["data"]["scrape.yaml"]
    )
    assert scrape["global"]["external_labels"] == {"cluster": site.cluster}
    alert = _args(_one(documents, "Deployment", victoria.VMALERT))
    assert _flag(alert, "datasource.url") == _flag(alert, "remoteRead.url") == store.read_url
    assert _flag(alert, "remoteWrite.url") == store.url
    assert _flag(alert, "notifier.url") == store.alertmanager_url
    # the autoscaler reads the store, not a Prometheus the site does not run
    scaled = next(d for d in documents if d["kind"] == "ScaledObject")
    assert {t["metadata"]["serverAddress"] for t in scaled["spec"]["triggers"]} == {store.read_url}


def test_vmagent_may_list_and_watch_only_what_its_discovery_reads(kubectl: str) -> None:
    documents = render(kubectl, SITE)
    agent = render(kubectl, f"{SITE}/node-agent")
    roles = [d for d in (*documents, *agent) if d["kind"] in ("Role", "ClusterRole")
             and d["metadata"]["name"] == victoria.VMAGENT]  # fmt: skip
    granted = {
        (role["kind"], role["metadata"]["namespace"], group, resource): tuple(rule["verbs"])
        for role in roles for rule in role["rules"]
        for group in rule["apiGroups"] for resource in rule["resources"]
    }  # fmt: skip
    assert granted == {
        ("Role", "inference", "", "pods"): ("list", "watch"),
        ("Role", "inference", "", "services"): ("list", "watch"),
        ("Role", "inference", "discovery.k8s.io", "endpointslices"): ("list", "watch"),
        ("Role", inject.NODE_AGENT_NAMESPACE, "", "pods"): ("list", "watch"),
    }
    bindings = [d for d in (*documents, *agent) if d["kind"] in ("RoleBinding",
                "ClusterRoleBinding") and d["metadata"]["name"] == victoria.VMAGENT]  # fmt: skip
    assert len(bindings) == 2
    for binding in bindings:
        assert binding["roleRef"]["kind"] == "Role"
        assert binding["subjects"] == [
            {"kind": "ServiceAccount", "name": victoria.VMAGENT, "namespace": "inference"}
        ]
    agent_pod = _one(documents, "StatefulSet", victoria.VMAGENT)["spec"]["template"]["spec"]
    assert agent_pod["serviceAccountName"] == victoria.VMAGENT
    alert_pod = _one(documents, "Deployment", victoria.VMALERT)["spec"]["template"]["spec"]
    assert alert_pod["automountServiceAccountToken"] is False


# -- the jobs select what the monitors select -----------------------------------------------


def _meta(name: str) -> str:
    return re.sub(r"[^a-zA-Z0-9_]", "_", name)


def _relabel(labels: dict[str, str], configs: list[dict[str, Any]]) -> dict[str, str] | None:
    """Prometheus' relabeling (replace, keep, drop) of one target; None when it is dropped."""
    labels = dict(labels)
    for config in configs:
        value = config.get("separator", ";").join(
            labels.get(s, "") for s in config.get("source_labels", [])
        )
        match = re.fullmatch(config.get("regex", "(.*)"), value)
        action = config.get("action", "replace")
        if (action == "keep" and not match) or (action == "drop" and match):
            return None
        if action == "replace" and match:
            replaced = match.expand(config.get("replacement", "$1").replace("$1", r"\1"))
            if replaced:
                labels[config["target_label"]] = replaced
            else:
                labels.pop(config["target_label"], None)
    return labels


def _pod_targets(documents: Any, node: str = "gpu-node-1") -> list[dict[str, str]]:
    """What Kubernetes discovery (role pod) finds: one target per container port."""
    found = []
    for workload in documents:
        template = workload.get("spec", {}).get("template")
        if workload["kind"] not in ("Deployment", "DaemonSet", "StatefulSet") or not template:
            continue
        labels = template["metadata"]["labels"]
        meta = {f"__meta_kubernetes_pod_label_{_meta(k)}": v for k, v in labels.items()}
        meta |= {f"__meta_kubernetes_pod_labelpresent_{_meta(k)}": "true" for k in labels}
        for container in template["spec"]["containers"]:
            for port in container.get("ports", []):
                found.append({
                    **meta, "__meta_kubernetes_namespace": workload["metadata"]["namespace"],
                    "__meta_kubernetes_pod_name": f"{workload['metadata']['name']}-0",
                    "__meta_kubernetes_pod_node_name": node,
                    "__meta_kubernetes_pod_phase": "Running",
                    "__meta_kubernetes_pod_container_name": container["name"],
                    "__meta_kubernetes_pod_container_port_name": port.get("name", ""),
                })  # fmt: skip
    return found


def _slice_targets(documents: Any, pods: list[dict[str, str]]) -> list[dict[str, str]]:
    """What role endpointslice finds: a Service's pods, on each named Service port."""
    found = []
    for service in (d for d in documents if d["kind"] == "Service"):
        selector = service["spec"].get("selector") or {}
        labels = service["metadata"].get("labels") or {}
        meta = {f"__meta_kubernetes_service_label_{_meta(k)}": v for k, v in labels.items()}
        meta |= {f"__meta_kubernetes_service_labelpresent_{_meta(k)}": "true" for k in labels}
        for port in service["spec"]["ports"]:
            for pod in pods:
                if pod["__meta_kubernetes_pod_container_port_name"] != port["targetPort"]:
                    continue
                if all(pod.get(f"__meta_kubernetes_pod_label_{_meta(k)}") == v
                       for k, v in selector.items()):  # fmt: skip
                    found.append({
                        **pod, **meta,
                        "__meta_kubernetes_service_name": service["metadata"]["name"],
                        "__meta_kubernetes_endpointslice_port_name": port["name"],
                    })  # fmt: skip
    return found


def _switched_kit(tmp_path: Path) -> Path:
    kit = tmp_path / "kit"
    shutil.copytree(KIT, kit, ignore=shutil.ignore_patterns("overlays"))
    site = yaml.safe_load((KIT / "sites" / f"{SWITCHED}.yaml").read_text())
    site |= {"tsdb": "victoriametrics", "victoriametrics": VICTORIA}
    (kit / "sites" / f"{SWITCHED}.yaml").write_text(yaml.safe_dump(site))
    k8s.write(kit, k8s.render(kit))
    return kit


def _kustomized(kubectl: str, folder: Path) -> list[dict[str, Any]]:
    result = subprocess.run([kubectl, "kustomize", str(folder)], capture_output=True,
                            text=True, timeout=120, check=False)  # fmt: skip
    assert result.returncode == 0, result.stderr
    return [d for d in yaml.safe_load_all(result.stdout) if d]


def test_vmagent_scrapes_what_the_operator_sites_monitors_select_with_their_labels(
    kubectl: str, tmp_path: Path
) -> None:
    """The operator site's monitors (the base's, the canary's, the node agent's and the
    injected model's), evaluated against the kit's pods as the operator's Prometheus jobs
    would select them, against the same site on VictoriaMetrics: its vmagent's jobs, run
    through their own relabeling against the same pods."""
    operator = [*render(kubectl, SWITCHED), *render(kubectl, f"{SWITCHED}/node-agent")]
    injected = yaml.safe_load_all(
        (KIT / "overlays" / SWITCHED / "inject" / "models.yaml").read_text()
    )
    monitors = [d for d in operator if d["kind"] in ("PodMonitor", "ServiceMonitor")]
    monitors += [d | {"metadata": {**d["metadata"], "namespace": "inference"}}
                 for d in injected if d and d["kind"] == "PodMonitor"]  # fmt: skip
    assert len(monitors) == 6
    kit = _switched_kit(tmp_path)
    overlay = kit / "overlays" / SWITCHED
    documents = [*_kustomized(kubectl, overlay), *_kustomized(kubectl, overlay / "node-agent")]
    assert not [d for d in documents if d["kind"] in ("PodMonitor", "ServiceMonitor")]
    models = list(yaml.safe_load_all((overlay / "inject" / "models.yaml").read_text()))
    assert [d["kind"] for d in models if d] == ["Service", "NetworkPolicy"]
    # the injected model's pod, as the injection makes it (its labels and ports)
    model_pod = {"kind": "Deployment", "metadata": {"name": "vllm-qwen3-32b", "namespace":
                 "inference"}, "spec": {"template": {"metadata": {"labels": {
                 "inferwatch.io/model": "qwen3-32b"}}, "spec": {"containers": [
                 {"name": "inferwatch-sidecar", "ports": [{"name": "iw-metrics"}]},
                 {"name": "inferwatch-proxy", "ports": [{"name": "iw-tenants"}]}]}}}}  # fmt: skip
    pods = _pod_targets([*documents, model_pod])
    slices = _slice_targets(documents, pods)
    config = yaml.safe_load(
        _config_map(documents, f"{victoria.VMAGENT}-config")["data"]["scrape.yaml"]
    )
    assert "global" not in config  # one cluster: no cluster label
    jobs = {job["job_name"]: job for job in config["scrape_configs"]}
    expected_jobs = set()
    for monitor in monitors:
        kind, name = monitor["kind"], monitor["metadata"]["name"]
        namespace = monitor["metadata"]["namespace"]
        selector = monitor["spec"]["selector"]["matchLabels"]
        pod = kind == "PodMonitor"
        endpoints = monitor["spec"]["podMetricsEndpoints" if pod else "endpoints"]
        for index, endpoint in enumerate(endpoints):
            job_name = f"{kind[0].lower()}{kind[1:]}/{namespace}/{name}/{index}"
            expected_jobs.add(job_name)
            job = jobs[job_name]
            prefix = "pod" if pod else "service"
            wanted = [
                t for t in (pods if pod else slices)
                if t["__meta_kubernetes_namespace"] == namespace
                and all(t.get(f"__meta_kubernetes_{prefix}_label_{_meta(k)}") == v
                        for k, v in selector.items())
                and t["__meta_kubernetes_pod_container_port_name" if pod
                      else "__meta_kubernetes_endpointslice_port_name"] == endpoint["port"]
            ]  # fmt: skip
            assert wanted, job_name
            (sd,) = job["kubernetes_sd_configs"]
            assert sd == {"role": "pod" if pod else "endpointslice",
                          "namespaces": {"names": [namespace]}}  # fmt: skip
            candidates = pods if pod else slices
            kept = [_relabel(t, job["relabel_configs"]) for t in candidates]
            scraped = [k for k in kept if k is not None]
            assert len(scraped) == len(wanted), job_name
            for target in scraped:
                public = {k: v for k, v in target.items() if not k.startswith("__")}
                assert public["job"] == (
                    f"{namespace}/{name}" if pod else target["__meta_kubernetes_service_name"]
                )
                assert public["endpoint"] == endpoint["port"]
                assert public["node"] == "gpu-node-1" and "cluster" not in public
                assert set(public) == {"namespace", "pod", "container", "job", "endpoint",
                                       "node", *(() if pod else ("service",))}  # fmt: skip
            assert job.get("scrape_interval") == endpoint.get("interval")
            assert job.get("scrape_timeout") == endpoint.get("scrapeTimeout")
            assert job["metrics_path"] == endpoint.get("path", "/metrics")
    assert set(jobs) == expected_jobs


def test_the_switched_site_lets_vmagent_reach_the_metrics_ports_prometheus_did(
    tmp_path: Path, kubectl: str
) -> None:
    """Each NetworkPolicy peer that named the monitoring namespace's Prometheus names the
    site's vmagent, the injected model's included; the Alertmanager keeps its own."""
    kit = _switched_kit(tmp_path)
    overlay = kit / "overlays" / SWITCHED
    documents = _kustomized(kubectl, overlay)
    policies = [d for d in documents if d["kind"] == "NetworkPolicy"]
    policies += [d for d in yaml.safe_load_all((overlay / "inject" / "models.yaml").read_text())
                 if d and d["kind"] == "NetworkPolicy"]  # fmt: skip
    peers = [p for d in policies for r in d["spec"]["ingress"] for p in r.get("from", [])]
    names = [p["podSelector"]["matchLabels"].get("app.kubernetes.io/name") for p in peers]
    assert "prometheus" not in names
    assert names.count(victoria.VMAGENT) == 4  # model, GPU exporter, receiver, injected model
    (alertmanager,) = [p for p in peers if p["podSelector"]["matchLabels"].get(
        "app.kubernetes.io/name") == "alertmanager"]  # fmt: skip
    assert alertmanager["namespaceSelector"]["matchLabels"] == {
        "kubernetes.io/metadata.name": "monitoring"
    }


BAD_SITES = {
    "unknown-tsdb": (
        "tsdb: thanos\n",
        "tsdb: expected one of prometheus-operator, victoriametrics",
    ),
    "no-store": ("tsdb: victoriametrics\n", "victoriametrics: is required with tsdb"),
    "no-alertmanager": (
        "tsdb: victoriametrics\nvictoriametrics: {url: 'http://vm:8428'}\n",
        "victoriametrics.alertmanager_url: is required",
    ),
    "remote-write-too": (
        "tsdb: victoriametrics\ncluster: a\n"
        "victoriametrics: {url: 'http://vm:8428', alertmanager_url: 'http://am:9093'}\n"
        "monitoring: {remote_write: {url: 'https://x/api/v1/push'}}\n",
        "monitoring.remote_write: is Prometheus'; with tsdb: victoriametrics",
    ),
    "shards": (
        "victoriametrics: {url: 'http://vm:8428', alertmanager_url: 'http://am:9093', shards: 0}\n",
        "victoriametrics.shards: expected an integer from 1 to 64",
    ),
}


@pytest.mark.parametrize(("text", "message"), BAD_SITES.values(), ids=list(BAD_SITES))
def test_a_bad_tsdb_value_is_one_clear_line(tmp_path: Path, text: str, message: str) -> None:
    path = tmp_path / "site.yaml"
    path.write_text(text)
    with pytest.raises(SiteError) as raised:
        load_site(path)
    (line,) = str(raised.value).splitlines()
    assert message in line, line
