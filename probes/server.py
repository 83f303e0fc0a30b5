"""HTTP side of ``inferwatch probe``: /metrics, /healthz, /readyz and /probe.

``/readyz`` carries the runner's ``quality`` condition, so a probe container running in a
replica's pod (probing that replica on localhost) takes the pod out of rotation when the
replica's answers go bad, without any API permission.
"""

from __future__ import annotations

import asyncio
import logging
import re
from collections.abc import AsyncIterator, Mapping
from contextlib import asynccontextmanager, suppress
from urllib.parse import urlsplit

import httpx
from starlette.applications import Starlette
from starlette.requests import Request
from starlette.responses import PlainTextResponse, Response
from starlette.routing import Route

from inferwatch.logs import log_event
from inferwatch.probes import blackbox, client
from inferwatch.probes.golden import GoldenSet
from inferwatch.probes.runner import ProbeRunner
from inferwatch.probes.scoring import Limits
from inferwatch.serving.endpoints import healthz, metrics_response, readiness_response
from inferwatch.serving.readiness import Condition

logger = logging.getLogger("inferwatch.probes")


def _error(status: int, message: str) -> Response:
    return PlainTextResponse(message + "\n", status_code=status)


class ProbeServer:
    def __init__(
        self,
        runner: ProbeRunner | None,
        modules: Mapping[str, GoldenSet],
        *,
        limits: Limits | None = None,
        allow_targets: re.Pattern[str] | None = None,
        readyz_quality: bool = True,
        http: httpx.AsyncClient | None = None,
    ) -> None:
        self.runner = runner
        self.modules = dict(modules)
        self.limits = limits or Limits()
        self.allow_targets = allow_targets
        self.readyz_quality = readyz_quality
        self.http = http or httpx.AsyncClient()
        self._task: asyncio.Task[None] | None = None

    def allowed(self, target: str) -> bool:
        """/probe serves the runner's own targets and URLs matching ``allow_targets`` only,
        so that the endpoint cannot be used to send requests anywhere on the network."""
        own = self.runner is not None and any(
            t.endpoint.url.rstrip("/") == target.rstrip("/") for t in self.runner.targets
        )
        return own or bool(self.allow_targets and self.allow_targets.fullmatch(target))

    def conditions(self) -> list[Condition]:
        conditions = []
        if self.runner is not None:
            running = self._task is not None and not self._task.done()
            conditions.append(
                Condition("probing", running, "" if running else "the probe loop is not running")
            )
            if self.readyz_quality:
                conditions.extend(self.runner.readiness())
        return conditions

    async def metrics(self, request: Request) -> Response:
        families = self.runner.families() if self.runner is not None else []
        return metrics_response(request, families)

    async def readyz(self, request: Request) -> Response:
        return readiness_response(self.conditions())

    async def probe(self, request: Request) -> Response:
        target = request.query_params.get("target", "")
        module = request.query_params.get("module", "default")
        parts = urlsplit(target)
        if parts.scheme not in ("http", "https") or not parts.netloc:
            return _error(400, f"target {target!r} is not an http(s) URL")
        if not self.allowed(target):
            return _error(
                403, f"target {target!r} is neither a probed target nor allowed by --allow-targets"
            )
        if module not in self.modules:
            return _error(400, f"unknown module {module!r} (known: {', '.join(self.modules)})")
        goldens = self.modules[module].probes
        wanted = request.query_params.getlist("probe")
        if wanted:
            unknown = sorted(set(wanted) - {g.id for g in goldens})
            if unknown:
                return _error(400, f"module {module!r} has no probes {unknown}")
            goldens = tuple(g for g in goldens if g.id in wanted)
        timeout = blackbox.scrape_timeout(
            request.headers.get("x-prometheus-scrape-timeout-seconds")
        )
        endpoint = client.Endpoint(target, request.query_params.get("model", ""))
        if not endpoint.model:
            try:
                model = await client.discover_model(self.http, endpoint, timeout)
            except (httpx.HTTPError, ValueError) as exc:
                log_event(
                    logger,
                    logging.WARNING,
                    "model discovery failed",
                    target=target,
                    reason=str(exc) or type(exc).__name__,
                )
                model = ""
            if not model:
                # Like blackbox_exporter: an unreachable target is probe_success 0, not a 5xx.
                return metrics_response(request, blackbox.failed(len(goldens)))
            endpoint = client.Endpoint(target, model)
        families = await blackbox.run_module(self.http, endpoint, goldens, self.limits, timeout)
        return metrics_response(request, families)

    def app(self) -> Starlette:
        @asynccontextmanager
        async def lifespan(app: Starlette) -> AsyncIterator[None]:
            if self.runner is not None:
                self._task = asyncio.create_task(self.runner.run())
            yield
            if self._task is not None:
                self._task.cancel()
                with suppress(asyncio.CancelledError):
                    await self._task
            if self.runner is not None:
                await self.runner.aclose()
            await self.http.aclose()

        return Starlette(
            routes=[
                Route("/metrics", self.metrics),
                Route("/healthz", healthz),
                Route("/readyz", self.readyz),
                Route("/probe", self.probe),
            ],
            lifespan=lifespan,
        )
