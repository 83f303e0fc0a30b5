"""The catalogue of the sidecar's sources: one registration per source, in build order.

Adding a source is one module here (its collector, flags and build) and one line below; its
``--collector.NAME`` switch comes with the registration.
A later source may use an earlier one's (the start-up tracker watches the engine and
discounts the probe runner's requests).
"""

from __future__ import annotations

from inferwatch.exporters.registry import Registration
from inferwatch.exporters.sources import engine, gpu, probes, startup

CATALOGUE: tuple[Registration, ...] = (
    engine.REGISTRATION,
    gpu.REGISTRATION,
    probes.REGISTRATION,
    startup.REGISTRATION,
)
