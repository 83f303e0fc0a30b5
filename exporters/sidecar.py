"""The sidecar's HTTP face: one canonical /metrics, /healthz and /readyz for one replica.

Each GET /metrics runs every collector concurrently under one deadline, a little shorter
than the scraping Prometheus' own timeout (its ``X-Prometheus-Scrape-Timeout-Seconds``
header), so a slow source costs its own metrics and never the whole scrape. /readyz is the
local isolation path: any failing condition (engine, GPU, quality) returns 503, and the pod's
readiness probe takes the replica out of every Service without any API permission.

Without an engine the sidecar is a GPU-only reader (one per node, a DaemonSet): it serves
the GPU collectors' series, reports no replica readiness, and /readyz holds only the
conditions of its readiness sources (none from a node-wide GPU scope), so it answers 200
while the process serves.
"""

from __future__ import annotations

import asyncio
import logging
import platform
import time
from collections.abc import AsyncIterator, Iterable, Mapping, Sequence
from contextlib import asynccontextmanager, suppress
from dataclasses import dataclass

from prometheus_client.core import Metric
from starlette.applications import Starlette
from starlette.requests import Request
from starlette.responses import Response
from starlette.routing import Route

from inferwatch import __version__, catalog
from inferwatch.exporters.collector import (
    BackgroundSource,
    Job,
    MetricSource,
    ReadinessSource,
    ReplicaSource,
    StatusSource,
)
from inferwatch.exporters.isolation import Isolation
from inferwatch.logs import log_event
from inferwatch.serving.endpoints import healthz, metrics_response, readiness_response
from inferwatch.serving.readiness import Condition, SourceFailure

logger = logging.getLogger("inferwatch.sidecar")

#: time kept back from Prometheus' scrape timeout for rendering and the network
SCRAPE_TIMEOUT_MARGIN = 0.5
#: deadline of one scrape when no status source sets it (a GPU-only sidecar)
DEFAULT_SCRAPE_TIMEOUT = 5.0


@dataclass
class CollectorRun:
    families: Sequence[Metric]
    success: bool
    duration: float


class Sidecar:
    def __init__(
        self,
        sources: Sequence[object],
        *,
        background: Sequence[Job] = (),
        readiness_max_age: float = 5.0,
        admin_token: str | None = None,
    ):
        """Serve ``sources``, each used for every interface of ``collector`` it implements.

        Without a ``ReplicaSource`` (an engine) the sidecar is GPU-only, which is no replica
        (see the module). ``background`` holds long-running jobs that live and die with the
        server, beside the sources' own; ``admin_token`` enables ``/admin/isolation``.
        """
        self.isolation = Isolation(admin_token)
        self.collectors = [s for s in sources if isinstance(s, MetricSource)]
        self.readiness_sources: list[ReadinessSource] = [
            *(s for s in sources if isinstance(s, ReadinessSource)),
            self.isolation,
        ]
        self.background: list[Job] = [
            *(job for s in sources if isinstance(s, BackgroundSource) for job in s.jobs()),
            *background,
        ]
        self.replica = next((s for s in sources if isinstance(s, ReplicaSource)), None)
        #: the collectors with status series of their own (protocol checks, done once)
        self.status_sources = [c for c in self.collectors if isinstance(c, StatusSource)]
        timeouts = [c.timeout_s for c in self.status_sources]
        self.scrape_timeout_s = max(timeouts, default=DEFAULT_SCRAPE_TIMEOUT)
        self.readiness_max_age = readiness_max_age
        self._failing: set[str] = set()

    async def gather(self, deadline: float) -> list[Metric]:
        """All families for one scrape: every collector's, then the sidecar's own."""
        runs = await asyncio.gather(*(self._run(c, deadline) for c in self.collectors))
        families: list[Metric] = []
        for run in runs:
            families.extend(run.families)
        for collector in self.status_sources:
            families.extend(collector.status_families())
        families.extend(self._self_families(zip(self.collectors, runs, strict=True)))
        if self.replica is not None:  # a GPU-only sidecar is no replica: counts as none
            families.append(self._readiness_family(self.replica.identity))
        return families

    def _readiness_family(self, replica: Mapping[str, str]) -> Metric:
        """/readyz as metrics, one series per condition, so alerts see what routers see."""
        cat = catalog.load()
        ready = cat["replica_ready"].new_family()
        identity = [replica[label] for label in cat["replica_ready"].identity]
        holds: dict[str, bool] = {}
        for condition in self.conditions():  # two sources may report the same condition
            holds[condition.name] = holds.get(condition.name, True) and condition.ok
        for name, ok in sorted(holds.items()):
            ready.add_metric([*identity, name], int(ok))  # type: ignore[attr-defined]
        return ready

    async def _run(self, collector: MetricSource, deadline: float) -> CollectorRun:
        started = time.perf_counter()
        # Every collector keeps the deadline itself, so that running out of time is recorded
        # as its own failure (engine_up 0, gpu_backend_up 0). No second timer around it: when
        # a busy process wakes the loop late, both would be due at once, and the outer one
        # would cancel the inner one before it records anything.
        try:
            families = await collector.collect(deadline)
        except Exception as exc:  # a failing source costs its own metrics, never the scrape
            self._note_failure(collector, exc)
            return CollectorRun((), False, time.perf_counter() - started)
        if collector.name in self._failing:
            self._failing.discard(collector.name)
            log_event(logger, logging.INFO, "collector recovered", collector=collector.name)
        return CollectorRun(families, True, time.perf_counter() - started)

    def _note_failure(self, collector: MetricSource, exc: BaseException) -> None:
        name = collector.name
        if name in self._failing:
            return  # logged when it started failing; the metric carries it from here
        self._failing.add(name)
        if not isinstance(exc, SourceFailure):  # the source logged that one with its reason
            reason = "timeout" if isinstance(exc, TimeoutError) else f"{type(exc).__name__}: {exc}"
            log_event(logger, logging.WARNING, "collector failed", collector=name, error=reason)

    @staticmethod
    def _self_families(runs: Iterable[tuple[MetricSource, CollectorRun]]) -> list[Metric]:
        cat = catalog.load()
        build = cat.family("exporter_build_info")
        build.add_metric([__version__, platform.python_version()], 1)
        success = cat.family("collector_success")
        duration = cat.family("collector_duration")
        for collector, run in runs:
            success.add_metric([collector.name], int(run.success))
            duration.add_metric([collector.name], run.duration)
        return [build, success, duration]

    def conditions(self) -> list[Condition]:
        return [c for source in self.readiness_sources for c in source.readiness()]

    # ---- HTTP ------------------------------------------------------------------------------

    async def metrics(self, request: Request) -> Response:
        deadline = self.scrape_timeout_s
        prometheus_timeout = request.headers.get("x-prometheus-scrape-timeout-seconds")
        if prometheus_timeout:
            with suppress(ValueError):
                deadline = min(deadline, float(prometheus_timeout) - SCRAPE_TIMEOUT_MARGIN)
        families = await self.gather(max(deadline, 0.1))
        return metrics_response(request, families)

    async def readyz(self, request: Request) -> Response:
        await asyncio.gather(*(c.refresh(self.readiness_max_age) for c in self.status_sources))
        return readiness_response(self.conditions())

    def app(self) -> Starlette:
        @asynccontextmanager
        async def lifespan(app: Starlette) -> AsyncIterator[None]:
            # Serve at once: a hung engine must not hold up start-up (or a SIGTERM).
            jobs = [asyncio.create_task(job()) for job in self.background]
            yield
            for job in jobs:
                job.cancel()
            await asyncio.gather(*jobs, return_exceptions=True)
            await self.aclose()

        return Starlette(
            routes=[
                Route("/metrics", self.metrics),
                Route("/healthz", healthz),
                Route("/readyz", self.readyz),
                *self.isolation.routes(),
            ],
            lifespan=lifespan,
        )

    async def aclose(self) -> None:
        for collector in self.collectors:
            if hasattr(collector, "aclose"):
                await collector.aclose()
            elif hasattr(collector, "close"):
                collector.close()
