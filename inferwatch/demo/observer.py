"""What the demo shows, read the way an operator's tools read it: from the components' endpoints.

Every poll scrapes each sidecar's ``/metrics`` and ``/readyz`` and each proxy's ``/metrics``
on its tenant metrics listener (and the scrapers' target lists and Alertmanager's alerts now and
then), keeps the last few seconds of scrapes, and turns them into one :class:`FleetState`:
rates from counter increases and latency quantiles from histogram bucket increases over that
window. Changes an operator would want to hear about (readiness flips, probe verdicts, engine
up/down, GPU health, cold-start phases, alerts reaching Alertmanager and resolving, and each
decision the runbook receiver appends to its audit log) become events.
"""

from __future__ import annotations

import asyncio
import json
import time
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field, replace
from datetime import datetime
from pathlib import Path
from typing import Any

import httpx

from inferwatch import catalog
from inferwatch.demo.loadgen import LoadStats
from inferwatch.demo.signals import History, Scrape, quantiles, rate
from inferwatch.demo.topology import Replica, Tenant

#: the /readyz conditions that fail, as (condition, reason)
Failing = tuple[tuple[str, str], ...]
#: seconds of scrapes that rates and quantiles are computed over
WINDOW = 10.0
_TARGETS_EVERY = 5.0
_ALERTS_EVERY = 2.0
#: alerts read from Alertmanager per poll; a fleet in real trouble has more, the view shows few
MAX_ALERTS = 200
#: bytes of the receiver's audit log read per poll (the rest waits for the next), and the
#: longest line taken (a longer one is skipped whole)
AUDIT_READ_BYTES = 256 * 1024
MAX_AUDIT_LINE = 64 * 1024
#: the receiver's latest decisions kept for the view
DECISIONS_KEPT = 5
#: what reaching each cold-start phase means, as the events say it
PHASE_EVENTS = {
    "process_start": "sidecar started, engine starting",
    "engine_reachable": "engine answering, model loading",
    "engine_healthy": "model loaded, warming up",
    "warmup_done": "warm-up done, ready for traffic",
    "serving": "serving its first client request",
}


def _name(key: str) -> str:
    return catalog.load()[key].name


@dataclass
class ReplicaState:
    replica: Replica
    reachable: bool = False  # the sidecar answered
    ready: bool | None = None
    failing: Failing = ()  # /readyz conditions that fail: (name, reason)
    engine_up: bool | None = None
    gpu_healthy: bool | None = None
    gpu_problem: str = ""
    gpu_utilization: float | None = None
    gpu_temperature: float | None = None
    requests_per_s: float | None = None  # all the engine finished, probes included
    probe_requests_per_s: float | None = None  # the sidecar's probes, straight to the engine
    tokens_per_s: float | None = None
    errors_per_s: float | None = None
    ttft: tuple[float | None, ...] = (None, None)  # p50, p99
    tpot: tuple[float | None, ...] = (None, None)
    running: float | None = None
    waiting: float | None = None
    kv_usage: float | None = None
    probe_pass: float | None = None
    probe_verdict: str = ""
    #: Unix time each cold-start phase was reached, in phase order
    phases: Mapping[str, float] = field(default_factory=dict)


@dataclass
class TenantState:
    tenant: Tenant
    requests_per_s: float | None = None
    ok: float = 0.0
    rejected: float = 0.0
    errors: float = 0.0
    tokens: float = 0.0
    tokens_per_s: float | None = None
    cost: float = 0.0
    cost_per_hour: float | None = None
    budget_left: float | None = None  # lowest share left over the proxies
    #: proxies that charged the tenant: its budget holds across all of them (shared state)
    proxies: int = 0


@dataclass(frozen=True)
class AlertState:
    """One alert as Alertmanager holds it."""

    fingerprint: str
    name: str
    severity: str
    where: str  # the replica, model version or GPU it is about
    inhibited: bool  # suppressed by an inhibition rule (or a silence)
    receivers: tuple[str, ...]
    starts_at: datetime | None

    @classmethod
    def parse(cls, raw: Any) -> AlertState:
        """One entry of Alertmanager's ``GET /api/v2/alerts``; raises on a malformed one."""
        labels: Mapping[str, str] = raw["labels"]
        # a replica's alert names it; a model's names the model (without its org) and version
        model = " ".join(
            part
            for part in (labels.get("model", "").rsplit("/", 1)[-1], labels.get("model_version"))
            if part
        )
        where = labels.get("replica") or labels.get("pod") or model
        if labels.get("tenant"):
            where = f"{where} tenant {labels['tenant']}".strip()
        try:
            starts_at: datetime | None = datetime.fromisoformat(raw["startsAt"])
        except (KeyError, TypeError, ValueError):
            starts_at = None
        return cls(
            fingerprint=str(raw["fingerprint"]),
            name=labels.get("alertname", "?"),
            severity=labels.get("severity", ""),
            where=where or labels.get("cluster", ""),
            inhibited=raw["status"]["state"] == "suppressed",
            receivers=tuple(str(r["name"]) for r in raw.get("receivers", ())),
            starts_at=starts_at,
        )

    def describe(self) -> str:
        """Name, severity, subject and where Alertmanager routes it (besides the automation)."""
        routed = ",".join(r for r in self.receivers if r != "automation") or "-"
        return " ".join(
            part for part in (self.name, self.severity, self.where, "->", routed) if part
        )


@dataclass(frozen=True)
class RunbookDecision:
    """One decision of the runbook receiver, from a line of its audit log."""

    decision: str  # dry_run, acted, no_op, skipped, failed, ..., rejected (a refused webhook)
    outcome: str
    action: str
    subject: str  # the replica the alert is about
    alertname: str
    reason: str

    @classmethod
    def parse(cls, record: Any) -> RunbookDecision | None:
        """The decision an audit record tells, or None for one without an action (an unmapped
        alert) or that is not a decision record at all."""
        if not isinstance(record, dict):
            return None
        decision = str(record.get("decision", ""))
        action = str(record.get("action", ""))
        if not action and decision != "rejected":
            return None
        labels = record.get("labels")
        labels = labels if isinstance(labels, dict) else {}
        subject = labels.get("replica") or labels.get("pod") or labels.get("instance") or ""
        return cls(
            decision=decision,
            outcome=str(record.get("outcome", "")),
            action=action,
            subject=str(subject)[:64],
            alertname=str(record.get("alertname", ""))[:64],
            reason=str(record.get("reason", ""))[:160],
        )

    def describe(self) -> str:
        """``dry-run: isolate_replica primary-v1 (InferwatchGPUXidErrors)``."""
        head = self.decision.replace("_", "-")
        if self.decision == "rejected":
            return f"rejected a webhook ({self.outcome}): {self.reason}"
        if self.outcome and self.outcome != self.decision:
            head += f" ({self.outcome})"
        text = f"{head}: {self.action} {self.subject or '?'} ({self.alertname})"
        return text if self.decision in ("dry_run", "acted") else f"{text}: {self.reason}"


class AuditTail:
    """Follows the receiver's JSONL audit log: each poll returns the decisions added since.

    Reads are bounded per poll and per line; a line that is not JSON is counted and skipped.
    """

    def __init__(self, path: Path) -> None:
        self.path = path
        self.offset = 0
        self.bad_lines = 0
        self._partial = b""

    def read(self) -> list[RunbookDecision]:
        try:
            with self.path.open("rb") as stream:
                stream.seek(self.offset)
                chunk = stream.read(AUDIT_READ_BYTES)
        except OSError:
            return []  # not written yet
        self.offset += len(chunk)
        *lines, self._partial = (self._partial + chunk).split(b"\n")
        if len(self._partial) > MAX_AUDIT_LINE:
            self._partial, self.bad_lines = b"", self.bad_lines + 1
        decisions = []
        for line in lines:
            try:
                record = json.loads(line) if len(line) <= MAX_AUDIT_LINE else None
            except ValueError:
                record = None
            if record is None:
                self.bad_lines += bool(line.strip())
                continue
            decision = RunbookDecision.parse(record)
            if decision is not None:
                decisions.append(decision)
        return decisions


@dataclass
class FleetState:
    t: float
    replicas: list[ReplicaState]
    tenants: list[TenantState]
    load: LoadStats
    rate: float
    targets: tuple[int, int] | None = None  # scrape targets up, targets
    alerts: tuple[AlertState, ...] | None = None  # None: no Alertmanager, or no answer yet
    #: the runbook receiver's latest decisions, newest last; None: no receiver
    decisions: tuple[RunbookDecision, ...] | None = None
    events: list[str] = field(default_factory=list)  # what changed since the last poll


class Observer:
    def __init__(
        self,
        http: httpx.AsyncClient,
        replicas: Sequence[Replica],
        tenants: Sequence[Tenant],
        sidecar_urls: Mapping[str, str],
        proxy_urls: Mapping[str, str],
        scrapers: Sequence[str],
        alertmanager_url: str | None = None,
        audit_log: Path | None = None,
    ) -> None:
        self.http = http
        self.replicas = tuple(replicas)
        self.tenants = tuple(tenants)
        #: what scrapes the fleet: Prometheus, or each cluster's vmagent (the same target API)
        self.scrapers = tuple(scrapers)
        self.sidecar_urls = dict(sidecar_urls)
        self.proxy_urls = dict(proxy_urls)
        self._sidecars = {r.name: History(WINDOW) for r in replicas}
        #: by proxy (a replica may have two, :func:`~inferwatch.demo.topology.proxy_names`)
        self._proxies = {name: History(WINDOW) for name in self.proxy_urls}
        self._previous: dict[str, ReplicaState] = {}
        self._targets_seen: tuple[int, int] | None = None
        self._targets_checked = 0.0
        self.alertmanager_url = alertmanager_url
        self._alerts: tuple[AlertState, ...] | None = None
        self._alerts_checked = 0.0
        self._alert_events: list[str] = []
        self._audit = AuditTail(audit_log) if audit_log is not None else None
        self._decisions: tuple[RunbookDecision, ...] = ()

    def watch(self, replica: Replica, sidecar_url: str, proxy_url: str) -> None:
        """Watch a replica started after t=0 (a scale-out): every cold-start phase it reaches
        from here on, its start included, becomes an event."""
        self.replicas = (*self.replicas, replica)
        self.sidecar_urls[replica.name] = sidecar_url
        self.proxy_urls[replica.name] = proxy_url
        self._sidecars[replica.name] = History(WINDOW)
        self._proxies[replica.name] = History(WINDOW)
        self._previous[replica.name] = ReplicaState(replica)  # nothing reached yet

    async def poll(self, t: float, load: LoadStats, load_rate: float) -> FleetState:
        """Read every endpoint once and return the fleet as it is now."""
        names = [r.name for r in self.replicas]
        sidecar_pages, proxy_pages, readiness, _, _ = await asyncio.gather(
            asyncio.gather(*(self._scrape(self.sidecar_urls[n] + "/metrics") for n in names)),
            asyncio.gather(*(self._scrape(url + "/metrics") for url in self.proxy_urls.values())),
            asyncio.gather(*(self._readyz(self.sidecar_urls[n]) for n in names)),
            self._targets(),
            self._read_alerts(),
        )
        for name, page in zip(names, sidecar_pages, strict=True):
            if page is not None:
                self._sidecars[name].add(page)
        for proxy, page in zip(self.proxy_urls, proxy_pages, strict=True):
            if page is not None:
                self._proxies[proxy].add(page)
        replicas = [
            self._replica(replica, fresh=page is not None, ready=ready)
            for replica, page, ready in zip(self.replicas, sidecar_pages, readiness, strict=True)
        ]
        decided = self._audit.read() if self._audit is not None else []
        self._decisions = (*self._decisions, *decided)[-DECISIONS_KEPT:]
        return FleetState(
            t=t,
            replicas=replicas,
            tenants=[self._tenant(tenant) for tenant in self.tenants],
            load=load,
            rate=load_rate,
            targets=self._targets_seen,
            alerts=self._alerts,
            decisions=self._decisions if self._audit is not None else None,
            events=self._changes(replicas)
            + self._take_alert_events()
            + [f"runbooks {decision.describe()}" for decision in decided],
        )

    def _changes(self, replicas: Sequence[ReplicaState]) -> list[str]:
        """Events for what changed on each replica since it was last known.

        A sidecar that does not answer (restarting with its pod) leaves its states unknown;
        they are compared with the last known ones, so that a replica that comes back ready
        says so.
        """
        events = []
        for now in replicas:
            name = now.replica.name
            before = self._previous.get(name)
            # an unknown state (a sidecar restarting) keeps the last known one, so that
            # ready -> no answer -> ready is no event and NOT READY -> no answer -> ready is one
            self._previous[name] = now if before is None else _known(before, now)
            if before is None:
                continue
            if _flipped(before.ready, now.ready):
                reasons = "; ".join(f"{condition}: {reason}" for condition, reason in now.failing)
                events.append(
                    f"{name}: /readyz NOT READY -> ready"
                    if now.ready
                    else f"{name}: /readyz ready -> NOT READY ({reasons})"
                )
            if _flipped(before.engine_up, now.engine_up):
                events.append(
                    f"{name}: engine_up {int(bool(before.engine_up))} -> {int(bool(now.engine_up))}"
                )
            if _flipped(before.gpu_healthy, now.gpu_healthy):
                events.append(
                    f"{name}: GPU healthy again"
                    if now.gpu_healthy
                    else f"{name}: GPU unhealthy ({now.gpu_problem})"
                )
            events += _phase_events(name, before.phases, now.phases)
            if _flipped(before.probe_verdict or None, now.probe_verdict or None):
                ratio = "-" if now.probe_pass is None else f"{now.probe_pass:.0%}"
                events.append(
                    f"{name}: probe verdict {before.probe_verdict} -> {now.probe_verdict} "
                    f"(pass rate {ratio})"
                )
        return events

    # --- reading endpoints -----------------------------------------------------------------------
    async def _scrape(self, url: str) -> Scrape | None:
        try:
            response = await self.http.get(url, timeout=2.0)
            response.raise_for_status()
        except httpx.HTTPError:
            return None
        return Scrape.parse(time.monotonic(), response.content)

    async def _readyz(self, base_url: str) -> tuple[bool, Failing] | None:
        try:
            response = await self.http.get(base_url + "/readyz", timeout=2.0)
            body = response.json()
        except (httpx.HTTPError, ValueError):
            return None
        try:
            failing = tuple(
                (str(c["name"]), str(c["reason"])) for c in body["conditions"] if not c["ok"]
            )
        except (KeyError, TypeError):
            failing = (("readyz", "unreadable answer"),)
        return response.status_code == 200, failing

    async def _targets(self) -> None:
        """Refresh the scrapers' target health every few seconds, summed over them; unknown
        while one does not answer."""
        now = time.monotonic()
        if not self.scrapers or now - self._targets_checked < _TARGETS_EVERY:
            return
        self._targets_checked = now
        try:
            answers = await asyncio.gather(
                *(self.http.get(url + "/api/v1/targets", timeout=2.0) for url in self.scrapers)
            )
            targets = [t for answer in answers for t in answer.json()["data"]["activeTargets"]]
        except (httpx.HTTPError, ValueError, KeyError, TypeError):
            self._targets_seen = None
            return
        self._targets_seen = (sum(t.get("health") == "up" for t in targets), len(targets))

    async def _read_alerts(self) -> None:
        """Refresh the alerts Alertmanager holds every few seconds; changes become events."""
        now = time.monotonic()
        if self.alertmanager_url is None or now - self._alerts_checked < _ALERTS_EVERY:
            return
        self._alerts_checked = now
        try:
            response = await self.http.get(self.alertmanager_url + "/api/v2/alerts", timeout=2.0)
            response.raise_for_status()
            raw = response.json()
            alerts = tuple(AlertState.parse(entry) for entry in raw[:MAX_ALERTS])
        except (httpx.HTTPError, ValueError, KeyError, TypeError, AttributeError):
            return  # keep the last answer; Alertmanager may be restarting
        before = {a.fingerprint: a for a in self._alerts or ()}
        after = {a.fingerprint: a for a in alerts}
        for fingerprint, alert in after.items():
            if fingerprint not in before:
                state = "inhibited" if alert.inhibited else "firing"
                self._alert_events.append(f"ALERT {state}: {alert.describe()}")
            elif before[fingerprint].inhibited != alert.inhibited:
                state = "now inhibited" if alert.inhibited else "no longer inhibited"
                self._alert_events.append(f"ALERT {state}: {alert.describe()}")
        for fingerprint, alert in before.items():
            if fingerprint not in after:
                self._alert_events.append(f"ALERT resolved: {alert.describe()}")
        self._alerts = tuple(
            sorted(alerts, key=lambda a: (_SEVERITY_ORDER.get(a.severity, 3), a.name, a.where))
        )

    def _take_alert_events(self) -> list[str]:
        events, self._alert_events = self._alert_events, []
        return events

    # --- turning scrapes into signals ------------------------------------------------------------
    def _replica(
        self, replica: Replica, fresh: bool, ready: tuple[bool, Failing] | None
    ) -> ReplicaState:
        state = ReplicaState(replica, reachable=fresh)
        if ready is not None:
            state.ready, state.failing = ready
        history = self._sidecars[replica.name]
        page = history.latest
        if page is None or not fresh:
            return state
        up = page.total(_name("engine_up"))
        state.engine_up = None if up is None else up > 0
        healthy = page.values(_name("gpu_healthy"))
        if healthy:
            state.gpu_healthy = all(value > 0 for _, value in healthy)
            faults = page.values(_name("gpu_fault"))
            state.gpu_problem = ", ".join(labels["reason"] for labels, value in faults if value > 0)
        state.gpu_utilization = page.total(_name("gpu_utilization"))
        state.gpu_temperature = page.total(
            _name("gpu_temperature"), lambda labels: labels.get("sensor") == "gpu"
        )
        state.running = page.total(_name("engine_requests_running"))
        state.waiting = page.total(_name("engine_requests_waiting"))
        state.kv_usage = page.total(_name("engine_kv_cache_usage"))
        state.probe_pass = page.total(_name("probe_pass_ratio"))
        verdicts = page.values(_name("probe_verdict"))
        state.probe_verdict = next((lbl["state"] for lbl, value in verdicts if value > 0), "")
        stamps = {
            lbl["phase"]: v for lbl, v in page.values(_name("replica_startup_phase_timestamp"))
        }
        state.phases = {phase: stamps[phase] for phase in PHASE_EVENTS if phase in stamps}
        span = history.span()
        if span is not None:
            old, new = span
            state.requests_per_s = rate(old, new, _name("engine_requests_finished"))
            state.probe_requests_per_s = rate(
                old, new, _name("probe_runs"), lambda labels: labels.get("route") == "direct"
            )
            state.tokens_per_s = rate(old, new, _name("engine_generation_tokens"))
            state.errors_per_s = rate(old, new, _name("engine_request_errors"))
            state.ttft = quantiles(old, new, _name("engine_time_to_first_token"), (0.5, 0.99))
            state.tpot = quantiles(old, new, _name("engine_time_per_output_token"), (0.5, 0.99))
        return state

    def _tenant(self, tenant: Tenant) -> TenantState:
        state = TenantState(tenant)

        def own(labels: Mapping[str, str]) -> bool:
            return labels.get("tenant") == tenant.name

        def charged(labels: Mapping[str, str]) -> bool:
            return own(labels) and labels.get("token_type") in ("prompt", "completion")

        requests, tokens, cost = (
            _name("tenancy_requests"),
            _name("tenancy_tokens"),
            _name("tenancy_cost"),
        )
        budget_name = _name("tenancy_budget_remaining")
        per_second: dict[str, float] = {}
        budgets: list[float] = []
        for history in self._proxies.values():
            page = history.latest
            if page is None:
                continue
            for labels, value in page.values(requests, own):
                outcome = labels.get("outcome", "")
                if outcome == "ok":
                    state.ok += value
                elif outcome.startswith("rejected"):
                    state.rejected += value
                else:
                    state.errors += value
            spent = page.total(tokens, charged) or 0.0
            state.tokens += spent
            state.proxies += spent > 0
            state.cost += page.total(cost, own) or 0.0
            remaining = page.total(budget_name, own)
            if remaining is not None and tenant.budget_tokens:
                budgets.append(remaining / tenant.budget_tokens)
            span = history.span()
            if span is not None:
                for key, name, where in (
                    ("requests", requests, own),
                    ("tokens", tokens, charged),
                    ("cost", cost, own),
                ):
                    per_s = rate(*span, name, where)
                    if per_s is not None:
                        per_second[key] = per_second.get(key, 0.0) + per_s
        state.requests_per_s = per_second.get("requests")
        state.tokens_per_s = per_second.get("tokens")
        state.cost_per_hour = per_second["cost"] * 3600 if "cost" in per_second else None
        state.budget_left = min(budgets) if budgets else None
        return state


_SEVERITY_ORDER = {"critical": 0, "warning": 1, "info": 2}


def _known(before: ReplicaState, now: ReplicaState) -> ReplicaState:
    """``now``, with the states it does not know taken from ``before``."""
    return replace(
        now,
        ready=before.ready if now.ready is None else now.ready,
        engine_up=before.engine_up if now.engine_up is None else now.engine_up,
        gpu_healthy=before.gpu_healthy if now.gpu_healthy is None else now.gpu_healthy,
        probe_verdict=now.probe_verdict or before.probe_verdict,
        phases=now.phases or before.phases,
    )


def _phase_events(name: str, before: Mapping[str, float], now: Mapping[str, float]) -> list[str]:
    """An event for each cold-start phase reached since ``before`` (a restarted sidecar
    starts them over with new timestamps), in phase order, each with its time after start."""
    start = now.get("process_start")
    events = []
    for phase, at in now.items():
        if before.get(phase) == at:
            continue
        after = (
            "" if start is None or phase == "process_start" else f" ({at - start:.1f}s after start)"
        )
        events.append(f"{name}: {PHASE_EVENTS[phase]}{after}")
    return events


def _flipped(before: object, now: object) -> bool:
    """A known state that changed (an unknown one, None, is no change)."""
    return before is not None and now is not None and before != now
