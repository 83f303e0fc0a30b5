"""Every pod the kit renders passes the Pod Security Standards (``support.pss``).

The inference namespace's pods (the model replicas, the canary, the GPU exporter, the
receiver) pass "restricted", so a namespace labelled
``pod-security.kubernetes.io/enforce: restricted`` admits the whole site's overlay. The one pod
that touches the kubelet's PodResources socket is the node agent, in a namespace of its own:
it breaks baseline only by that read-only hostPath, and nothing else mounts one; a site that
turns on the GPU reset (``automation.gpu_reset``) makes it privileged as well, and nothing
else.
"""

from __future__ import annotations

import copy
from typing import Any

import click
import pytest
import yaml

from inferwatch.cli import main
from inferwatch.k8s import inject, victoria
from inferwatch.k8s.site import Site, load_site
from inferwatch.nodeagent import kube_facts
from support.k8s import KIT, render, validate
from support.pss import pod_templates, violations
from support.shared import tool

pytestmark = pytest.mark.proc

SITES = sorted(p.parent.name for p in (KIT / "overlays").glob("*/kustomization.yaml"))
POD_RESOURCES = "/var/lib/kubelet/pod-resources"
CLUSTER_SCOPED = ("Namespace", "ClusterRole", "ClusterRoleBinding")


@pytest.fixture(scope="module")
def kubectl() -> str:
    return tool("kubectl")


@pytest.mark.parametrize("site", SITES)
def test_every_inference_pod_passes_restricted(kubectl: str, site: str) -> None:
    templates = [t for d in render(kubectl, site) for t in pod_templates(d)]
    names = {where for where, _ in templates}
    # the model replicas, the canary, the GPU exporter and the receiver are all checked
    assert {"Deployment/llama-8b", "Deployment/llama-8b-canary",
            "DaemonSet/inferwatch-gpu-exporter"} <= names, names  # fmt: skip
    for where, template in templates:
        assert violations(template, "restricted") == [], where


@pytest.mark.parametrize("site", SITES)
def test_only_the_node_agent_mounts_the_kubelets_socket(kubectl: str, site: str) -> None:
    documents = render(kubectl, f"{site}/node-agent")
    for document in documents:
        validate(document)
    (namespace,) = [d for d in documents if d["kind"] == "Namespace"]
    assert all(d["metadata"].get("namespace") == namespace["metadata"]["name"]
               for d in documents if d["kind"] not in CLUSTER_SCOPED)  # fmt: skip
    ((where, template),) = [t for d in documents for t in pod_templates(d)]
    found = violations(template, "baseline")
    expected = ["hostPath volumes: volume pod-resources is a hostPath"]
    if load_site(KIT / "sites" / f"{site}.yaml").gpu_reset:
        expected.append("privileged containers: containers[inferwatch-node-agent] is privileged")
    assert sorted(found) == sorted(expected), (where, found)
    (volume,) = template["spec"]["volumes"]
    assert volume["hostPath"]["path"] == POD_RESOURCES
    (container,) = template["spec"]["containers"]
    assert [m for m in container["volumeMounts"] if m["name"] == volume["name"]] == [
        {"name": "pod-resources", "mountPath": POD_RESOURCES, "readOnly": True}
    ]
    service = next(d for d in documents if d["kind"] == "Service")
    assert service["spec"]["internalTrafficPolicy"] == "Local"
    # the agent's arguments are ones its real command line accepts
    command = main.get_command(click.Context(main), container["args"][0])
    assert command is not None
    params = command.make_context(container["args"][0], container["args"][1:]).params
    assert str(params["kubelet_socket"]).startswith(POD_RESOURCES + "/")
    assert params["listen"].endswith(f":{service['spec']['ports'][0]['port']}")


@pytest.mark.parametrize("site", SITES)
def test_sidecars_ask_the_agent_its_namespace_lets_in(kubectl: str, site: str) -> None:
    """The sidecars' --node-agent-url names the agent's Service, the token Secret is the one
    the agent reads, and its NetworkPolicy admits the sidecars' namespace and pod label."""
    agent = render(kubectl, f"{site}/node-agent")
    service = next(d for d in agent if d["kind"] == "Service")
    policy = next(d for d in agent if d["kind"] == "NetworkPolicy")
    daemonset = next(d for d in agent if d["kind"] == "DaemonSet")
    (agent_container,) = daemonset["spec"]["template"]["spec"]["containers"]
    agent_secret = _secret(agent_container, "INFERWATCH_NODE_AGENT_TOKEN")
    meta, port = service["metadata"], service["spec"]["ports"][0]["port"]
    url = f"--node-agent-url=http://{meta['name']}.{meta['namespace']}.svc:{port}"
    sidecars, scraper = policy["spec"]["ingress"][0]["from"]
    allowed = sidecars
    config = load_site(KIT / "sites" / f"{site}.yaml")
    space, labels = _scraper(config)
    assert scraper == {"namespaceSelector": {"matchLabels": {"kubernetes.io/metadata.name": space}},
                       "podSelector": {"matchLabels": labels}}  # fmt: skip
    if config.tsdb == victoria.OPERATOR:  # vmagent's job: tests/test_k8s_victoria.py
        monitor = next(d for d in agent if d["kind"] == "PodMonitor")
        assert monitor["metadata"]["labels"]["release"] == config.release
        assert [e["port"] for e in monitor["spec"]["podMetricsEndpoints"]] == [
            p["name"] for p in agent_container["ports"]
        ]
    checked = 0
    for document in render(kubectl, site):
        for where, template in pod_templates(document):
            for container in template["spec"]["containers"]:
                if "--gpu-scope=agent" not in container.get("args", []):
                    continue
                assert url in container["args"], where
                assert _secret(container, "INFERWATCH_SIDECAR_NODE_AGENT_TOKEN") == agent_secret
                labels = template["metadata"]["labels"]
                pod_selector = allowed["podSelector"]["matchLabels"]
                assert all(labels.get(k) == v for k, v in pod_selector.items()), where
                namespace = allowed["namespaceSelector"]["matchLabels"]
                assert namespace == {"kubernetes.io/metadata.name":
                                     document["metadata"]["namespace"]}  # fmt: skip
                checked += 1
    assert checked == 2, "the stable and canary sidecars ask the node agent"


def _site(site: str) -> Site:
    return load_site(KIT / "sites" / f"{site}.yaml")


def _scraper(site: Site) -> tuple[str, dict[str, str]]:
    """The namespace and labels of the pods that scrape the site: Prometheus or vmagent."""
    if site.tsdb == victoria.OPERATOR:
        return site.monitoring_namespace, {"app.kubernetes.io/name": "prometheus"}
    return site.namespace, {"app.kubernetes.io/name": victoria.VMAGENT}


def _agent_pod(documents: tuple[dict[str, Any], ...]) -> dict[str, Any]:
    (daemonset,) = [d for d in documents if d["kind"] == "DaemonSet"]
    template: dict[str, Any] = daemonset["spec"]["template"]
    return template


def _parsed(container: dict[str, Any]) -> dict[str, Any]:
    """The container's arguments as the real command line parses them."""
    command = main.get_command(click.Context(main), container["args"][0])
    assert command is not None
    return command.make_context(container["args"][0], container["args"][1:]).params


@pytest.mark.parametrize("site", SITES)
def test_the_node_agent_resets_gpus_only_where_the_site_asks_with_what_a_reset_needs(
    kubectl: str, site: str
) -> None:
    """--gpu-reset, its own account bound to exactly the reset's rules, every GPU of the
    node with the NVIDIA runtime, privilege, and the admin token the sidecars check; a site
    without the switch gets the agent as before: no account, no API token, no privilege."""
    documents = render(kubectl, f"{site}/node-agent")
    template = _agent_pod(documents)
    spec = template["spec"]
    (container,) = spec["containers"]
    params = _parsed(container)
    roles = [d for d in documents if d["kind"] in ("ClusterRole", "ClusterRoleBinding")]
    if not _site(site).gpu_reset:
        assert params["gpu_reset"] is False
        assert roles == [] and "serviceAccountName" not in spec
        assert spec["automountServiceAccountToken"] is False
        assert container["securityContext"]["capabilities"] == {"drop": ["ALL"]}
        assert violations(template, "baseline") == [
            "hostPath volumes: volume pod-resources is a hostPath"
        ]
        return
    assert params["gpu_reset"] is True and params["gpu_reset_dry_run"] is False
    env = {e["name"]: e for e in container["env"]}
    assert env["NVIDIA_VISIBLE_DEVICES"]["value"] == "all"
    assert "utility" in env["NVIDIA_DRIVER_CAPABILITIES"]["value"].split(",")  # nvidia-smi, NVML
    assert spec["runtimeClassName"] == "nvidia"
    assert container["securityContext"]["privileged"] is True
    (account,) = [d for d in documents if d["kind"] == "ServiceAccount"]
    assert spec["serviceAccountName"] == account["metadata"]["name"]
    assert spec["automountServiceAccountToken"] is True
    role = next(d for d in roles if d["kind"] == "ClusterRole")
    binding = next(d for d in roles if d["kind"] == "ClusterRoleBinding")
    assert role["rules"] == [dict(rule) for rule in kube_facts.GPU_RESET_RULES]
    assert binding["roleRef"]["name"] == role["metadata"]["name"]
    assert binding["subjects"] == [{"kind": "ServiceAccount", "name": account["metadata"]["name"],
                                    "namespace": account["metadata"]["namespace"]}]  # fmt: skip
    for document in documents:
        validate(document)
    # the agent drains with the token every sidecar of the site checks on /admin/isolation
    drains = _secret(container, "INFERWATCH_RUNBOOKS_SIDECAR_TOKEN")
    sidecars = [
        c for d in render(kubectl, site) for _, t in pod_templates(d)
        for c in t["spec"]["containers"] if "--gpu-scope=agent" in c.get("args", [])
    ]  # fmt: skip
    assert len(sidecars) == 2
    for sidecar in sidecars:
        assert _secret(sidecar, "INFERWATCH_SIDECAR_ADMIN_TOKEN") == drains


def _selects(selector: dict[str, Any], labels: dict[str, str]) -> bool:
    """A label selector, as the API server evaluates one."""
    if any(labels.get(k) != v for k, v in (selector.get("matchLabels") or {}).items()):
        return False
    for expression in selector.get("matchExpressions") or []:
        key, operator, values = expression["key"], expression["operator"], expression.get("values")
        found = {"In": key in labels and labels[key] in values,
                 "NotIn": key not in labels or labels[key] not in values,
                 "Exists": key in labels, "DoesNotExist": key not in labels}[operator]  # fmt: skip
        if not found:
            return False
    return True


def admits(policy: dict[str, Any], port: int, namespace: str, labels: dict[str, str]) -> bool:
    """Whether ``policy``'s ingress lets a pod (``labels``, in ``namespace``) reach ``port``."""
    own = policy["metadata"]["namespace"]
    for rule in policy["spec"].get("ingress") or []:
        ports = rule.get("ports")
        if ports and not any(p["port"] <= port <= p.get("endPort", p["port"]) for p in ports):
            continue
        for peer in rule.get("from") or [{"namespaceSelector": {}}]:
            spaces = peer.get("namespaceSelector")
            in_space = (namespace == own if spaces is None
                        else _selects(spaces, {"kubernetes.io/metadata.name": namespace}))
            if in_space and _selects(peer.get("podSelector") or {}, labels):
                return True
    return False


@pytest.mark.parametrize("site", SITES)
def test_the_sidecars_port_admits_the_node_agent_after_the_overlays_replacements(
    kubectl: str, site: str
) -> None:
    """The kit model's NetworkPolicy, as rendered (the monitoring_namespace replacement has
    run), and each injected model's let the node agent reach the sidecar's port, and only
    that port, where the site turns the GPU reset on; nowhere else."""
    agent = _agent_pod(render(kubectl, f"{site}/node-agent"))["metadata"]["labels"]
    space = inject.NODE_AGENT_NAMESPACE
    rendered = render(kubectl, site)
    policies = [d for d in rendered if d["kind"] == "NetworkPolicy"]
    pods = [t["metadata"]["labels"] for d in rendered for _, t in pod_templates(d)
            if t["metadata"]["labels"].get("inferwatch.io/sidecar") == "true"]  # fmt: skip
    injected = KIT / "overlays" / site / "inject" / "models.yaml"
    if injected.is_file():
        for document in yaml.safe_load_all(injected.read_text()):
            if document["kind"] == "NetworkPolicy":
                document["metadata"]["namespace"] = _site(site).namespace
                policies.append(document)
                pods.append(document["spec"]["podSelector"]["matchLabels"])
    assert len(pods) == 2 + len(_site(site).models)
    wanted = _site(site).gpu_reset
    for labels in pods:
        (policy,) = [p for p in policies if _selects(p["spec"]["podSelector"], labels)]
        assert admits(policy, 9400, space, agent) is wanted, (site, policy["metadata"]["name"])
        assert not admits(policy, 9402, space, agent), "tenant metrics stay closed to it"
        # the replacement still points Prometheus at the site's monitoring namespace (or
        # the patches vmagent at its own)
        assert admits(policy, 9400, *_scraper(_site(site)))
        assert not admits(policy, 9400, "elsewhere", agent)


def _secret(container: dict[str, Any], name: str) -> dict[str, Any]:
    (found,) = [e for e in container["env"] if e["name"] == name]
    return dict(found["valueFrom"]["secretKeyRef"])


RESTRICTED_POD = yaml.safe_load(
    """
metadata: {labels: {app: x}}
spec:
  securityContext: {runAsNonRoot: true, runAsUser: 65532, seccompProfile: {type: RuntimeDefault}}
  containers:
    - name: c
      image: x
      securityContext:
        allowPrivilegeEscalation: false
        capabilities: {drop: [ALL]}
  volumes:
    - {name: scratch, emptyDir: {}}
"""
)


def _set(path: str, value: Any) -> Any:
    def change(pod: dict[str, Any]) -> None:
        *parents, leaf = path.split(".")
        node: Any = pod
        for part in parents:
            node = node[int(part)] if part.isdigit() else node.setdefault(part, {})
        node[int(leaf) if leaf.isdigit() else leaf] = value

    return change


C = "spec.containers.0."  # the container's fields
S = "spec.securityContext."  # the pod's security context
BREAKS = {
    # what the kit's model pod did before the node agent: the kubelet's socket by hostPath
    "hostPath": ("baseline",
                 _set("spec.volumes.0", {"name": "pr", "hostPath": {"path": POD_RESOURCES}})),
    "hostNetwork": ("baseline", _set("spec.hostNetwork", True)),
    "hostPID": ("baseline", _set("spec.hostPID", True)),
    "hostIPC": ("baseline", _set("spec.hostIPC", True)),
    "privileged": ("baseline", _set(C + "securityContext.privileged", True)),
    "SYS_ADMIN": ("baseline", _set(C + "securityContext.capabilities.add", ["SYS_ADMIN"])),
    "hostPort": ("baseline", _set(C + "ports", [{"containerPort": 80, "hostPort": 80}])),
    "unconfined": ("baseline", _set(S + "seccompProfile.type", "Unconfined")),
    "procMount": ("baseline", _set(C + "securityContext.procMount", "Unmasked")),
    "sysctl": ("baseline", _set(S + "sysctls", [{"name": "kernel.msgmax", "value": "1"}])),
    "selinux": ("baseline", _set(S + "seLinuxOptions", {"type": "spc_t"})),
    "escalation": ("restricted", _set(C + "securityContext.allowPrivilegeEscalation", True)),
    "root": ("restricted", _set(S + "runAsNonRoot", False)),
    "uid0": ("restricted", _set(C + "securityContext.runAsUser", 0)),
    "no-seccomp": ("restricted", _set(S + "seccompProfile", {})),
    "no-drop": ("restricted", _set(C + "securityContext.capabilities.drop", [])),
    "CHOWN": ("restricted", _set(C + "securityContext.capabilities.add", ["CHOWN"])),
    "nfs": ("restricted", _set("spec.volumes.0", {"name": "n", "nfs": {"server": "s"}})),
}  # fmt: skip


def test_the_restricted_pod_passes() -> None:
    assert violations(RESTRICTED_POD, "restricted") == []


@pytest.mark.parametrize("name", sorted(BREAKS))
def test_each_control_refuses_what_the_standard_forbids(name: str) -> None:
    level, change = BREAKS[name]
    pod = copy.deepcopy(RESTRICTED_POD)
    change(pod)
    assert violations(pod, "restricted"), name
    if level == "baseline":
        assert violations(pod, "baseline"), f"{name} breaks baseline too"
    else:
        assert violations(pod, "baseline") == [], f"{name} is allowed by baseline"
