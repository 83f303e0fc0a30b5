"""The fault drill: the demo's stack with the receiver acting, faults in turn, each one timed.

The stack is the demo's (:class:`inferwatch.demo.run.Demo`): simulated replicas, sidecars,
proxies, probes, HAProxy, Prometheus (or VictoriaMetrics's vmagents and vmalert, with
``--tsdb victoriametrics``) with the generated rules, Alertmanager routed to the
runbook receiver, which here executes its actions on the sidecars, HAProxy and a fake
Kubernetes API (:mod:`inferwatch.drill.kubefake`, served in this process). After a healthy control
period, each scenario injects its fault and waits, with a deadline, for each event of its
timeline: the alert reaching Alertmanager, the receiver's audited action, the traffic moving
as the client sees it through HAProxy (the ``X-Served-By`` of each answer), then the repair
and the traffic coming back. Between scenarios the drill does what the on-call person would:
it resets the receiver's circuit breaker.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import time
from collections.abc import Callable, Sequence
from dataclasses import asdict, dataclass, field, replace
from pathlib import Path
from typing import Any

import httpx

from inferwatch import wire
from inferwatch.config import Duration
from inferwatch.demo import automation, routing, topology
from inferwatch.demo.loadgen import Completion, LoadGenerator
from inferwatch.demo.observer import Observer
from inferwatch.demo.processes import Component, StartError, Supervisor
from inferwatch.demo.run import Demo
from inferwatch.demo.scenario import Step
from inferwatch.drill import books
from inferwatch.drill.kubefake import FakeKube

#: seconds of healthy load before the first fault, during which nothing may fire or act
CONTROL = 20.0
#: the longest any one event of a timeline may take to happen
DEADLINE = 90.0
#: a replica counts as out of (back in) rotation once this long passes without (with) it
QUIET = 3.0
#: max_tokens from which the degenerate-version fault strikes: above every golden probe's
LONG_GENERATION = 96
DEGENERATE_ON_LONG = {"mode": "repetition", "rate": 0.9, "min_tokens": LONG_GENERATION}


@dataclass(frozen=True)
class Scenario:
    name: str
    about: str
    fault: Sequence[Step]  # what is done to the fleet
    repair: Sequence[Step]  # what brings it back
    alert: str  # the alert that must fire
    action: str | None  # the action that must be applied exactly once (None: none at all)
    moved_from: tuple[str, ...] = ()  # replicas the traffic must leave (and come back to)
    breaker: bool = False  # the breaker must refuse at least one action
    flood: str | None = None  # a tenant that sends a burst on its own
    also: tuple[str, ...] = ()  # further actions that must be applied exactly once
    #: the fault is the proxies' Redis killed (``kill -9``) during the flood, the repair
    #: its restart: the budget holds on each proxy's local bound and the journal replays
    kills_redis: bool = False


def _inject(replicas: Sequence[str], faults: dict[str, Any]) -> Step:
    return Step(0, "inject", tuple(replicas), faults)


def _repair(replicas: Sequence[str]) -> Step:
    return Step(0, "repair", tuple(replicas))


def _clear(replicas: Sequence[str]) -> Step:
    return Step(0, "clear", tuple(replicas))


ALL = tuple(r.name for r in topology.REPLICAS)
#: the primary model's replicas (node-a and node-b); the fallback model's GPUs are node-c's
PRIMARY = tuple(r.name for r in topology.REPLICAS if r.role == "primary")
SCENARIOS: tuple[Scenario, ...] = (
    Scenario(
        "reset-class-xid",
        "primary-v1's GPU reports XID 48 (double-bit ECC, reset_gpu)",
        [_inject(["primary-v1"], {"gpu": [{"index": 0, "xid": 48}]})],
        [_repair(["primary-v1"])],
        "InferwatchGPUXidErrors",
        "isolate_replica",
        moved_from=("primary-v1",),
        also=(automation.XID,),  # the GPU reset request on the (fake) node
    ),
    Scenario(
        "degenerate-version",
        "model version v2-fp8 (primary-v2) falls into repetitions on long generations",
        # long ones only (the golden probes ask for at most 64 tokens): the probes keep
        # passing, so only the proxies' screening of live answers sees it, and the alert
        # and its traffic shift are what take the version out, not the quality gate racing
        # them (which, on a busy machine, took it out before any live answer was screened)
        [_inject(["primary-v2"], {"degenerate": DEGENERATE_ON_LONG})],
        [_clear(["primary-v2"]), _repair(["primary-v2"])],
        "InferwatchDegenerateOutputRising",
        "shift_traffic",
        moved_from=("primary-v2",),
    ),
    Scenario(
        "tenant-flood",
        "tenant initech sends a burst far over its token budget",
        [],
        [],
        "InferwatchAdmissionRejectionsRising",
        None,  # admission control contains it: nothing to isolate or shift
        flood="initech",
    ),
    Scenario(
        "redis-dies",
        "the proxies' Redis is killed mid-flood of tenant hooli, then restarted",
        [],
        [],
        "InferwatchSharedStateDown",
        None,  # the failure policy is the response: fail_open, at most budget / N² per proxy
        # hooli sends nothing else: its budget window has room from the start, where
        # initech's share of the load and the flood before spend it
        flood="hooli",
        kills_redis=True,
    ),
    Scenario(
        "hung-engine",
        "primary-v2's engine stops stepping (requests stall, /health 503)",
        [_inject(["primary-v2"], {"hang": True})],
        [_clear(["primary-v2"]), _repair(["primary-v2"])],
        "InferwatchEngineStalled",
        "isolate_replica",
        moved_from=("primary-v2",),
    ),
    Scenario(
        "mass-ecc-fault",
        "every GPU reports an uncorrectable ECC error at once (engines still run)",
        [_inject(ALL, {"gpu": [{"index": 0, "ecc_dbe": 1}]})],
        [_repair(ALL)],
        "InferwatchGPUEccUncorrectable",
        "isolate_replica",
        breaker=True,  # and the gateway fails open: every replica is unready
    ),
    Scenario(
        "mass-gpu-fault",
        "every GPU of the primary model reports XID 48 at once (its engines die)",
        [_inject(PRIMARY, {"gpu": [{"index": 0, "xid": 48}]})],
        [_repair(PRIMARY)],
        "InferwatchGPUXidErrors",
        "isolate_replica",
        # a fatal XID kills the engine with its GPU: what the primary held in flight is
        # lost, the rest goes to the fallback model until the primary is repaired
        moved_from=PRIMARY,
        breaker=True,
    ),
)


@dataclass
class Timeline:
    scenario: str
    about: str
    fault: float | None = None  # seconds after t=0
    alert: float | None = None
    action: float | None = None
    moved: float | None = None
    repaired: float | None = None
    recovered: float | None = None
    acted: dict[str, int] = field(default_factory=dict)  # action -> times applied
    refused_by_breaker: int = 0
    lost: int = 0  # client requests failed beyond those in flight on the failed replica
    in_flight_failed: int = 0
    checks: dict[str, bool] = field(default_factory=dict)
    #: the receiver's audited decisions during the scenario (alert, action, outcome, reason)
    decisions: list[dict[str, str]] = field(default_factory=list)
    #: Redis killed: the flooding tenant's tokens charged over every proxy while it was down,
    #: and what they may be (budget x (1 + 1/N) per window touched, plus one reservation)
    spent_while_down: float | None = None
    allowed_while_down: float | None = None
    #: seconds after t=0 at which every proxy reached Redis again with its journal replayed
    replayed: float | None = None
    #: afterwards, the largest gap between a proxy's charges and its engine's counters
    drift_tokens: float | None = None

    @property
    def ok(self) -> bool:
        return all(self.checks.values())


class Drill(Demo):
    """The demo with the receiver executing and :data:`SCENARIOS` played and checked."""

    def __init__(
        self,
        *args: Any,
        progress: Callable[[str], None],
        scenarios: Sequence[Scenario] = SCENARIOS,
        **kwargs: Any,
    ) -> None:
        super().__init__(*args, **kwargs)
        self.scenarios = tuple(scenarios)  # those played, in the drill's order
        self.kube = FakeKube()
        self.kube_url = ""
        self.progress = progress
        self.control_ok: dict[str, bool] = {}
        self.timelines: list[Timeline] = []
        self.workdir = Path()

    async def run(self) -> str | None:
        for replica in topology.REPLICAS:
            self.kube.add_node(replica.node)
        with self.kube.serve() as url:
            self.kube_url = url
            return await super().run()

    def event(self, text: str) -> None:
        """The demo's events (a restarted sidecar) go to the drill's progress lines."""
        self.progress(f"  {text}")

    def _runbooks(self, workdir: Path) -> Component:
        self.workdir = workdir
        settings = automation.Settings(
            True,
            workdir / routing.RUNTIME,
            sidecars=self.ports.sidecar,
            kube_host=self.kube_url,
            cooldown="5s",
        )
        return automation.component(workdir, self.ports.runbooks, settings)

    # --- the drill ------------------------------------------------------------------------------
    async def session(
        self, supervisor: Supervisor, observer: Observer, load: LoadGenerator
    ) -> str | None:
        http = observer.http
        self.progress(f"control period: {CONTROL:g}s of healthy load")
        await asyncio.sleep(CONTROL)
        firing = await self._firing(http)
        decisions = self._audit()
        self.control_ok = {
            "nothing fired": not firing,
            "nothing acted": not [d for d in decisions if d["decision"] != "skipped"],
        }
        self.progress(f"control period: {'quiet' if all(self.control_ok.values()) else 'NOT quiet'}"
                      f" (firing: {', '.join(sorted(firing)) or 'none'})")  # fmt: skip
        for scenario in self.scenarios:
            dead = supervisor.exited()
            if dead is not None:
                return f"{dead.label} exited unexpectedly: {dead.last_log_line()}"
            self.timelines.append(await self._drill(scenario, http, load))
        return None

    def _now(self) -> float:
        return time.monotonic() - self.t0

    async def _drill(
        self, scenario: Scenario, http: httpx.AsyncClient, load: LoadGenerator
    ) -> Timeline:
        line = Timeline(scenario.name, scenario.about)
        self.progress(f"{scenario.name}: {scenario.about}")
        start_audit = len(self._audit())
        line.fault = self._now()
        flood = None
        for step in scenario.fault:
            await self._apply(step, http, load)
        if scenario.flood is not None:
            tenant = next(t for t in topology.TENANTS if t.name == scenario.flood)
            alone = replace(tenant, share=1.0)  # every request of the flood is the tenant's
            flood = LoadGenerator(http, topology.url(self.ports.gateway),
                                  {tenant.role: topology.replica("fallback").model}, [alone], 25.0,
                                  seed=7)  # fmt: skip
            flood_task = asyncio.create_task(flood.run())
        redis = self.supervisor.find("redis", "") if scenario.kills_redis else None
        down_since = time.time()
        before = None
        if redis is not None and scenario.flood is not None:
            before = books.spent(await books.pages(http, self._proxy_metrics()), scenario.flood)
            await self.supervisor.crash(redis)
            self.progress(f"  redis-server killed (pid {redis.pid})")
        line.alert = await self._until(lambda: self._alert_seen(http, scenario.alert), "alert")
        self.progress(f"  alert {scenario.alert}: {self._show(line.alert, line.fault)}")
        if scenario.action is not None:
            action = scenario.action
            line.action = await self._until(lambda: self._acted(start_audit, action), "action")
            self.progress(f"  action {action}: {self._show(line.action, line.fault)}")
        if scenario.moved_from:
            left = await self._until(
                lambda: self._traffic_left(load, scenario.moved_from, line.fault or 0), "traffic"
            )
            line.moved = None if left is None else self._last_sent(load, scenario, line.fault)
            self.progress(f"  traffic off {', '.join(scenario.moved_from)}: "
                          f"{self._show(line.moved, line.fault)}")  # fmt: skip
        else:
            await asyncio.sleep(QUIET)
        if scenario.breaker:  # the other faulted replicas' alerts may come a group later
            await self._until(lambda: self._refused(start_audit), "breaker refusal")
        if flood is not None:
            flood_task.cancel()
            await asyncio.gather(flood_task, return_exceptions=True)
        line.repaired = self._now()
        if redis is not None and scenario.flood is not None:
            await self._redis_back(line, redis, http, scenario.flood, before, down_since)
        for step in scenario.repair:
            await self._apply(step, http, load)
        if scenario.moved_from:
            line.recovered = await self._until(
                lambda: self._traffic_back(load, scenario.moved_from, line.repaired or 0),
                "recovery",
            )
        else:
            line.recovered = line.repaired
        self.progress(f"  recovered: {self._show(line.recovered, line.fault)}")
        decisions = self._audit()[start_audit:]
        line.decisions = [
            {key: str(d.get(key, "")) for key in ("alertname", "action", "outcome", "reason")}
            for d in decisions
            if d.get("status") == "firing" or d.get("outcome") in ("reverted", "revert_failed")
        ]
        for decision in decisions:
            if decision["decision"] == "acted":
                line.acted[decision["action"]] = line.acted.get(decision["action"], 0) + 1
            if decision.get("outcome") == "breaker":
                line.refused_by_breaker += 1
        self._count_losses(line, load, scenario)
        line.checks = self._checks(line, scenario)
        await self._reset_breaker(http)
        line.checks["fleet back to normal"] = await self._settle()
        return line

    async def _settle(self) -> bool:
        """Wait until HAProxy has every server up at its configured weight, so that the next
        scenario starts from a healthy fleet; if it does not, the drill (as the on-call person
        would) puts the weights back, and the scenario fails this check."""
        try:
            await routing.wait_all_up(self.gateway, DEADLINE)
        except StartError:
            return False
        deadline = time.monotonic() + DEADLINE
        while time.monotonic() < deadline:
            states = await routing.backends(self.gateway)
            if all(s.weight == s.initial_weight for servers in states.values() for s in servers):
                return True
            await asyncio.sleep(0.5)
        for model, servers in states.items():
            for server in servers:
                await self.gateway.set_weight(
                    wire.backend_name(model), server.name, server.initial_weight
                )
        return False

    def _proxy_metrics(self) -> list[str]:
        return [topology.url(port) for port in self.ports.proxy_metrics.values() if port]

    async def _redis_back(
        self,
        line: Timeline,
        redis: Component,
        http: httpx.AsyncClient,
        tenant_name: str,
        before: float | None,
        down_since: float,
    ) -> None:
        """Measure what the tenant spent while Redis was down, restart it, and wait for every
        proxy's journal to replay and the books to agree with the engines again."""
        after = books.spent(await books.pages(http, self._proxy_metrics()), tenant_name)
        tenant = next(t for t in topology.TENANTS if t.name == tenant_name)
        if before is not None and after is not None and tenant.budget_tokens:
            proxies = len(self._proxy_metrics())
            window = Duration.parse(tenant.budget_window).seconds
            windows = int(time.time() // window) - int(down_since // window) + 1
            line.spent_while_down = after - before
            line.allowed_while_down = windows * tenant.budget_tokens * (1 + 1 / proxies) + (
                topology.MAX_INPUT_TOKENS + tenant.max_tokens[1]
            )
        await self.supervisor.restart(redis)
        try:
            await self.supervisor.wait_answering(redis, http, DEADLINE)
        except StartError as exc:
            self.progress(f"  {exc}")
            return
        self.progress(f"  redis-server started again (pid {redis.pid})")

        async def replayed() -> bool:
            return books.replayed(await books.pages(http, self._proxy_metrics()))

        line.replayed = await self._until(replayed, "journal replay")
        tolerance = self.options.alerts.alert("InferwatchReconciliationDrift").number("tokens")

        async def agree() -> bool:
            gap = books.drift(await books.pages(http, self._proxy_metrics()))
            line.drift_tokens = gap
            return gap is not None and gap <= tolerance

        await self._until(agree, "books agreeing with the engines")

    def _checks(self, line: Timeline, scenario: Scenario) -> dict[str, bool]:
        checks = {"alert fired": line.alert is not None}
        if scenario.action is None:
            checks["no action taken"] = not line.acted
        elif scenario.breaker:
            checks["breaker refused the rest"] = line.refused_by_breaker > 0
            checks[f"{scenario.action} at most once"] = line.acted.get(scenario.action, 0) <= 1
        else:
            for action in (scenario.action, *scenario.also):
                checks[f"{action} exactly once"] = line.acted.get(action, 0) == 1
        if scenario.moved_from:
            checks["traffic moved"] = line.moved is not None
            checks["traffic came back"] = line.recovered is not None
        # beyond what the failed replicas held in flight (a mass ECC fault leaves no ready
        # replica anywhere: the gateway fails open and serves from the unready ones)
        checks["no request lost"] = line.lost == 0
        if scenario.kills_redis:
            checks["within budget x (1 + 1/N) while down"] = (
                line.spent_while_down is not None
                and line.allowed_while_down is not None
                and line.spent_while_down <= line.allowed_while_down
            )
            checks["journal replayed"] = line.replayed is not None
            tolerance = self.options.alerts.alert("InferwatchReconciliationDrift").number("tokens")
            checks["books equal the engines' counters"] = (
                line.drift_tokens is not None and line.drift_tokens <= tolerance
            )
        return checks

    def _count_losses(self, line: Timeline, load: LoadGenerator, scenario: Scenario) -> None:
        """Failed requests of the scenario, less those the failed replica took before the
        gateway stopped sending it traffic (in flight when it failed)."""
        start, left = self.t0 + (line.fault or 0), self.t0 + (line.moved or line.recovered or 0)
        for done in list(load.history):
            if done.started < start or done.outcome != "failed":
                continue
            if done.replica in scenario.moved_from and done.started < left:
                line.in_flight_failed += 1
            else:
                line.lost += 1

    # --- what the drill watches -----------------------------------------------------------------
    async def _until(self, check: Callable[[], Any], what: str) -> float | None:
        """Seconds after t=0 at which ``check`` (sync or async) first held; None past DEADLINE."""
        deadline = time.monotonic() + DEADLINE
        while time.monotonic() < deadline:
            result = check()
            if asyncio.iscoroutine(result):
                result = await result
            if result:
                return self._now()
            await asyncio.sleep(0.25)
        self.progress(f"  no {what} within {DEADLINE:g}s")
        return None

    async def _firing(self, http: httpx.AsyncClient) -> set[str]:
        url = topology.url(self.ports.alertmanager) + "/api/v2/alerts"
        with contextlib.suppress(httpx.HTTPError, ValueError):
            response = await http.get(url, params={"active": "true"}, timeout=2.0)
            return {a["labels"].get("alertname", "") for a in response.json()}
        return set()

    async def _alert_seen(self, http: httpx.AsyncClient, name: str) -> bool:
        return name in await self._firing(http)

    def _audit(self) -> list[dict[str, Any]]:
        path = self.workdir / automation.AUDIT_LOG
        if not path.exists():
            return []
        lines = path.read_text(encoding="utf-8").splitlines()
        return [json.loads(line) for line in lines if line.strip()]

    def _acted(self, since: int, action: str) -> bool:
        return any(d["decision"] == "acted" and d["action"] == action
                   for d in self._audit()[since:])  # fmt: skip

    def _refused(self, since: int) -> bool:
        return any(d.get("outcome") == "breaker" for d in self._audit()[since:])

    def _recent(self, load: LoadGenerator, since: float) -> list[Completion]:
        return [d for d in load.history if d.started >= since and d.role == "primary"]

    def _traffic_left(self, load: LoadGenerator, replicas: Sequence[str], fault: float) -> bool:
        """No new primary request has been sent to ``replicas`` for QUIET seconds (as the
        answers' headers say), while others were."""
        now = time.monotonic()
        since = max(self.t0 + fault, now - QUIET)
        recent = [replica for at, role, replica in list(load.routed)
                  if at >= since and role == "primary"]  # fmt: skip
        return (
            now - (self.t0 + fault) >= QUIET
            and len(recent) >= 3
            and not [replica for replica in recent if replica in replicas]
        )

    def _last_sent(self, load: LoadGenerator, scenario: Scenario, fault: float | None) -> float:
        """When the gateway sent the faulted replicas their last new request (seconds after
        t=0): the moment traffic moved, whatever moved it (its checks or the action)."""
        start = self.t0 + (fault or 0)
        faulted = scenario.moved_from
        sent = [at for at, role, replica in list(load.routed)
                if at >= start and role == "primary" and replica in faulted]  # fmt: skip
        return (max(sent) if sent else start) - self.t0

    def _traffic_back(self, load: LoadGenerator, replicas: Sequence[str], since: float) -> bool:
        served = {d.replica for d in self._recent(load, self.t0 + since) if d.outcome == "ok"}
        return set(replicas) <= served

    async def _reset_breaker(self, http: httpx.AsyncClient) -> None:
        token = (self.workdir / automation.TOKEN).read_text(encoding="utf-8").strip()
        url = topology.url(self.ports.runbooks) + "/admin/breaker/reset"
        with contextlib.suppress(httpx.HTTPError):
            await http.post(url, headers={"Authorization": f"Bearer {token}"}, timeout=5.0)

    @staticmethod
    def _show(at: float | None, since: float | None) -> str:
        return "not seen" if at is None or since is None else f"+{at - since:.1f}s"

    # --- the report -----------------------------------------------------------------------------
    def report(self) -> dict[str, Any]:
        alerts = self.options.alerts
        return {
            "ok": self.passed,
            "control": self.control_ok,
            "settings": {
                "tsdb": "victoriametrics" if self.options.victoria else "prometheus",
                "group_wait_automation": "0s",  # the automation route's (alerts.alertmanager)
                "scrape_interval": topology.INTERVAL,
                "evaluation_interval": topology.INTERVAL,
                "for": {
                    name: alerts.alert(name).for_
                    for name in sorted({s.alert for s in self.scenarios})
                },
            },
            "scenarios": [asdict(line) | {"ok": line.ok} for line in self.timelines],
        }

    @property
    def passed(self) -> bool:
        return (
            bool(self.control_ok)
            and all(self.control_ok.values())
            and len(self.timelines) == len(self.scenarios)
            and all(line.ok for line in self.timelines)
        )
