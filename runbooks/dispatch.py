"""From an accepted notification to audited decisions: the receiver's guard pipeline.

Alerts are handled one at a time by a single worker, in arrival order, so guards never race.
For each firing alert and each rule that matches it, in order: namespace allow-list, plan,
idempotency, dry-run, cooldown, circuit breaker, then apply, verify, and record. Every
outcome, including each refusal, is an audit line and a counted decision. A resolved alert
whose rule asks for it is reverted after the rule's hold time, unless it fires again first.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import asdict
from datetime import datetime
from typing import Any

from inferwatch.logs import log_event
from inferwatch.runbooks import dedup
from inferwatch.runbooks.actions.base import Action, ActionError, Alert, Outcome, Step
from inferwatch.runbooks.audit import AuditLog
from inferwatch.runbooks.breaker import CircuitBreaker
from inferwatch.runbooks.config import Config, Rule
from inferwatch.runbooks.dedup import SeenSet
from inferwatch.runbooks.metrics import RunbookMetrics
from inferwatch.runbooks.payload import Notification

logger = logging.getLogger("inferwatch.runbooks")

QUEUE_SIZE = 1000


class Dispatcher:
    def __init__(
        self,
        config: Config,
        actions: Mapping[str, Action],
        audit: AuditLog,
        *,
        execute: bool,
        seen: SeenSet | None = None,
        breaker: CircuitBreaker | None = None,
        metrics: RunbookMetrics | None = None,
        clock: Callable[[], float] = time.time,
        queue_size: int = QUEUE_SIZE,
    ) -> None:
        self.config = config
        self.actions = actions
        self.audit = audit
        self.execute = execute
        self.seen = seen or SeenSet()
        self.breaker = breaker or CircuitBreaker(config.breaker, clock=clock)
        self.metrics = metrics or RunbookMetrics()
        self.clock = clock
        self.queue: asyncio.Queue[tuple[Notification, dict[str, Any]]] = asyncio.Queue(queue_size)
        self._last_applied: dict[tuple[str, str], float] = {}  # (action, target) -> when
        self._rollbacks: dict[tuple[str, str], asyncio.Task[None]] = {}  # (fingerprint, rule)

    def submit(self, notification: Notification, meta: dict[str, Any]) -> bool:
        """Queue a notification; False when the queue is full (Alertmanager retries)."""
        try:
            self.queue.put_nowait((notification, meta))
        except asyncio.QueueFull:
            return False
        return True

    async def run(self) -> None:
        while True:
            notification, meta = await self.queue.get()
            try:
                if notification.truncated_alerts:
                    reason = f"{notification.truncated_alerts} alerts cut off by max_alerts"
                    record = {**meta, "decision": "skipped", "outcome": "truncated"}
                    await self.audit.write({**record, "reason": reason})
                for alert in notification.alerts:
                    await self.handle(alert, meta)
            except Exception:  # a bug must cost this notification, never the worker
                logger.exception("notification handling failed")
            finally:
                self.queue.task_done()

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
            else:
                await self._resolved(alert, rule, record)

    async def _firing(self, alert: Alert, rule: Rule, record: dict[str, Any]) -> None:
        pending = self._rollbacks.pop((alert.fingerprint, rule.name), None)
        if pending is not None:
            pending.cancel()
            await self._decide(
                record,
                rule.action,
                "skipped",
                "rollback_cancelled",
                reason="fired again before the rollback hold ended",
            )
        if not self.config.namespace_allowed(alert.labels):
            namespace = alert.labels.get("namespace", "")
            await self._decide(
                record,
                rule.action,
                "skipped",
                "namespace",
                reason=f"namespace {namespace!r} is not allowed",
            )
            return
        action = self.actions[rule.action]
        steps = await self._plan(action, alert, rule, record)
        if steps is None:
            return
        record["steps"] = [asdict(step) for step in steps]
        key = dedup.key(alert.fingerprint, alert.starts_at, rule.action)
        if key in self.seen:
            await self._decide(
                record,
                rule.action,
                "skipped",
                "duplicate",
                reason="this firing episode was already acted on",
            )
            return
        if not self.execute:
            await self._decide(
                record,
                rule.action,
                "dry_run",
                "dry_run",
                reason="dry-run: plan recorded, nothing changed",
            )
            return
        now = self.clock()
        for step in steps:
            last = self._last_applied.get((rule.action, step.target))
            if last is not None and now - last < rule.cooldown:
                await self._decide(
                    record,
                    rule.action,
                    "skipped",
                    "cooldown",
                    reason=f"{step.target} was acted on {now - last:.0f}s ago "
                    f"(cooldown {rule.cooldown:g}s)",
                )
                return
        verdict = self.breaker.check(steps)
        if not verdict.allowed:
            await self._decide(record, rule.action, "skipped", "breaker", reason=verdict.reason)
            return
        await self._act(alert, rule, action, steps, record, key)

    async def _act(
        self,
        alert: Alert,
        rule: Rule,
        action: Action,
        steps: Sequence[Step],
        record: dict[str, Any],
        key: str,
    ) -> None:
        started = time.perf_counter()
        results, changed = [], False
        for step in steps:
            outcome = await _safely(action.apply, step)
            results.append({"target": step.target, **_outcome(outcome)})
            if not outcome.ok:
                record["results"] = results
                await self._decide(
                    record,
                    rule.action,
                    "failed",
                    "failed",
                    reason=outcome.detail,
                    duration_s=time.perf_counter() - started,
                )
                return
            changed = changed or outcome.changed
            if outcome.changed:
                self._last_applied[(rule.action, step.target)] = self.clock()
        self.breaker.record(steps)
        if changed:
            self.metrics.observe_applied(rule.action, self.clock() - _epoch(alert.starts_at))
        verification = [_outcome(await _safely(action.verify, step)) for step in steps]
        record.update(
            results=results, verification=verification, duration_s=time.perf_counter() - started
        )
        self.seen.add(key)
        if not all(v["ok"] for v in verification):
            await self._decide(
                record,
                rule.action,
                "failed",
                "verification_failed",
                reason="applied, but the target does not read back as desired",
            )
            return
        if changed:
            await self._decide(record, rule.action, "acted", "applied", reason="applied")
        else:
            await self._decide(
                record, rule.action, "no_op", "no_op", reason="target already in the desired state"
            )

    async def _resolved(self, alert: Alert, rule: Rule, record: dict[str, Any]) -> None:
        if rule.rollback_after is None:
            await self._decide(
                record,
                rule.action,
                "skipped",
                "resolved",
                reason="resolved; the rule does not roll back",
            )
            return
        task_key = (alert.fingerprint, rule.name)
        if (
            task_key in self._rollbacks
            or _rolled_back(alert, rule) in self.seen
            or not self.config.namespace_allowed(alert.labels)
        ):
            return  # a resolve redelivered during the hold or after it, or one refused firing
        await self._decide(
            record,
            rule.action,
            "scheduled",
            "rollback_scheduled",
            reason=f"rollback in {rule.rollback_after:g}s unless it fires again",
        )
        self._rollbacks[task_key] = asyncio.create_task(self._rollback(alert, rule, record))

    async def _rollback(self, alert: Alert, rule: Rule, record: dict[str, Any]) -> None:
        await asyncio.sleep(rule.rollback_after or 0)
        self._rollbacks.pop((alert.fingerprint, rule.name), None)
        self.seen.add(_rolled_back(alert, rule))  # this episode's rollback has had its turn
        action = self.actions[rule.action]
        steps = await self._plan(action, alert, rule, record)
        if steps is None:
            return
        record = {**record, "steps": [asdict(step) for step in steps]}
        if not self.execute:
            await self._decide(
                record,
                rule.action,
                "dry_run",
                "dry_run",
                reason="dry-run: rollback plan recorded, nothing changed",
            )
            return
        results = [{"target": s.target, **_outcome(await _safely(action.revert, s))} for s in steps]
        record["results"] = results
        if all(r["ok"] for r in results):
            await self._decide(
                record,
                rule.action,
                "reverted",
                "reverted",
                reason=f"resolved {rule.rollback_after:g}s ago",
            )
        else:
            await self._decide(
                record,
                rule.action,
                "failed",
                "revert_failed",
                reason="; ".join(r["detail"] for r in results if not r["ok"]),
            )

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
        self, record: dict[str, Any], action: str, decision: str, outcome: str, **fields: Any
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
        for task in self._rollbacks.values():
            task.cancel()
        for action in self.actions.values():
            close = getattr(action, "aclose", None)
            if close is not None:
                await close()


async def _safely(call: Callable[[Step], Any], step: Step) -> Outcome:
    """An action's call, with any exception it lets out turned into a failed outcome."""
    try:
        outcome: Outcome = await call(step)
    except Exception as exc:
        return Outcome(False, False, f"{type(exc).__name__}: {exc}"[:300])
    return outcome


def _outcome(outcome: Outcome) -> dict[str, Any]:
    return {
        "ok": outcome.ok,
        "changed": outcome.changed,
        "detail": outcome.detail,
        "observed": dict(outcome.observed),
    }


def _alert_fields(alert: Alert) -> dict[str, Any]:
    return {
        "alertname": alert.labels.get("alertname", ""),
        "status": alert.status,
        "fingerprint": alert.fingerprint,
        "starts_at": alert.starts_at,
        "labels": dict(alert.labels),
    }


def _epoch(timestamp: str) -> float:
    """Seconds since the epoch of an RFC 3339 time with up to nanoseconds (Go's format)."""
    head, dot, rest = timestamp.partition(".")
    if dot:
        digits = rest.rstrip("Z").split("+")[0].split("-")[0]
        zone = rest[len(digits) :]
        timestamp = f"{head}.{digits[:6]}{zone}"
    return datetime.fromisoformat(timestamp.replace("Z", "+00:00")).timestamp()


def _rolled_back(alert: Alert, rule: Rule) -> str:
    """The seen-set key of an episode's rollback: once it has run, a late redelivery of the
    resolve does not schedule another (a cancelled one never ran, so the next resolve may)."""
    return dedup.key(alert.fingerprint, alert.starts_at, f"rollback {rule.name}")
