"""The shipped Kubernetes manifests call inferwatch with flags it really has.

The manifests are the kit's overlays as ``kubectl kustomize`` renders them (what a cluster
receives), not its source files, which hold patches and partial objects.
"""

from __future__ import annotations

import subprocess
from pathlib import Path
from typing import Any

import click
import pytest
import yaml

from inferwatch.cli import main
from support.shared import find_tool, tool

pytestmark = pytest.mark.unit

KIT = Path(__file__).resolve().parent.parent / "deploy" / "kubernetes"


def render_overlays() -> list[tuple[str, dict[str, Any]]]:
    """(overlay, document) for every object of every overlay; empty without kubectl (the
    first test below then fails or skips as the tools of support.shared do)."""
    kubectl = find_tool("kubectl")
    if kubectl is None:
        return []
    found = []
    for overlay in sorted((KIT / "overlays").glob("*/kustomization.yaml")):
        result = subprocess.run(
            [kubectl, "kustomize", str(overlay.parent)],
            capture_output=True,
            text=True,
            timeout=120,
            check=True,
        )
        found += [(overlay.parent.name, d) for d in yaml.safe_load_all(result.stdout) if d]
    return found


RENDERED = render_overlays()


def inferwatch_containers() -> list[tuple[str, dict[str, Any]]]:
    found = []
    for overlay, document in RENDERED:
        spec = document.get("spec", {}).get("template", {}).get("spec", {})
        for container in spec.get("containers", []):
            if container["image"].startswith("inferwatch"):
                where = f"{overlay}:{document['metadata']['name']}:{container['name']}"
                found.append((where, container))
    return found


CONTAINERS = inferwatch_containers()


def test_manifests_have_inferwatch_containers() -> None:
    tool("kubectl")
    assert len(CONTAINERS) >= 2


@pytest.mark.parametrize(("where", "container"), CONTAINERS, ids=[w for w, _ in CONTAINERS])
def test_container_args_parse(where: str, container: dict[str, Any]) -> None:
    name, *options = container["args"]
    command = main.get_command(click.Context(main), name)
    assert command is not None, f"{where}: no subcommand {name!r}"
    if isinstance(command, click.Group):
        sub, *options = options
        found = command.get_command(click.Context(command), sub)
        assert found is not None, f"{where}: no subcommand {name} {sub!r}"
        command, name = found, sub
    # Parsing checks every option's name and value without running the command.
    context = command.make_context(name, options)
    assert context.params


def test_readiness_points_at_the_sidecar() -> None:
    probes = [c.get("readinessProbe") for _, c in CONTAINERS if c.get("readinessProbe")]
    assert probes and all(p["httpGet"]["path"] == "/readyz" for p in probes)


def documents(kind: str) -> list[dict[str, Any]]:
    return [document for _, document in RENDERED if document.get("kind") == kind]


def test_pod_monitors_are_picked_up_by_a_default_kube_prometheus_stack() -> None:
    monitors = documents("PodMonitor")
    assert monitors
    for monitor in monitors:
        assert "release" in monitor["metadata"].get("labels", {}), monitor["metadata"]["name"]
        for endpoint in monitor["spec"]["podMetricsEndpoints"]:
            targets = {r.get("targetLabel") for r in endpoint.get("relabelings", [])}
            assert "node" in targets  # node comes from discovery, as pod and namespace do


def test_sidecars_scoped_by_the_node_agent_know_their_pod_and_node() -> None:
    """The agent answers for a named pod and a sidecar checks the answer's node: both come
    from the downward API. No replica mounts the kubelet's socket itself."""
    scoped = 0
    for deployment in documents("Deployment"):
        spec = deployment["spec"]["template"]["spec"]
        assert not any("hostPath" in v for v in spec.get("volumes", [])), deployment["metadata"]
        for container in spec["containers"]:
            if "--gpu-scope=agent" not in container.get("args", []):
                continue
            env = {e["name"] for e in container.get("env", [])}
            assert {"POD_NAME", "POD_NAMESPACE", "NODE_NAME"} <= env, container["name"]
            assert any(a.startswith("--node-agent-url=") for a in container["args"])
            scoped += 1
    assert scoped, "no sidecar asks the node agent for its GPUs"


def test_tenant_metrics_are_scraped_on_a_port_no_service_exposes() -> None:
    """Per-tenant series live on the proxy's --metrics-listen port: the PodMonitor must scrape
    that port (a named container port), and no Service may route clients to it."""
    proxies = [c for w, c in CONTAINERS if c["args"][0] == "proxy"]
    assert proxies
    for proxy in proxies:
        (listen,) = [a for a in proxy["args"] if a.startswith("--metrics-listen=")]
        port = int(listen.rsplit(":", 1)[1])
        (name,) = [p["name"] for p in proxy["ports"] if p["containerPort"] == port]
        scraped = {
            e["port"] for m in documents("PodMonitor") for e in m["spec"]["podMetricsEndpoints"]
        }
        assert name in scraped
        exposed = {
            str(p.get("targetPort")) for s in documents("Service") for p in s["spec"]["ports"]
        }
        assert name not in exposed and str(port) not in exposed
