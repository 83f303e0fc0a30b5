"""Cold-start phases of one replica: started, ready, and really serving told apart.

A replica passes five phases, each recorded once per sidecar start (in a pod the sidecar
starts with the engine, so it is the replica's start) as a timestamp gauge, a current-phase
gauge and one log line:

``process_start``     the sidecar started, or saw the engine gone (see below)
``engine_reachable``  the engine's health endpoint answered anything at all (SGLang and llama.cpp
                      answer 503 while they load; vLLM answers nothing until it has
                      loaded, so for vLLM this and the next phase coincide)
``engine_healthy``    the health endpoint answered 200: the model is loaded
``warmup_done``       the warm-up gate passed (:mod:`inferwatch.exporters.startup.warmup`); at once
                      after ``engine_healthy`` when no warm-up is configured
``serving``           the engine finished its first successful request that the sidecar did
                      not send itself

The last phase is learnt from the engine's own request counter
(``inferwatch_engine_requests_finished_total`` without its ``abort`` and ``error`` reasons),
read from a scrape taken as the engine turns healthy (the baseline) and then polled. Requests
the sidecar sends itself are subtracted: every warm-up request counts as soon as it is sent
(one the sidecar gave up on may still finish in the engine), and so does every quality probe
the sidecar's probe runner has recorded. The excess must be seen on two consecutive polls, so
that a probe the engine has counted but the runner has not recorded yet is not taken for a
client. Subtracting more than the engine counted only delays the phase; it never records it
early. The poll starts every second and backs off to ``SERVING_POLL_MAX_S`` while no client
comes, and stops once one has: the recorded time is within one poll of the request.

An engine restarted inside the pod (its container, while the sidecar runs on) starts cold
again. Once healthy, the engine's health endpoint is watched every ``WATCH_POLL_S``; when
nothing listens there any more (connection refused), the phases start over from
``process_start`` and the warm-up gate closes until a round passes on the new process. A slow
or failing engine that still answers is no restart: the ``engine`` condition covers it; nor
is a socket the sidecar could not open (out of file descriptors): that is its own fault.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Awaitable, Callable, Iterable, Sequence

import httpx
from prometheus_client.core import Metric

from inferwatch import catalog
from inferwatch.exporters.engine.collector import EngineCollector
from inferwatch.exporters.startup.warmup import Warmup
from inferwatch.logs import log_event
from inferwatch.serving.page_fetch import ScrapeFailure, own_fault
from inferwatch.serving.readiness import Condition

logger = logging.getLogger("inferwatch.startup")

PHASES = ("process_start", "engine_reachable", "engine_healthy", "warmup_done", "serving")
#: the engine's health endpoint, where it is not ``/health``
HEALTH_PATHS = {"triton": "/v2/health/ready"}
#: finish reasons of ``engine_requests_finished`` that are no success
FAILED_REASONS = frozenset({"abort", "error"})
SERVING_POLL_MAX_S = 10.0
#: seconds between health polls that watch a healthy engine for a restart
WATCH_POLL_S = 1.0
#: what ``_health`` says when nothing listens, and when the engine does not answer in time
GONE, NO_ANSWER = "gone", "no answer"


def successful_requests(families: Iterable[Metric]) -> float | None:
    """Successful requests the engine counted, from one scrape's families (None: not there)."""
    spec = catalog.load()["engine_requests_finished"]
    names = {spec.name, spec.name.removesuffix("_total")}
    found = None
    for family in families:
        if family.name not in names:
            continue
        found = sum(
            s.value
            for s in family.samples
            if s.name.endswith("_total") and s.labels.get("reason", "") not in FAILED_REASONS
        )
    return found


class StartupTracker:
    """Metric and readiness source for the phases; ``run`` is its background job."""

    name = "startup"

    def __init__(
        self,
        engine: EngineCollector,
        warmup: Warmup | None = None,
        *,
        own_requests: Callable[[], int] = lambda: 0,
        poll_s: float = 1.0,
        watch_s: float = WATCH_POLL_S,
        http: httpx.AsyncClient | None = None,
    ):
        """``own_requests`` counts the other requests the sidecar sends the engine (its
        quality probes); ``poll_s`` is the health poll's period and the first serving poll's;
        ``watch_s`` the period of the health poll that watches for a restart once healthy."""
        self.engine = engine
        self.warmup = warmup
        self.own_requests = own_requests
        self.poll_s = poll_s
        self.watch_s = watch_s
        self.http = http or httpx.AsyncClient(headers={"User-Agent": "inferwatch"})
        self._started = time.monotonic()
        self.reached: dict[str, float] = {}
        self._warmed = asyncio.Event()
        self._reach("process_start")

    @property
    def phase(self) -> str:
        return [p for p in PHASES if p in self.reached][-1]

    def _reach(self, phase: str, at: float | None = None, **detail: object) -> None:
        """Record ``phase`` as reached now (or at the Unix time ``at``), once."""
        if phase in self.reached:
            return
        now = time.time()
        self.reached[phase] = now if at is None else at
        since = time.monotonic() - self._started - (now - self.reached[phase])
        log_event(
            logger,
            logging.INFO,
            "replica phase reached",
            phase=phase,
            seconds_since_start=round(since, 3),
            **detail,
        )

    # ---- the phases ----------------------------------------------------------------------------

    async def run(self) -> None:
        """Walk the phases; when the engine restarts (its container, inside the pod), again."""
        while True:
            walk = asyncio.create_task(self._walk())
            try:
                await self._until_gone()
            finally:
                walk.cancel()
                await asyncio.gather(walk, return_exceptions=True)
            self._restart()

    async def _walk(self) -> None:
        await self._until_healthy()
        baseline = await self._successes()
        settled = self._own()  # what of ours the baseline may already hold, at most
        if self.warmup is None:
            self._reach("warmup_done", warmup="not configured")
        else:
            await self.warmup.run_until_done()
            self._reach("warmup_done", warmup_requests=self.warmup.sent)
        self._warmed.set()
        await self._until_serving(baseline, settled)

    async def after_warmup(self, job: Callable[[], Awaitable[None]]) -> None:
        """Run ``job`` (the quality probes) once the replica has first passed warm-up."""
        await self._warmed.wait()
        await job()

    async def _until_healthy(self) -> None:
        while True:
            status = await self._health()
            if isinstance(status, int):
                self._reach("engine_reachable", status=status)
            if status == 200:
                self._reach("engine_healthy")
                return
            await asyncio.sleep(self.poll_s)

    async def _until_gone(self) -> None:
        """Return once nothing listens at the engine's address after it was healthy: its
        process is gone, and the next one starts cold. A slow or failing engine that still
        answers is no restart (the engine readiness condition covers it)."""
        while True:
            await asyncio.sleep(self.watch_s)
            if "engine_healthy" in self.reached and await self._health() == GONE:
                return

    def _restart(self) -> None:
        log_event(
            logger,
            logging.WARNING,
            "engine gone; the replica starts again, warm-up included, when it is back",
            url=self.engine.base_url,
        )
        self.reached = {}
        self._started = time.monotonic()
        self._reach("process_start", restart=True)
        if self.warmup is not None:
            self.warmup.reset()

    async def _health(self) -> int | str:
        """The status of the engine's health endpoint (its body unread), or GONE (connection
        refused: nothing listens) or NO_ANSWER (any other failure within the timeout)."""
        path = HEALTH_PATHS.get(self.engine.fixed_engine or self.engine.engine or "", "/health")
        timeout = self.engine.scraper.timeout_s
        try:
            async with asyncio.timeout(timeout):
                async with self.http.stream(
                    "GET", self.engine.base_url + path, timeout=timeout
                ) as response:
                    return response.status_code
        except httpx.ConnectError as exc:
            if (cause := own_fault(exc)) is not None:  # our socket, not the engine, failed
                self.engine.note_own_fault(f"cannot open a socket: {cause.strerror}")
                return NO_ANSWER
            return GONE
        except (TimeoutError, httpx.HTTPError):
            return NO_ANSWER
        except OSError as exc:
            if (cause := own_fault(exc)) is None:
                raise
            self.engine.note_own_fault(f"cannot open a socket: {cause.strerror}")
            return NO_ANSWER

    async def _successes(self) -> float | None:
        try:
            return successful_requests(await self.engine.collect())
        except ScrapeFailure:  # recorded by the engine collector
            return None

    def _own(self) -> int:
        return (self.warmup.sent if self.warmup else 0) + self.own_requests()

    def _unsettled_warmup(self) -> int:
        """Warm-up requests sent that did not succeed: the engine may still count them."""
        return self.warmup.sent - self.warmup.outcomes["ok"] if self.warmup else 0

    async def _until_serving(self, baseline: float | None, settled: int) -> None:
        """Poll until the engine's successes exceed the baseline by more than ours."""
        interval = self.poll_s
        first_seen: float | None = None
        while True:
            now = await self._successes()
            if now is None:
                first_seen = None
            elif baseline is None:
                # No baseline from before the warm-up: the warm-up requests that succeeded
                # are in this one; those that did not may still be counted later.
                baseline = now
                settled = self._own() - self._unsettled_warmup()
            elif now - baseline > self._own() - settled:
                if first_seen is not None:
                    clients = int(now - baseline - (self._own() - settled))
                    self._reach("serving", at=first_seen, client_requests=clients)
                    return
                first_seen = time.time()
                interval = self.poll_s
            else:
                first_seen = None
            await asyncio.sleep(interval)
            interval = min(interval * 2, SERVING_POLL_MAX_S)

    # ---- what the sidecar serves -----------------------------------------------------------

    def readiness(self) -> Sequence[Condition]:
        return self.warmup.readiness() if self.warmup else []

    async def collect(self, deadline: float | None = None) -> Sequence[Metric]:
        """The start-up phases, read from memory: within any deadline."""
        cat = catalog.load()
        replica = self.engine.identity
        identity = [replica[label] for label in cat["replica_startup_phase"].identity]
        current = cat.family("replica_startup_phase")
        stamps = cat.family("replica_startup_phase_timestamp")
        phase = self.phase
        for name in PHASES:
            current.add_metric([*identity, name], int(name == phase))
            if name in self.reached:
                stamps.add_metric([*identity, name], self.reached[name])
        families = [current, stamps]
        if self.warmup is not None:
            families.extend(self.warmup.families())
        return families

    async def aclose(self) -> None:
        await self.http.aclose()
        if self.warmup is not None:
            await self.warmup.aclose()
