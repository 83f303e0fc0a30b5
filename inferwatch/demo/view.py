"""The demo's two faces: a live table on a terminal, a plain summary every refresh otherwise.

Both show the same :class:`~inferwatch.demo.observer.FleetState`; the plain summary is short
lines without escape codes (one per replica, per tenant, for the alerts), so that it reads well
in a log file or CI output, where the events also appear as they happen.
"""

from __future__ import annotations

from collections import deque
from collections.abc import Sequence
from dataclasses import dataclass, field
from datetime import UTC, datetime

from rich import box
from rich.console import Group, RenderableType
from rich.table import Table
from rich.text import Text

from inferwatch.demo.observer import (
    WINDOW,
    AlertState,
    FleetState,
    ReplicaState,
    RunbookDecision,
    TenantState,
)

EVENTS_SHOWN = 8
REPLICA_COLUMNS = ("replica", "version GPU", "/readyz", "engine", "GPU", "req/s (probes)", "tok/s",
                   "TTFT p50/99", "TPOT p50/99", "run/wait", "KV", "err/s", "probes")  # fmt: skip
ALERTS_SHOWN = 10
#: firing alerts the plain summary names on its one line (the live view's table shows more)
ALERTS_NAMED = 2
ALERT_COLUMNS = ("alert", "severity", "about", "state", "since", "receivers")
_SEVERITY_STYLE = {"critical": "bold red", "warning": "yellow", "info": "dim"}
TENANT_COLUMNS = ("tenant", "model", "req/s", "ok / rejected / errors", "tokens/s", "tokens",
                  "cost", "cost/h", "budget left")  # fmt: skip


@dataclass
class Context:
    """What the view shows besides the fleet: routing, scenario progress, recent events."""

    speed: float | None  # the simulators' clock; None: the replicas are real engines
    prometheus_url: str | None  # the query API: Prometheus's, or VictoriaMetrics's
    alertmanager_url: str | None = None
    models: str = ""
    scenario: str = ""
    next_step: str = ""
    routing: str = ""
    runbooks_mode: str = ""  # dry-run or execute; "": no runbook receiver
    tsdb: str = "Prometheus"  # what answers at prometheus_url
    events: deque[str] = field(default_factory=lambda: deque(maxlen=EVENTS_SHOWN))


# --- number formats --------------------------------------------------------------------------
def pair(values: Sequence[float | None]) -> str:
    """Latency quantiles in one unit: ``9/38ms`` or ``0.41/2.10s``."""
    if all(v is None for v in values):
        return "-"
    known = [v for v in values if v is not None]
    if max(known) < 1:
        return "/".join("-" if v is None else f"{v * 1000:.0f}" for v in values) + "ms"
    return "/".join("-" if v is None else f"{v:.2f}" for v in values) + "s"


def number(value: float | None, digits: int = 1) -> str:
    if value is None:
        return "-"
    for limit, suffix in ((1e9, "G"), (1e6, "M"), (1e3, "k")):
        if abs(value) >= limit:
            return f"{value / limit:.1f}{suffix}"
    return f"{value:.{digits}f}"


def percent(value: float | None) -> str:
    return "-" if value is None else f"{value:.0%}"


def money(value: float | None) -> str:
    if value is None:
        return "-"
    return f"${value:.2f}" if value >= 1 else f"${value:.5f}"


def stamp(t: float) -> str:
    return f"[{t:6.1f}s]"


# --- cells shared by both faces --------------------------------------------------------------
def readiness(state: ReplicaState) -> tuple[str, str]:
    """(text, style) of the replica's /readyz."""
    if not state.reachable or state.ready is None:
        return "no answer", "red"
    if state.ready:
        return "ready", "green"
    return "NO: " + ",".join(name for name, _ in state.failing), "bold red"


def gpu(state: ReplicaState) -> tuple[str, str]:
    if state.gpu_healthy is None:
        return "-", "dim"
    if not state.gpu_healthy:
        return f"BAD: {state.gpu_problem}", "bold red"
    details = [percent(state.gpu_utilization)]
    if state.gpu_temperature is not None:
        details.append(f"{state.gpu_temperature:.0f}C")
    return "ok " + " ".join(details), "green"


def probes(state: ReplicaState) -> tuple[str, str]:
    if not state.probe_verdict:
        return "-", "dim"
    style = {"pass": "green", "fail": "bold red"}.get(state.probe_verdict, "yellow")
    return f"{state.probe_verdict} {percent(state.probe_pass)}", style


def engine(state: ReplicaState) -> tuple[str, str]:
    if state.engine_up is None:
        return "-", "dim"
    return ("up", "green") if state.engine_up else ("DOWN", "bold red")


def budget(tenant: TenantState) -> str:
    return "-" if tenant.budget_left is None else percent(tenant.budget_left)


# --- the terminal view -----------------------------------------------------------------------
def render(state: FleetState, context: Context) -> RenderableType:
    load = state.load
    speed = "" if context.speed is None else f"speed {context.speed:g}x   "
    header = Text.assemble(
        ("inferwatch demo", "bold"),
        f"   t={state.t:.0f}s   {speed}load {state.rate:g} req/s  ",
        (f"sent {load.sent}  ok {load.ok}  rejected {load.rejected}  failed {load.failed}", "dim"),
    )
    lines: list[RenderableType] = [header]
    if context.prometheus_url:
        up = "-" if state.targets is None else f"{state.targets[0]}/{state.targets[1]}"
        lines.append(Text(f"{context.tsdb} {context.prometheus_url}   targets up {up}"))
    lines.append(Text(f"models    {context.models}"))
    lines.append(Text(f"routing   {context.routing}"))
    if context.scenario:
        lines.append(Text(f"scenario  {context.scenario}   {context.next_step}", style="cyan"))
    lines += [_replica_table(state.replicas), _tenant_table(state.tenants)]
    if context.alertmanager_url:
        lines.append(_alert_table(state, context.alertmanager_url))
    if context.runbooks_mode and state.decisions is not None:
        lines.append(_decisions(state.decisions, context.runbooks_mode))
    events = Table(title="events", title_justify="left", show_header=False, box=None)
    for event in context.events:
        events.add_row(Text(event, style="red" if "NOT READY" in event else ""))
    lines.append(events)
    return Group(*lines)


def _table(title: str, columns: Sequence[str]) -> Table:
    """A compact, left-titled table with one unwrapped column per name."""
    table = Table(
        title=title, title_justify="left", box=box.SIMPLE_HEAD, padding=0, show_edge=False
    )
    for column in columns:
        table.add_column(column, no_wrap=True)
    return table


def _replica_table(replicas: Sequence[ReplicaState]) -> Table:
    table = _table(
        f"replicas (sidecar /metrics and /readyz, rates over the last {WINDOW:g}s; a replica's "
        "requests are its tenants' plus its probes)",
        REPLICA_COLUMNS,
    )
    for state in replicas:
        r = state.replica
        table.add_row(
            r.name,
            f"{r.version} {r.gpu}",
            Text(*readiness(state)),
            Text(*engine(state)),
            Text(*gpu(state)),
            f"{number(state.requests_per_s)} ({number(state.probe_requests_per_s)})",
            number(state.tokens_per_s, 0),
            pair(state.ttft),
            pair(state.tpot),
            f"{number(state.running, 0)}/{number(state.waiting, 0)}",
            percent(state.kv_usage),
            Text(number(state.errors_per_s), style="red" if state.errors_per_s else ""),
            Text(*probes(state)),
        )
    return table


def _tenant_table(tenants: Sequence[TenantState]) -> Table:
    table = _table("tenants (tenancy proxies' /metrics)", TENANT_COLUMNS)
    for state in tenants:
        t = state.tenant
        table.add_row(
            t.name,
            t.role,
            number(state.requests_per_s),
            f"{state.ok:.0f} / {state.rejected:.0f} / {state.errors:.0f}",
            number(state.tokens_per_s, 0),
            number(state.tokens, 0),
            money(state.cost),
            money(state.cost_per_hour),
            budget(state) + (f" ({state.proxies} proxies)" if t.budget_tokens else ""),
        )
    return table


def _alert_table(state: FleetState, url: str) -> RenderableType:
    if state.alerts is None:
        return Text(f"alerts    Alertmanager {url}: no answer yet", style="dim")
    if not state.alerts:
        return Text(f"alerts    none firing (Alertmanager {url})", style="green")
    table = _table(f"alerts reaching Alertmanager {url}", ALERT_COLUMNS)
    now = datetime.now(UTC)
    for alert in state.alerts[:ALERTS_SHOWN]:
        since = (
            "-" if alert.starts_at is None else f"{(now - alert.starts_at).total_seconds():.0f}s"
        )
        table.add_row(
            Text(alert.name, style="dim" if alert.inhibited else "bold"),
            Text(alert.severity, style=_SEVERITY_STYLE.get(alert.severity, "")),
            alert.where,
            Text("inhibited", style="dim") if alert.inhibited else Text("firing", style="red"),
            since,
            ",".join(alert.receivers) or "-",
        )
    if len(state.alerts) > ALERTS_SHOWN:
        table.caption = f"and {len(state.alerts) - ALERTS_SHOWN} more"
    return table


def _decisions(decisions: Sequence[RunbookDecision], mode: str) -> RenderableType:
    title = f"runbooks  receiver in {mode} mode"
    if not decisions:
        return Text(f"{title}: no decision yet", style="dim")
    lines = [Text(f"{title}, latest decisions:")]
    for decision in decisions:
        style = {"acted": "bold red", "failed": "red", "dry_run": "yellow"}.get(decision.decision)
        lines.append(Text(f"  {decision.describe()}", style=style or ""))
    return Group(*lines)


def decisions_summary(decisions: Sequence[RunbookDecision]) -> str:
    """``runbooks last dry-run: isolate_replica primary-v1 (...)`` for the plain summary."""
    if not decisions:
        return "runbooks no decision yet"
    return f"runbooks last {decisions[-1].describe()}"


def alerts_summary(alerts: Sequence[AlertState]) -> str:
    """``alerts 2 firing, 1 inhibited: NameA critical replica, ...`` for the plain summary."""
    firing = [a for a in alerts if not a.inhibited]
    shown = ", ".join(f"{a.name} {a.severity} {a.where}".strip() for a in firing[:ALERTS_NAMED])
    if len(firing) > ALERTS_NAMED:
        shown += f" and {len(firing) - ALERTS_NAMED} more"
    head = f"alerts {len(firing)} firing, {len(alerts) - len(firing)} inhibited"
    return f"{head}: {shown}" if shown else head


# --- the plain summary -----------------------------------------------------------------------
def summary(state: FleetState) -> list[str]:
    """Short lines with the key signals, each stamped: the load, one per replica, one per
    tenant, then the scrape targets, alerts and runbooks where they run. A log reader greps
    ``] replica primary-v1 `` or ``] tenant acme `` for one series."""
    load = state.load
    head = (
        f"load {state.rate:g}/s sent {load.sent} ok {load.ok} rejected {load.rejected} "
        f"failed {load.failed}"
    )
    # requests the client did not send (too many in flight) matter only once there are some
    lines = [head + (f" dropped {load.dropped}" if load.dropped else "")]
    for r in state.replicas:
        lines.append(
            f"replica {r.replica.name} {readiness(r)[0]} engine {engine(r)[0]} "
            f"{number(r.requests_per_s)} req/s ({number(r.probe_requests_per_s)} probes) "
            f"{number(r.tokens_per_s, 0)} tok/s "
            f"ttft {pair(r.ttft)} tpot {pair(r.tpot)} "
            f"run {number(r.running, 0)} wait {number(r.waiting, 0)} kv {percent(r.kv_usage)} "
            f"err {number(r.errors_per_s)}/s gpu {gpu(r)[0]} probes {probes(r)[0]}"
        )
    for t in state.tenants:
        left = ""
        if t.tenant.budget_tokens:
            left = f" budget left {budget(t)} over {t.proxies} proxies"
        lines.append(
            f"tenant {t.tenant.name} {number(t.tokens, 0)} tok {money(t.cost)} "
            f"ok {t.ok:.0f} rejected {t.rejected:.0f} errors {t.errors:.0f}{left}"
        )
    if state.targets is not None:
        lines.append(f"scrape targets {state.targets[0]}/{state.targets[1]} up")
    if state.alerts is not None:
        lines.append(alerts_summary(state.alerts))
    if state.decisions is not None:
        lines.append(decisions_summary(state.decisions))
    return [f"{stamp(state.t)} {line}" for line in lines]
