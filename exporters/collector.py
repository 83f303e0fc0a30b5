"""The two small interfaces every sidecar component implements.

A ``MetricSource`` (named apart from prometheus_client's ``Collector``, which it is not) turns
one source (the engine's /metrics, NVML, a dcgm-exporter, the probe runner) into catalogue
families; the sidecar times it, bounds it, and reports its success. A
``ReadinessSource`` contributes conditions to ``/readyz`` so that a replica with a dead
engine, a broken GPU or failing quality probes drops out of every router by itself.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Protocol, runtime_checkable

from prometheus_client.core import Metric


@runtime_checkable
class MetricSource(Protocol):
    #: value of the ``collector`` label on ``inferwatch_collector_*`` self-metrics
    name: str

    async def collect(self) -> Sequence[Metric]:
        """Read the source once and return filled catalogue families.

        Raise on failure: the sidecar turns the exception into ``collector_success 0`` and a
        log line, and keeps serving every other collector's metrics.
        """
        ...


@dataclass(frozen=True)
class Condition:
    """One reason a replica should, or should not, take traffic."""

    name: str
    ok: bool
    reason: str = ""


@runtime_checkable
class ReadinessSource(Protocol):
    def readiness(self) -> Sequence[Condition]:
        """Current conditions; must be cheap and must not block (no I/O)."""
        ...


@runtime_checkable
class SelfTimedSource(Protocol):
    """A collector that keeps the scrape deadline itself and records its own failures.

    The engine collector is one: running out of time must be recorded as a scrape failure
    (``engine_up 0``), so the sidecar puts no second timer around it and logs nothing for it,
    asks it for the status families that exist whether or not the read succeeded, and has it
    read again before answering /readyz when its last outcome is stale.
    """

    name: str

    async def collect(self, deadline: float | None = None) -> Sequence[Metric]: ...

    def status_families(self) -> list[Metric]: ...

    async def refresh(self, max_age: float) -> None: ...
