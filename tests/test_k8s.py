"""The Kubernetes kit, as ``kubectl kustomize`` renders each overlay, validated offline.

Built-in kinds are checked by kubernetes-validate's strict schemas (unknown fields are
errors); the prometheus-operator and Gateway API objects by the openAPIV3Schema of their
CRDs, read in place from ../shared/fixtures/crds/, with unknown fields made errors too (the
API server would silently prune them, so a misspelt field would be lost without a word). The
CRDs' CEL rules (x-kubernetes-validations) need an API server and are not evaluated.
"""

from __future__ import annotations

import copy
import json
import re
import subprocess
from collections.abc import Iterator
from typing import Any

import click
import jsonschema
import kubernetes_validate
import pytest
import yaml

from inferwatch import catalog
from inferwatch.k8s import victoria
from inferwatch.k8s.inject import NODE_AGENT_INGRESS, SIDECAR_LABEL
from inferwatch.k8s.overlay import prometheus_values
from inferwatch.k8s.rbac import RECEIVER
from inferwatch.k8s.site import QUEUE, load_site
from inferwatch.runbooks import kube_facts
from inferwatch.wire import HEADER, USER, WEIGHT
from support.k8s import KIT, render, validate
from support.shared import REPO, tool

pytestmark = pytest.mark.proc

OVERLAYS = sorted(p.parent.name for p in (KIT / "overlays").glob("*/kustomization.yaml"))
SPLITS = (HEADER, WEIGHT, USER)  # the order of the route's rules
#: the objects only the Prometheus operator path renders (a VictoriaMetrics site runs vmagent
#: and vmalert instead: tests/test_k8s_victoria.py)
OPERATOR_KINDS = {"PodMonitor", "ServiceMonitor", "PrometheusRule", "AlertmanagerConfig"}


def on_operator(overlay: str) -> bool:
    return load_site(KIT / "sites" / f"{overlay}.yaml").tsdb == victoria.OPERATOR


@pytest.fixture(scope="module")
def kubectl() -> str:
    return tool("kubectl")


@pytest.fixture(params=OVERLAYS)
def rendered(request: pytest.FixtureRequest, kubectl: str) -> tuple[str, list[dict[str, Any]]]:
    overlay = str(request.param)
    return overlay, copy.deepcopy(list(render(kubectl, overlay)))


def test_every_overlay_is_rendered() -> None:
    assert set(OVERLAYS) >= {"single-cluster", "multi-cluster-east"}


def test_every_rendered_object_matches_its_schema(
    rendered: tuple[str, list[dict[str, Any]]],
) -> None:
    overlay, documents = rendered
    kinds = {d["kind"] for d in documents}
    # the whole kit is there: a render that lost a base would still validate
    assert kinds >= {
        "Deployment", "DaemonSet", "Service", "ConfigMap", "ServiceAccount", "ClusterRole",
        "ClusterRoleBinding", "PodDisruptionBudget", "NetworkPolicy", "Gateway", "HTTPRoute",
    }  # fmt: skip
    if on_operator(overlay):
        assert kinds >= OPERATOR_KINDS
    else:
        assert not kinds & OPERATOR_KINDS and {"StatefulSet", "Role", "RoleBinding"} <= kinds
    for document in documents:
        try:
            validate(document)
        except (jsonschema.ValidationError, kubernetes_validate.ValidationError) as exc:
            pytest.fail(f"{overlay}: {document['kind']}/{document['metadata']['name']}: {exc}")


def _first(documents: list[dict[str, Any]], kind: str) -> dict[str, Any]:
    return copy.deepcopy(next(d for d in documents if d["kind"] == kind))


@pytest.mark.parametrize(
    ("kind", "breaks"),
    [
        ("PodMonitor", lambda d: d["spec"]["podMetricsEndpoints"][0].update(relabellings=[])),
        ("PodMonitor", lambda d: d["spec"]["podMetricsEndpoints"][0].update(interval="15 s")),
        ("HTTPRoute", lambda d: d["spec"]["rules"][1]["backendRefs"][0].update(weight="95")),
        ("AlertmanagerConfig", lambda d: d["spec"]["route"].update(matchers="alertname")),
        ("Deployment", lambda d: d["spec"]["template"]["spec"].update(containres=[])),
        ("NetworkPolicy", lambda d: d["spec"].update(podSelector="llama-8b")),
    ],
    ids=["misspelt-field", "bad-duration", "string-weight", "matcher-string",
         "deployment-typo", "wrong-type"],
)  # fmt: skip
def test_the_validation_rejects_a_broken_object(kubectl: str, kind: str, breaks: Any) -> None:
    """The check above can fail: each class of mistake in a kit object is caught."""
    document = _first(list(render(kubectl, "single-cluster")), kind)
    validate(document)
    breaks(document)
    with pytest.raises((jsonschema.ValidationError, kubernetes_validate.ValidationError)):
        validate(document)


def pods(documents: list[dict[str, Any]]) -> Iterator[tuple[dict[str, Any], dict[str, Any]]]:
    """(workload, pod template) of every Deployment and DaemonSet."""
    for document in documents:
        if document["kind"] in ("Deployment", "DaemonSet"):
            yield document, document["spec"]["template"]


def granted(role: dict[str, Any]) -> dict[tuple[str, str], set[str]]:
    verbs: dict[tuple[str, str], set[str]] = {}
    for rule in role["rules"]:
        assert set(rule) == {"apiGroups", "resources", "verbs"}  # no resourceNames tricks
        for group in rule["apiGroups"]:
            for resource in rule["resources"]:
                verbs.setdefault((group, resource), set()).update(rule["verbs"])
    return verbs


def declared(*parts: tuple[Any, ...]) -> dict[tuple[str, str], set[str]]:
    verbs: dict[tuple[str, str], set[str]] = {}
    for rule in (rule for rules in parts for rule in rules):
        for group in rule["apiGroups"]:
            for resource in rule["resources"]:
                verbs.setdefault((group, resource), set()).update(rule["verbs"])
    return verbs


def test_rbac_grants_only_the_receivers_verbs(
    rendered: tuple[str, list[dict[str, Any]]],
) -> None:
    """A ClusterRole with exactly the rules the Kubernetes actions and the inventory declare,
    and a Role (in the receiver's namespace) with exactly the state store's and the
    election's (their tests run against a fake API server that allows only these)."""
    _, documents = rendered
    roles = {
        d["kind"]: d
        for d in documents
        if d["kind"] in ("Role", "ClusterRole") and d["metadata"]["name"] == RECEIVER
    }
    assert sorted(roles) == ["ClusterRole", "Role"]
    cluster_wide = declared(kube_facts.ACTIONS_RULES, kube_facts.INVENTORY_RULES)
    assert granted(roles["ClusterRole"]) == cluster_wide
    assert granted(roles["Role"]) == declared(kube_facts.STATE_RULES)
    assert roles["Role"]["metadata"]["namespace"] == "inference"
    for role in roles.values():
        assert all("*" not in verbs for verbs in granted(role).values())
    assert {"nodes", "pods", "httproutes"} == {r for _, r in granted(roles["ClusterRole"])}
    assert {"configmaps", "leases"} == {r for _, r in granted(roles["Role"])}


def test_role_bindings_bind_only_the_receivers_account(
    rendered: tuple[str, list[dict[str, Any]]],
) -> None:
    _, documents = rendered
    # vmagent's account, on a VictoriaMetrics site, is checked in tests/test_k8s_victoria.py
    (account,) = [
        d for d in documents
        if d["kind"] == "ServiceAccount" and d["metadata"]["name"] != victoria.VMAGENT
    ]  # fmt: skip
    (receiver,) = [
        t
        for w, t in pods(documents)
        if t["spec"].get("serviceAccountName") == "inferwatch-receiver"
    ]
    assert receiver
    bindings = [
        d for d in documents
        if d["kind"] in ("RoleBinding", "ClusterRoleBinding")
        and d["metadata"]["name"] != victoria.VMAGENT
    ]  # fmt: skip
    assert sorted(b["kind"] for b in bindings) == ["ClusterRoleBinding", "RoleBinding"]
    for binding in bindings:
        assert binding["subjects"] == [
            {
                "kind": "ServiceAccount",
                "name": account["metadata"]["name"],
                "namespace": account["metadata"]["namespace"],
            }
        ]
    # every other pod runs without an API token
    for workload, template in pods(documents):
        if workload["metadata"]["name"] != "inferwatch-receiver":
            assert template["spec"].get("automountServiceAccountToken") is False


SECRET_NAME = re.compile(r"TOKEN|SECRET|PASSWORD|API_?KEY|CREDENTIAL", re.IGNORECASE)


def test_no_secret_value_is_inlined(rendered: tuple[str, list[dict[str, Any]]]) -> None:
    overlay, documents = rendered
    assert not [d for d in documents if d["kind"] == "Secret"]
    references = 0
    for _, template in pods(documents):
        for container in template["spec"]["containers"]:
            for env in container.get("env", []):
                if SECRET_NAME.search(env["name"]):
                    assert "value" not in env, f"{container['name']}: {env['name']} is inlined"
                    assert "secretKeyRef" in env["valueFrom"]
                    references += 1
            for arg in container.get("args", []):
                assert not re.match(r"--[a-z-]*(token|secret|password)=", arg), arg
    assert references >= 1  # the receiver's webhook token
    if not on_operator(overlay):
        return  # no AlertmanagerConfig: the site's Alertmanager holds the webhook's route
    (config,) = [d for d in documents if d["kind"] == "AlertmanagerConfig"]
    (webhook,) = config["spec"]["receivers"][0]["webhookConfigs"]
    credentials = webhook["httpConfig"]["authorization"]["credentials"]
    assert set(credentials) == {"name", "key"}


def test_every_pod_runs_restricted(rendered: tuple[str, list[dict[str, Any]]]) -> None:
    _, documents = rendered
    for workload, template in pods(documents):
        spec = template["spec"]
        assert spec["securityContext"]["runAsNonRoot"] is True, workload["metadata"]["name"]
        assert spec["securityContext"]["seccompProfile"] == {"type": "RuntimeDefault"}
        for container in spec["containers"]:
            if not container["image"].startswith("inferwatch"):
                continue  # the engine's image is the user's
            context = container["securityContext"]
            assert context["readOnlyRootFilesystem"] is True, container["name"]
            assert context["allowPrivilegeEscalation"] is False
            assert context["capabilities"]["drop"] == ["ALL"]
            resources = container["resources"]
            assert set(resources["requests"]) == set(resources["limits"]) == {"cpu", "memory"}
            # writable only where the pod's own scratch space is (the receiver's audit log)
            scratch = {v["name"] for v in spec.get("volumes", []) if "emptyDir" in v}
            for mount in container.get("volumeMounts", []):
                assert mount.get("readOnly") or mount["name"] in scratch, mount


def test_sidecars_are_probed_and_know_their_pod(
    rendered: tuple[str, list[dict[str, Any]]],
) -> None:
    _, documents = rendered
    sidecars = [
        (w, c)
        for w, t in pods(documents)
        for c in t["spec"]["containers"]
        if c.get("args", [""])[0] == "sidecar"
    ]
    assert len(sidecars) == 3  # stable, canary, GPU exporter
    for workload, container in sidecars:
        assert container["livenessProbe"]["httpGet"]["path"] == "/healthz"
        env = {e["name"]: e.get("valueFrom", {}).get("fieldRef") for e in container["env"]}
        assert env["NODE_NAME"] == {"fieldPath": "spec.nodeName"}
        if workload["kind"] == "Deployment":
            assert container["readinessProbe"]["httpGet"]["path"] == "/readyz"
            assert env["POD_NAME"] == {"fieldPath": "metadata.name"}
            assert env["POD_NAMESPACE"] == {"fieldPath": "metadata.namespace"}
        else:
            assert "--gpu-scope=node" in container["args"]


def _selects(selector: dict[str, str], labels: dict[str, str]) -> bool:
    return all(labels.get(k) == v for k, v in selector.items())


def test_monitors_scrape_named_ports_and_keep_discovery_labels(
    rendered: tuple[str, list[dict[str, Any]]],
) -> None:
    """Each monitor selects pods of the kit on ports they name; relabeling adds only node and
    cluster, never a label the sidecar emits, and leaves pod and namespace to discovery
    (vmagent's jobs, on a VictoriaMetrics site, are these monitors' own:
    tests/test_k8s_victoria.py)."""
    overlay, documents = rendered
    emitted = {label for entry in catalog.load().values() for label in entry.label_names}
    assert {"model", "gpu_uuid"} <= emitted
    services = {d["metadata"]["name"]: d for d in documents if d["kind"] == "Service"}
    templates = [t for _, t in pods(documents)]
    monitors = [d for d in documents if d["kind"] in ("PodMonitor", "ServiceMonitor")]
    assert len(monitors) == (4 if on_operator(overlay) else 0)
    for monitor in monitors:
        selector = monitor["spec"]["selector"]["matchLabels"]
        if monitor["kind"] == "PodMonitor":
            endpoints = monitor["spec"]["podMetricsEndpoints"]
            matched = [t for t in templates if _selects(selector, t["metadata"]["labels"])]
            assert len(matched) == 1, monitor["metadata"]["name"]  # stable and canary apart
            ports = {
                p["name"] for c in matched[0]["spec"]["containers"] for p in c.get("ports", [])
            }
        else:
            endpoints = monitor["spec"]["endpoints"]
            matched = [s for s in services.values() if _selects(selector, s["metadata"]["labels"])]
            assert len(matched) == 1
            ports = {p["name"] for p in matched[0]["spec"]["ports"]}
        for endpoint in endpoints:
            assert endpoint["port"] in ports
            targets = [r["targetLabel"] for r in endpoint["relabelings"]]
            assert sorted(targets) == ["cluster", "node"]
            assert not set(targets) & (emitted - {"node"})


def test_admin_ports_open_only_to_prometheus_and_the_receiver(
    rendered: tuple[str, list[dict[str, Any]]],
) -> None:
    overlay, documents = rendered
    site = load_site(KIT / "sites" / f"{overlay}.yaml")
    policies = [d for d in documents if d["kind"] == "NetworkPolicy"]
    scraper = (
        {
            "namespaceSelector": {
                "matchLabels": {"kubernetes.io/metadata.name": site.monitoring_namespace}
            },
            "podSelector": {"matchLabels": {"app.kubernetes.io/name": "prometheus"}},
        }
        if site.tsdb == victoria.OPERATOR
        else {"podSelector": {"matchLabels": {"app.kubernetes.io/name": victoria.VMAGENT}}}
    )
    allowed_peers = [
        scraper,
        {"podSelector": {"matchLabels": {"app.kubernetes.io/name": "inferwatch-receiver"}}},
    ]
    for _, template in pods(documents):
        labels = template["metadata"]["labels"]
        ports = {
            p["containerPort"] for c in template["spec"]["containers"] for p in c.get("ports", [])
        }
        admin = ports & {9400, 9402}
        if not admin:
            continue
        (policy,) = [
            p for p in policies if _selects(p["spec"]["podSelector"]["matchLabels"], labels)
        ]
        for rule in policy["spec"]["ingress"]:
            opened = {p["port"] for p in rule["ports"]}
            if opened & admin and site.gpu_reset and rule == NODE_AGENT_INGRESS:
                # the node agent drains a GPU's replicas through the sidecar's port alone
                assert opened == {9400} and template["metadata"]["labels"].get(SIDECAR_LABEL)
            elif opened & admin:
                assert rule["from"] == allowed_peers
            else:
                assert opened == {8080}  # clients reach the proxy only


def test_the_canary_route_weighs_and_matches(
    rendered: tuple[str, list[dict[str, Any]]],
) -> None:
    overlay, documents = rendered
    site = load_site(KIT / "sites" / f"{overlay}.yaml")
    (route,) = [d for d in documents if d["kind"] == "HTTPRoute"]
    (gateway,) = [d for d in documents if d["kind"] == "Gateway"]
    assert route["spec"]["parentRefs"][0]["name"] == gateway["metadata"]["name"]
    assert route["spec"]["hostnames"] == [site.hostname]
    assert gateway["spec"]["gatewayClassName"] == site.gateway_class
    header_rule, weighted, *by_user = route["spec"]["rules"]
    assert header_rule["matches"][0]["headers"][0]["name"] == "x-inferwatch-canary"
    assert [b["name"] for b in header_rule["backendRefs"]] == ["llama-8b-canary"]
    # each rule tells the proxy its split, replacing a client's value
    for rule, split in zip((header_rule, weighted, *by_user), SPLITS, strict=False):
        (modifier,) = [f["requestHeaderModifier"] for f in rule["filters"]]
        assert modifier["set"] == [{"name": "x-inferwatch-split", "value": split}]
    if site.canary_users:
        (user_rule,) = by_user
        users = [m["headers"][0]["value"] for m in user_rule["matches"]]
        assert users == list(site.canary_users)
        assert [b["name"] for b in user_rule["backendRefs"]] == ["llama-8b-canary"]
    else:
        assert by_user == []
    weights = {b["name"]: b["weight"] for b in weighted["backendRefs"]}
    # another model's Service (not in this overlay) at weight 0, for the receiver's shift
    fallback = {site.fallback: 0} if site.fallback else {}
    assert weights == {
        "llama-8b": 100 - site.canary_weight, "llama-8b-canary": site.canary_weight, **fallback
    }
    services = {d["metadata"]["name"]: d for d in documents if d["kind"] == "Service"}
    templates = [t["metadata"]["labels"] for _, t in pods(documents)]
    for name in set(weights) - set(fallback):
        selector = services[name]["spec"]["selector"]
        assert len([t for t in templates if _selects(selector, t)]) == 1, name


def test_the_site_sets_namespace_release_and_cluster(
    rendered: tuple[str, list[dict[str, Any]]],
) -> None:
    overlay, documents = rendered
    site = load_site(KIT / "sites" / f"{overlay}.yaml")
    for document in documents:
        if document["kind"] not in ("ClusterRole", "ClusterRoleBinding"):
            assert document["metadata"]["namespace"] == site.namespace
        if document["apiVersion"].startswith("monitoring.coreos.com/"):
            assert document["metadata"]["labels"]["release"] == site.release
        for endpoint in document.get("spec", {}).get("podMetricsEndpoints", []):
            (cluster,) = [r for r in endpoint["relabelings"] if r["targetLabel"] == "cluster"]
            assert cluster["replacement"] == site.cluster
    if site.tsdb == victoria.OPERATOR:
        (config,) = [d for d in documents if d["kind"] == "AlertmanagerConfig"]
        url = config["spec"]["receivers"][0]["webhookConfigs"][0]["url"]
        assert url == f"http://inferwatch-receiver.{site.namespace}.svc:9405/webhook"
    for _, template in pods(documents):
        for container in template["spec"]["containers"]:
            if container["image"].startswith("inferwatch"):
                assert container["image"] == f"inferwatch:{site.image_tag}"
    values = KIT / "overlays" / overlay / "prometheus-values.yaml"
    if site.cluster and site.tsdb == victoria.OPERATOR:
        spec = yaml.safe_load(values.read_text(encoding="utf-8"))["prometheus"]["prometheusSpec"]
        assert spec["externalLabels"] == {"cluster": site.cluster}
        assert [w["url"] for w in spec.get("remoteWrite", [])] == (
            [site.remote_write.url] if site.remote_write else []
        )
    else:
        assert not values.exists()


def test_rules_component_carries_the_generated_prometheus_rule(
    rendered: tuple[str, list[dict[str, Any]]],
) -> None:
    """The PrometheusRule holds the groups of the committed rule files, each once; on a
    VictoriaMetrics site, vmalert's rule file holds them."""
    overlay, documents = rendered
    committed = {
        group["name"]: group
        for path in sorted((REPO / "alerts" / "generated").glob("*.yaml"))
        for group in yaml.safe_load(path.read_text())["groups"]
    }
    if on_operator(overlay):
        (rule,) = [d for d in documents if d["kind"] == "PrometheusRule"]
        groups = rule["spec"]["groups"]
    else:
        (rules,) = [
            d for d in documents
            if d["kind"] == "ConfigMap" and d["metadata"]["name"].startswith(f"{victoria.VMALERT}-")
        ]  # fmt: skip
        groups = yaml.safe_load(rules["data"][victoria.RULES_FILE])["groups"]
    assert len(groups) == len(committed)
    assert {group["name"]: group for group in groups} == committed


def test_every_object_fits_kubectl_applys_annotation(
    rendered: tuple[str, list[dict[str, Any]]],
) -> None:
    """``kubectl apply`` keeps each object as JSON in an annotation of at most 256 KiB: a
    dashboard ConfigMap larger than that cannot be applied (without --server-side)."""
    _, documents = rendered
    for document in documents:
        size = len(json.dumps(document, separators=(",", ":")).encode())
        assert size < 262144, f"{document['kind']}/{document['metadata']['name']}: {size} bytes"


#: the operator's RemoteWriteSpec.queueConfig fields the kit sets -> prometheus.yml's names
#: (the operator writes each into Prometheus' remote_write.queue_config under that name)
QUEUE_FIELDS = {
    "capacity": "capacity",
    "maxShards": "max_shards",
    "maxSamplesPerSend": "max_samples_per_send",
    "batchSendDeadline": "batch_send_deadline",
}


def prometheus_yml(spec: dict[str, Any]) -> dict[str, Any]:
    """The prometheus.yml the operator writes from a ``prometheusSpec``'s external labels
    and remote write; a field the operator does not know fails here (KeyError)."""
    remote_write = []
    for remote in spec.get("remoteWrite", []):
        assert set(remote) <= {"url", "queueConfig"}, remote
        queue = {QUEUE_FIELDS[key]: value for key, value in remote["queueConfig"].items()}
        remote_write.append({"url": remote["url"], "queue_config": queue})
    return {"global": {"external_labels": spec["externalLabels"]}, "remote_write": remote_write}


def check_config(promtool: str, tmp_path: Any, spec: dict[str, Any]) -> None:
    config = tmp_path / "prometheus.yml"
    config.write_text(yaml.safe_dump(prometheus_yml(spec)))
    result = subprocess.run(
        [promtool, "check", "config", str(config)], capture_output=True, text=True, timeout=60
    )
    assert result.returncode == 0, result.stdout + result.stderr


def test_each_sites_prometheus_values_are_a_config_prometheus_accepts(
    promtool: str, tmp_path: Any
) -> None:
    """Each overlay's values, as the operator hands them to Prometheus, pass the real
    Prometheus' config check (the multi-cluster test runs them)."""
    checked = 0
    for values in sorted((KIT / "overlays").glob("*/prometheus-values.yaml")):
        spec = yaml.safe_load(values.read_text(encoding="utf-8"))["prometheus"]["prometheusSpec"]
        check_config(promtool, tmp_path, spec)
        checked += bool(spec.get("remoteWrite"))
    assert checked, "no overlay remote-writes"


@pytest.mark.parametrize("edge", ["minimum", "maximum"])
def test_remote_write_settings_at_the_schemas_edges_are_a_config_prometheus_accepts(
    promtool: str, tmp_path: Any, edge: str
) -> None:
    """Whatever the site schema lets through, Prometheus accepts."""
    side = {"minimum": 0, "maximum": 1}[edge]
    settings = {key: bounds[side] for key, bounds in QUEUE.items()}
    site = tmp_path / "edge.yaml"
    site.write_text(yaml.safe_dump({
        "cluster": "edge",
        "monitoring": {"remote_write": {
            "url": "http://store:19291/api/v1/receive", "batch_send_deadline": "1m30s", **settings
        }},
    }))  # fmt: skip
    spec = prometheus_values(load_site(site))["prometheus"]["prometheusSpec"]
    check_config(promtool, tmp_path, spec)
    with pytest.raises(KeyError):  # the check can fail: a misspelt field
        broken = copy.deepcopy(spec)
        broken["remoteWrite"][0]["queueConfig"]["maxShard"] = 1
        prometheus_yml(broken)


def _inferwatch_containers(documents: list[dict[str, Any]]) -> Iterator[tuple[str, list[str]]]:
    for document in documents:
        template = document.get("spec", {}).get("template", {}).get("spec", {})
        for container in template.get("containers", []):
            if container["image"].startswith("inferwatch:"):
                yield f"{document['metadata']['name']}/{container['name']}", container["args"]


def test_every_inferwatch_container_s_arguments_are_accepted_by_its_command(
    rendered: tuple[str, list[dict[str, Any]]],
) -> None:
    """The kit's args are parsed by the real command line (options, types and callbacks),
    so a renamed flag or a bad value in a manifest fails here, not in a crash-looping pod."""
    from inferwatch.cli import main

    _, documents = rendered
    checked = 0
    for where, args in _inferwatch_containers(documents):
        command = main.get_command(click.Context(main), args[0])
        assert command is not None, f"{where}: no command {args[0]!r}"
        try:
            command.make_context(args[0], list(args[1:]))
        except click.ClickException as exc:
            pytest.fail(f"{where}: {exc.format_message()}")
        checked += 1
    assert checked >= 3, "the kit runs the sidecar, the proxy and the receiver"
