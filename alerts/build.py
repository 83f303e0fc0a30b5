"""All rule groups for a config: recording rules, then one group per alert layer.

Disabling an alert by name in the config drops every rule of that name here, after the
layers have built them, so no builder needs to know about it.
"""

from __future__ import annotations

from collections.abc import Callable

from inferwatch.alerts import availability, cost, gpu, latency, quality
from inferwatch.mixin import recording
from inferwatch.mixin.config import Config
from inferwatch.mixin.model import Alert, Group

LAYER_BUILDERS: dict[str, Callable[[Config], list[Alert]]] = {
    "latency": latency.alerts,
    "availability": availability.alerts,
    "gpu": gpu.alerts,
    "cost": cost.alerts,
    "quality": quality.alerts,
}


def layers(config: Config) -> dict[str, list[Group]]:
    """File stem -> its groups: ``recording`` and one per layer."""
    result: dict[str, list[Group]] = {"recording": recording.groups(config)}
    for layer, builder in LAYER_BUILDERS.items():
        built = builder(config)
        unknown = {a.name for a in built} - set(config.alert_names)
        if unknown:
            raise AssertionError(f"alerts without a config entry: {sorted(unknown)}")
        kept = tuple(a for a in built if not config.alert(a.name).disabled)
        result[layer] = [Group(f"inferwatch-{layer}", kept)]
    return result


def alert_names(config: Config) -> list[str]:
    """Every alert name the layers define (disabled ones included), in file order."""
    names: list[str] = []
    for builder in LAYER_BUILDERS.values():
        for alert in builder(config):
            if alert.name not in names:
                names.append(alert.name)
    return names
