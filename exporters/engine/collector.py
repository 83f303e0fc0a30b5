"""The engine collector: one scrape of the engine, mapped onto the catalogue.

It also keeps the engine's health: ``inferwatch_engine_up``, scrape errors by reason,
malformed lines, dropped series and page size are emitted on every sidecar scrape, including
the ones where the engine is down, and the ``engine`` readiness condition follows the last
outcome.

Concurrent callers (two Prometheus replicas, a /readyz probe) share one scrape: one upstream
request, one parse, one mapping, and at most one counted error for it, however many callers
waited on it. The page is parsed and mapped in a worker thread, so that a large page never
holds up the event loop (and /healthz) while it is read.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
from collections import Counter
from collections.abc import Mapping, Sequence
from typing import Any

from prometheus_client.core import Metric

from inferwatch import catalog
from inferwatch.exporters.collector import Job
from inferwatch.exporters.engine import adapters as engines
from inferwatch.exporters.engine.checks import Limits, PageChecks
from inferwatch.exporters.engine.counter_resets import ResetCompensation
from inferwatch.identity import KEYS as KNOWABLE
from inferwatch.identity import UNKNOWN, or_unknown
from inferwatch.logs import log_event
from inferwatch.serving import textformat
from inferwatch.serving.page_fetch import EngineScraper, FetchedPage, OwnFault, ScrapeFailure
from inferwatch.serving.readiness import Condition

logger = logging.getLogger("inferwatch.engine")
#: the start-up messages are the sidecar's (what it serves while the engine is away)
sidecar_logger = logging.getLogger("inferwatch.sidecar")

#: identity labels the engine itself can tell us (read from its version endpoint)
DISCOVERABLE = ("engine_version", "model")
VERSION_RETRY_SECONDS = 60.0
#: how often the settings the engine's JSON endpoints tell are read again (a restart with
#: other flags shows within this)
SETTINGS_SECONDS = 60.0
#: ``reason`` of ``inferwatch_engine_scrape_dropped_series_total`` for a garbage setting
BAD_SETTING = "bad_setting"


class EngineCollector:
    """The metric source and readiness source for one engine behind one /metrics URL."""

    name = "engine"

    def __init__(
        self,
        scraper: EngineScraper,
        identity: Mapping[str, str],
        *,
        engine: str | None = None,
        base_url: str | None = None,
        limits: Limits | None = None,
    ):
        """``identity`` holds the values given by flags; empty ones may be discovered.

        ``engine`` fixes the engine type instead of detecting it from each page,
        ``base_url`` is where its version endpoint lives (default: the scrape URL's origin),
        and ``limits`` bound what one page may put into the output (default: ``Limits()``).
        """
        self.scraper = scraper
        self.fixed_engine = engine
        self.base_url = base_url or _origin(scraper.url)
        self._given = {k: v for k, v in identity.items() if v}
        self._discovered: dict[str, str] = {}
        self._version_task: asyncio.Task[None] | None = None
        self._version_checked_at = -VERSION_RETRY_SECONDS
        self._identified = False  # the first answer waited for the version endpoint
        #: the settings the engine's JSON endpoints told last (engines.read_settings)
        self.told: dict[str, float] = {}
        self._settings_task: asyncio.Task[None] | None = None
        self._settings_read_at = -SETTINGS_SECONDS
        #: garbage settings the endpoints told: counted on the event loop, apart from
        #: ``checks.dropped``, which the page's worker thread counts into
        self.bad_told = 0
        self.engine: str | None = engine
        self.up = False
        #: the engine's sleep state when it is not awake (vLLM's sleep mode), else ""
        self.sleep_state = ""
        self.last_error = "no scrape yet"
        self.last_outcome_at = 0.0
        self.errors: Counter[str] = Counter()
        #: times the sidecar could not open a socket (out of descriptors), and the last one
        self.own_faults = 0
        self.own_fault = ""
        self.malformed_lines = 0
        self.page_size = 0
        self.checks = PageChecks(limits)
        self.resets = ResetCompensation()
        self._in_flight: asyncio.Task[list[Metric]] | None = None
        self._counted: asyncio.Task[list[Metric]] | None = None  # the scrape an error counts

    @property
    def identity(self) -> dict[str, str]:
        labels = {label: "" for label in catalog.load().identities["engine"]}
        labels.update(self._discovered)
        labels.update(self._given)
        labels["engine"] = self.engine or self._given.get("engine", "")
        for key in KNOWABLE:  # one spelling for what nobody knows, as in the proxy and probes
            labels[key] = or_unknown(labels.get(key))
        return labels

    @property
    def timeout_s(self) -> float:
        return self.scraper.timeout_s

    def jobs(self) -> Sequence[Job]:
        return [self.first_look]

    async def first_look(self) -> None:
        """Tell the operator at start whether the engine answers, and what happens if not."""
        try:
            await self.collect()
        except ScrapeFailure:
            log_event(
                sidecar_logger,
                logging.WARNING,
                "engine not answering yet; serving inferwatch_engine_up 0 and /readyz 503 "
                "until it does",
                url=self.scraper.url,
            )
        else:
            log_event(sidecar_logger, logging.INFO, "engine answering", engine=self.engine)

    async def collect(self, deadline: float | None = None) -> Sequence[Metric]:
        """The engine's families; waits at most ``deadline`` seconds (default: the timeout).

        A caller that joins a scrape already in flight shares its result. When the caller's
        own deadline passes first, the shared scrape keeps running for the others.
        """
        scrape = self._in_flight
        if scrape is None or scrape.done():
            scrape = self._in_flight = asyncio.create_task(self._scrape())
            # Every waiter may have given up by the time it ends: mark its outcome as seen.
            scrape.add_done_callback(_consume_outcome)
        timeout = self.scraper.timeout_s
        wait = timeout if deadline is None else min(deadline, timeout)
        try:
            async with asyncio.timeout(wait):
                return await asyncio.shield(scrape)
        except TimeoutError:
            failure = ScrapeFailure("timeout", f"no complete answer within {wait:.1f}s")
            self._record_failure(scrape, failure)
            raise failure from None

    async def _scrape(self) -> list[Metric]:
        """One scrape, its outcome recorded once."""
        scrape = asyncio.current_task()
        try:
            page = await self.scraper.fetch()
            if self._identified:
                families = await asyncio.to_thread(self._map, page)
            else:
                exposition = await asyncio.to_thread(self._parse, page)
                await self._first_identification()
                families = await asyncio.to_thread(self._normalize, exposition)
        except ScrapeFailure as failure:
            self._record_failure(scrape, failure)
            raise
        except Exception as exc:  # a page that trips a bug in an adapter must not take us down
            logger.exception("engine page could not be mapped")
            internal = ScrapeFailure("internal", f"{type(exc).__name__}: {exc}")
            self._record_failure(scrape, internal)
            raise internal from exc
        self._maybe_discover_version(self.engine or "")
        self._maybe_read_settings(self.engine or "")
        if scrape is not self._counted:  # else a waiter's deadline passed first: a timeout
            self.up = True
            self.last_error = ""
            self.own_fault = ""
            self.last_outcome_at = time.monotonic()
        return families

    def _map(self, page: FetchedPage) -> list[Metric]:
        """Parse, check and map one page (in a worker thread; one at a time)."""
        return self._normalize(self._parse(page))

    def _parse(self, page: FetchedPage) -> textformat.Exposition:
        """Parse the page and name its engine (``self.engine``)."""
        self.page_size = len(page.body)
        exposition, engine = self._read(page.body)
        if engine != self.engine:  # another engine answers: nothing of the last one carries over
            self.resets.clear()
            if self.engine is not None:
                self._discovered.clear()
            self.told = {}
        self.engine = engine
        return exposition

    def _normalize(self, exposition: textformat.Exposition) -> list[Metric]:
        """Check and map a parsed page of ``self.engine``."""
        engine = self.engine or ""
        wanted = engines.wanted(engine)
        self.resets.apply(exposition, self.checks.apply(exposition, wanted))
        families = engines.normalize(exposition, engine, self.identity)
        self._learn_model(families)
        setting = self._settings_family(exposition, engine, families)
        if setting is not None:
            families.append(setting)
        self.sleep_state = _sleep_state(families)
        return families

    def _learn_model(self, families: list[Metric]) -> None:
        """Label our own series with the model the engine's series name, when it names one.

        vLLM and SGLang carry ``model_name`` on every series; without a --model flag the
        sidecar's engine_up and scrape-health series would otherwise say model="" and fail to
        join with them. Learned once: a page that names another model later does not move
        engine_up to a new series (which would reset every alert's ``for:`` timer).
        """
        if self._given.get("model") or self._discovered.get("model"):
            return
        models = {f.samples[0].labels.get("model", "") for f in families if f.samples}
        models -= {"", UNKNOWN}
        if len(models) == 1:
            self._discovered["model"] = models.pop()

    def _settings_family(
        self, exposition: textformat.Exposition, engine: str, families: list[Metric]
    ) -> Metric | None:
        """``inferwatch_engine_setting`` from the page and what the endpoints told last,
        labelled with the model the page's series name; None when the engine tells none."""
        found, bad = engines.page_settings(exposition, engine)
        if bad:
            self.checks.dropped[BAD_SETTING] += bad
        told = {**self.told, **found}
        if not told:
            return None
        cat = catalog.load()
        spec = cat["engine_setting"]
        labels = self.identity
        models = {f.samples[0].labels.get("model") for f in families if f.samples}
        if len(models) == 1 and (model := models.pop()):
            labels["model"] = model
        family = cat.family("engine_setting")
        for setting in sorted(told):
            family.add_metric([labels[label] for label in spec.identity] + [setting], told[setting])
        built: Metric = family
        return built

    def _maybe_read_settings(self, engine: str) -> None:
        """Read the settings the engine's JSON endpoints tell, in the background, every
        ``SETTINGS_SECONDS``."""
        if self._settings_task is not None and not self._settings_task.done():
            return
        now = time.monotonic()
        if now - self._settings_read_at < SETTINGS_SECONDS:
            return
        self._settings_read_at = now
        self._settings_task = asyncio.create_task(self._read_settings(engine))

    async def _read_settings(self, engine: str) -> None:
        """A read that tells nothing (an endpoint that did not answer this once) keeps what
        the last one told, so that a setting does not blink out of the board."""
        told, bad = await engines.read_settings(self.scraper.client, self.base_url, engine)
        self.bad_told += bad
        if told and engine == self.engine:
            self.told = told

    def _read(self, body: bytes) -> tuple[textformat.Exposition, str]:
        """Parse the page and name its engine.

        Once the engine is known, only the families its adapter reads are parsed (several
        times faster on a vLLM page). If such a page no longer looks like that engine (a
        different engine now answers at the URL), the whole page is read again and detected.
        """
        known = self.fixed_engine or self.engine
        if known:
            exposition = textformat.parse(body, wanted=engines.wanted(known))
            if exposition.families and (self.fixed_engine or engines.detect(exposition) == known):
                self.malformed_lines += exposition.malformed_lines
                return exposition, known
        exposition = textformat.parse(body)
        self.malformed_lines += exposition.malformed_lines
        if not exposition.families:
            raise ScrapeFailure("not_metrics", "the page holds no metric samples")
        if self.fixed_engine:
            raise ScrapeFailure("unknown_engine", f"no {self.fixed_engine} metrics on the page")
        detected = engines.detect(exposition)
        if detected is None:
            raise ScrapeFailure(
                "unknown_engine",
                "no known engine's metrics on the page; set --engine to one of "
                + ", ".join(engines.ENGINES),
            )
        return exposition, detected

    def note_own_fault(self, detail: str) -> None:
        """The sidecar could not open a socket to the engine: our fault, not the engine's.
        Counted and logged (once until a scrape succeeds again); what was last known of the
        engine stands, and readiness names the sidecar instead."""
        self.own_faults += 1
        if not self.own_fault:
            log_event(
                sidecar_logger,
                logging.ERROR,
                "sidecar out of file descriptors; the engine's state is unknown",
                detail=detail,
                url=self.scraper.url,
            )
        self.own_fault = detail
        self.last_outcome_at = time.monotonic()

    def _record_failure(self, scrape: asyncio.Task[Any] | None, failure: ScrapeFailure) -> None:
        """Count the failure unless one was counted for this scrape already (a waiter that
        gave up on it, then the scrape itself)."""
        if isinstance(failure, OwnFault):
            self.note_own_fault(failure.detail)
            return
        self.own_fault = ""
        if scrape is None or scrape is not self._counted:
            self._counted = scrape
            self.errors[failure.reason] += 1
        if self.up or failure.detail != self.last_error:
            log_event(
                logger,
                logging.WARNING,
                "engine scrape failed",
                reason=failure.reason,
                detail=failure.detail,
                url=self.scraper.url,
            )
        self.up = False
        self.last_error = failure.detail
        self.last_outcome_at = time.monotonic()

    def _maybe_discover_version(self, engine: str) -> None:
        """Ask the engine's version endpoint in the background, now and then, until it answers."""
        if all(self._given.get(k) or self._discovered.get(k) for k in DISCOVERABLE):
            return
        if self._version_task is not None and not self._version_task.done():
            return
        now = time.monotonic()
        if now - self._version_checked_at < VERSION_RETRY_SECONDS:
            return
        self._version_checked_at = now
        self._version_task = asyncio.create_task(self._discover_version(engine))

    async def _first_identification(self) -> None:
        """On the engine's first answer, ask its version endpoint before the page is mapped
        and wait for it, at most half the scrape timeout, unless the flags gave what it tells:
        the first engine_up and engine series would otherwise say engine_version="unknown"
        (and, where the page names no model, llama.cpp's or TGI's, model="unknown") and the
        next ones the values, new series that reset every alert's ``for:`` timer."""
        self._identified = True
        self._maybe_discover_version(self.engine or "")
        if self._version_task is None or self._version_task.done():
            return
        with contextlib.suppress(TimeoutError):
            async with asyncio.timeout(self.scraper.timeout_s / 2):
                await asyncio.shield(self._version_task)

    async def identify(self) -> None:
        """Wait for the version endpoints a scrape asked: where the page names no model
        (llama.cpp, TGI), only they tell it. Best effort, as the read in the background."""
        if self._version_task is not None:
            await self._version_task

    async def _discover_version(self, engine: str) -> None:
        found = await engines.read_version(self.scraper.client, self.base_url, engine)
        limit = self.checks.limits.label_length
        for key, value in found.items():  # what the page taught us first stays
            if key in DISCOVERABLE and value and len(value) <= limit:
                self._discovered.setdefault(key, value)
        if found:
            log_event(logger, logging.INFO, "engine identified", engine=engine, **found)

    def status_families(self) -> list[Metric]:
        """Health of the engine scrape; emitted whether or not the last scrape succeeded."""
        cat = catalog.load()
        identity = self.identity
        up = cat.family("engine_up")
        up.add_metric([identity[label] for label in cat["engine_up"].label_names], int(self.up))
        errors = cat.family("engine_scrape_errors")
        for reason, count in sorted(self.errors.items()):
            errors.add_metric([reason], count)
        malformed = cat.family("engine_scrape_parse_errors")
        malformed.add_metric([""], self.malformed_lines)
        for family, count in sorted(self.checks.misnamed.items()):
            malformed.add_metric([family], count)
        dropped = cat.family("engine_scrape_dropped_series")
        counts = dict(self.checks.dropped)
        if self.bad_told:
            counts[BAD_SETTING] = counts.get(BAD_SETTING, 0) + self.bad_told
        for reason, count in sorted(counts.items()):
            dropped.add_metric([reason], count)
        size = cat.family("engine_scrape_size")
        size.add_metric([], self.page_size)
        own = cat.family("sidecar_descriptor_exhaustion")
        own.add_metric([], self.own_faults)
        return [up, errors, malformed, dropped, size, own]

    def readiness(self) -> Sequence[Condition]:
        """The ``engine`` condition: answering and awake. A sleeping engine (vLLM's sleep
        mode) still answers /health and /metrics but serves no request until woken. While the
        sidecar cannot open a socket, the ``sidecar`` condition fails and names that."""
        if self.own_fault:
            engine = self._engine_condition()
            return [engine, Condition("sidecar", False, f"{self.own_fault} (the sidecar's fault)")]
        return [self._engine_condition()]

    def _engine_condition(self) -> Condition:
        if not self.up:
            return Condition("engine", False, self.last_error)
        if self.sleep_state:
            reason = f"{self.engine} is asleep ({self.sleep_state}) and serves no request"
            return Condition("engine", False, reason)
        return Condition("engine", True, f"{self.engine} answering")

    async def refresh(self, max_age: float) -> None:
        """Scrape again when the last outcome is older than ``max_age`` seconds (for /readyz)."""
        if time.monotonic() - self.last_outcome_at < max_age:
            return
        with contextlib.suppress(ScrapeFailure):  # recorded; readiness reports it
            await self.collect()

    async def aclose(self) -> None:
        for task in (self._version_task, self._settings_task, self._in_flight):
            if task is not None:
                task.cancel()
        await self.scraper.aclose()


def _sleep_state(families: Sequence[Metric]) -> str:
    """The sleep state a mapped page reports as current, other than awake; "" when awake or
    when the engine has no sleep mode."""
    name = catalog.load()["engine_sleep_state"].name
    for family in families:
        if family.name == name:
            asleep = (s.labels["state"] for s in family.samples if s.value == 1)
            return next((state for state in asleep if state != "awake"), "")
    return ""


def _consume_outcome(task: asyncio.Task[list[Metric]]) -> None:
    if not task.cancelled():
        task.exception()


def _origin(url: str) -> str:
    scheme, _, rest = url.partition("://")
    return f"{scheme}://{rest.split('/', 1)[0]}"
