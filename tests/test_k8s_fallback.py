"""Model fallback on the Gateway API: the kit's route carries another model's Service at weight
0, and the receiver's HTTPRoute shift moves the stable replicas' weight there and back.

The route is the one ``kubectl kustomize`` renders for the site that names a fallback, served
by the fake Kubernetes API (``inferwatch/drill/kubefake.py``), which checks every write against
the Gateway API CRD. The mapping rules are the ones docs/kubernetes.md gives, read by the
receiver's own config parser; the action is the receiver's ``kubernetes_httproute_shift``.
"""

from __future__ import annotations

import asyncio
import re
from collections.abc import Iterator
from typing import Any

import pytest
import yaml
from kubernetes import client

from inferwatch.drill.kubefake import FakeKube, httproute_validator
from inferwatch.k8s.site import load_site
from inferwatch.runbooks import config as mapping
from inferwatch.runbooks.actions.base import Alert, Outcome
from inferwatch.runbooks.actions.httproute import HTTPRouteShift
from inferwatch.runbooks.actions.kubernetes_api import connect
from support.k8s import KIT, render
from support.shared import REPO, shared_path, tool

pytestmark = pytest.mark.proc

SITE = "single-cluster"
CRD = shared_path("fixtures/crds/gateway.networking.k8s.io_httproutes.yaml")


def documented_rules() -> mapping.Config:
    """The fallback rules of docs/kubernetes.md, parsed as the receiver parses its config."""
    text = (REPO / "docs" / "kubernetes.md").read_text(encoding="utf-8")
    (block,) = re.findall(r"```yaml\n(# receiver mapping.*?)```", text, flags=re.S)
    return mapping.parse(yaml.safe_load(block), "docs/kubernetes.md")


@pytest.fixture
def fake() -> FakeKube:
    kubectl = tool("kubectl")
    (route,) = [d for d in render(kubectl, SITE) if d["kind"] == "HTTPRoute"]
    served = FakeKube(httproute_validator(str(CRD)))
    served.add_httproute(route["metadata"]["namespace"], route["metadata"]["name"], route["spec"])
    return served


@pytest.fixture
def api(fake: FakeKube) -> Iterator[client.ApiClient]:
    with fake.serve() as url, connect(url) as api_client:
        yield api_client


def weights(fake: FakeKube) -> dict[str, int]:
    route = fake.get("httproutes", "inference", "llama-8b")
    return {r["name"]: r["weight"] for r in route["spec"]["rules"][1]["backendRefs"]}


def alert(name: str, fingerprint: str) -> Alert:
    return Alert(
        status="firing",
        labels={"alertname": name, "namespace": "inference", "severity": "critical",
                "model": "meta-llama/Llama-3.1-8B-Instruct", "model_version": "2024-07-23"},
        annotations={},
        starts_at="2026-12-01T08:00:00Z",
        ends_at="0001-01-01T00:00:00Z",
        fingerprint=fingerprint,
    )  # fmt: skip


def run(coro: Any) -> Outcome:
    result: Outcome = asyncio.run(coro)
    return result


def test_the_route_carries_the_sites_fallback_at_weight_zero(fake: FakeKube) -> None:
    site = load_site(KIT / "sites" / f"{SITE}.yaml")
    assert weights(fake) == {"llama-8b": 95, "llama-8b-canary": 5, site.fallback: 0}
    assert {m.name for m in site.models} >= {"qwen3-32b"}
    assert site.fallback == "qwen3-32b-inferwatch", "the injected model's proxy Service"


@pytest.mark.parametrize(
    "alertname", ["InferwatchDegenerateOutputRising", "InferwatchKVCacheSaturated"]
)
def test_a_quality_or_capacity_alert_moves_the_weight_to_the_fallback_and_back(
    fake: FakeKube, api: client.ApiClient, alertname: str
) -> None:
    rules = documented_rules().rules_for(alert(alertname, "f1").labels)
    (rule,) = rules
    assert rule.action == HTTPRouteShift.name
    action = HTTPRouteShift(api)
    (step,) = action.plan(alert(alertname, "f1"), {**rule.params, "step_interval": 0})
    shifted = run(action.apply(step))
    assert shifted.ok and shifted.changed, shifted.detail
    assert weights(fake) == {"llama-8b": 0, "llama-8b-canary": 5, "qwen3-32b-inferwatch": 95}
    assert run(action.verify(step)).ok
    back = run(action.revert(step))
    assert back.ok and back.changed, back.detail
    assert weights(fake) == {"llama-8b": 95, "llama-8b-canary": 5, "qwen3-32b-inferwatch": 0}
