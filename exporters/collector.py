"""The small interfaces the sidecar's sources implement; it knows none of its sources by name.

A ``MetricSource`` (named apart from prometheus_client's ``Collector``, which it is not) turns
one source (the engine's /metrics, NVML, a dcgm-exporter, the probe runner) into catalogue
families; the sidecar times it, bounds it, and reports its success. A
``ReadinessSource`` contributes conditions to ``/readyz`` so that a replica with a dead
engine, a broken GPU or failing quality probes drops out of every router by itself.
The rest are optional: a ``SelfTimedSource`` keeps the scrape deadline itself, a
``ReplicaSource`` makes the sidecar a replica (whose readiness is served as metrics too),
and a ``BackgroundSource`` runs long-lived jobs with the server.
"""

from __future__ import annotations

from collections.abc import Callable, Coroutine, Mapping, Sequence
from dataclasses import dataclass
from typing import Any, Protocol, runtime_checkable

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

    #: the longest one read may take; the deadline of a scrape when no Prometheus sets one
    @property
    def timeout_s(self) -> float: ...

    async def collect(self, deadline: float | None = None) -> Sequence[Metric]: ...

    def status_families(self) -> list[Metric]: ...

    async def refresh(self, max_age: float) -> None: ...


@runtime_checkable
class ReplicaSource(Protocol):
    """The source that makes the sidecar one replica (the engine); without one the sidecar
    is a GPU-only reader that reports no replica readiness."""

    @property
    def identity(self) -> Mapping[str, str]:
        """The replica's identity labels (for ``inferwatch_replica_ready``)."""
        ...


#: a long-running job of the server (the quality probe loop, the engine's first look)
Job = Callable[[], Coroutine[Any, Any, None]]


@runtime_checkable
class BackgroundSource(Protocol):
    def jobs(self) -> Sequence[Job]:
        """Jobs that start when the server does and are cancelled when it stops."""
        ...
