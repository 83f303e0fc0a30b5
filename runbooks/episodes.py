"""Episodes: what a firing alert that passed the guards changes, and how that is undone.

An episode (fingerprint, startsAt, rule) holds the targets it wants out while it fires. Its
rollback, once its alert has resolved and the rule's hold has passed, undoes only the targets
it changed, and of those only the ones no other active episode holds: a held target passes to
the holder, whose own rollback undoes it later. Episodes and pending rollbacks live in the
state store, so a restarted receiver resumes them (audited), and a periodic read-back
(``reassert_every``) and every redelivery re-assert an active episode's targets that lost
their state (a restarted sidecar).

The functions taking a :class:`~inferwatch.runbooks.state.State` run inside one store
transaction each; :class:`Episodes` calls the actions between them and audits each outcome.
"""

from __future__ import annotations

import dataclasses
import hashlib
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import asdict, dataclass
from typing import Any, Protocol

from inferwatch.runbooks import breaker, payload
from inferwatch.runbooks.actions.base import Action, Alert, Outcome, Step
from inferwatch.runbooks.config import Breaker, Rule
from inferwatch.runbooks.metrics import RunbookMetrics
from inferwatch.runbooks.state import Episode, State, StateStore, episode_id


def key(fingerprint: str, starts_at: str, action: str) -> str:
    """The idempotency key of one episode's action: each episode starts each action once."""
    return hashlib.sha256(f"{fingerprint}|{starts_at}|{action}".encode()).hexdigest()[:32]


@dataclass(frozen=True)
class Attempt:
    """A firing alert's planned steps under one rule: what the guards read and, when they
    pass, what its episode begins with. Fixed before the transaction, so a store that reruns
    it on a fresh read decides on the same plan at the same time."""

    alert: Alert
    rule: Rule
    steps: Sequence[Step]
    #: the inventory's size of the target's population, by name (empty: no inventory entry)
    populations: Mapping[str, int]
    #: when it is decided: the cooldowns and the breaker's window count from here
    now: float

    @property
    def idempotency_key(self) -> str:
        return key(self.alert.fingerprint, self.alert.starts_at, self.rule.action)

    @property
    def episode_id(self) -> str:
        return episode_id(self.alert.fingerprint, self.alert.starts_at, self.rule.name)


class Decide(Protocol):
    """Write one decision: its audit line, its count and its log line."""

    async def __call__(
        self, record: Mapping[str, Any], action: str, decision: str, outcome: str, **fields: Any
    ) -> None: ...


class Episodes:
    """The actions' calls an episode makes, each audited: its apply, the re-assert of a held
    target that lost its state, and its rollback once resolved."""

    def __init__(
        self,
        store: StateStore,
        actions: Mapping[str, Action],
        metrics: RunbookMetrics,
        clock: Callable[[], float],
        decide: Decide,
    ) -> None:
        self.store = store
        self.actions = actions
        self.metrics = metrics
        self.clock = clock
        self.decide = decide

    async def apply(self, attempt: Attempt, action: Action, record: dict[str, Any]) -> None:
        """Apply a begun episode's steps, then read them back; a failed step ends it there and
        gives its key back, so that a redelivery may try again."""
        rule = attempt.rule
        started = time.perf_counter()
        results, changed = [], []
        for step in attempt.steps:
            outcome = await _safely(action.apply, step)
            results.append({"target": step.target, **_outcome(outcome)})
            if outcome.changed:
                changed.append(step.target)
            if not outcome.ok:
                await self.store.transact(lambda state: _abandon(state, attempt, changed))
                record["results"] = results
                await self.decide(
                    record,
                    rule.action,
                    "failed",
                    "failed",
                    reason=outcome.detail,
                    duration_s=time.perf_counter() - started,
                )
                return
        now = self.clock()
        identity = attempt.episode_id
        await self.store.transact(lambda state: _settle(state, identity, rule.action, changed, now))
        if changed:
            self.metrics.observe_applied(rule.action, now - payload.epoch(attempt.alert.starts_at))
        verification = [_outcome(await _safely(action.verify, step)) for step in attempt.steps]
        record.update(
            results=results, verification=verification, duration_s=time.perf_counter() - started
        )
        if not all(v["ok"] for v in verification):
            await self.decide(
                record,
                rule.action,
                "failed",
                "verification_failed",
                reason="applied, but the target does not read back as desired",
            )
        elif changed:
            await self.decide(record, rule.action, "acted", "applied", reason="applied")
        else:
            await self.decide(
                record, rule.action, "no_op", "no_op", reason="target already in the desired state"
            )

    async def lost(self, action: Action, steps: Sequence[Step]) -> list[Step]:
        """The steps whose targets no longer read back as desired."""
        return [s for s in steps if not (await _safely(action.verify, s)).ok]

    async def reassert(
        self, action: Action, steps: Sequence[Step], record: Mapping[str, Any], identity: str
    ) -> None:
        """Apply again steps whose targets lost their state; what changed, episode
        ``identity`` now has made (so that its rollback undoes it)."""
        outcomes = [(s, await _safely(action.apply, s)) for s in steps]
        changed = [s.target for s, outcome in outcomes if outcome.changed]
        now = self.clock()
        rule = record.get("rule", "")
        await self.store.transact(lambda state: _settle(state, identity, action.name, changed, now))
        results = [{"target": s.target, **_outcome(outcome)} for s, outcome in outcomes]
        ok = all(r["ok"] for r in results)
        line = {**record, "rule": rule, "results": results}
        reason = "a held target had lost its state; applied again"
        await self.decide(
            line,
            action.name,
            "acted" if ok else "failed",
            "reasserted" if ok else "reassert_failed",
            reason=reason,
        )

    async def resolved(self, alert: Alert, rule: Rule, record: dict[str, Any]) -> bool:
        """Decide a resolve; True when it scheduled a rollback (the ticker then sleeps less)."""
        now = self.clock()
        outcome = await self.store.transact(lambda state: _resolve(state, alert, rule, record, now))
        if outcome == "never_acted":
            await self.decide(
                record,
                rule.action,
                "skipped",
                "never_acted",
                reason="this episode changed nothing, so it undoes nothing",
            )
        elif outcome == "resolved":
            await self.decide(
                record,
                rule.action,
                "skipped",
                "resolved",
                reason="resolved; the rule does not roll back",
            )
        elif outcome == "scheduled":
            await self.decide(
                record,
                rule.action,
                "scheduled",
                "rollback_scheduled",
                reason=f"rollback in {rule.rollback_after:g}s unless it fires again",
            )
            return True
        return False

    async def resume(self) -> None:
        """After a restart: audit the rollbacks still pending, which the ticker then runs."""
        pending = await self.store.transact(
            lambda state: [e for e in state.episodes.values() if not e.active]
        )
        for episode in pending:
            await self.decide(
                dict(episode.record),
                episode.action,
                "scheduled",
                "rollback_resumed",
                reason="pending across a receiver restart",
                due=episode.rollback_at,
            )

    async def roll_back_due(self, now: float) -> None:
        """Run every rollback due by ``now``."""
        due = await self.store.transact(lambda state: _take_due(state, now))
        for episode, undo, kept in due:
            await self._roll_back(episode, undo, kept)

    async def read_back(self) -> None:
        """Re-assert every target an active episode holds that lost its state."""
        held = await self.store.transact(_held_steps)
        for episode, raw in held:
            action = self.actions.get(episode.action)
            if action is None:
                continue
            step = Step(**raw)
            if not (await _safely(action.verify, step)).ok:
                await self.reassert(action, [step], episode.record, episode.id)

    async def _roll_back(
        self, episode: Episode, undo: Sequence[dict[str, Any]], kept: Mapping[str, str]
    ) -> None:
        record = dict(episode.record)
        action = self.actions[episode.action]
        if kept:
            held = "; ".join(f"{target} held by {by}" for target, by in sorted(kept.items()))
            await self.decide(
                record, episode.action, "skipped", "rollback_held", reason=f"left out: {held}"
            )
        if not undo:
            if not kept:
                await self.decide(
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
            await self.decide(
                record, episode.action, "reverted", "reverted", reason="resolved and held no longer"
            )
        else:
            await self.decide(
                record,
                episode.action,
                "failed",
                "revert_failed",
                reason="; ".join(r["detail"] for r in results if not r["ok"]),
            )


def cancel_rollback(state: State, alert: Alert, rule: Rule) -> bool:
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


def begin(state: State, attempt: Attempt, limits: Breaker, record: Mapping[str, Any]) -> None:
    """The guards passed: the key is taken (no other replica acts on it), the targets count
    against the breaker, and the episode holds its steps."""
    state.remember(state.seen, attempt.idempotency_key, attempt.now)
    breaker.record(state, limits, attempt.steps, attempt.now)
    alert, rule = attempt.alert, attempt.rule
    episode = state.episodes.setdefault(
        attempt.episode_id,
        Episode(alert.fingerprint, alert.starts_at, rule.name, rule.action, [], []),
    )
    for step in attempt.steps:
        if not episode.holds(step.target):
            episode.steps.append(asdict(step))
    episode.record = _short(record)


def _abandon(state: State, attempt: Attempt, changed: Sequence[str]) -> None:
    """An apply failed: a redelivery may try again, and what did not go out is not counted."""
    state.seen.pop(attempt.idempotency_key, None)
    breaker.forget(state, [s for s in attempt.steps if s.target not in changed], attempt.now)
    episode = state.episodes.get(attempt.episode_id)
    if episode is None:
        return
    episode.made = sorted(set(episode.made) | set(changed))
    if not episode.made:
        del state.episodes[attempt.episode_id]


def _settle(state: State, identity: str, action: str, changed: Sequence[str], now: float) -> None:
    """An apply or re-assert finished: what it changed is the episode's to undo, and each
    changed target's cooldown starts now."""
    episode = state.episodes.get(identity)
    if episode is not None:
        episode.made = sorted(set(episode.made) | set(changed))
        episode.settled = True
    for target in changed:
        state.remember(state.applied, f"{action} {target}", now)


def _resolve(state: State, alert: Alert, rule: Rule, record: Mapping[str, Any], now: float) -> str:
    """What a resolve does to its episode: ``again``, ``never_acted``, ``resolved`` (the rule
    does not roll back) or ``scheduled``."""
    identity = episode_id(alert.fingerprint, alert.starts_at, rule.name)
    episode = state.episodes.get(identity)
    rolled = _rolled_back(alert.fingerprint, alert.starts_at, rule.name)
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


def _short(record: Mapping[str, Any]) -> dict[str, Any]:
    """What an episode keeps of its alert's audit fields, for its later lines."""
    kept = ("alertname", "fingerprint", "starts_at", "rule", "action", "target")
    return {k: record[k] for k in kept if k in record}


def _rolled_back(fingerprint: str, starts_at: str, rule: str) -> str:
    """The idempotency key of an episode's rollback: once it has run, a late redelivery of
    the resolve does not schedule another."""
    return key(fingerprint, starts_at, f"rollback {rule}")
