"""The kit's receiver acts as shipped: its mapping, generated from the site file, acts on
every mapped alert kind against the kit's own objects, with no edit to a shipped file.

The mapping is the ConfigMap ``kubectl kustomize`` renders for the site, read through the
receiver's ``--config`` path in the rendered Deployment; the receiver is the real
``Dispatcher`` with every action built from that mapping's settings, as ``runbooks serve
--execute`` builds them; the Kubernetes API is the fake one (``inferwatch/drill/kubefake.py``)
holding the rendered HTTPRoute, a GPU node the node agent's selector picks and a replica pod,
and allowing exactly the rendered ClusterRole; the sidecar is a real one.
"""

from __future__ import annotations

import json
import re
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import yaml
from kubernetes.config import kube_config

from inferwatch.drill.kubefake import FakeKube, httproute_validator
from inferwatch.k8s import automation
from inferwatch.runbooks import config as mapping
from inferwatch.runbooks import lint, registry
from inferwatch.runbooks.actions.base import Alert
from inferwatch.runbooks.actions.gpu_reset_request import PREFIX
from inferwatch.runbooks.actions.httproute import HTTPRouteShift
from inferwatch.runbooks.actions.isolate_replica import TOKEN_ENV
from inferwatch.runbooks.audit import AuditLog
from inferwatch.runbooks.dispatch import Dispatcher
from support.k8s import render
from support.runbooks_harness import SIDECAR_TOKEN, Loop, SidecarUnderTest
from support.shared import REPO, shared_path, tool

pytestmark = pytest.mark.proc

SITE = "single-cluster"
CRD = shared_path("fixtures/crds/gateway.networking.k8s.io_httproutes.yaml")
MODEL = "meta-llama/Llama-3.1-8B-Instruct"
NODE = "gpu-node-1"
GPU = "GPU-00b2b091-2154-3d4b-55dd-be43b60b9d6a"
POD = "llama-8b-6d5f7c9b8-x2k4q"


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
    assert config.namespaces == {"inference"}
    assert not config.execute, "dry-run until the receiver runs with --execute"
    assert dict(config.breaker.populations) == {
        "inference/llama-8b-inferwatch": 2,  # the HPA's floor
        "inference/qwen3-32b-inferwatch": 2,  # the injected model's replicas
        automation.NODES: 4,
        automation.GPUS: 32,
    }
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


REPLICA = {"job": "inference/llama-8b-inferwatch", "pod": POD, "node": NODE, "gpu_uuid": GPU}
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


@pytest.fixture
def fake(rendered: tuple[dict[str, Any], ...]) -> FakeKube:
    served = FakeKube(httproute_validator(str(CRD)))
    served.rules = one(rendered, "ClusterRole", "inferwatch-receiver")["rules"]
    route = one(rendered, "HTTPRoute", "llama-8b")
    served.add_httproute(route["metadata"]["namespace"], route["metadata"]["name"], route["spec"])
    agent = one(render(tool("kubectl"), f"{SITE}/node-agent"), "DaemonSet", "inferwatch-node")
    served.add_node(NODE, labels=agent["spec"]["template"]["spec"]["nodeSelector"])
    served.add_pod("inference", POD, node=NODE)
    return served


@pytest.fixture
def loop() -> Iterator[Loop]:
    running = Loop()
    yield running
    running.close()


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


def receiver(loop: Loop, config: mapping.Config, audit: Path) -> Dispatcher:
    """The receiver as ``runbooks serve --execute`` builds it from the mapping."""

    async def build() -> Dispatcher:
        actions = {
            name: registry.create(name, config.action_settings.get(name, {}))
            for name in sorted({rule.action for rule in config.rules})
        }
        return Dispatcher(config, actions, AuditLog(audit), execute=True)

    built: Dispatcher = loop.run(build)
    return built


@pytest.mark.parametrize(
    ("alertname", "case"),
    [(name, index) for name, cases in KINDS.items() for index in range(len(cases))],
)
def test_the_kit_receiver_acts_on_each_mapped_alert_kind(
    rendered: tuple[dict[str, Any], ...], fake: FakeKube, kubeconfig: str, loop: Loop,
    tmp_path: Path, alertname: str, case: int,
) -> None:  # fmt: skip
    sidecar = SidecarUnderTest(loop, "http://127.0.0.1:9", model=MODEL)
    labels, rules = KINDS[alertname][case]
    fired = alert(alertname, **REPLICA, instance=sidecar.address, **labels)
    dispatcher = receiver(loop, kit_mapping(rendered), tmp_path / "audit.jsonl")
    loop.run(lambda: dispatcher.handle(fired, {}), timeout=120)
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
    loop.run(dispatcher.aclose)
