"""The recommended Alertmanager configuration for the generated alerts: routing and inhibition.

Routing follows the severities the rules carry: ``critical`` pages, ``warning`` opens a
ticket, ``info`` is kept for troubleshooting and sent nowhere. Every critical and warning alert
also goes to the runbook automation receiver first (``continue: true``), alone and at once,
and the automation decides on its own what it may act on. People's notifications are grouped
per alert name, cluster and model, so that a model whose replicas all fail at once pages once.

Inhibition hides what is explained by something worse that is already firing:

- the critical twin of an alert hides its warning (and both hide an ``info`` twin) for the
  same series;
- a critical GPU fault (lost or unhealthy GPU, XID, uncorrectable ECC, failed row remap) hides
  the symptoms of the replica that GPU serves (engine down, not ready, KV pressure, probes, and
  any per-replica latency or error alert), matched on the scrape target (``instance``), the one
  label that the sidecar's GPU and engine series share;
- an engine that is down hides the latency alerts of its model version.

Alertmanager treats a label that is missing on both sides as equal, so the rules across alert
names also require the labels they match on to be present on the target: a GPU fault never
silences a model-wide alert, which has no ``instance`` label.

The receivers are webhooks whose URLs (and bearer token files) come from the ``alertmanager``
section of the alerts config (declared and checked by :mod:`.routing`); by default only the
automation has one, the local ``inferwatch runbooks serve``.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from inferwatch.alerts import routing
from inferwatch.alerts.routing import Settings
from inferwatch.mixin.config import Config, ConfigError

RECEIVERS = ("page", "ticket", "automation")
#: the labels a notification group is keyed on
GROUP_BY = ("alertname", "cluster", "model")
#: the labels that identify one series of one alert, for critical-over-warning
SERIES_LABELS = ("alertname", "cluster", "model", "model_version", "instance", "gpu_uuid",
                 "tenant")  # fmt: skip
#: the label that identifies one replica on both its GPU and its engine series
REPLICA_LABELS = ("cluster", "instance")

GPU_FAULTS = (
    "InferwatchGPUUnhealthy",
    "InferwatchGPUXidErrors",
    "InferwatchGPUEccUncorrectable",
    "InferwatchGPURowRemapFailure",
)
REPLICA_SYMPTOMS = (
    "InferwatchEngineDown",
    "InferwatchEngineStalled",
    "InferwatchReplicaNotReady",
    "InferwatchReplicaStuckInWarmup",
    "InferwatchErrorRatioHigh",
    "InferwatchTTFTHigh",
    "InferwatchTPOTHigh",
    "InferwatchE2ELatencyHigh",
    "InferwatchKVCacheSaturated",
    "InferwatchPreemptionStorm",
    "InferwatchGPUClocksThrottled",
    "InferwatchGPUIdleWaste",
    "InferwatchProbeFailing",
    "InferwatchProbePassRateBelowBaseline",
    "InferwatchDegenerateOutputRising",
)
LATENCY_ALERTS = ("InferwatchTTFTHigh", "InferwatchTPOTHigh", "InferwatchE2ELatencyHigh")
#: every alert name the routing and inhibition rules spell (checked against the rule files)
NAMED_ALERTS = tuple(dict.fromkeys((*GPU_FAULTS, *REPLICA_SYMPTOMS, *LATENCY_ALERTS)))


def settings(config: Config) -> Settings:
    """The receivers and intervals the alerts config chose; raises ConfigError (the loader
    calls it, so that a config it accepts always gives a file Alertmanager accepts)."""
    return routing.settings(config.section("alertmanager"), config.source, ConfigError)


def _matchers(**labels: str | Sequence[str]) -> list[str]:
    """Alertmanager matchers: one value is ``=``, several are an anchored ``=~`` alternation."""
    out = []
    for name, value in labels.items():
        if isinstance(value, str):
            out.append(f'{name}="{value}"')
        else:
            out.append(f'{name}=~"{"|".join(value)}"')
    return out


def _present(*labels: str) -> list[str]:
    return [f'{label}=~".+"' for label in labels]


def inhibit_rules() -> list[dict[str, Any]]:
    """The inhibition rules, most specific reason first."""
    return [
        {
            "source_matchers": _matchers(severity="critical"),
            "target_matchers": _matchers(severity=("warning", "info")),
            "equal": list(SERIES_LABELS),
        },
        {
            "source_matchers": _matchers(severity="warning"),
            "target_matchers": _matchers(severity="info"),
            "equal": list(SERIES_LABELS),
        },
        {
            "source_matchers": _matchers(alertname=GPU_FAULTS, severity="critical"),
            "target_matchers": [*_matchers(alertname=REPLICA_SYMPTOMS), *_present("instance")],
            "equal": list(REPLICA_LABELS),
        },
        {
            "source_matchers": _matchers(alertname="InferwatchEngineDown"),
            "target_matchers": [
                *_matchers(alertname=LATENCY_ALERTS),
                *_present("model", "model_version"),
            ],
            "equal": ["cluster", "model", "model_version"],
        },
    ]


def _webhook(url: str, token_file: str) -> dict[str, Any]:
    webhook: dict[str, Any] = {"url": url, "send_resolved": True}
    if token_file:
        webhook["http_config"] = {
            "authorization": {"type": "Bearer", "credentials_file": token_file}
        }
    return webhook


def document(chosen: Settings) -> dict[str, Any]:
    """The Alertmanager configuration as data."""
    repeat = chosen.repeat_interval
    receivers: list[dict[str, Any]] = [
        {
            "name": name,
            **(
                {
                    "webhook_configs": [
                        _webhook(url, chosen.token_files.get(name, "")) for url in urls
                    ]
                }
                if urls
                else {}
            ),
        }
        for name, urls in chosen.receivers.items()
    ]
    receivers.append({"name": "none"})  # info alerts: kept in Alertmanager, sent nowhere
    return {
        "route": {
            "receiver": "ticket",  # an alert without a known severity still reaches someone
            "group_by": list(GROUP_BY),
            "group_wait": chosen.group_wait,
            "group_interval": chosen.group_interval,
            "repeat_interval": repeat["ticket"],
            "routes": [
                {
                    "receiver": "automation",
                    "matchers": _matchers(severity=("critical", "warning")),
                    # one notification per alert, sent at once: a second replica's fault must
                    # not wait a group interval behind the first one's
                    "group_by": ["..."],
                    "group_wait": "0s",
                    "repeat_interval": repeat["automation"],
                    "continue": True,
                },
                {
                    "receiver": "page",
                    "matchers": _matchers(severity="critical"),
                    "repeat_interval": repeat["page"],
                },
                {"receiver": "ticket", "matchers": _matchers(severity="warning")},
                {"receiver": "none", "matchers": _matchers(severity="info")},
            ],
        },
        "inhibit_rules": inhibit_rules(),
        "receivers": receivers,
    }
