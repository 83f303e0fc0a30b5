"""The probe runner: golden probes on a jittered schedule, within a token budget.

Each target (a replica probed directly, or the router in front of the replicas) gets its
own loop, so there is never more than one probe in flight per target. One *cycle* is one
pass over the golden set, spread over ``cycle_s`` seconds with jitter so that probes from
many runners never line up. Results feed :class:`~inferwatch.probes.verdict.Verdicts`.

The runner is both a sidecar ``MetricSource`` (its metrics) and a ``ReadinessSource`` (the
``quality`` condition: failing when a directly probed target's verdict is ``fail``).
"""

from __future__ import annotations

import asyncio
import logging
import random
import time
from collections import deque
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Final, Literal

import httpx
from prometheus_client.core import Metric

from inferwatch.identity import or_unknown
from inferwatch.logs import log_event
from inferwatch.probes import client, refusal
from inferwatch.probes.golden import Golden, GoldenSet
from inferwatch.probes.metrics import ProbeMetrics
from inferwatch.probes.reply import Reply
from inferwatch.probes.scoring import Limits, Outcome, score
from inferwatch.probes.verdict import Policy, SeriesKey, Verdicts
from inferwatch.serving.readiness import Condition

if TYPE_CHECKING:
    from opentelemetry.sdk.trace import TracerProvider

    from inferwatch.probes.tracing import ProbeTracing

logger = logging.getLogger("inferwatch.probes")

Route = Literal["direct", "router"]
_HOUR_S: Final = 3600.0
_CHARS_PER_TOKEN: Final = 4


@dataclass(frozen=True)
class Target:
    """One thing to probe. ``model_version`` is the deployment's (flag, env, pod label);
    empty is ``unknown``, as on the engine's and the proxy's series."""

    name: str
    endpoint: client.Endpoint
    route: Route = "direct"
    model_version: str = ""


@dataclass(frozen=True)
class Schedule:
    cycle_s: float = 300.0
    jitter: float = 0.2
    timeout_s: float = 30.0
    tokens_per_hour: int = 200_000


@dataclass
class TokenBudget:
    """A rolling one-hour token budget shared by every target of the runner."""

    per_hour: int
    clock: Callable[[], float] = time.monotonic
    _spent: deque[tuple[float, int]] = field(default_factory=deque)

    def remaining(self) -> int:
        horizon = self.clock() - _HOUR_S
        while self._spent and self._spent[0][0] <= horizon:
            self._spent.popleft()
        return self.per_hour - sum(n for _, n in self._spent)

    def allows(self, estimate: int) -> bool:
        return self.remaining() >= estimate

    def spend(self, tokens: int) -> None:
        self._spent.append((self.clock(), tokens))


def estimate_tokens(golden: Golden) -> int:
    """Upper-bound guess of a probe's cost before sending it (prompt chars / 4 + max_tokens)."""
    chars = sum(len(m["content"]) for m in golden.messages)
    return chars // _CHARS_PER_TOKEN + golden.max_tokens


class ProbeRunner:
    name = "probes"

    def __init__(
        self,
        goldens: GoldenSet,
        targets: Sequence[Target],
        *,
        schedule: Schedule | None = None,
        policy: Policy | None = None,
        limits: Limits | None = None,
        state_file: Path | None = None,
        http: httpx.AsyncClient | None = None,
        rng: random.Random | None = None,
        tracer_provider: TracerProvider | None = None,
    ) -> None:
        """``tracer_provider``: a span per probe (off, and not imported, without)."""
        names = [t.name for t in targets]
        if len(set(names)) != len(names):
            raise ValueError(f"target names must be unique: {names}")
        self.goldens = goldens
        self.targets = tuple(targets)
        self.schedule = schedule or Schedule()
        self.limits = limits or Limits()
        self.verdicts = Verdicts(
            frozenset(g.id for g in goldens.probes), policy or Policy(), state_file
        )
        self.metrics = ProbeMetrics(goldens.name)
        self.budget = TokenBudget(self.schedule.tokens_per_hour)
        self.http = http or httpx.AsyncClient()
        self.rng = rng or random.Random()
        self._models: dict[str, str] = {}
        self._undiscovered: set[str] = set()
        self._current: dict[str, SeriesKey] = {}
        self.tracing: ProbeTracing | None = None
        if tracer_provider is not None:
            from inferwatch.probes.tracing import ProbeTracing

            self.tracing = ProbeTracing(tracer_provider)

    async def aclose(self) -> None:
        await self.http.aclose()

    async def _model(self, target: Target) -> str | None:
        if target.endpoint.model:
            return target.endpoint.model
        if target.name not in self._models:
            try:
                self._models[target.name] = await client.discover_model(
                    self.http, target.endpoint, self.schedule.timeout_s
                )
            except (httpx.HTTPError, ValueError) as exc:
                if target.name not in self._undiscovered:  # log once per failing streak
                    self._undiscovered.add(target.name)
                    log_event(
                        logger,
                        logging.WARNING,
                        "model discovery failed; probes skipped",
                        target=target.name,
                        reason=str(exc) or type(exc).__name__,
                    )
                return None
            self._undiscovered.discard(target.name)
        return self._models[target.name]

    async def probe_once(self, target: Target, golden: Golden) -> Outcome | None:
        """Send one golden to one target and record it; None when skipped (budget, model, or a
        reply no parser can read)."""
        if not self.budget.allows(estimate_tokens(golden)):
            self.metrics.skip(target.name, "budget")
            return None
        model = await self._model(target)
        if model is None:
            self.metrics.skip(target.name, "discovery")
            return None
        headers = target.endpoint.headers
        if self.tracing is None:
            return (await self._send(target, golden, model, headers))[1]
        span, context = self.tracing.start(target.name, target.route, golden, model)
        reply: Reply | None = None
        outcome: Outcome | None = None
        try:
            reply, outcome = await self._send(target, golden, model, {**headers, **context})
        finally:
            self.tracing.end(span, reply, outcome)
        return outcome

    async def _send(
        self, target: Target, golden: Golden, model: str, headers: Mapping[str, str]
    ) -> tuple[Reply, Outcome | None]:
        """Send the probe and judge its reply; no outcome when it says nothing of quality."""
        endpoint = client.Endpoint(target.endpoint.url, model, target.endpoint.api_key, headers)
        reply = await client.send(self.http, endpoint, golden, self.schedule.timeout_s)
        return reply, self._judge(target, golden, model, reply)

    def _judge(self, target: Target, golden: Golden, model: str, reply: Reply) -> Outcome | None:
        spent = reply.prompt_tokens + reply.completion_tokens
        self.budget.spend(spent or (estimate_tokens(golden) if reply.ok else 0))
        if reply.error == client.UNREADABLE:  # the probe could not run: no quality verdict
            self.metrics.skip(target.name, client.UNREADABLE)
            log_event(logger, logging.WARNING, "probe reply unreadable", target=target.name)
            return None
        refused = refusal.not_applicable(golden, reply)
        if refused is not None:  # the engine's configuration, not its quality
            self._not_applicable(target, golden, refused)
            return None
        self.metrics.applicable(target.name, golden.id)
        outcome = score(golden, reply, self.limits)
        # The deployment names the version; the reply's system_fingerprint is an engine build.
        key = SeriesKey(target.name, target.route, model, or_unknown(target.model_version))
        self._current[target.name] = key
        self.verdicts.record(key, golden.id, outcome.passed)
        self.metrics.observe(key, outcome)
        if not outcome.passed:
            log_event(
                logger,
                logging.INFO,
                "probe failed",
                target=target.name,
                probe=golden.id,
                stage=outcome.stage,
                failures=outcome.failures,
            )
        return outcome

    def _not_applicable(self, target: Target, golden: Golden, reason: str) -> None:
        """Report the probe as not applicable here and leave it out of the verdict."""
        if self.metrics.not_applicable(target.name, golden.id, reason):
            log_event(
                logger,
                logging.WARNING,
                "probe not applicable: the engine refuses it by configuration",
                target=target.name,
                probe=golden.id,
                reason=reason,
            )
        self.verdicts.exclude(golden.id)

    async def run_cycle(self, target: Target) -> list[Outcome]:
        """One pass over the golden set in a fresh random order, spaced with jitter."""
        order = list(self.goldens.probes)
        self.rng.shuffle(order)
        spacing = self.schedule.cycle_s / len(order)
        outcomes = []
        for golden in order:
            outcome = await self.probe_once(target, golden)
            if outcome is not None:
                outcomes.append(outcome)
            jitter = self.schedule.jitter
            await asyncio.sleep(spacing * self.rng.uniform(1 - jitter, 1 + jitter))
        return outcomes

    async def run(self) -> None:
        """Probe every target until cancelled."""
        await asyncio.gather(*(self._loop(t) for t in self.targets))

    async def _loop(self, target: Target) -> None:
        await asyncio.sleep(self.rng.uniform(0, self.schedule.cycle_s / len(self.goldens)))
        while True:
            await self.run_cycle(target)

    def verdict_for(self, target: Target) -> tuple[SeriesKey | None, str, str]:
        """(series, state, reason) of a target's current model version."""
        key = self._current.get(target.name)
        if key is None:
            return None, "warming", "no probe results yet"
        verdict = self.verdicts.verdict(key)
        return key, verdict.state, verdict.reason

    def readiness(self) -> Sequence[Condition]:
        """``quality`` fails when a directly probed target fails its verdict."""
        failing = []
        for target in self.targets:
            if target.route != "direct":
                continue
            _, state, reason = self.verdict_for(target)
            if state == "fail":
                failing.append(f"{target.name}: {reason}")
        return [Condition("quality", not failing, "; ".join(failing))]

    async def collect(self, deadline: float | None = None) -> Sequence[Metric]:
        """The probe metrics, read from memory: within any deadline."""
        return self.families()

    def families(self) -> list[Metric]:
        return self.metrics.families(self.verdicts, max(0, self.budget.remaining()))
