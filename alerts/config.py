"""The alerts config: the shared defaults with this component's own on top, then a user's file.

Each alert's settings (``for``, thresholds) are declared beside its rule, in the ``SETTINGS``
of its layer's module, and the Alertmanager routing's in :mod:`.routing`; this gathers them
into the part :func:`inferwatch.mixin.config.load` merges, so that a user's file sets them
under the same keys as ever (``alerts.<name>``, ``alertmanager``). Every command that reads
an alert's settings (rules, boards drawing its threshold, reports) loads through here.
"""

from __future__ import annotations

from pathlib import Path

from inferwatch.alerts import alertmanager, availability, cost, gpu, latency, quality, routing
from inferwatch.mixin import config
from inferwatch.mixin.config import Config, ConfigError

__all__ = ["PART", "Config", "ConfigError", "load"]

#: the layers in the order of their rule files
LAYERS = (latency, availability, gpu, cost, quality)

PART = config.Part(
    defaults={
        "alertmanager": routing.DEFAULTS,
        "alerts": {name: entry for layer in LAYERS for name, entry in layer.SETTINGS.items()},
    },
    check=alertmanager.settings,
)


def load(path: Path | None = None) -> Config:
    """The defaults, with ``path`` (if given) on top; raises ConfigError on any bad field."""
    return config.load(path, PART)
