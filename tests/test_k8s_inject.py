"""Injection into the deployments users already have, on their own manifests.

Each case reads a project's published manifest in place (../shared/fixtures/k8s-examples/),
names it in a site file's ``models``, renders that site's injection Component with
``kubectl kustomize`` over the manifest, and checks that the injected pod would work, not
only render: every inferwatch container's arguments are parsed by the real command line, its
ports, probes and upstream agree with the pod, the PodMonitor, the Service and the
NetworkPolicy, the pod gains no Pod Security violation, and every object validates (the
LeaderWorkerSet, whose CRD is too large to ship, by its pod templates). The Helm
post-renderer gives the same result as the kustomization.
"""

from __future__ import annotations

import json
import os
import subprocess
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import click
import pytest
import yaml

from inferwatch.cli import main
from inferwatch.k8s import inject
from inferwatch.k8s.components import inject_component
from inferwatch.k8s.site import SiteError, load_site
from support.k8s import KIT, validate
from support.pss import pod_templates, violations
from support.shared import shared_path, tool

pytestmark = pytest.mark.proc

EXAMPLES = shared_path("fixtures/k8s-examples")
POST_RENDERER = KIT / "helm" / "inferwatch-post-renderer"


@dataclass(frozen=True)
class Case:
    files: tuple[str, ...]
    model: dict[str, Any]
    #: the workload (kind/name) whose serving pod gets the containers
    injected: str
    #: strategic-merge patches the team applies over ``files`` (llm-d's guides)
    patches: tuple[str, ...] = ()


CASES = {
    "llm-d": Case(
        ("llm-d/optimized-baseline-gpu-vllm-deployment.yaml",),
        {"name": "qwen3-32b", "labels": {"llm-d.ai/role": "decode", "llm-d.ai/model": "Qwen3-32B"},
         "model_version": "qwen3-32b-2025-04"},
        "Deployment/optimized-baseline-nvidia-gpu-vllm-decode",
    ),
    "llm-d-recipe": Case(
        ("llm-d/recipes-single-host-decode-deployment.yaml",),
        {"name": "decode", "workload": "decode", "kind": "Deployment"},
        "Deployment/decode",
        ("llm-d/optimized-baseline-gpu-vllm-patch-vllm.yaml",),
    ),
    "production-stack": Case(
        ("production-stack/disaggregated-prefill-orchestrated-decode-deploy.yaml",),
        {"name": "decode", "workload": "decode"},
        "Deployment/decode",
    ),
    "inference-extension": Case(
        ("gateway-api-inference-extension/vllm-gpu-deployment.yaml",),
        {"name": "qwen3-32b", "workload": "vllm-qwen3-32b", "prompt_version": "v2"},
        "Deployment/vllm-qwen3-32b",
    ),
    "leaderworkerset": Case(
        ("lws/vllm-gpu-lws.yaml",),
        {"name": "llama-405b", "workload": "vllm", "kind": "LeaderWorkerSet", "engine_port": 8080},
        "LeaderWorkerSet/vllm.leaderTemplate",
    ),
}  # fmt: skip


@pytest.fixture(scope="module")
def kubectl() -> str:
    return tool("kubectl")


def component(tmp_path: Path, models: list[dict[str, Any]]) -> Path:
    """The injection Component ``generate k8s`` renders for a site with ``models``."""
    site_file = tmp_path / "sites" / "injected.yaml"
    site_file.parent.mkdir(parents=True)
    site_file.write_text(yaml.safe_dump({"namespace": "inference", "models": models}))
    site = load_site(site_file)
    folder = tmp_path / "inject"
    folder.mkdir()
    for name, text in inject_component(site).items():
        (folder / Path(name).name).write_text(text)
    return folder


def kustomize(kubectl: str, folder: Path) -> list[dict[str, Any]]:
    result = subprocess.run(
        [kubectl, "kustomize", "--load-restrictor", "LoadRestrictionsNone", str(folder)],
        capture_output=True, text=True, timeout=120, check=False,
    )  # fmt: skip
    assert result.returncode == 0, result.stderr
    return [d for d in yaml.safe_load_all(result.stdout) if d]


def render(kubectl: str, tmp_path: Path, case: Case, with_component: bool) -> list[dict[str, Any]]:
    folder = tmp_path / ("injected" if with_component else "plain")
    folder.mkdir(exist_ok=True)
    kustomization: dict[str, Any] = {
        "apiVersion": "kustomize.config.k8s.io/v1beta1",
        "kind": "Kustomization",
        "resources": [str(EXAMPLES / f) for f in case.files],
    }
    if case.patches:
        kustomization["patches"] = [{"path": str(EXAMPLES / p)} for p in case.patches]
    if with_component:
        kustomization["components"] = [os.path.relpath(component(tmp_path, [case.model]), folder)]
    (folder / "kustomization.yaml").write_text(yaml.safe_dump(kustomization))
    return kustomize(kubectl, folder)


def templates(documents: list[dict[str, Any]]) -> dict[str, dict[str, Any]]:
    return {where: t for d in documents for where, t in pod_templates(d)}


def parse(args: list[str], where: str) -> dict[str, Any]:
    """The parameters the real command line makes of a container's arguments."""
    command = main.get_command(click.Context(main), args[0])
    assert command is not None, f"{where}: no command {args[0]!r}"
    try:
        return dict(command.make_context(args[0], list(args[1:])).params)
    except click.ClickException as exc:
        pytest.fail(f"{where}: {exc.format_message()}")


def _port_of(listen: str) -> int:
    return int(listen.rpartition(":")[2])


@pytest.mark.parametrize("name", sorted(CASES))
def test_an_injected_pod_works_and_validates(kubectl: str, tmp_path: Path, name: str) -> None:
    case = CASES[name]
    before = templates(render(kubectl, tmp_path, case, with_component=False))
    documents = render(kubectl, tmp_path, case, with_component=True)
    after = templates(documents)
    assert set(after) == set(before)
    template = after[case.injected]
    spec = template["spec"]
    ours = {c["name"]: c for c in spec["containers"] if c["name"].startswith("inferwatch-")}
    assert set(ours) == {"inferwatch-sidecar", "inferwatch-proxy"}, case.injected
    theirs = [c for c in spec["containers"] if c["name"] not in ours]
    assert theirs == before[case.injected]["spec"]["containers"], "the engine was changed"
    # every other pod template (an LWS's workers) is as it was
    for where in set(after) - {case.injected}:
        assert after[where] == before[where], where

    ports = [p for c in spec["containers"] for p in c.get("ports", [])]
    numbers = [p["containerPort"] for p in ports]
    assert len(numbers) == len(set(numbers)), f"two containers claim a port: {numbers}"
    named = {p["name"]: p["containerPort"] for p in ports if "name" in p}
    sidecar = parse(ours["inferwatch-sidecar"]["args"], "sidecar")
    proxy = parse(ours["inferwatch-proxy"]["args"], "proxy")
    assert _port_of(sidecar["listen"]) == named["iw-metrics"]
    assert _port_of(proxy["listen"]) == named["iw-proxy"]
    assert _port_of(proxy["metrics_listen"]) == named["iw-tenants"]
    assert proxy["metrics_listen"].startswith("0.0.0.0:"), "Prometheus scrapes it from outside"
    engine_port = case.model.get("engine_port", 8000)
    assert sidecar["engine_url"] == proxy["upstream"] == f"http://127.0.0.1:{engine_port}"
    engine_ports = {p["containerPort"] for c in theirs for p in c.get("ports", [])}
    assert engine_port in engine_ports, f"the engine does not declare {engine_port}"
    assert sidecar["gpu_scope"] == "agent" and sidecar["node_agent_url"]
    env = {e["name"]: e.get("valueFrom") for e in ours["inferwatch-sidecar"]["env"]}
    assert env["POD_NAME"] == {"fieldRef": {"fieldPath": "metadata.name"}}
    assert env["POD_NAMESPACE"] == {"fieldRef": {"fieldPath": "metadata.namespace"}}
    assert env["NODE_NAME"] == {"fieldRef": {"fieldPath": "spec.nodeName"}}
    for container in ours.values():
        for probe in ("readinessProbe", "livenessProbe"):
            if probe in container:
                assert container[probe]["httpGet"]["port"] in named, (container["name"], probe)
        assert container["readinessProbe"]["httpGet"]["path"] == "/readyz"
        assert not container.get("volumeMounts"), "injection adds no volume"
        resources = container["resources"]
        assert set(resources["requests"]) == set(resources["limits"]) == {"cpu", "memory"}

    labels = template["metadata"]["labels"]
    by_kind = {d["kind"]: d for d in documents if d["metadata"]["name"].endswith("-inferwatch")}
    monitor, service, policy = by_kind["PodMonitor"], by_kind["Service"], by_kind["NetworkPolicy"]
    for selector in (monitor["spec"]["selector"]["matchLabels"], service["spec"]["selector"],
                     policy["spec"]["podSelector"]["matchLabels"]):  # fmt: skip
        assert all(labels.get(k) == v for k, v in selector.items()), selector
    scraped = {e["port"] for e in monitor["spec"]["podMetricsEndpoints"]}
    assert scraped == {"iw-metrics", "iw-tenants"} and scraped <= set(named)
    assert service["spec"]["ports"][0]["targetPort"] in named
    open_rule, guarded_rule = policy["spec"]["ingress"]
    guarded = {p["port"] for p in guarded_rule["ports"]}
    assert guarded == {named["iw-metrics"], named["iw-tenants"]}

    def opened(port: int) -> bool:
        return any(
            r["protocol"] == "TCP" and r["port"] <= port <= r.get("endPort", r["port"])
            for r in open_rule["ports"]
        )

    assert not any(opened(p) for p in guarded), "a guarded port is open to everyone"
    assert all(opened(p) for p in {*engine_ports, named["iw-proxy"]}), "a port was closed"

    for level in ("baseline", "restricted"):
        assert sorted(violations(template, level)) == sorted(
            violations(before[case.injected], level)
        ), f"injection changed what {level} says"
    for document in documents:
        if document["kind"] == "LeaderWorkerSet":
            for _, pod in pod_templates(document):
                validate({"apiVersion": "v1", "kind": "Pod", **pod})
        else:
            validate(document)


def test_the_helm_post_renderer_applies_the_same_patches(kubectl: str, tmp_path: Path) -> None:
    models = [CASES[name].model for name in ("inference-extension", "leaderworkerset")]
    folder = component(tmp_path, models)
    files = [*CASES["inference-extension"].files, *CASES["leaderworkerset"].files]
    stream = "\n---\n".join((EXAMPLES / f).read_text() for f in files)
    result = subprocess.run(
        [str(POST_RENDERER), str(folder)], input=stream, capture_output=True, text=True,
        timeout=120, check=False,
    )  # fmt: skip
    assert result.returncode == 0, result.stderr
    helm = [d for d in yaml.safe_load_all(result.stdout) if d]
    (tmp_path / "kustomized").mkdir()
    (tmp_path / "kustomized" / "kustomization.yaml").write_text(yaml.safe_dump({
        "resources": [str(EXAMPLES / f) for f in files],
        "components": [os.path.relpath(folder, tmp_path / "kustomized")],
    }))  # fmt: skip
    assert helm == kustomize(kubectl, tmp_path / "kustomized")
    injected = templates(helm)
    for where in ("Deployment/vllm-qwen3-32b", "LeaderWorkerSet/vllm.leaderTemplate"):
        names = [c["name"] for c in injected[where]["spec"]["containers"]]
        assert names[-2:] == ["inferwatch-sidecar", "inferwatch-proxy"], where
    usage = subprocess.run([str(POST_RENDERER)], capture_output=True, text=True, check=False)
    assert usage.returncode == 2 and "usage" in usage.stderr


@pytest.mark.parametrize(
    "files",
    [("dcgm-exporter/dcgm-exporter.yaml", "dcgm-exporter/service-monitor.yaml"),
     ("kserve/hf_isvc.yaml", "kserve/llm-inference-service-qwen2-7b-gpu.yaml"),
     ("production-stack/production-stack_v1alpha1_vllmruntime.yaml",)],
    ids=["dcgm-exporter", "kserve", "vllmruntime"],
)  # fmt: skip
def test_what_no_model_names_is_left_as_it_was(
    kubectl: str, tmp_path: Path, files: tuple[str, ...]
) -> None:
    """The node's GPU exporter and the operators' resources (whose pods the operator builds,
    docs/kubernetes.md) are not touched by a Component that names other workloads."""
    case = Case(files, {"name": "decode", "workload": "decode"}, "")
    before = render(kubectl, tmp_path, case, with_component=False)
    after = render(kubectl, tmp_path, case, with_component=True)
    assert [d for d in after if not d["metadata"]["name"].endswith("-inferwatch")] == before


@pytest.mark.parametrize(
    ("model", "message"),
    [
        ({"name": "x"}, "models[0].workload: name the workload, its labels, or both"),
        ({"name": "x", "workload": "w", "engine_port": 9400}, "models[0].engine_port: 9400"),
        ({"name": "X", "workload": "w"}, "models[0].name"),
        ({"name": "x", "labels": {"bad key!": "v"}}, "models[0].labels.bad key!"),
        ({"name": "x", "workload": "w", "kind": "CronJob"}, "models[0].kind"),
        ({"name": "x", "workload": "w", "extra": 1}, "models[0].extra: unknown field"),
    ],
)
def test_a_bad_model_entry_is_one_line(
    tmp_path: Path, model: dict[str, Any], message: str
) -> None:
    site_file = tmp_path / "bad.yaml"
    site_file.write_text(yaml.safe_dump({"models": [model]}))
    with pytest.raises(SiteError) as error:
        load_site(site_file)
    assert message in str(error.value) and "\n" not in str(error.value)


def test_two_models_of_one_name_are_refused(tmp_path: Path) -> None:
    site_file = tmp_path / "twice.yaml"
    entry = {"name": "x", "workload": "w"}
    site_file.write_text(yaml.safe_dump({"models": [entry, entry]}))
    with pytest.raises(SiteError, match="named twice"):
        load_site(site_file)


def test_the_injected_ports_are_the_ones_the_policy_guards() -> None:
    (model,) = [inject.Model("m", workload="w")]
    sidecar, proxy = inject.containers(model)
    assert {p["name"] for c in (sidecar, proxy) for p in c["ports"]} == set(inject.PORTS)


def test_a_sites_tracing_reaches_the_injected_proxy(tmp_path: Path) -> None:
    site_file = tmp_path / "traced.yaml"
    site_file.write_text(yaml.safe_dump({
        "models": [{"name": "m", "workload": "w", "kind": "Deployment"}],
        "tracing": {"otlp_endpoint": "http://collector:4318", "sampling_ratio": 0.25},
    }))  # fmt: skip
    kustomization = yaml.safe_load(inject_component(load_site(site_file))[
        "traced/inject/kustomization.yaml"])  # fmt: skip
    (patch,) = kustomization["patches"]
    added = [op["value"] for op in json.loads(patch["patch"]) if op["path"].endswith("/-")]
    (proxy,) = [c for c in added if c["name"] == "inferwatch-proxy"]
    params = parse(proxy["args"], "proxy")
    assert params["otlp_endpoint"] == "http://collector:4318"
    assert params["otlp_sampling_ratio"] == 0.25
    env = {e["name"]: e["valueFrom"]["fieldRef"]["fieldPath"] for e in proxy["env"]}
    assert env == {"POD_NAME": "metadata.name", "POD_NAMESPACE": "metadata.namespace",
                   "NODE_NAME": "spec.nodeName"}  # fmt: skip
