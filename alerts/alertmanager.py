"""The recommended Alertmanager configuration for the generated alerts: routing and inhibition.

Routing follows the severities the rules carry: ``critical`` pages, ``warning`` opens a
ticket, ``info`` is kept for troubleshooting and sent nowhere. Every critical and warning alert
also goes to the runbook automation receiver first (``continue: true``), which decides on its
own what it may act on. Notifications are grouped per alert name, cluster and model, so that a
model whose replicas all fail at once pages once.

Inhibition hides what is explained by something worse that is already firing:

- the critical twin of an alert hides its warning (and both hide an ``info`` twin) for the
  same series;
- a critical GPU fault (lost or unhealthy GPU, XID, uncorrectable ECC, failed row remap) hides
  the symptoms of the replica that GPU serves (engine down, not ready, errors, latency, probes),
  matched on the scrape target, the one label that the sidecar's GPU and engine series share;
- an engine that is down hides the latency alerts of its model version.

Alertmanager treats a label that is missing on both sides as equal, so every rule whose
``equal`` names a label also requires that label on the target: a GPU fault never silences a
fleet-wide alert that has no ``instance`` label.

The receivers are webhooks whose URLs come from the ``alertmanager`` section of the alerts
config (:func:`settings`); by default all three point at the local runbook receiver.
"""

from __future__ import annotations

import re
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any
from urllib.parse import urlsplit

import yaml

#: where ``inferwatch runbooks serve`` listens by default; the demo replaces it with its own
DEFAULT_WEBHOOK = "http://127.0.0.1:9095/alerts"
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
    "InferwatchReplicaNotReady",
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

_DURATION = re.compile(r"^(?:\d+y)?(?:\d+w)?(?:\d+d)?(?:\d+h)?(?:\d+m)?(?:\d+s)?(?:\d+ms)?$")
_FIELDS = {"receivers", "group_wait", "group_interval", "repeat_interval"}


class AlertmanagerConfigError(ValueError):
    """A bad ``alertmanager`` section; the message names the file, the field and the reason."""


@dataclass(frozen=True)
class Settings:
    """What a user chooses; everything else in the config is the recommendation."""

    #: webhook URLs per receiver name (page, ticket, automation); an empty list drops
    receivers: Mapping[str, tuple[str, ...]] = field(
        default_factory=lambda: {name: (DEFAULT_WEBHOOK,) for name in RECEIVERS}
    )
    group_wait: str = "30s"
    group_interval: str = "5m"
    #: per receiver: pages are repeated sooner than tickets
    repeat_interval: Mapping[str, str] = field(
        default_factory=lambda: {"page": "4h", "ticket": "24h", "automation": "1h"}
    )


def settings(section: Any, source: str) -> Settings:
    """The ``alertmanager`` section of an alerts config (None: defaults), validated."""
    if section is None:
        return Settings()
    where = f"{source}: alertmanager"
    if not isinstance(section, Mapping):
        raise AlertmanagerConfigError(f"{where}: expected a mapping")
    unknown = sorted(set(section) - _FIELDS)
    if unknown:
        raise AlertmanagerConfigError(
            f"{where}.{unknown[0]}: unknown field (known: {', '.join(sorted(_FIELDS))})"
        )
    defaults = Settings()
    receivers = dict(defaults.receivers)
    for name, urls in _mapping(section, "receivers", where).items():
        receivers[name] = _urls(urls, f"{where}.receivers.{name}")
    repeat = dict(defaults.repeat_interval)
    for name, value in _mapping(section, "repeat_interval", where).items():
        repeat[name] = _duration(value, f"{where}.repeat_interval.{name}")
    return Settings(
        receivers=receivers,
        group_wait=_duration(section.get("group_wait", defaults.group_wait), f"{where}.group_wait"),
        group_interval=_duration(
            section.get("group_interval", defaults.group_interval), f"{where}.group_interval"
        ),
        repeat_interval=repeat,
    )


def _mapping(section: Mapping[str, Any], key: str, where: str) -> Mapping[str, Any]:
    """A sub-mapping keyed by receiver name; {} when absent."""
    value = section.get(key, {})
    if not isinstance(value, Mapping):
        raise AlertmanagerConfigError(f"{where}.{key}: expected a mapping of receiver names")
    for name in value:
        if name not in RECEIVERS:
            raise AlertmanagerConfigError(
                f"{where}.{key}.{name}: unknown receiver (receivers: {', '.join(RECEIVERS)})"
            )
    return value


def _urls(value: Any, where: str) -> tuple[str, ...]:
    values = [value] if isinstance(value, str) else value
    if not isinstance(values, list):
        raise AlertmanagerConfigError(f"{where}: expected a webhook URL or a list of them")
    for url in values:
        parts = urlsplit(url) if isinstance(url, str) else None
        if parts is None or parts.scheme not in ("http", "https") or not parts.hostname:
            raise AlertmanagerConfigError(f"{where}: expected an http(s) URL, got {url!r}")
    return tuple(values)


def _duration(value: Any, where: str) -> str:
    if not isinstance(value, str) or not value or not _DURATION.match(value):
        raise AlertmanagerConfigError(
            f"{where}: expected a duration such as 30s, 5m or 4h, got {value!r}"
        )
    return value


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


def document(chosen: Settings) -> dict[str, Any]:
    """The Alertmanager configuration as data."""
    repeat = chosen.repeat_interval
    receivers: list[dict[str, Any]] = [
        {
            "name": name,
            **(
                {"webhook_configs": [{"url": url, "send_resolved": True} for url in urls]}
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
                    "group_wait": "0s",  # act on the first alert, not after the batch
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


def render(chosen: Settings, header: str) -> str:
    """The config file's text: ``header`` (the generated-file marker) and the YAML."""
    body = yaml.safe_dump(document(chosen), sort_keys=False, default_flow_style=False, width=100)
    return header + body
