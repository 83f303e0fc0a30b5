"""The demo's life: start the fleet, drive load and the scenario, show it, tear it all down.

Order of events: the processes start in stages, each configured with the addresses the earlier
ones bound: engines, sidecars, proxies and the runbook receiver bind port 0 and say what they
got, then Alertmanager, Prometheus and HAProxy start with configs written from those addresses
(:func:`~inferwatch.demo.processes.start_on_free_ports`); no port is picked for one of our
processes before it binds it. The demo waits until each answers its health endpoint and
HAProxy's checks find every replica up, then the clock starts (t=0): load (through HAProxy),
scenario and view run until the duration ends, a signal arrives or a component dies. A spare
replica that the scenario starts (a scale-out) has its gateway server (in maintenance) from the
beginning, and its processes, addresses and scrape targets from its step on.
Teardown always runs: load stops first, then every child gets SIGTERM (SIGKILL after a
grace period) and is reaped, and the work directory is removed.
"""

from __future__ import annotations

import asyncio
import contextlib
import functools
import json
import secrets
import shutil
import signal
import tempfile
import time
from collections.abc import Awaitable, Callable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import TextIO

import httpx
from rich.console import Console
from rich.live import Live

from inferwatch.demo import alerting, automation, routing, sharedstate, topology, victoria
from inferwatch.demo import engines as external
from inferwatch.demo.loadgen import MAX_IN_FLIGHT, LoadGenerator
from inferwatch.demo.observer import Observer
from inferwatch.demo.processes import (
    ATTEMPTS,
    INFERWATCH,
    Component,
    PortInUse,
    StartError,
    Supervisor,
    port_of,
    start_on_free_ports,
)
from inferwatch.demo.scenario import Scenario, Step
from inferwatch.demo.topology import Ports, Replica, Role
from inferwatch.demo.view import Context, render, stamp, summary
from inferwatch.mixin.config import Config
from inferwatch.runbooks.haproxy_runtime import RuntimeApi, RuntimeApiError

START_TIMEOUT = 30.0
#: the demo's client connections: two load generators at their cap (the drill floods beside
#: the load) and the demo's own calls (scrapes, Prometheus, the scenario's steps)
CONNECTIONS = 2 * MAX_IN_FLIGHT + 64
#: the work directory's folder of Prometheus discovery files (the spares' targets)
DISCOVERY = "discovered"
#: the work directory's folder of the proxies' usage logs (chargeback)
USAGE_LOG = "usage"
#: the file the scrapers discover the advisor's target in, under the work directory
ADVISOR_TARGETS = "advisor-targets.json"
#: how often the demo's advisor evaluates each model's advice
ADVISOR_EVERY = "10s"


@dataclass(frozen=True)
class Options:
    duration: float | None
    scenario: Scenario | None
    speed: float
    rate: float
    base_port: int | None
    prometheus: str | None  # path of the binary; None: no Prometheus
    alertmanager: str | None  # path of the binary; None: no Alertmanager (nor without Prometheus)
    alerts: Config  # the alert config the rules and Alertmanager's routing are generated from
    probe_cycle: float
    refresh: float
    haproxy: str  # path of the binary: the gateway the load goes through
    redis: str  # path of redis-server: the proxies' shared budgets
    execute_runbooks: bool = False  # the runbook receiver acts; else it only audits its plans
    #: engines the user runs, which replace the simulated replicas
    engines: tuple[external.Engine, ...] = ()
    #: VictoriaMetrics's binaries, which take Prometheus's place (``--tsdb victoriametrics``):
    #: the fleet is then two clusters, each scraped by its vmagent, the rules on vmalert
    victoria: victoria.Binaries | None = None


class Demo:
    supervisor: Supervisor  # set by run(), with the run's work directory
    gateway: RuntimeApi  # HAProxy's Runtime API, in the same work directory

    def __init__(self, options: Options, out: TextIO, live: bool) -> None:
        self.options = options
        self.out = out
        self.live = live
        #: running from t=0
        self.replicas = external.replicas(options.engines) if options.engines else topology.REPLICAS
        #: those and the spares the scenario starts later
        spares = options.scenario.spares if options.scenario else ()
        self.fleet = topology.fleet(spares, self.replicas)
        self.tenants = external.fitted(topology.TENANTS, options.engines)
        #: the fleet by cluster: one, or two with VictoriaMetrics (one vmagent each)
        self.clusters = topology.clusters(self.fleet, split=options.victoria is not None)
        scrapers = self.clusters if options.victoria else ()
        self.ports = Ports.assign(options.base_port, self.fleet, scrapers)
        self.started: list[str] = []  # the spares started so far, which the scrapers discover
        self.observer: Observer | None = None  # set at t=0
        self.joining: list[asyncio.Task[None]] = []  # started spares coming up
        self.admin_token = secrets.token_urlsafe(16)
        self.stop = asyncio.Event()
        self.stop_reason = ""
        self.t0 = 0.0
        self.routes: dict[Role, str] = {}  # where HAProxy sends each role, as last read
        self.context = Context(
            speed=None if options.engines else options.speed,
            prometheus_url=None,  # their addresses, once they are bound
            alertmanager_url=None,
            tsdb="VictoriaMetrics" if options.victoria else "Prometheus",
            models="   ".join(
                f"{role} {model}" for role, model in topology.models(self.replicas).items()
            ),
            runbooks_mode=(
                ("execute" if options.execute_runbooks else "dry-run") if self._alerting else ""
            ),
        )
        self.console = Console(file=out, highlight=False)

    @property
    def _tsdb(self) -> bool:
        """Whether a Prometheus, or VictoriaMetrics in its place, stores the fleet's series."""
        return bool(self.options.prometheus or self.options.victoria)

    @property
    def _alerting(self) -> bool:
        """Alertmanager runs only where a Prometheus (or vmalert) sends it alerts."""
        return self._tsdb and bool(self.options.alertmanager)

    # --- output ---------------------------------------------------------------------------------
    def say(self, line: str) -> None:
        print(line, file=self.out, flush=True)

    def event(self, text: str) -> None:
        line = f"{stamp(time.monotonic() - self.t0)} {text}"
        self.context.events.append(line)
        if not self.live:
            self.say(line)

    # --- the whole run --------------------------------------------------------------------------
    async def run(self) -> str | None:
        """Run until done; returns an error message (after cleaning up) or None."""
        loop = asyncio.get_running_loop()
        for signum in (signal.SIGINT, signal.SIGTERM):
            loop.add_signal_handler(signum, self._on_signal, signum)
        workdir = Path(tempfile.mkdtemp(prefix="inferwatch-demo-"))
        supervisor = self.supervisor = Supervisor(workdir)
        self.gateway = routing.runtime(workdir)
        try:
            async with httpx.AsyncClient(limits=httpx.Limits(max_connections=CONNECTIONS)) as http:
                return await self._serve(workdir, http)
        except PortInUse:
            raise  # the caller's exit status says so (PORT_TAKEN)
        except StartError as exc:
            return str(exc)
        finally:
            started = time.monotonic()
            stopped = await supervisor.stop_all()
            shutil.rmtree(workdir, ignore_errors=True)
            for signum in (signal.SIGINT, signal.SIGTERM):
                loop.remove_signal_handler(signum)
            self.say(  # the pids too: a start that failed has printed none yet
                f"stopped {len(stopped)} processes in {time.monotonic() - started:.1f}s "
                f"({', '.join(f'pid {pid}' for pid in stopped)}); removed work dir {workdir}"
            )

    def _on_signal(self, signum: int) -> None:
        self.stop_reason = signal.Signals(signum).name
        self.stop.set()

    async def _serve(self, workdir: Path, http: httpx.AsyncClient) -> str | None:
        supervisor = self.supervisor
        began = time.monotonic()
        if not await self._until_stopped(self._start(workdir, http)):
            return None
        self._announce(supervisor, workdir)
        if not await self._until_stopped(supervisor.wait_ready(http, START_TIMEOUT)):
            return None
        up = routing.wait_all_up(self.gateway, START_TIMEOUT, self.replicas)
        if not await self._until_stopped(up):
            return None
        self.t0 = time.monotonic()
        self.say(
            f"all {len(supervisor.components)} processes answering after {self.t0 - began:.1f}s"
        )
        load = LoadGenerator(
            http,
            topology.url(self.ports.gateway),
            topology.models(self.replicas),
            self.tenants,
            self.options.rate,
        )
        observer = self.observer = Observer(
            http,
            self.replicas,
            self.tenants,
            {r.name: topology.url(self.ports.sidecar[r.name]) for r in self.replicas},
            {
                name: topology.url(self.ports.proxy_metrics[name])
                for r in self.replicas
                for name in topology.proxy_names(r)
            },
            self._scrapers(),
            self.context.alertmanager_url,
            workdir / automation.AUDIT_LOG if self._alerting else None,
        )
        background = [asyncio.create_task(load.run())]
        if self.options.scenario is not None:
            background.append(asyncio.create_task(self._play(self.options.scenario, http, load)))
        try:
            return await self.session(supervisor, observer, load)
        finally:
            background += self.joining
            for task in background:
                task.cancel()
            await asyncio.gather(*background, return_exceptions=True)

    async def _until_stopped(self, work: Awaitable[None]) -> bool:
        """Run ``work`` unless a stop comes first; False when stopped."""
        task = asyncio.ensure_future(work)
        stopped = asyncio.ensure_future(self.stop.wait())
        await asyncio.wait({task, stopped}, return_when=asyncio.FIRST_COMPLETED)
        stopped.cancel()
        if task.done():
            task.result()  # raises StartError
            return True
        task.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            await task
        return False

    async def session(
        self, supervisor: Supervisor, observer: Observer, load: LoadGenerator
    ) -> str | None:
        """Refresh the view until the end; a child that dies ends the demo with an error."""
        duration = self.options.duration
        live = Live(console=self.console, auto_refresh=False) if self.live else None
        printed = 0.0
        with live or contextlib.nullcontext():
            while not self.stop.is_set():
                tick = time.monotonic()
                dead = supervisor.exited()
                if dead is not None:
                    assert dead.process is not None
                    reason = dead.last_log_line() or "no output"
                    return (
                        f"{dead.label} exited unexpectedly "
                        f"(code {dead.process.returncode}): {reason}"
                    )
                state = await observer.poll(tick - self.t0, load.stats, load.rate)
                for text in state.events:
                    self.event(text)
                await self._route()
                if live is not None:
                    live.update(render(state, self.context), refresh=True)
                elif tick - printed >= self.options.refresh or printed == 0:
                    self.say("\n".join(summary(state)))
                    printed = tick
                if duration is not None and tick - self.t0 >= duration:
                    self.stop_reason = f"{duration:g}s elapsed"
                    break
                with contextlib.suppress(TimeoutError):
                    async with asyncio.timeout(max(0.0, tick + 1.0 - time.monotonic())):
                        await self.stop.wait()
        self.say(f"{stamp(time.monotonic() - self.t0)} stopping ({self.stop_reason or 'done'})")
        return None

    async def _route(self) -> None:
        """Report where each model's traffic goes now, as HAProxy says."""
        try:
            after = await routing.routes(self.gateway, self.replicas)
        except RuntimeApiError as exc:
            self.context.routing = f"haproxy: {exc}"
            return
        before, self.routes = self.routes, after
        self.context.routing = "   ".join(f"{role} -> {after[role]}" for role in after)
        for role, now in after.items():
            if before and now != before.get(role):
                self.event(f"routing: {role} traffic now goes to {now}")

    async def _play(self, scenario: Scenario, http: httpx.AsyncClient, load: LoadGenerator) -> None:
        """Run the scenario's steps at their times (seconds after t=0)."""
        self.context.scenario = scenario.name
        about = f": {scenario.description}" if scenario.description else ""
        self.event(f"scenario {scenario.name}{about}")
        for index, step in enumerate(scenario.steps):
            self.context.next_step = f"next at {step.at:g}s: {step.describe()}"
            await asyncio.sleep(max(0.0, self.t0 + step.at - time.monotonic()))
            self.event(f"scenario: {step.describe()}")
            await self._apply(step, http, load)
            if index == len(scenario.steps) - 1:
                self.context.next_step = "(all steps done)"

    async def _apply(self, step: Step, http: httpx.AsyncClient, load: LoadGenerator) -> None:
        if step.action == "rate":
            load.rate = step.rate
        elif step.action == "start":  # a cold start takes seconds: later steps keep their times
            self.joining.append(asyncio.create_task(self._apply_each(step, http)))
        else:
            await self._apply_each(step, http)

    async def _apply_each(self, step: Step, http: httpx.AsyncClient) -> None:
        for name in step.replicas:
            try:
                await self._apply_to(step, name, http)
            except (httpx.HTTPError, StartError) as exc:
                self.event(f"scenario step failed on {name}: {exc}")

    async def _apply_to(self, step: Step, name: str, http: httpx.AsyncClient) -> None:
        """One step on one replica, through the simulator's admin endpoint or its process."""
        if step.action == "start":
            await self._start_spare(topology.replica(name), step, http)
            return
        sim = self.supervisor.find("sim", name)
        if step.action == "crash":
            await self.supervisor.crash(sim)
            self.event(f"sim {name} killed")
            return
        if step.action == "repair" and sim.held_down:
            await self.supervisor.restart(sim)
            await self.supervisor.wait_answering(sim, http, START_TIMEOUT)
            self.event(f"sim {name} started again (pid {sim.pid})")
        url, headers = sim.url + "/admin/faults", {"Authorization": f"Bearer {self.admin_token}"}
        if step.action == "inject":
            response = await http.post(url, json=step.faults, headers=headers, timeout=5)
        else:
            response = await http.delete(url, headers=headers, timeout=5)
        response.raise_for_status()
        if step.action == "repair":  # a new pod: the sidecar forgets the latched GPU faults
            sidecar = self.supervisor.find("sidecar", name)
            await self.supervisor.restart(sidecar)
            self.event(f"sidecar {name} restarted (pid {sidecar.pid})")

    async def _start_spare(self, replica: Replica, step: Step, http: httpx.AsyncClient) -> None:
        """A scale-out: the gateway checks the new replica and its processes start; the
        scenario goes on while they come up (:meth:`_join`).

        It takes traffic once HAProxy's checks find its /readyz passing: after its weights
        loaded and its warm-up passed, which its cold-start phases put on the timeline.
        """
        workdir = self.supervisor.log_dir
        components = await self._start_replicas([replica], workdir, step.faults)
        await routing.enable(self.gateway, replica, self.ports, START_TIMEOUT)
        pids = ", ".join(f"{c.kind} {c.pid}" for c in components)
        self.event(f"{replica.name}: processes started ({pids}); gateway checks its /readyz")
        self.joining.append(asyncio.create_task(self._join(replica, components[1:], http)))

    async def _join(
        self, replica: Replica, servers: Sequence[Component], http: httpx.AsyncClient
    ) -> None:
        """Once a started spare's sidecar and proxy answer, Prometheus discovers them (no
        failed scrape of a process still starting) and the view watches the replica."""
        try:
            for component in servers:
                await self.supervisor.wait_answering(component, http, START_TIMEOUT)
        except StartError as exc:
            self.event(f"scale-out of {replica.name} failed: {exc}")
            return
        self.started.append(replica.name)
        self._write_discovered()
        if self.observer is not None:
            self.observer.watch(
                replica,
                topology.url(self.ports.sidecar[replica.name]),
                topology.url(self.ports.proxy_metrics[replica.name]),
            )

    # --- the fleet ------------------------------------------------------------------------------
    async def _start(self, workdir: Path, http: httpx.AsyncClient) -> None:
        """Start every component, each stage configured with the addresses bound before it:
        Redis before the proxies (their shared budgets), the receiver before Alertmanager (its
        webhook), Alertmanager before Prometheus, the replicas before HAProxy (its servers),
        both before Prometheus (its targets: HAProxy's exporter is one)."""
        automation.write_tokens(workdir)
        self._advisor_targets.write_text("[]", encoding="utf-8")  # discovered once it binds
        redis = functools.partial(self._redis, workdir)
        await self._external(http, redis, self.ports.redis)
        await self._start_replicas(self.replicas, workdir)
        if self._alerting:
            await self._started(lambda: self._runbooks(workdir))
            alertmanager = functools.partial(self._alertmanager, workdir)
            await self._external(http, alertmanager, self.ports.alertmanager)
            self.context.alertmanager_url = topology.url(self.ports.alertmanager)
        haproxy = functools.partial(self._haproxy, workdir)
        await self._external(http, haproxy, self.ports.gateway, self.ports.gateway_metrics)
        if self.options.prometheus:
            prometheus = functools.partial(self._prometheus, workdir)
            await self._external(http, prometheus, self.ports.prometheus)
        elif self.options.victoria:
            await self._victoria(workdir, http, self.options.victoria)
        if self._tsdb:
            self.context.prometheus_url = topology.url(self.ports.prometheus)
        if self._tsdb or self.ports.fixed:  # given ports: the user's Prometheus is expected
            await self._started(self._advisor)
            if not self.ports.fixed:
                cluster = next(iter(self.clusters))
                topology.write_advisor(self._advisor_targets, self.ports.advisor, cluster)

    async def _victoria(
        self, workdir: Path, http: httpx.AsyncClient, binaries: victoria.Binaries
    ) -> None:
        """VictoriaMetrics, then vmalert on the port VictoriaMetrics proxies ``/api/v1/rules``
        to (both again on other ports when another process took that one meanwhile), then
        each cluster's vmagent."""
        rules = alerting.write_rules(workdir / "rules", self.options.alerts)
        notifier = topology.url(self.ports.alertmanager)
        storage = functools.partial(self._storage, workdir, binaries.victoria_metrics)

        def rule_engine(port: list[int]) -> Component:
            storage_url = topology.url(self.ports.prometheus)
            return victoria.rule_engine(binaries.vmalert, port[0], rules, storage_url, notifier)

        tries = 1 if self.ports.fixed else ATTEMPTS
        while True:
            await self._external(http, storage, self.ports.prometheus, self.ports.vmalert)
            try:
                await start_on_free_ports(self.supervisor, http, 1, rule_engine,
                                          [self.ports.vmalert], START_TIMEOUT)  # fmt: skip
                break
            except PortInUse:
                tries -= 1
                if tries == 0:
                    raise
                stale = self.supervisor.find("victoria", "")
                await self.supervisor.crash(stale)
                self.supervisor.discard(stale)
        for index, cluster in enumerate(self.clusters):
            agent = functools.partial(self._vmagent, workdir, binaries.vmagent, cluster, index == 0)
            await self._external(http, agent, self.ports.vmagent[cluster])

    def _storage(self, workdir: Path, binary: str, port: int, vmalert: int) -> Component:
        self.ports.prometheus, self.ports.vmalert = port, vmalert
        return victoria.storage(binary, port, workdir, vmalert)

    def _vmagent(
        self, workdir: Path, binary: str, cluster: str, first: bool, port: int
    ) -> Component:
        """The vmagent of ``cluster``; the first cluster's also scrapes what serves the whole
        fleet (HAProxy's exporter, the runbook receiver)."""
        self.ports.vmagent[cluster] = port
        config = workdir / f"vmagent-{cluster}.yml"
        config.write_text(
            topology.vmagent_config(self.ports, cluster, self.clusters[cluster],
                                    self._discovery(cluster), first, first and self._alerting,
                                    self._advisor_targets)
        )  # fmt: skip
        storage_url = topology.url(self.ports.prometheus)
        return victoria.agent(binary, cluster, port, workdir, config, storage_url)

    async def _external(
        self, http: httpx.AsyncClient, build: Callable[..., Component], *ports: int
    ) -> None:
        """Start an external binary on ``ports`` if the user gave them (``--base-port``),
        else on free ones (another set when one was taken before it bound it)."""
        fixed = list(ports) if self.ports.fixed else None
        await start_on_free_ports(
            self.supervisor, http, len(ports), lambda chosen: build(*chosen), fixed, START_TIMEOUT
        )

    async def _start_replicas(
        self, replicas: Sequence[Replica], workdir: Path, faults: object = None
    ) -> list[Component]:
        """Engines, then sidecars (which scrape them), then proxies (which read the sidecars'
        probe counters; :func:`~inferwatch.demo.topology.proxy_names`), each stage all at
        once; ``faults``: a fault document the engines start with. A replica served by the
        user's engine has no engine process."""
        started: list[Component] = []
        stages: list[list[Callable[[], Component]]] = [
            [
                functools.partial(self._sim, r, workdir, faults)
                for r in replicas
                if not r.engine_url
            ],
            [functools.partial(self._sidecar, r, workdir) for r in replicas],
            [
                functools.partial(self._proxy, r, workdir, name)
                for r in replicas
                for name in topology.proxy_names(r)
            ],
        ]
        for builds in stages:
            stage = [build() for build in builds]
            for component in stage:
                self.supervisor.start(component)
            for build, component in zip(builds, stage, strict=True):
                await self._bound(component, build)
            started += stage
        return started

    async def _started(self, build: Callable[[], Component]) -> None:
        component = build()
        self.supervisor.start(component)
        await self._bound(component, build)

    async def _bound(self, component: Component, rebuild: Callable[[], Component]) -> None:
        """Record the ports a component says it bound (it was given port 0, or the user's),
        and give it the command line that binds those again: a restart (a repaired engine, a
        new sidecar) then comes back where the configs written from them point."""
        said = await self.supervisor.announced(component, START_TIMEOUT)
        name, ports = component.name, self.ports
        if component.kind == "sim":
            ports.sim[name] = port_of(said["url"])
        elif component.kind == "sidecar":
            ports.sidecar[name] = port_of(said["listen"])
        elif component.kind == "proxy":
            ports.proxy[name] = port_of(said["listen"])
            ports.proxy_metrics[name] = port_of(said["metrics_listen"])
        elif component.kind == "advisor":
            ports.advisor = port_of(said["listen"])
        else:
            ports.runbooks = port_of(said["listen"])
        fresh = rebuild()
        component.argv, component.url = fresh.argv, fresh.url

    @property
    def _advisor_targets(self) -> Path:
        """The file the scrapers discover the advisor in (it starts after them)."""
        return self.supervisor.log_dir / ADVISOR_TARGETS

    def _advisor(self) -> Component:
        """``inferwatch advisor`` for every model of the fleet, from the query API, often
        enough that the fleet board's advice appears within a minute of load."""
        port = self.ports.advisor
        models = dict.fromkeys(topology.models(self.replicas).values())
        argv = [*INFERWATCH, "advisor", "--prometheus", topology.url(self.ports.prometheus),
                *(arg for model in models for arg in ("--model", model)),
                "--every", ADVISOR_EVERY, "--window", "1m", "--timeout", "10",
                "--listen", f"127.0.0.1:{port}"]  # fmt: skip
        return Component("advisor", "", topology.url(port), "/healthz", argv)

    def _runbooks(self, workdir: Path) -> Component:
        settings = automation.Settings(
            self.options.execute_runbooks,
            workdir / routing.RUNTIME,
            replicas=self.fleet,
            sidecars=self.ports.sidecar,
        )
        return automation.component(workdir, self.ports.runbooks, settings)

    def _prometheus(self, workdir: Path, port: int) -> Component:
        assert self.options.prometheus
        self.ports.prometheus = port
        rules = alerting.write_rules(workdir / "rules", self.options.alerts)
        config = workdir / "prometheus.yml"
        discovery = self._discovery(topology.CLUSTER)  # spares: discovered once they start
        advisor = self._advisor_targets
        config.write_text(
            topology.prometheus_config(
                self.ports, rules, self._alerting, self.fleet, discovery, advisor
            )
        )
        argv = [
            self.options.prometheus,
            f"--config.file={config}",
            f"--storage.tsdb.path={workdir / 'prometheus-data'}",
            f"--web.listen-address=127.0.0.1:{port}",
            "--log.level=warn",
        ]
        return Component("prometheus", "", topology.url(port), "/-/ready", argv)

    def _discovery(self, cluster: str) -> Path | None:
        """Where ``cluster``'s scraper reads its spares' targets once they start (file-based
        discovery), written now with those started so far; None: the fleet has no spares."""
        if len(self.fleet) == len(self.replicas):
            return None
        folder = self.supervisor.log_dir / DISCOVERY
        folder = folder / cluster if self.options.victoria else folder
        started = [r.name for r in self.clusters[cluster] if r.name in self.started]
        topology.write_discovered(folder, self.ports, started, cluster)
        return folder

    def _write_discovered(self) -> None:
        """Every cluster's discovery files, listing the spares started so far."""
        if self._tsdb:
            for cluster in self.clusters:
                self._discovery(cluster)

    def _scrapers(self) -> list[str]:
        """Where the fleet's target health is read: Prometheus, or each cluster's vmagent."""
        if self.options.victoria:
            return [topology.url(port) for port in self.ports.vmagent.values()]
        return [topology.url(self.ports.prometheus)] if self.options.prometheus else []

    def _alertmanager(self, workdir: Path, port: int) -> Component:
        assert self.options.alertmanager
        self.ports.alertmanager = port
        config = workdir / "alertmanager.yml"
        config.write_text(
            alerting.alertmanager_config(
                self.options.alerts,
                automation.webhook_url(self.ports.runbooks),
                workdir / automation.TOKEN,
            )
        )
        argv = topology.alertmanager_argv(
            self.options.alertmanager, config, workdir / "alertmanager-data", port
        )
        return Component("alertmanager", "", topology.url(port), "/-/ready", argv)

    def _redis(self, workdir: Path, port: int) -> Component:
        self.ports.redis = port
        return sharedstate.component(self.options.redis, port, workdir)

    def _haproxy(self, workdir: Path, port: int, metrics: int) -> Component:
        self.ports.gateway, self.ports.gateway_metrics = port, metrics
        return routing.component(self.options.haproxy, self.ports, workdir, self.fleet)

    def _sim(self, replica: Replica, workdir: Path, faults: object = None) -> Component:
        """A replica's simulated engine; ``faults``: a fault document it starts with."""
        start_faults: list[str] = []
        if faults:
            path = workdir / f"faults-{replica.name}.json"
            path.write_text(json.dumps(faults), encoding="utf-8")
            start_faults = ["--faults", str(path)]
        port = self.ports.sim[replica.name]
        ready = workdir / f"sim-{replica.name}.ready.json"
        return Component(
            "sim",
            replica.name,
            topology.url(port),
            "/health",
            [*INFERWATCH, "sim", "--model", replica.model, "--gpu", replica.gpu,
             "--speed", f"{self.options.speed:g}", "--seed", str(self.fleet.index(replica)),
             "--hostname", replica.node, "--host", "127.0.0.1",
             *(f"--served-model-name={name}" for name in topology.served_names(replica)),
             "--port", str(port), "--ready-file", str(ready), *replica.sim_flags,
             *start_faults,
             "--storage-bandwidth", f"{replica.storage_bandwidth:g}"],
            env={"INFERWATCH_SIM_ADMIN_TOKEN": self.admin_token},
            ready_file=ready,
        )  # fmt: skip

    def _engine(self, replica: Replica) -> str:
        """Where a replica's engine answers: the user's, or its simulator's bound address."""
        return replica.engine_url or topology.url(self.ports.sim[replica.name])

    def _sidecar(self, replica: Replica, workdir: Path) -> Component:
        engine = self._engine(replica)
        gpu = "none" if replica.engine_url else f"dcgm={engine}/gpu/metrics"
        port = self.ports.sidecar[replica.name]
        return Component(
            "sidecar",
            replica.name,
            topology.url(port),
            "/healthz",
            [*INFERWATCH, "sidecar", "--engine-url", engine,
             "--engine", "auto" if replica.engine_url else "vllm",
             "--listen", f"127.0.0.1:{port}",
             "--gpu", gpu, "--model", replica.model,
             "--model-version", replica.version, "--pod", replica.name, "--node", replica.node,
             "--namespace", topology.NAMESPACE, "--probes", "default",
             "--admin-token-file", str(workdir / automation.SIDECAR_TOKEN),
             "--probe-cycle", f"{self.options.probe_cycle:g}",
             "--warmup-batch-sizes", "1,4", "--warmup-prompt-tokens", "16,256"],
        )  # fmt: skip

    def _proxy(self, replica: Replica, workdir: Path, name: str) -> Component:
        """The proxy ``name`` in front of ``replica``, its budgets in the demo's Redis."""
        config = workdir / f"proxy-{name}.yaml"
        sidecar_url = topology.url(self.ports.sidecar[replica.name])
        shared = sharedstate.proxy_section(self.ports.redis, workdir / f"journal-{name}")
        config.write_text(
            topology.proxy_config(
                replica,
                self._engine(replica),
                sidecar_url,
                self.tenants,
                self.fleet,
                shared,
                str(workdir / USAGE_LOG),
            )
        )
        port = self.ports.proxy[name]
        return Component(
            "proxy",
            name,
            topology.url(port),
            "/healthz",
            [*INFERWATCH, "proxy", "--config", str(config), "--no-access-log",
             "--listen", f"127.0.0.1:{port}",
             "--metrics-listen", f"127.0.0.1:{self.ports.proxy_metrics[name]}",
             "--drain-grace", "1"],
        )  # fmt: skip

    def _storage_summary(self) -> str:
        """The banner's words for where the series go and the rules run."""
        if self.options.victoria:
            clusters = ", ".join(self.clusters)
            return (f", {len(self.clusters)} clusters ({clusters}) each scraped by its vmagent "
                    f"into VictoriaMetrics, vmalert with the generated rules")  # fmt: skip
        return ", Prometheus with the generated rules" if self.options.prometheus else ""

    def _announce(self, supervisor: Supervisor, workdir: Path) -> None:
        """Where everything listens, so that a person can curl it or open it."""
        options = self.options
        engine = "your engine" if options.engines else "simulated vLLM"
        self.say(
            f"inferwatch demo: {len(self.replicas)} replicas ({engine} + sidecar + tenancy "
            f"proxy each, two proxies per primary replica, budgets shared in Redis)"
            f"{self._storage_summary()}"
            f"{', Alertmanager' if self._alerting else ''}"
            f"{f', runbook receiver ({self.context.runbooks_mode})' if self._alerting else ''}; "
            f"load {options.rate:g} req/s"
            + ("" if options.engines else f"; speed {options.speed:g}x")
        )
        what = {  # each URL as the flags that take it want it
            "sim": "OpenAI API and /metrics (--engine-url, --upstream); DCGM page {url}/gpu/metrics"
            " (--gpu dcgm=URL)",
            "sidecar": "/metrics /readyz",
            "proxy": "OpenAI API per tenant (base URL {url}/v1); tenant /metrics on its own port",
            "redis": "the proxies' shared budgets (shared_state url)",
            "prometheus": "web UI and API, /alerts",
            "victoria": "VictoriaMetrics single node (victoria-metrics): every cluster's series, "
            "its Prometheus-compatible API (/api/v1/query; --prometheus of snapshot, canary, "
            "report usage), /vmui",
            "vmagent": "scrapes its cluster's sidecars and proxies (/targets, /api/v1/targets), "
            "remote-writes them with its cluster label",
            "vmalert": "evaluates the generated rules against VictoriaMetrics, /api/v1/alerts "
            "/api/v1/rules",
            "alertmanager": "web UI, /api/v2/alerts",
            "haproxy": "the gateway clients call: OpenAI API at {url}/v1, routed by model, "
            "checks on each sidecar's /readyz; its /metrics at {metrics}",
            "runbooks": f"/webhook (Alertmanager's automation receiver) /metrics; audit log "
            f"{workdir / automation.AUDIT_LOG}",
            "advisor": f"inferwatch advise every {ADVISOR_EVERY} per model as /metrics "
            "(the fleet board's advised vs running settings)",
        }
        for c in supervisor.components:
            # the gateway's row gives the URL clients call, where a person looks for it
            url = topology.url(self.ports.gateway) if c.kind == "haproxy" else c.url
            about = what[c.kind].format(url=url, metrics=f"{c.url}/metrics")
            self.say(f"  {c.kind:<12} {c.name:<12} {url:<24} pid {c.pid:<7} {about}")
        if options.engines:
            for replica, served in zip(self.replicas, options.engines, strict=True):
                context = f", max_model_len {served.max_model_len}" if served.max_model_len else ""
                self.say(
                    f"  engine       {replica.name:<12} {served.url:<24} yours   model "
                    f"{served.model}{context} (/v1/models); not started or stopped by the demo"
                )
        for spare in self.fleet[len(self.replicas) :]:
            self.say(
                f"  spare        {spare.name:<12} a second {spare.version} replica, started by "
                f"the scenario (gateway server in maintenance until then)"
            )
        tenants = ", ".join(f"{t.name} ({t.key})" for t in self.tenants)
        first = self.replicas[0]
        self.say(f"  tenant API keys: {tenants}")
        for tenant in self.tenants:
            if tenant.share == 0 and tenant.budget_tokens:
                self.say(
                    f"  {tenant.name} sends nothing unless you do: its budget of "
                    f"{tenant.budget_tokens} tokens per {tenant.budget_window} holds over every "
                    f"proxy of its model (kept in Redis), however they share its requests"
                )
        question = "Which planet in our solar system is the largest? Reply with one word."
        body = json.dumps(
            {"model": first.model, "messages": [{"role": "user", "content": question}]}
        )
        self.say(
            f"  try: curl -s {topology.url(self.ports.gateway)}/v1/chat/completions "
            f"-H 'Authorization: Bearer {topology.TENANTS[0].key}' "
            f"-H 'Content-Type: application/json' -d '{body}'"
        )
        # announced before the load starts: the log's first line comes after this second
        since = time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime(time.time()))
        chargeback = (
            f"inferwatch report usage --log-dir {workdir / USAGE_LOG} --from {since} --to <now>"
        )
        if self._tsdb:
            chargeback += f" --prometheus {topology.url(self.ports.prometheus)}"
        self.say(f"  chargeback: {chargeback}")
        self.say(f"  work dir {workdir} (removed on exit)")
