"""The small interfaces the sidecar's sources implement; it knows none of its sources by name.

A ``MetricSource`` (named apart from prometheus_client's ``Collector``, which it is not) turns
one source (the engine's /metrics, NVML, a dcgm-exporter, the probe runner) into catalogue
families within the deadline it is given; the sidecar times every source the same way and
reports its success and duration. A ``ReadinessSource`` contributes conditions to
``/readyz`` so that a replica with a dead engine, a broken GPU or failing quality probes
drops out of every router by itself.
The rest are optional: a ``StatusSource`` has status series of its own (engine_up), a
``ReplicaSource`` makes the sidecar a replica (whose readiness is served as metrics too),
and a ``BackgroundSource`` runs long-lived jobs with the server.
"""

from __future__ import annotations

from collections.abc import Callable, Coroutine, Mapping, Sequence
from typing import Any, Protocol, runtime_checkable

from prometheus_client.core import Metric

from inferwatch.serving.readiness import Condition


@runtime_checkable
class MetricSource(Protocol):
    #: value of the ``collector`` label on ``inferwatch_collector_*`` self-metrics
    name: str

    async def collect(self, deadline: float | None = None) -> Sequence[Metric]:
        """Read the source once, within ``deadline`` seconds (None: its own timeout), and
        return filled catalogue families.

        The source keeps the deadline itself (the sidecar puts no timer around it), so that
        running out of time is recorded as the source's own failure. Raise on failure: the
        sidecar turns the exception into ``collector_success 0``, logs it once unless it is a
        ``SourceFailure`` (logged by the source with its reason), and keeps serving every
        other collector's metrics.
        """
        ...


@runtime_checkable
class ReadinessSource(Protocol):
    def readiness(self) -> Sequence[Condition]:
        """Current conditions; must be cheap and must not block (no I/O)."""
        ...


@runtime_checkable
class StatusSource(MetricSource, Protocol):
    """A collector whose failed reads are a state of their own (``engine_up 0``).

    The engine collector is one: the sidecar asks it for the status families that exist
    whether or not the read succeeded, and has it read again before answering /readyz when
    its last outcome is stale.
    """

    #: the longest one read may take; the deadline of a scrape when no Prometheus sets one
    @property
    def timeout_s(self) -> float: ...

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
