"""The kit's autoscaling components, rendered by ``kubectl kustomize`` and checked offline.

Schemas are covered by test_k8s.py (kubernetes-validate for the HPA, the KEDA CRD read in
place for the ScaledObject); here: what they scale on, how fast, and that every query the
HPA's adapter and KEDA send evaluates on the recorded series to the figure it should, in
promtool's PromQL engine with the generated recording rules loaded.
"""

from __future__ import annotations

import copy
import subprocess
from pathlib import Path
from typing import Any

import jsonschema
import pytest
import yaml

from inferwatch.alerts import writer
from inferwatch.k8s import autoscaling
from inferwatch.k8s.overlay import render_overlay
from inferwatch.k8s.site import SiteError, load_site
from inferwatch.mixin import config as alert_config
from support.k8s import KIT, render, validate
from support.shared import tool

pytestmark = pytest.mark.proc

SCALED = autoscaling.scaled_model(KIT)
#: the sidecar's label set on the kit's model, as test_alerts' promtool cases use it
LABELS = (
    'engine="vllm",engine_version="0.33.0",job="inferwatch-sidecar",namespace="inference",'
    'prompt_version="unknown"'
)


def _documents(kubectl: str, overlay: str) -> list[dict[str, Any]]:
    return copy.deepcopy(list(render(kubectl, overlay)))


def _one(documents: list[dict[str, Any]], kind: str, name: str) -> dict[str, Any]:
    (found,) = [d for d in documents if d["kind"] == kind and d["metadata"]["name"] == name]
    return found


@pytest.fixture(scope="module")
def kubectl() -> str:
    return tool("kubectl")


def test_the_kit_scales_its_model_deployment() -> None:
    assert (
        autoscaling.Scaled("llama-8b", "meta-llama/Llama-3.1-8B-Instruct", "2024-07-23", 2)
        == SCALED
    )


def test_the_hpa_scales_on_the_recorded_signals_at_the_configured_targets(
    kubectl: str,
) -> None:
    documents = _documents(kubectl, "single-cluster")
    site = load_site(KIT / "sites" / "single-cluster.yaml")
    hpa = _one(documents, "HorizontalPodAutoscaler", "llama-8b")
    spec = hpa["spec"]
    target = spec["scaleTargetRef"]
    assert (target["kind"], target["name"]) == ("Deployment", "llama-8b")
    assert (spec["minReplicas"], spec["maxReplicas"]) == (site.min_replicas, site.max_replicas)
    assert {m["type"] for m in spec["metrics"]} == {"External"}  # no CPU, no memory
    targets = alert_config.load().autoscaling["targets"]
    assert {m["external"]["metric"]["name"]: m["external"]["target"] for m in spec["metrics"]} == {
        autoscaling.metric_name(SCALED, signal): {
            "type": "Value",
            "value": autoscaling.quantity(float(value)),
        }
        for signal, value in targets.items()
    }
    for metric in spec["metrics"]:
        assert metric["external"]["metric"]["selector"] == {
            "matchLabels": {"model_version": SCALED.model_version}
        }
    # the adapter serves each of those names, once
    values = yaml.safe_load(
        (KIT / "overlays" / "single-cluster" / "prometheus-adapter-values.yaml").read_text()
    )
    served = [rule["name"]["as"] for rule in values["rules"]["external"]]
    assert sorted(served) == sorted(m["external"]["metric"]["name"] for m in spec["metrics"])
    assert values["prometheus"] == {
        "url": "http://kube-prometheus-stack-prometheus.monitoring.svc",
        "port": 9090,
    }
    assert values["rules"]["default"] is False
    for rule in values["rules"]["external"]:
        assert set(rule) == {"seriesQuery", "resources", "name", "metricsQuery"}
        assert rule["resources"] == {"namespaced": False}
        assert "<<.LabelMatchers>>" in rule["metricsQuery"]


def test_the_autoscaler_owns_the_replica_count_of_the_stable_deployment_only(
    kubectl: str,
) -> None:
    for overlay in ("single-cluster", "multi-cluster-east"):
        documents = _documents(kubectl, overlay)
        assert "replicas" not in _one(documents, "Deployment", "llama-8b")["spec"]
        assert _one(documents, "Deployment", "llama-8b-canary")["spec"]["replicas"] == 1


def test_scale_down_is_slow_and_one_replica_at_a_time_scale_up_fast_but_bounded(
    kubectl: str,
) -> None:
    hpa = _one(_documents(kubectl, "single-cluster"), "HorizontalPodAutoscaler", "llama-8b")
    keda = _one(_documents(kubectl, "multi-cluster-east"), "ScaledObject", "llama-8b")
    keda_behavior = keda["spec"]["advanced"]["horizontalPodAutoscalerConfig"]["behavior"]
    for behavior in (hpa["spec"]["behavior"], keda_behavior):
        down, up = behavior["scaleDown"], behavior["scaleUp"]
        # longer than a replica takes to load its weights, so a dip does not cost a warm one
        assert down["stabilizationWindowSeconds"] >= 300
        assert down["selectPolicy"] == "Min"
        assert all(p["type"] == "Pods" and p["value"] == 1 for p in down["policies"])
        assert all(p["periodSeconds"] >= 60 for p in down["policies"])
        assert up["stabilizationWindowSeconds"] == 0
        assert up["selectPolicy"] != "Disabled"
        # bounded: every policy limits pods or percent per period (none above doubling)
        for policy in up["policies"]:
            limit = 100 if policy["type"] == "Percent" else 4
            assert 0 < policy["value"] <= limit and policy["periodSeconds"] >= 15


def test_the_scaled_object_queries_the_sites_prometheus_at_the_configured_targets(
    kubectl: str,
) -> None:
    documents = _documents(kubectl, "multi-cluster-east")
    site = load_site(KIT / "sites" / "multi-cluster-east.yaml")
    spec = _one(documents, "ScaledObject", "llama-8b")["spec"]
    assert spec["scaleTargetRef"]["name"] == "llama-8b"
    assert (spec["minReplicaCount"], spec["maxReplicaCount"]) == (
        site.min_replicas,
        site.max_replicas,
    )
    url = autoscaling.prometheus_url(site.release, site.monitoring_namespace)
    targets = alert_config.load().autoscaling["targets"]
    assert len(spec["triggers"]) == len(targets)
    for trigger, (signal, value) in zip(spec["triggers"], targets.items(), strict=True):
        assert trigger["type"] == "prometheus" and trigger["metricType"] == "Value"
        assert trigger["metadata"]["serverAddress"] == url
        assert float(trigger["metadata"]["threshold"]) == float(value)
        assert trigger["name"] == signal.replace("_", "-")


@pytest.mark.parametrize(
    "breaks",
    [
        lambda d: d["spec"]["triggers"][0].update(type=""),
        lambda d: d["spec"].update(minReplicaCount="2"),
        lambda d: d["spec"]["triggers"][0].update(metdata={}),
    ],
    ids=["empty-trigger-type", "string-count", "misspelt-field"],
)
def test_the_keda_crd_rejects_a_broken_scaled_object(kubectl: str, breaks: Any) -> None:
    document = _one(_documents(kubectl, "multi-cluster-east"), "ScaledObject", "llama-8b")
    validate(document)
    breaks(document)
    with pytest.raises(jsonschema.ValidationError):
        validate(document)


def _series(name: str, labels: str, values: str) -> dict[str, str]:
    return {"series": f"{name}{{{labels}}}", "values": values}


def _replica(model: str, version: str, pod: str, ready: bool, waiting: int, kv: float) -> list:
    labels = f'{LABELS},model="{model}",model_version="{version}",pod="{pod}"'
    return [
        _series("inferwatch_replica_ready", labels + ',condition="engine"', "1x15"),
        _series("inferwatch_replica_ready", labels + ',condition="gpu"', f"{int(ready)}x15"),
        _series("inferwatch_engine_requests_waiting", labels, f"{waiting}x15"),
        _series("inferwatch_engine_kv_cache_usage_ratio", labels, f"{kv}x15"),
    ]


def test_every_autoscaler_query_evaluates_to_its_signal_for_the_kits_model_only(
    tmp_path: Path, promtool: str
) -> None:
    """Each adapter and KEDA query, run by promtool on the generated recording rules, gives
    the kit model's figures; another model serving the same version string is not mixed in."""
    model, version = SCALED.model, SCALED.model_version
    queued = f'{LABELS},model="{model}",model_version="{version}",pod="llama-8b-0"'
    series = [
        *_replica(model, version, "llama-8b-0", True, 6, 0.8),
        # loading: its queue (its warm-up) and its empty cache are left out
        *_replica(model, version, "llama-8b-1", False, 2, 0.0),
        *_replica("Qwen/Qwen3-32B", version, "qwen-0", True, 100, 0.99),
        # 10 requests a minute: 1 waited under 0.5 s, all under 1 s; p90 = 0.5 + 0.5 * 8/9
        _series("inferwatch_engine_request_queue_duration_seconds_bucket",
                queued + ',le="0.5"', "0+1x15"),
        _series("inferwatch_engine_request_queue_duration_seconds_bucket",
                queued + ',le="1.0"', "0+10x15"),
        _series("inferwatch_engine_request_queue_duration_seconds_bucket",
                queued + ',le="+Inf"', "0+10x15"),
    ]  # fmt: skip
    expected = {"queue_per_replica": 6.0, "kv_cache_usage": 0.8, "queue_wait": 0.5 + 0.5 * 8 / 9}
    config = alert_config.load()
    values = autoscaling.adapter_values(config, SCALED, "http://p:9090")
    keda = autoscaling.scaled_object(config, SCALED)
    version_matcher = f'model_version="{version}"'
    cases = []
    for signal, rule, trigger in zip(
        config.autoscaling["targets"], values["rules"]["external"], keda["spec"]["triggers"],
        strict=True,
    ):  # fmt: skip
        hpa_query = rule["metricsQuery"].replace("<<.LabelMatchers>>", version_matcher)
        for expr in (hpa_query, trigger["metadata"]["query"]):
            cases.append(
                {
                    "expr": expr,
                    "eval_time": "10m",
                    "exp_samples": [{"labels": "{}", "value": expected[signal]}],
                }
            )
        # the adapter's discovery query finds the kit model's series
        cases.append({"expr": f"count({rule['seriesQuery']})", "eval_time": "10m",
                      "exp_samples": [{"labels": "{}", "value": 1}]})  # fmt: skip
    rules = writer.default_out() / "recording.yaml"
    test = {
        "rule_files": [str(rules)],
        "evaluation_interval": "1m",
        "tests": [{"interval": "1m", "input_series": series, "promql_expr_test": cases}],
    }
    path = tmp_path / "autoscaling-queries.yaml"
    path.write_text(yaml.safe_dump(test, sort_keys=False))
    done = subprocess.run(
        [promtool, "test", "rules", str(path)],
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )
    assert done.returncode == 0, done.stdout + done.stderr


BAD_SITES = {
    "mode": (
        "autoscaling: {mode: cpu}\n",
        "autoscaling.mode: expected one of none, hpa, keda, got 'cpu'",
    ),
    "min-above-max": (
        "autoscaling: {mode: hpa, min_replicas: 9, max_replicas: 3}\n",
        "autoscaling.min_replicas: 9 is above max_replicas 3",
    ),
    "zero": (
        "autoscaling: {min_replicas: 0}\n",
        "min_replicas: expected an integer from 1 to 1000",
    ),
    "bool": (
        "autoscaling: {max_replicas: true}\n",
        "max_replicas: expected an integer from 1 to 1000",
    ),
    "string": (
        "autoscaling: {max_replicas: '8'}\n",
        "max_replicas: expected an integer from 1 to 1000",
    ),
    "unknown": ("autoscaling: {target_cpu: 80}\n", "autoscaling.target_cpu: unknown field"),
}


@pytest.mark.parametrize(("text", "message"), BAD_SITES.values(), ids=list(BAD_SITES))
def test_a_bad_autoscaling_site_value_is_one_clear_line(
    tmp_path: Path, text: str, message: str
) -> None:
    path = tmp_path / "site.yaml"
    path.write_text(text)
    with pytest.raises(SiteError) as caught:
        load_site(path)
    assert "\n" not in str(caught.value) and message in str(caught.value), caught.value


@pytest.mark.parametrize(
    ("release", "url"),
    [
        ("kube-prometheus-stack", "http://kube-prometheus-stack-prometheus.monitoring.svc:9090"),
        ("kps", "http://kps-kube-prometheus-stack-prometheus.monitoring.svc:9090"),
        ("monitoring-stack", "http://monitoring-stack-kube-prom-prometheus.monitoring.svc:9090"),
    ],
)
def test_the_prometheus_service_is_named_as_the_chart_names_it(release: str, url: str) -> None:
    assert autoscaling.prometheus_url(release, "monitoring") == url


def test_a_site_without_autoscaling_renders_neither_component(tmp_path: Path) -> None:
    path = tmp_path / "plain.yaml"
    path.write_text("namespace: inference\n")
    files = render_overlay(load_site(path), SCALED)
    kustomization = yaml.safe_load(files["plain/kustomization.yaml"])
    assert not any("autoscaling" in c for c in kustomization["components"])
    # no adapter values: the overlay, the receiver's mapping and the node agent's are all
    assert set(files) == {
        "plain/kustomization.yaml", "plain/receiver-mapping.yaml",
        "plain/node-agent/kustomization.yaml",
    }  # fmt: skip
