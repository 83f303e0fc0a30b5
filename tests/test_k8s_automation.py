"""The kit's receiver acts as shipped: its mapping, generated from the site file, acts on
every mapped alert kind against the kit's own objects, with no edit to a shipped file.

The mapping is the ConfigMap ``kubectl kustomize`` renders for the site, read through the
receiver's ``--config`` path in the rendered Deployment; the receiver is the real
``Dispatcher`` with every action and its inventory built from that mapping, as ``runbooks
serve --execute`` builds them; the Kubernetes API is the fake one
(``inferwatch/drill/kubefake.py``) holding the rendered HTTPRoute, the GPU nodes the node
agent's selector picks (and a control-plane node it does not), the model's replica pods and
the canary's, each Running with a pod IP and the labels of its rendered pod template, and
allowing exactly the rendered ClusterRole and Role; the sidecar is a real one, listening on
its pod IP (a loopback address) at the port the kit gives it.
"""

from __future__ import annotations

import dataclasses
import json
import os
import re
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest
import yaml
from kubernetes.config import kube_config

from inferwatch.drill.kubefake import FakeKube, httproute_validator
from inferwatch.k8s import autoscaling
from inferwatch.k8s.overlay import receiver_mapping
from inferwatch.k8s.site import SiteError, load_site
from inferwatch.runbooks import config as mapping
from inferwatch.runbooks import inventory, lint, registry
from inferwatch.runbooks.actions import httproute
from inferwatch.runbooks.actions.base import Alert
from inferwatch.runbooks.actions.gpu_reset_request import PREFIX
from inferwatch.runbooks.actions.httproute import HTTPRouteShift
from inferwatch.runbooks.actions.isolate_replica import TOKEN_ENV
from inferwatch.runbooks.actions.kubernetes_api import connect
from inferwatch.runbooks.audit import AuditLog
from inferwatch.runbooks.dispatch import Dispatcher
from inferwatch.runbooks.kube_state import ConfigMapStore, LeaseElector
from inferwatch.runbooks.server import MAX_BODY_BYTES, Receiver
from support.k8s import KIT, render
from support.runbooks_harness import (
    RECEIVER_TOKEN,
    SIDECAR_TOKEN,
    Loop,
    Served,
    SidecarUnderTest,
)
from support.shared import REPO, shared_path, tool
from support.wait import wait_for

pytestmark = pytest.mark.proc

SITE = "single-cluster"
CRD = shared_path("fixtures/crds/gateway.networking.k8s.io_httproutes.yaml")
MODEL = "meta-llama/Llama-3.1-8B-Instruct"
NODE = "gpu-node-1"
GPU = "GPU-00b2b091-2154-3d4b-55dd-be43b60b9d6a"
POD = "llama-8b-6d5f7c9b8-x2k4q"
#: the replica's pod IP: a loopback address of this process's own, so that its sidecar can
#: listen at the kit's sidecar port while other test runs do the same
POD_IP = f"127.94.{os.getpid() // 256 % 256}.{os.getpid() % 256 or 1}"
SIDECAR_PORT = 9400


@pytest.fixture(scope="module")
def rendered() -> tuple[dict[str, Any], ...]:
    return render(tool("kubectl"), SITE)


def one(documents: tuple[dict[str, Any], ...], kind: str, prefix: str) -> dict[str, Any]:
    (found,) = [
        d for d in documents if d["kind"] == kind and d["metadata"]["name"].startswith(prefix)
    ]
    return found


def kit_mapping(documents: tuple[dict[str, Any], ...]) -> mapping.Config:
    """The mapping the rendered receiver reads: the file its --config names, in the
    ConfigMap its volume mounts there."""
    deployment = one(documents, "Deployment", "inferwatch-receiver")
    pod = deployment["spec"]["template"]["spec"]
    (container,) = pod["containers"]
    (path,) = [a.split("=", 1)[1] for a in container["args"] if a.startswith("--config=")]
    (mount,) = [m for m in container["volumeMounts"] if path.startswith(m["mountPath"] + "/")]
    (volume,) = [v for v in pod["volumes"] if v["name"] == mount["name"]]
    configmap = one(documents, "ConfigMap", volume["configMap"]["name"])
    assert configmap["metadata"]["name"] == volume["configMap"]["name"]
    text = configmap["data"][Path(path).relative_to(mount["mountPath"]).as_posix()]
    return mapping.parse(yaml.safe_load(text), f"ConfigMap {configmap['metadata']['name']}")


def test_the_kit_mapping_is_the_sites(rendered: tuple[dict[str, Any], ...]) -> None:
    config = kit_mapping(rendered)
    assert config.namespaces == {"inference", ""}, "the nodes have no namespace"
    assert not config.execute, "dry-run until the receiver runs with --execute"
    assert dict(config.inventory) == {
        "replicas": {"kubernetes": {
            "namespace": "inference", "port": SIDECAR_PORT, "model_label": "",
            "population_label": "inferwatch.io/model",
            "selector": "inferwatch.io/sidecar=true,inferwatch.io/track!=canary",
        }},
        "nodes": {"kubernetes": {"selector": "nvidia.com/gpu.present=true"}},
    }  # fmt: skip
    assert all("group" not in rule.params for rule in config.rules)
    assert {rule.alertname for rule in config.rules} == set(KINDS)


def test_the_kit_mapping_passes_check_config_without_a_warning(
    rendered: tuple[dict[str, Any], ...],
) -> None:
    shipped = lint.shipped_alerts(REPO / "alerts" / "generated")
    assert lint.warnings(kit_mapping(rendered), shipped) == []


def test_the_fallback_rules_docs_kubernetes_md_gives_are_the_generated_ones(
    rendered: tuple[dict[str, Any], ...],
) -> None:
    text = (REPO / "docs" / "kubernetes.md").read_text(encoding="utf-8")
    (block,) = re.findall(r"```yaml\n(# receiver mapping.*?)```", text, flags=re.S)
    documented = mapping.parse(yaml.safe_load(block), "docs/kubernetes.md").rules
    generated = [r for r in kit_mapping(rendered).rules if r.action == HTTPRouteShift.name]
    assert documented == tuple(generated)


def alert(name: str, **labels: str) -> Alert:
    """An alert with the labels its shipped rule keeps for the kit's replica of the model."""
    return Alert(
        status="firing",
        labels={"alertname": name, "namespace": "inference", "model": MODEL, **labels},
        annotations={"summary": f"{name} fired"},
        starts_at="2026-12-01T08:00:00Z",
        ends_at="0001-01-01T00:00:00Z",
        fingerprint=f"fp-{name}-{labels.get('action', '')}",
    )


REPLICA = {
    "job": "inference/llama-8b-inferwatch", "pod": POD, "node": NODE, "gpu_uuid": GPU,
    "instance": f"{POD_IP}:{SIDECAR_PORT}",
}  # fmt: skip
#: per mapped alert kind: its labels (besides the replica's) and the rules that must act
KINDS: dict[str, list[tuple[dict[str, str], set[str]]]] = {
    "InferwatchGPUXidErrors": [
        ({"severity": "critical", "xid": "79", "action": "reboot_node"},
         {"isolate-replica-on-reset-class-xid", "remediate-reset-class-xid"}),
        ({"severity": "critical", "xid": "48", "action": "reset_gpu"},
         {"isolate-replica-on-reset-class-xid", "remediate-reset-class-xid"}),
    ],
    "InferwatchGPUEccUncorrectable": [
        ({"severity": "critical", "error": "uncorrected"},
         {"isolate-replica-on-uncorrectable-ecc", "isolate-node-on-uncorrectable-ecc"}),
    ],
    "InferwatchEngineDown": [({"severity": "critical"}, {"isolate-replica-on-engine-down"})],
    "InferwatchEngineStalled": [
        ({"severity": "critical"}, {"isolate-replica-on-engine-stalled"})
    ],
    "InferwatchDegenerateOutputRising": [
        ({"severity": "warning", "signal": "repetition"}, {"fallback-on-degenerate-output"})
    ],
    "InferwatchKVCacheSaturated": [
        ({"severity": "warning"}, {"fallback-on-kv-cache-saturation"})
    ],
    "InferwatchModelReplicasNotReady": [
        ({"severity": "critical"}, {"fallback-on-replicas-not-ready"})
    ],
}  # fmt: skip


def pod_labels(documents: tuple[dict[str, Any], ...], deployment: str) -> dict[str, str]:
    (found,) = [d for d in documents if d["kind"] == "Deployment"
                and d["metadata"]["name"] == deployment]  # fmt: skip
    labels: dict[str, str] = found["spec"]["template"]["metadata"]["labels"]
    return labels


def receiver_rules(documents: tuple[dict[str, Any], ...]) -> list[dict[str, Any]]:
    """What the rendered receiver may do: its ClusterRole's rules and its Role's."""
    return [
        rule for kind in ("ClusterRole", "Role")
        for rule in one(documents, kind, "inferwatch-receiver")["rules"]
    ]  # fmt: skip


def kit_objects(
    served: FakeKube, documents: tuple[dict[str, Any], ...], node_selector: dict[str, str]
) -> None:
    """The kit's objects as a cluster holds them: its route, its model's two replicas (the
    HPA's floor) and the canary's pod, two GPU nodes and a control-plane node."""
    route = one(documents, "HTTPRoute", "llama-8b")
    served.add_httproute(route["metadata"]["namespace"], route["metadata"]["name"], route["spec"])
    for name in (NODE, "gpu-node-2"):
        served.add_node(name, labels=node_selector)
    served.add_node("control-plane-1", labels={"node-role.kubernetes.io/control-plane": ""})
    stable, canary = pod_labels(documents, "llama-8b"), pod_labels(documents, "llama-8b-canary")
    served.add_pod("inference", POD, node=NODE, labels=stable, ip=POD_IP)
    served.add_pod("inference", "llama-8b-6d5f7c9b8-q7m2n", node="gpu-node-2", labels=stable,
                   ip="10.0.1.7")  # fmt: skip
    served.add_pod("inference", "llama-8b-canary-5c4b-z9x8w", node="gpu-node-2", labels=canary,
                   ip="10.0.1.8")  # fmt: skip


def node_selector() -> dict[str, str]:
    agent = one(render(tool("kubectl"), f"{SITE}/node-agent"), "DaemonSet", "inferwatch-node")
    selector: dict[str, str] = agent["spec"]["template"]["spec"]["nodeSelector"]
    return selector


@pytest.fixture
def fake(rendered: tuple[dict[str, Any], ...]) -> FakeKube:
    served = FakeKube(httproute_validator(str(CRD)))
    served.rules = receiver_rules(rendered)
    kit_objects(served, rendered, node_selector())
    return served


@pytest.fixture
def kubeconfig(fake: FakeKube, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Iterator[str]:
    """The receiver's environment: the fake API as its cluster, the sidecars' admin token."""
    with fake.serve() as url:
        config = {
            "apiVersion": "v1", "kind": "Config", "current-context": "fake",
            "clusters": [{"name": "fake", "cluster": {"server": url}}],
            "users": [{"name": "receiver", "user": {}}],
            "contexts": [{"name": "fake", "context": {"cluster": "fake", "user": "receiver"}}],
        }  # fmt: skip
        path = tmp_path / "kubeconfig"
        path.write_text(json.dumps(config))
        # the client reads $KUBECONFIG once, at import: its default location is set instead
        monkeypatch.setattr(kube_config, "KUBE_CONFIG_DEFAULT_LOCATION", str(path))
        monkeypatch.delenv("KUBERNETES_SERVICE_HOST", raising=False)
        monkeypatch.setenv(TOKEN_ENV, SIDECAR_TOKEN)
        yield url


def receiver(loop: Loop, config: mapping.Config, audit: Path, **options: Any) -> Dispatcher:
    """The receiver as ``runbooks serve --execute`` builds it from the mapping."""

    async def build() -> Dispatcher:
        actions = {
            name: registry.create(name, config.action_settings.get(name, {}))
            for name in sorted({rule.action for rule in config.rules})
        }
        targets = inventory.build(config.inventory)
        return Dispatcher(
            config, actions, AuditLog(audit), execute=True, inventory=targets, **options
        )

    built: Dispatcher = loop.run(build)
    return built


class Replica(SidecarUnderTest):
    """A real sidecar at its pod IP and the kit's sidecar port, as the inventory names it."""

    def __init__(self, loop: Loop) -> None:
        super().__init__(loop, "http://127.0.0.1:9", model=MODEL)
        self.served.stop()
        self.served = Served(loop, self.sidecar.app(), SIDECAR_PORT, host=POD_IP)
        self.url, self.address = self.served.url, self.served.address


@pytest.mark.parametrize(
    ("alertname", "case"),
    [(name, index) for name, cases in KINDS.items() for index in range(len(cases))],
)
def test_the_kit_receiver_acts_on_each_mapped_alert_kind(
    rendered: tuple[dict[str, Any], ...], fake: FakeKube, kubeconfig: str, runbook_loop: Loop,
    tmp_path: Path, alertname: str, case: int, monkeypatch: pytest.MonkeyPatch,
) -> None:  # fmt: skip
    # what the shift ends at is checked here, its steps in test_kube_actions: without the
    # default 5 s between its three steps, a fallback case does not wait 10 s for nothing
    monkeypatch.setattr(httproute, "DEFAULT_INTERVAL", 0.0)
    sidecar = Replica(runbook_loop)
    labels, rules = KINDS[alertname][case]
    fired = alert(alertname, **REPLICA, **labels)
    dispatcher = receiver(runbook_loop, kit_mapping(rendered), tmp_path / "audit.jsonl")
    runbook_loop.run(lambda: dispatcher.handle(fired, {}), timeout=120)
    records = [json.loads(line) for line in (tmp_path / "audit.jsonl").read_text().splitlines()]
    acted = {r["rule"] for r in records if r.get("decision") == "acted"}
    assert acted == rules, records
    node = fake.get("nodes", "", NODE)
    assert node is not None
    route = fake.get("httproutes", "inference", "llama-8b")
    assert route is not None
    weights = {r["name"]: r["weight"] for r in route["spec"]["rules"][1]["backendRefs"]}
    if any(rule.startswith("isolate-replica") for rule in rules):
        assert sidecar.state()["isolated"] is True
    if "isolate-node-on-uncorrectable-ecc" in rules or labels.get("action") == "reboot_node":
        assert node["spec"].get("unschedulable") is True
    if labels.get("action") == "reset_gpu":
        assert PREFIX + GPU in node["metadata"]["annotations"]
    if any(rule.startswith("fallback") for rule in rules):
        assert weights == {"llama-8b": 0, "llama-8b-canary": 5, "qwen3-32b-inferwatch": 95}
    else:
        assert weights["qwen3-32b-inferwatch"] == 0
    sidecar.served.stop()
    runbook_loop.run(dispatcher.aclose)


def state_store(documents: tuple[dict[str, Any], ...]) -> tuple[str, str, list[str]]:
    """Where the rendered receiver keeps its state (``--state-configmap``, its downward-API
    variables resolved as the kubelet resolves them) and its flags."""
    deployment = one(documents, "Deployment", "inferwatch-receiver")
    assert deployment["spec"]["replicas"] == 2
    (container,) = deployment["spec"]["template"]["spec"]["containers"]
    fields = {
        e["name"]: e["valueFrom"]["fieldRef"]["fieldPath"]
        for e in container["env"] if "fieldRef" in e.get("valueFrom", {})
    }  # fmt: skip
    assert fields["POD_NAME"] == "metadata.name", "the Lease's holder identity"
    downward = {"metadata.namespace": deployment["metadata"]["namespace"]}
    args = [
        re.sub(r"\$\((\w+)\)", lambda m: downward[fields[m[1]]], arg) for arg in container["args"]
    ]
    (where,) = [a.split("=", 1)[1] for a in args if a.startswith("--state-configmap=")]
    namespace, name = where.split("/")
    return namespace, name, args


def test_the_kits_two_receivers_elect_one_leader_and_act_once_on_one_alert(
    rendered: tuple[dict[str, Any], ...], fake: FakeKube, kubeconfig: str, runbook_loop: Loop,
    tmp_path: Path,
) -> None:  # fmt: skip
    namespace, name, args = state_store(rendered)
    assert namespace == "inference" and not any(a.startswith("--state-dir") for a in args)
    sidecar = Replica(runbook_loop)
    config = kit_mapping(rendered)
    receivers, served = [], []
    for replica in ("a", "b"):
        api = connect()
        identity = f"inferwatch-receiver-5f7d8c-{replica}"
        dispatcher = receiver(
            runbook_loop, config, tmp_path / f"audit-{replica}.jsonl",
            store=ConfigMapStore(api, namespace, name),
            leader=LeaseElector(api, namespace, name, identity),
        )  # fmt: skip
        receivers.append(dispatcher)
        served.append(
            Served(runbook_loop, Receiver(dispatcher, RECEIVER_TOKEN, MAX_BODY_BYTES).app())
        )
    leaders = wait_for(
        lambda: [d for d in receivers if d.leading()], "a receiver holding the Lease", 30
    )
    (leader,) = leaders
    (standby,) = [d for d in receivers if d is not leader]
    labels, _ = KINDS["InferwatchGPUXidErrors"][0]  # reboot class: isolate, cordon and taint
    # as Alertmanager fingerprints alerts: hex digits
    fired = dataclasses.replace(
        alert("InferwatchGPUXidErrors", **REPLICA, **labels), fingerprint="3f6a1c2b9d8e7f01"
    )
    body = {
        "version": "4", "status": "firing", "receiver": "inferwatch-runbooks",
        "groupLabels": {}, "commonLabels": {}, "commonAnnotations": {},
        "externalURL": "http://alertmanager:9093", "groupKey": "{}", "truncatedAlerts": 0,
        "alerts": [{
            "status": fired.status, "labels": dict(fired.labels),
            "annotations": dict(fired.annotations), "startsAt": fired.starts_at,
            "endsAt": fired.ends_at, "generatorURL": "", "fingerprint": fired.fingerprint,
        }],
    }  # fmt: skip
    # Alertmanager sends the notification to both receivers: the standby refuses it
    answers = {
        id(d): httpx.post(f"{s.url}/webhook", json=body, timeout=10,
                          headers={"authorization": f"Bearer {RECEIVER_TOKEN}"}).status_code
        for d, s in zip(receivers, served, strict=True)
    }  # fmt: skip
    assert (answers[id(leader)], answers[id(standby)]) == (200, 503)

    def audit(dispatcher: Dispatcher) -> list[dict[str, Any]]:
        path = Path(dispatcher.audit.path)
        return [json.loads(x) for x in path.read_text().splitlines()] if path.exists() else []

    acted = wait_for(
        lambda: len([r for r in audit(leader) if r.get("decision") == "acted"]) == 2,
        "the leader acting on both rules of the XID alert", 60,
    )  # fmt: skip
    assert acted
    # the standby had the alert too (a delivery before a failover): the shared state says done
    runbook_loop.run(lambda: standby.handle(fired, {}), timeout=60)
    assert {r["outcome"] for r in audit(standby) if "rule" in r} == {"duplicate"}, audit(standby)
    lease = fake.get("leases", namespace, name)
    assert lease is not None and lease["spec"]["holderIdentity"].endswith(
        "-a" if leader is receivers[0] else "-b"
    )
    assert fake.get("configmaps", namespace, name) is not None
    cordons = [w for w in fake.written
               if w["kind"] == "Node" and w["metadata"]["name"] == NODE]  # fmt: skip
    assert cordons and all(w["spec"].get("unschedulable") for w in cordons)
    assert fake.get("nodes", "", "gpu-node-2")["spec"].get("unschedulable") is None
    assert sidecar.state()["isolated"] is True
    for server in served:
        server.stop()
    sidecar.served.stop()


@pytest.mark.parametrize(
    ("text", "message"),
    [
        ("automation: {gpu_node_selector: 'gpu in (a, b)'}\n",
         "automation.gpu_node_selector: expected a label selector"),
        ("automation: {gpu_node_selector: 'a=b,'}\n",
         "automation.gpu_node_selector: expected a label selector"),
        # the breaker's sizes are the inventory's now, never a count in the site file
        ("automation: {gpu_nodes: 4}\n", "automation.gpu_nodes: unknown field"),
    ],
)  # fmt: skip
def test_a_bad_automation_site_value_is_one_clear_line(
    tmp_path: Path, text: str, message: str
) -> None:
    path = tmp_path / "site.yaml"
    path.write_text(text)
    with pytest.raises(SiteError) as caught:
        load_site(path)
    assert "\n" not in str(caught.value) and message in str(caught.value), caught.value


def test_a_site_names_the_gpu_nodes_the_receiver_may_act_on(tmp_path: Path) -> None:
    path = tmp_path / "site.yaml"
    selector = "pool=h200,!node-role.kubernetes.io/control-plane"
    path.write_text(f"automation: {{gpu_node_selector: '{selector}'}}\n")
    site = load_site(path)
    nodes = receiver_mapping(site, autoscaling.scaled_model(KIT))["inventory"]["nodes"]
    assert nodes == {"kubernetes": {"selector": selector}}


def test_the_kit_receiver_refuses_targets_its_inventory_does_not_list(
    rendered: tuple[dict[str, Any], ...], fake: FakeKube, kubeconfig: str, runbook_loop: Loop,
    tmp_path: Path,
) -> None:  # fmt: skip
    """The canary's pod and a control-plane node are in the cluster, not in the inventory."""
    canary = {"pod": "llama-8b-canary-5c4b-z9x8w", "instance": "10.0.1.8:9400",
              "node": "control-plane-1"}  # fmt: skip
    fired = alert("InferwatchGPUEccUncorrectable", **{**REPLICA, **canary}, severity="critical")
    dispatcher = receiver(runbook_loop, kit_mapping(rendered), tmp_path / "audit.jsonl")
    runbook_loop.run(lambda: dispatcher.handle(fired, {}), timeout=60)
    records = [json.loads(line) for line in (tmp_path / "audit.jsonl").read_text().splitlines()]
    assert {(r["rule"], r["outcome"]) for r in records} == {
        ("isolate-replica-on-uncorrectable-ecc", "inventory"),
        ("isolate-node-on-uncorrectable-ecc", "inventory"),
    }, records
    node = fake.get("nodes", "", "control-plane-1")
    assert node is not None and "unschedulable" not in node["spec"]
    runbook_loop.run(dispatcher.aclose)
