"""From an accepted notification to audited decisions: the receiver's worker.

Alerts are handled one at a time by a single worker, in arrival order, each on its own: a
malformed alert, or one whose handling fails, is audited and costs only itself. For each
firing alert and each rule that matches it, in order: inventory (the alert must name exactly
one target the receiver trusts), the namespace guard, plan, then one state transaction that
runs the state's guards (idempotency, dry-run, cooldown, the circuit breaker, capacity; see
:mod:`~inferwatch.runbooks.guards`) and, when all pass, begins the episode, which then
applies, verifies and records what it changed (:mod:`~inferwatch.runbooks.episodes`). A
ticker runs the rollbacks when due and the periodic read-backs. Every outcome, each refusal
included, is an audit line and a counted decision.
"""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import logging
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import asdict
from typing import Any, Protocol

from inferwatch.logs import log_event
from inferwatch.runbooks import breaker
from inferwatch.runbooks.actions.base import Action, ActionError, Alert, Step
from inferwatch.runbooks.audit import AuditLog
from inferwatch.runbooks.config import Config, Rule
from inferwatch.runbooks.episodes import Attempt, Episodes, begin, cancel_rollback
from inferwatch.runbooks.guards import Namespace, Reason, first_reason, pipeline
from inferwatch.runbooks.inventory import Inventory, Refused
from inferwatch.runbooks.metrics import RunbookMetrics
from inferwatch.runbooks.payload import Malformed, Notification
from inferwatch.runbooks.state import MemoryStore, State, StateError, StateStore

logger = logging.getLogger("inferwatch.runbooks")

QUEUE_SIZE = 1000
#: notification bytes read or queued at once, at most (then 429 with Retry-After)
MAX_BACKLOG_BYTES = 8 * 1024 * 1024
#: how long the ticker sleeps with nothing due (a new schedule wakes it at once)
IDLE_S = 60.0


class Leader(Protocol):
    """Who acts among receiver replicas (a Kubernetes Lease)."""

    def leading(self) -> bool: ...

    async def run(self) -> None:
        """Keep acquiring or renewing, until cancelled."""
        ...


def _failed(what: str, exc: Exception) -> None:
    """A store that cannot be read or written says where and why in its one line; anything
    else is a bug, logged with its traceback."""
    if isinstance(exc, StateError):
        log_event(logger, logging.ERROR, what, reason=str(exc)[:500])
    else:
        logger.exception(what)


class Dispatcher:
    """The receiver's one worker: what the server accepted, decided in arrival order, and a
    ticker for what falls due later."""

    def __init__(
        self,
        config: Config,
        actions: Mapping[str, Action],
        audit: AuditLog,
        *,
        execute: bool,
        store: StateStore | None = None,
        inventory: Inventory | None = None,
        metrics: RunbookMetrics | None = None,
        clock: Callable[[], float] = time.time,
        queue_size: int = QUEUE_SIZE,
        max_backlog_bytes: int = MAX_BACKLOG_BYTES,
        leader: Leader | None = None,
    ) -> None:
        self.config = config
        self.actions = actions
        self.audit = audit
        self.execute = execute
        self.store: StateStore = store or MemoryStore()
        self.inventory = inventory or Inventory({})
        self.metrics = metrics or RunbookMetrics()
        self.clock = clock
        self.leader = leader
        self.queue: asyncio.Queue[tuple[Notification, dict[str, Any], int]] = asyncio.Queue(
            queue_size
        )
        self.max_backlog_bytes = max_backlog_bytes
        self.backlog_bytes = 0
        self.namespace = Namespace(config)
        self.guards = pipeline(config, execute)
        self.episodes = Episodes(self.store, actions, self.metrics, clock, self._decide)
        self._wake = asyncio.Event()
        self._last_reassert = 0.0

    # -- intake ------------------------------------------------------------------------

    def leading(self) -> bool:
        """Whether this receiver acts: always, unless replicas elect a leader."""
        return self.leader is None or self.leader.leading()

    def reserve(self, size: int) -> bool:
        """Count ``size`` more bytes against the backlog; False (nothing counted) when full."""
        if self.backlog_bytes + size > self.max_backlog_bytes:
            return False
        self.backlog_bytes += size
        return True

    def release(self, size: int) -> None:
        self.backlog_bytes -= size

    def submit(self, notification: Notification, meta: dict[str, Any], size: int) -> bool:
        """Queue a notification whose ``size`` bytes are reserved; False when the queue is full."""
        try:
            self.queue.put_nowait((notification, meta, size))
        except asyncio.QueueFull:
            return False
        return True

    async def run(self) -> None:
        """The worker: notifications in order, and rollbacks and read-backs when due."""
        background = [asyncio.create_task(self._ticker())]
        if self.leader is not None:
            background.append(asyncio.create_task(self.leader.run()))
        try:
            await self.episodes.resume()
        except Exception as exc:  # the ticker still runs the pending rollbacks
            _failed("cannot read the pending rollbacks", exc)
        try:
            while True:
                notification, meta, size = await self.queue.get()
                try:
                    await self._notification(notification, meta)
                finally:
                    self.release(size)
                    self.queue.task_done()
        finally:
            for task in background:
                task.cancel()
            await asyncio.gather(*background, return_exceptions=True)

    async def _notification(self, notification: Notification, meta: Mapping[str, Any]) -> None:
        if notification.truncated_alerts:
            reason = f"{notification.truncated_alerts} alerts cut off by max_alerts"
            record = {**meta, "decision": "skipped", "outcome": "truncated"}
            await self.audit.write({**record, "reason": reason})
        for item in notification.alerts:
            await self.handle_one(item, meta)

    async def handle_one(self, item: Alert | Malformed, meta: Mapping[str, Any]) -> None:
        """One alert, decided and audited on its own: nothing it does reaches the next."""
        if isinstance(item, Malformed):
            self.metrics.actions[("", "malformed")] += 1
            fields = {"alertname": item.alertname, "fingerprint": item.fingerprint}
            line = {**meta, **fields, "decision": "skipped", "outcome": "malformed"}
            await self.audit.write({**line, "reason": item.reason})
            return
        try:
            await self.handle(item, meta)
        except Exception as exc:  # a bug or a lost store costs this alert, never the others
            _failed("alert handling failed", exc)
            self.metrics.actions[("", "error")] += 1
            reason = f"{type(exc).__name__}: {exc}"[:300]
            line = {**meta, **_alert_fields(item), "decision": "failed", "outcome": "error"}
            await self.audit.write({**line, "reason": reason})

    async def handle(self, alert: Alert, meta: Mapping[str, Any]) -> None:
        rules = self.config.rules_for(alert.labels)
        base = {**meta, **_alert_fields(alert), "execute": self.execute}
        if not rules:
            if alert.status == "firing":
                self.metrics.unmapped += 1
            await self.audit.write({**base, "decision": "skipped", "reason": "unmapped"})
            return
        for rule in rules:
            record = {**base, "rule": rule.name, "action": rule.action, "params": rule.params}
            if alert.status == "firing":
                await self._firing(alert, rule, record)
            elif await self.episodes.resolved(alert, rule, record):
                self._wake.set()

    # -- firing ------------------------------------------------------------------------

    async def _firing(self, alert: Alert, rule: Rule, record: dict[str, Any]) -> None:
        try:
            found = await self.inventory.resolve(rule.action, alert.labels)
        except Refused as exc:
            await self._decide(record, rule.action, "skipped", "inventory", reason=str(exc))
            return
        populations: dict[str, int] = {}
        if found is not None:
            entry, size = found
            # the entry names the target and its namespace (none: cluster-scoped), never a label
            trusted = {k: v for k, v in alert.labels.items() if k != "namespace"}
            alert = dataclasses.replace(alert, labels=trusted | dict(entry.labels))
            populations[entry.population] = size
            record["target"] = dict(entry.labels)
        if (reason := self.namespace.check(alert.labels)) is not None:
            await self._held_back(record, rule.action, reason)
            return
        action = self.actions[rule.action]
        steps = await self._plan(action, alert, rule, record)
        if steps is None:
            return
        if found is not None:
            steps = [dataclasses.replace(s, group=found[0].population) for s in steps]
        record["steps"] = [asdict(step) for step in steps]
        attempt = Attempt(alert, rule, steps, populations, self.clock())
        reason, cancelled = await self.store.transact(
            lambda state: self._admit(state, attempt, record)
        )
        if cancelled:
            why = "fired again before the rollback hold ended"
            await self._decide(record, rule.action, "skipped", "rollback_cancelled", reason=why)
        if reason is None:
            await self.episodes.apply(attempt, action, record)
            return
        lost = await self.episodes.lost(action, steps) if reason.read_back and self.execute else []
        if lost:
            await self.episodes.reassert(action, lost, record, attempt.episode_id)
        else:
            await self._held_back(record, rule.action, reason)

    def _admit(
        self, state: State, attempt: Attempt, record: Mapping[str, Any]
    ) -> tuple[Reason | None, bool]:
        """One transaction: a pending rollback taken over, then the guards and, when they all
        pass, the episode begun."""
        cancelled = cancel_rollback(state, attempt.alert, attempt.rule)
        reason = first_reason(self.guards, attempt, state)
        if reason is None:
            begin(state, attempt, self.config.breaker, record)
        return reason, cancelled

    async def _held_back(self, record: Mapping[str, Any], action: str, reason: Reason) -> None:
        await self._decide(record, action, reason.decision, reason.outcome, reason=reason.text)

    # -- the ticker: rollbacks and read-backs --------------------------------------------

    async def _ticker(self) -> None:
        while True:
            try:
                wait = await self.tick()
            except Exception as exc:  # a lost store: said, and tried again, never the end of it
                _failed("rollbacks and read-backs failed", exc)
                wait = self.config.reassert_every or IDLE_S
            self._wake.clear()
            with contextlib.suppress(TimeoutError):
                async with asyncio.timeout(wait):
                    await self._wake.wait()

    async def tick(self) -> float:
        """Run the rollbacks that are due and, when it is time, the read-backs; the seconds
        until the next one is due. Only the leading receiver acts."""
        every = self.config.reassert_every
        if not self.leading():
            return every or IDLE_S
        now = self.clock()
        await self.episodes.roll_back_due(now)
        if every is not None and now - self._last_reassert >= every:
            self._last_reassert = now
            await self.episodes.read_back()
        pending = await self.store.transact(
            lambda state: [e.rollback_at for e in state.episodes.values() if e.rollback_at]
        )
        soonest = min([every or IDLE_S, *(at - now for at in pending)])
        return max(soonest, 0.01)

    # -- the breaker, for the admin endpoints ------------------------------------------

    async def open_breakers(self) -> dict[str, str]:
        return await self.store.transact(lambda state: dict(state.open))

    async def reset_breakers(self) -> list[str]:
        return await self.store.transact(breaker.reset)

    # -- plumbing ----------------------------------------------------------------------

    async def _plan(
        self, action: Action, alert: Alert, rule: Rule, record: dict[str, Any]
    ) -> Sequence[Step] | None:
        """The action's steps for ``alert``; None, decided as a failure, when it cannot plan."""
        try:
            return action.plan(alert, rule.params)
        except ActionError as exc:
            await self._decide(record, rule.action, "failed", "plan_error", reason=str(exc))
            return None

    async def _decide(
        self, record: Mapping[str, Any], action: str, decision: str, outcome: str, **fields: Any
    ) -> None:
        self.metrics.actions[(action, outcome)] += 1
        line = {**record, "decision": decision, "outcome": outcome, **fields}
        await self.audit.write(line)
        level = logging.WARNING if decision == "failed" else logging.INFO
        log_event(
            logger,
            level,
            f"runbook {decision}",
            action=action,
            outcome=outcome,
            alertname=record.get("alertname"),
            fingerprint=record.get("fingerprint"),
            reason=fields.get("reason", ""),
        )

    async def drain(self) -> None:
        """Wait until every queued notification is handled (tests, benchmarks, shutdown)."""
        await self.queue.join()

    async def aclose(self) -> None:
        for action in self.actions.values():
            close = getattr(action, "aclose", None)
            if close is not None:
                await close()


def _alert_fields(alert: Alert) -> dict[str, Any]:
    return {
        "alertname": alert.labels.get("alertname", ""),
        "status": alert.status,
        "fingerprint": alert.fingerprint,
        "starts_at": alert.starts_at,
        "labels": dict(alert.labels),
    }
