"""The kit's autoscaling: an HPA on prometheus-adapter's external metrics, or a KEDA
ScaledObject, scaling the model Deployment on the recorded autoscaling signals, never CPU.

Both read the same recording rules (``inferwatch/mixin/recording.py``, group
``inferwatch-recording-autoscaling``) and compare them with the same targets
(``autoscaling.targets`` in ``inferwatch/mixin/config.yaml``). Each signal is already a figure
per ready replica, so both use a ``Value`` target: desired = ceil(current x signal / target).

Model names such as ``meta-llama/Llama-3.1-8B-Instruct`` are not valid Kubernetes label
values, so an HPA cannot select them; each scaled Deployment gets external metrics of its
own (``inferwatch-<deployment>-<signal>``) whose adapter query names the model, and the HPA
selects only the version, which is a valid label value.
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import yaml

from inferwatch import config as layer
from inferwatch.mixin import promql, recording
from inferwatch.mixin.config import Config

MODES = ("none", "hpa", "keda")
COMPONENT = {"hpa": "autoscaling-hpa", "keda": "autoscaling-keda"}
#: the Deployment the kit scales and the file that defines it
DEPLOYMENT_FILE = "base/model/vllm.yaml"

# A new replica loads its weights for minutes, so the fleet grows early and in bounded steps
# (at most 2 pods or 50 % a minute, whichever is more) and shrinks late and one replica at a
# time: a dip in traffic shorter than the 10-minute window never throws a warm replica away.
BEHAVIOR: dict[str, Any] = {
    "scaleUp": {
        "stabilizationWindowSeconds": 0,
        "selectPolicy": "Max",
        "policies": [
            {"type": "Pods", "value": 2, "periodSeconds": 60},
            {"type": "Percent", "value": 50, "periodSeconds": 60},
        ],
    },
    "scaleDown": {
        "stabilizationWindowSeconds": 600,
        "selectPolicy": "Min",
        "policies": [{"type": "Pods", "value": 1, "periodSeconds": 300}],
    },
}
#: how often KEDA asks Prometheus, in seconds (the HPA's own sync period is 15 s too)
POLLING_INTERVAL = 15


@dataclass(frozen=True)
class Scaled:
    """The Deployment to scale and the model and version its sidecar labels series with."""

    deployment: str
    model: str
    model_version: str
    #: the Deployment's own count, which an autoscaled site replaces
    replicas: int = 1


def scaled_model(kit: Path) -> Scaled:
    """Read the model Deployment of the kit's base: its name, the engine's ``--model`` and
    the sidecar's ``--model-version`` (the labels the recording rules keep)."""
    path = kit / DEPLOYMENT_FILE
    documents = layer.parse_all(layer.read_text(path), str(path))
    (deployment,) = [d for d in documents if d and d["kind"] == "Deployment"]
    containers = {c["name"]: c for c in deployment["spec"]["template"]["spec"]["containers"]}
    engine_args = [str(a) for a in containers["vllm"]["args"]]
    model = engine_args[engine_args.index("--model") + 1]
    (version,) = [
        str(a).split("=", 1)[1]
        for a in containers["inferwatch-sidecar"]["args"]
        if str(a).startswith("--model-version=")
    ]
    replicas = int(deployment["spec"].get("replicas", 1))
    return Scaled(deployment["metadata"]["name"], model, version, replicas)


def metric_name(scaled: Scaled, signal: str) -> str:
    """The external metric the adapter serves for one Deployment's signal."""
    return f"inferwatch-{scaled.deployment}-{signal.replace('_', '-')}"


def query(config: Config, scaled: Scaled, signal: str, matchers: str) -> str:
    """PromQL for one signal of one model; ``matchers`` are added inside the braces (the
    adapter's ``<<.LabelMatchers>>``, or the version for KEDA). The largest over clusters:
    a Prometheus that sees several scales on the one under most pressure."""
    name, own = recording.autoscaling_signals(config)[signal]
    parts = [f"model={promql.quoted(scaled.model)}", *own, matchers]
    return f"max({name}{{{','.join(p for p in parts if p)}}})"


def quantity(value: float) -> str:
    """A target as a Kubernetes quantity: whole numbers plain, else in thousandths (750m)."""
    return str(int(value)) if value == int(value) else f"{round(value * 1000)}m"


def _targets(config: Config) -> Mapping[str, float]:
    return {signal: float(v) for signal, v in config.autoscaling["targets"].items()}


def hpa(config: Config, scaled: Scaled) -> dict[str, Any]:
    metrics = [
        {
            "type": "External",
            "external": {
                "metric": {
                    "name": metric_name(scaled, signal),
                    "selector": {"matchLabels": {"model_version": scaled.model_version}},
                },
                "target": {"type": "Value", "value": quantity(target)},
            },
        }
        for signal, target in _targets(config).items()
    ]
    return {
        "apiVersion": "autoscaling/v2",
        "kind": "HorizontalPodAutoscaler",
        "metadata": {"name": scaled.deployment, "labels": _labels(scaled)},
        "spec": {
            "scaleTargetRef": {
                "apiVersion": "apps/v1",
                "kind": "Deployment",
                "name": scaled.deployment,
            },
            # the overlay sets both from its site file
            "minReplicas": 1,
            "maxReplicas": 1,
            "metrics": metrics,
            "behavior": BEHAVIOR,
        },
    }


def scaled_object(config: Config, scaled: Scaled) -> dict[str, Any]:
    version = f"model_version={promql.quoted(scaled.model_version)}"
    triggers = [
        {
            "type": "prometheus",
            "name": signal.replace("_", "-"),
            "metricType": "Value",
            "metadata": {
                # the overlay sets the site's Prometheus
                "serverAddress": "http://prometheus:9090",
                "query": query(config, scaled, signal, version),
                "threshold": promql.number(target),
            },
        }
        for signal, target in _targets(config).items()
    ]
    return {
        "apiVersion": "keda.sh/v1alpha1",
        "kind": "ScaledObject",
        "metadata": {"name": scaled.deployment, "labels": _labels(scaled)},
        "spec": {
            "scaleTargetRef": {"apiVersion": "apps/v1", "kind": "Deployment",
                               "name": scaled.deployment},
            "pollingInterval": POLLING_INTERVAL,
            "minReplicaCount": 1,
            "maxReplicaCount": 1,
            "advanced": {"horizontalPodAutoscalerConfig": {"behavior": BEHAVIOR}},
            "triggers": triggers,
        },
    }  # fmt: skip


def adapter_rules(config: Config, scaled: Scaled) -> list[dict[str, Any]]:
    """prometheus-adapter ``externalRules``: one external metric per signal of the model.

    Not namespaced: the recording rules aggregate over pods, so their series carry no
    namespace for the adapter to match the HPA's against."""
    rules = []
    for signal in _targets(config):
        name, own = recording.autoscaling_signals(config)[signal]
        selector = ",".join((f"model={promql.quoted(scaled.model)}", *own))
        rules.append(
            {
                "seriesQuery": f"{name}{{{selector}}}",
                "resources": {"namespaced": False},
                "name": {"matches": "^(.*)$", "as": metric_name(scaled, signal)},
                "metricsQuery": query(config, scaled, signal, "<<.LabelMatchers>>"),
            }
        )
    return rules


def adapter_values(config: Config, scaled: Scaled, prometheus_url: str) -> dict[str, Any]:
    """Values for the prometheus-community/prometheus-adapter chart: the site's Prometheus
    and only our external rules (the chart's default pod rules are turned off)."""
    base, _, port = prometheus_url.rpartition(":")
    return {
        "prometheus": {"url": base, "port": int(port)},
        "rules": {"default": False, "external": adapter_rules(config, scaled)},
    }


def prometheus_url(release: str, namespace: str) -> str:
    """kube-prometheus-stack's Prometheus Service: the chart's fullname (the release, with
    the chart's name added unless the release already has it, cut to 26 characters) plus
    ``-prometheus``."""
    chart = "kube-prometheus-stack"
    fullname = release if chart in release else f"{release}-{chart}"
    fullname = fullname[:26].rstrip("-")
    return f"http://{fullname}-prometheus.{namespace}.svc:9090"


def render_components(config: Config, scaled: Scaled) -> dict[str, str]:
    """Relative path (under ``components/``) -> the text of both components' files, without
    the generated-file marker (the caller adds it)."""
    # the autoscaler owns the replica count; a count in the Deployment would reset it on
    # every apply
    unpin = {
        # kustomize matches a name before the canary's suffix too; the label keeps it out
        "target": {
            "kind": "Deployment",
            "name": scaled.deployment,
            "labelSelector": "inferwatch.io/track!=canary",
        },
        "patch": json.dumps([{"op": "remove", "path": "/spec/replicas"}]),
    }
    files = {}
    for mode, document in (("hpa", hpa(config, scaled)), ("keda", scaled_object(config, scaled))):
        folder = COMPONENT[mode]
        resource = "hpa.yaml" if mode == "hpa" else "scaledobject.yaml"
        kustomization = {
            "apiVersion": "kustomize.config.k8s.io/v1alpha1",
            "kind": "Component",
            "resources": [resource],
            "patches": [unpin],
        }
        files[f"{folder}/kustomization.yaml"] = _dump(kustomization)
        files[f"{folder}/{resource}"] = _dump(document)
    return files


def overlay_patches(
    mode: str, scaled: Scaled, min_replicas: int, max_replicas: int, url: str, signals: int
) -> list[dict[str, Any]]:
    """The overlay's patches that put the site's replica bounds (and for KEDA its
    Prometheus) into the component's object."""
    if mode == "hpa":
        kind, ops = "HorizontalPodAutoscaler", [
            {"op": "replace", "path": "/spec/minReplicas", "value": min_replicas},
            {"op": "replace", "path": "/spec/maxReplicas", "value": max_replicas},
        ]
    else:
        kind, ops = "ScaledObject", [
            {"op": "replace", "path": "/spec/minReplicaCount", "value": min_replicas},
            {"op": "replace", "path": "/spec/maxReplicaCount", "value": max_replicas},
        ] + [
            {"op": "replace", "path": f"/spec/triggers/{i}/metadata/serverAddress", "value": url}
            for i in range(signals)
        ]
    return [{"target": {"kind": kind, "name": scaled.deployment}, "patch": json.dumps(ops)}]


def _labels(scaled: Scaled) -> dict[str, str]:
    return {"app.kubernetes.io/name": scaled.deployment, "app.kubernetes.io/part-of": "inferwatch"}


def _dump(document: Any) -> str:
    return yaml.safe_dump(document, sort_keys=False, width=100)
