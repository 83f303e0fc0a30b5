"""From an accepted notification to audited decisions: the receiver's guard pipeline.

Alerts are handled one at a time by a single worker, in arrival order, each on its own: a
malformed alert, or one whose handling fails, is audited and costs only itself. For each
firing alert and each rule that matches it, in order: inventory (the alert must name exactly
one target the receiver trusts), namespace allow-list, plan, then one state transaction that
checks idempotency, dry-run, cooldown and the circuit breaker and, when all pass, reserves the
episode; then apply, verify, and record what the episode changed. Every outcome, each refusal
included, is an audit line and a counted decision.

An episode (fingerprint, startsAt, rule) holds the targets it wants out while it fires. Its
rollback, once its alert has resolved and the rule's hold has passed, undoes only the targets
it changed, and of those only the ones no other active episode holds: a held target passes to
the holder, whose own rollback undoes it later. Episodes and pending rollbacks live in the
state store, so a restarted receiver resumes them (audited), and a periodic read-back
(``reassert_every``) and every redelivery re-assert an active episode's targets that lost
their state (a restarted sidecar).
"""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import hashlib
import logging
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import asdict
from typing import Any, Protocol

from inferwatch.logs import log_event
from inferwatch.runbooks import breaker, payload
from inferwatch.runbooks.actions.base import Action, ActionError, Alert, Outcome, Step
from inferwatch.runbooks.audit import AuditLog
from inferwatch.runbooks.config import Config, Rule
from inferwatch.runbooks.inventory import Inventory, Refused
from inferwatch.runbooks.metrics import RunbookMetrics
from inferwatch.runbooks.payload import Malformed, Notification
from inferwatch.runbooks.state import (
    MAX_EPISODES,
    Episode,
    MemoryStore,
    State,
    StateError,
    StateStore,
    episode_id,
)

logger = logging.getLogger("inferwatch.runbooks")

QUEUE_SIZE = 1000


class Leader(Protocol):
    """Who acts among receiver replicas (a Kubernetes Lease)."""

    def leading(self) -> bool: ...

    async def run(self) -> None:
        """Keep acquiring or renewing, until cancelled."""
        ...


#: how long the ticker sleeps with nothing due (a new schedule wakes it at once)
IDLE_S = 60.0
#: notification bytes read or queued at once, at most (then 429 with Retry-After)
MAX_BACKLOG_BYTES = 8 * 1024 * 1024


def _failed(what: str, exc: Exception) -> None:
    """A store that cannot be read or written says where and why in its one line; anything
    else is a bug, logged with its traceback."""
    if isinstance(exc, StateError):
        log_event(logger, logging.ERROR, what, reason=str(exc)[:500])
    else:
        logger.exception(what)


def key(fingerprint: str, starts_at: str, action: str) -> str:
    """The idempotency key of one episode's action: each episode starts each action once."""
    return hashlib.sha256(f"{fingerprint}|{starts_at}|{action}".encode()).hexdigest()[:32]


class Dispatcher:
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
            await self._resume()
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
            else:
                await self._resolved(alert, rule, record)

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
        if not self.config.namespace_allowed(alert.labels):
            namespace = alert.labels.get("namespace", "")
            reason = f"namespace {namespace!r} is not allowed"
            await self._decide(record, rule.action, "skipped", "namespace", reason=reason)
            return
        action = self.actions[rule.action]
        steps = await self._plan(action, alert, rule, record)
        if steps is None:
            return
        if found is not None:
            steps = [dataclasses.replace(s, group=found[0].population) for s in steps]
        record["steps"] = [asdict(step) for step in steps]
        done = key(alert.fingerprint, alert.starts_at, rule.action)
        identity = episode_id(alert.fingerprint, alert.starts_at, rule.name)
        now = self.clock()

        def verdict(state: State) -> tuple[str, str]:
            """What the guards that read the shared state say: ``act``, or why not."""
            if done in state.seen:
                episode = state.episodes.get(identity)
                settled = episode is not None and episode.settled  # else: being applied now
                return ("duplicate" if settled else "acting"), "this episode was acted on already"
            if not self.execute:
                return "dry_run", "dry-run: plan recorded, nothing changed"
            for step in steps:
                last = state.applied.get(f"{rule.action} {step.target}")
                if last is not None and now - last < rule.cooldown:
                    ago = f"{now - last:.0f}s ago (cooldown {rule.cooldown:g}s)"
                    return "cooldown", f"{step.target} was acted on {ago}"
            allowed = breaker.check(state, self.config.breaker, steps, populations, now)
            if not allowed.allowed:
                return "breaker", allowed.reason
            if identity not in state.episodes and len(state.episodes) >= MAX_EPISODES:
                return "state_full", f"{MAX_EPISODES} episodes are held already"
            return "act", ""

        def decide(state: State) -> tuple[str, str, bool]:
            cancelled = _cancel_rollback(state, alert, rule)
            outcome, reason = verdict(state)
            if outcome != "act":
                return outcome, reason, cancelled
            state.remember(state.seen, done, now)  # reserved: no other replica acts on it
            breaker.record(state, self.config.breaker, steps, now)
            episode = state.episodes.setdefault(
                identity,
                Episode(alert.fingerprint, alert.starts_at, rule.name, rule.action, [], []),
            )
            for step in steps:
                if not episode.holds(step.target):
                    episode.steps.append(asdict(step))
            episode.record = _short(record)
            return "act", "", cancelled

        outcome, reason, cancelled = await self.store.transact(decide)
        if cancelled:
            why = "fired again before the rollback hold ended"
            await self._decide(record, rule.action, "skipped", "rollback_cancelled", reason=why)
        if outcome == "duplicate":
            await self._duplicate(action, steps, rule, record, reason, identity)
        elif outcome == "acting":  # another receiver is applying it right now
            await self._decide(record, rule.action, "skipped", "duplicate", reason=reason)
        elif outcome == "dry_run":
            await self._decide(record, rule.action, "dry_run", "dry_run", reason=reason)
        elif outcome != "act":
            await self._decide(record, rule.action, "skipped", outcome, reason=reason)
        else:
            await self._act(alert, rule, action, steps, record, done, now)

    async def _act(
        self,
        alert: Alert,
        rule: Rule,
        action: Action,
        steps: Sequence[Step],
        record: dict[str, Any],
        done: str,
        reserved_at: float,
    ) -> None:
        started = time.perf_counter()
        results, changed = [], []
        identity = episode_id(alert.fingerprint, alert.starts_at, rule.name)
        for step in steps:
            outcome = await _safely(action.apply, step)
            results.append({"target": step.target, **_outcome(outcome)})
            if outcome.changed:
                changed.append(step.target)
            if not outcome.ok:
                await self.store.transact(
                    lambda state: _unreserve(state, identity, done, steps, changed, reserved_at)
                )
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
        now = self.clock()
        await self.store.transact(lambda state: _made(state, identity, rule.action, changed, now))
        if changed:
            self.metrics.observe_applied(rule.action, now - payload.epoch(alert.starts_at))
        verification = [_outcome(await _safely(action.verify, step)) for step in steps]
        record.update(
            results=results, verification=verification, duration_s=time.perf_counter() - started
        )
        if not all(v["ok"] for v in verification):
            await self._decide(
                record,
                rule.action,
                "failed",
                "verification_failed",
                reason="applied, but the target does not read back as desired",
            )
        elif changed:
            await self._decide(record, rule.action, "acted", "applied", reason="applied")
        else:
            await self._decide(
                record, rule.action, "no_op", "no_op", reason="target already in the desired state"
            )

    async def _duplicate(
        self,
        action: Action,
        steps: Sequence[Step],
        rule: Rule,
        record: dict[str, Any],
        why: str,
        identity: str,
    ) -> None:
        """A redelivered episode: nothing new, unless a target lost its state (re-asserted)."""
        if self.execute:
            lost = [s for s in steps if not (await _safely(action.verify, s)).ok]
            if lost:
                await self._reassert(action, lost, record, identity)
                return
        await self._decide(record, rule.action, "skipped", "duplicate", reason=why)

    async def _reassert(
        self, action: Action, steps: Sequence[Step], record: Mapping[str, Any], identity: str
    ) -> None:
        """Apply again steps whose targets lost their state; what changed, episode
        ``identity`` now has made (so that its rollback undoes it)."""
        outcomes = [(s, await _safely(action.apply, s)) for s in steps]
        changed = [s.target for s, outcome in outcomes if outcome.changed]
        now = self.clock()
        rule = record.get("rule", "")
        await self.store.transact(lambda state: _made(state, identity, action.name, changed, now))
        results = [{"target": s.target, **_outcome(outcome)} for s, outcome in outcomes]
        ok = all(r["ok"] for r in results)
        line = {**record, "rule": rule, "results": results}
        reason = "a held target had lost its state; applied again"
        await self._decide(
            line,
            action.name,
            "acted" if ok else "failed",
            "reasserted" if ok else "reassert_failed",
            reason=reason,
        )

    # -- resolved and rollbacks --------------------------------------------------------

    async def _resolved(self, alert: Alert, rule: Rule, record: dict[str, Any]) -> None:
        identity = episode_id(alert.fingerprint, alert.starts_at, rule.name)
        rolled = _rolled_back(alert.fingerprint, alert.starts_at, rule.name)
        now = self.clock()

        def resolve(state: State) -> str:
            episode = state.episodes.get(identity)
            if rolled in state.seen or (episode is not None and not episode.active):
                return "again"  # a resolve redelivered during the hold or after it
            if episode is None:
                return "never_acted"
            if rule.rollback_after is None:
                del state.episodes[identity]
                return "resolved"
            episode.rollback_at = now + rule.rollback_after
            episode.record = _short(record)
            return "scheduled"

        outcome = await self.store.transact(resolve)
        if outcome == "never_acted":
            await self._decide(
                record,
                rule.action,
                "skipped",
                "never_acted",
                reason="this episode changed nothing, so it undoes nothing",
            )
        elif outcome == "resolved":
            await self._decide(
                record,
                rule.action,
                "skipped",
                "resolved",
                reason="resolved; the rule does not roll back",
            )
        elif outcome == "scheduled":
            await self._decide(
                record,
                rule.action,
                "scheduled",
                "rollback_scheduled",
                reason=f"rollback in {rule.rollback_after:g}s unless it fires again",
            )
            self._wake.set()

    async def _resume(self) -> None:
        """After a restart: audit the rollbacks still pending, which the ticker then runs."""
        pending = await self.store.transact(
            lambda state: [e for e in state.episodes.values() if not e.active]
        )
        for episode in pending:
            await self._decide(
                dict(episode.record),
                episode.action,
                "scheduled",
                "rollback_resumed",
                reason="pending across a receiver restart",
                due=episode.rollback_at,
            )

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
        due = await self.store.transact(lambda state: _take_due(state, now))
        for episode, undo, kept in due:
            await self._roll_back(episode, undo, kept)
        if every is not None and now - self._last_reassert >= every:
            self._last_reassert = now
            await self._read_back()
        pending = await self.store.transact(
            lambda state: [e.rollback_at for e in state.episodes.values() if e.rollback_at]
        )
        soonest = min([every or IDLE_S, *(at - now for at in pending)])
        return max(soonest, 0.01)

    async def _roll_back(
        self, episode: Episode, undo: Sequence[dict[str, Any]], kept: Mapping[str, str]
    ) -> None:
        record = dict(episode.record)
        action = self.actions[episode.action]
        if kept:
            held = "; ".join(f"{target} held by {by}" for target, by in sorted(kept.items()))
            await self._decide(
                record, episode.action, "skipped", "rollback_held", reason=f"left out: {held}"
            )
        if not undo:
            if not kept:
                await self._decide(
                    record,
                    episode.action,
                    "skipped",
                    "never_acted",
                    reason="this episode changed nothing, so it undoes nothing",
                )
            return
        steps = [Step(**raw) for raw in undo]
        results = [{"target": s.target, **_outcome(await _safely(action.revert, s))} for s in steps]
        record.update(steps=list(undo), results=results)
        if all(r["ok"] for r in results):
            await self._decide(
                record, episode.action, "reverted", "reverted", reason="resolved and held no longer"
            )
        else:
            await self._decide(
                record,
                episode.action,
                "failed",
                "revert_failed",
                reason="; ".join(r["detail"] for r in results if not r["ok"]),
            )

    async def _read_back(self) -> None:
        """Re-assert every target an active episode holds that lost its state."""
        held = await self.store.transact(_held_steps)
        for episode, raw in held:
            action = self.actions.get(episode.action)
            if action is None:
                continue
            step = Step(**raw)
            if not (await _safely(action.verify, step)).ok:
                await self._reassert(action, [step], episode.record, episode.id)

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


def _cancel_rollback(state: State, alert: Alert, rule: Rule) -> bool:
    """A re-fire of an alert whose rollback is pending: the firing episode takes it over."""
    identity = episode_id(alert.fingerprint, alert.starts_at, rule.name)
    pending = [
        e
        for e in state.episodes.values()
        if e.fingerprint == alert.fingerprint and e.rule == rule.name and not e.active
    ]
    for old in pending:
        del state.episodes[old.id]
        episode = state.episodes.setdefault(identity, dataclasses.replace(old, rollback_at=None))
        episode.starts_at = alert.starts_at
        for step in old.steps:
            if not episode.holds(step["target"]):
                episode.steps.append(step)
        episode.made = sorted(set(episode.made) | set(old.made))
    return bool(pending)


def _unreserve(
    state: State,
    identity: str,
    done: str,
    steps: Sequence[Step],
    changed: Sequence[str],
    reserved_at: float,
) -> None:
    """An apply failed: a redelivery may try again, and what did not go out is not counted."""
    state.seen.pop(done, None)
    breaker.forget(state, [s for s in steps if s.target not in changed], reserved_at)
    episode = state.episodes.get(identity)
    if episode is None:
        return
    episode.made = sorted(set(episode.made) | set(changed))
    if not episode.made:
        del state.episodes[identity]


def _made(state: State, identity: str, action: str, changed: Sequence[str], now: float) -> None:
    episode = state.episodes.get(identity)
    if episode is not None:
        episode.made = sorted(set(episode.made) | set(changed))
        episode.settled = True
    for target in changed:
        state.remember(state.applied, f"{action} {target}", now)


def _take_due(
    state: State, now: float
) -> list[tuple[Episode, list[dict[str, Any]], dict[str, str]]]:
    """Remove the episodes whose rollback is due; per episode, the steps it undoes and the
    targets it leaves to another active episode that holds them (which inherits them)."""
    due = [e for e in state.episodes.values() if e.rollback_at is not None and e.rollback_at <= now]
    out = []
    for episode in due:
        del state.episodes[episode.id]
        state.remember(
            state.seen, _rolled_back(episode.fingerprint, episode.starts_at, episode.rule), now
        )
        undo, kept = [], {}
        for raw in episode.steps:
            if raw["target"] not in episode.made:
                continue
            holder = next(
                (
                    e
                    for e in state.episodes.values()
                    if e.active and e.action == episode.action and e.holds(raw["target"])
                ),
                None,
            )
            if holder is None:
                undo.append(raw)
                continue
            # the holder takes over the step as it was applied (unless it applied its own
            # since), so that its rollback undoes what the target holds
            if raw["target"] not in holder.made:
                holder.steps = [s for s in holder.steps if s["target"] != raw["target"]] + [raw]
                holder.made = sorted({*holder.made, raw["target"]})
            kept[raw["target"]] = holder.record.get("alertname", "") + " " + holder.fingerprint
        out.append((episode, undo, kept))
    return out


def _held_steps(state: State) -> list[tuple[Episode, dict[str, Any]]]:
    """Each target active episodes hold, once, with the episode whose step re-asserts it:
    the one that changed it, else the first holder."""
    chosen: dict[str, tuple[Episode, dict[str, Any], bool]] = {}
    for episode in state.episodes.values():
        if not episode.active or not episode.settled:  # unsettled: still being applied
            continue
        for raw in episode.steps:
            made = raw["target"] in episode.made
            name = f"{episode.action} {raw['target']}"
            if name not in chosen or (made and not chosen[name][2]):
                chosen[name] = (episode, raw, made)
    return [(episode, raw) for episode, raw, _ in chosen.values()]


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


def _short(record: Mapping[str, Any]) -> dict[str, Any]:
    """What an episode keeps of its alert's audit fields, for its later lines."""
    kept = ("alertname", "fingerprint", "starts_at", "rule", "action", "target")
    return {k: record[k] for k in kept if k in record}


def _rolled_back(fingerprint: str, starts_at: str, rule: str) -> str:
    """The idempotency key of an episode's rollback: once it has run, a late redelivery of
    the resolve does not schedule another."""
    return key(fingerprint, starts_at, f"rollback {rule}")
