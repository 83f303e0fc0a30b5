"""End to end on VictoriaMetrics: the demo fleet's sidecars scraped by two vmagents into a
single-node VictoriaMetrics, the generated rules evaluated there by vmalert, alerts sent to
the generated Alertmanager, and ``inferwatch snapshot`` reading VictoriaMetrics's
Prometheus-compatible API.

The demo runs its replicas, sidecars and proxies (``--no-prometheus``) on a reserved run of
ports; the vmagents read the scrape config ``inferwatch generate vmagent`` writes for those
ports. The main stack's vmagents replicate (every target scraped by both, VictoriaMetrics
deduplicating); a second, sharded pair (replication 1, each labelling what it writes with
its member number) shows the targets split between them. A scenario gives primary-v1's GPU
a contained XID (with the dashboards test's other faults, so that every panel has a
series to draw) and the fallback replica a failing half of its requests (an availability
SLO burn), after one vmagent was killed.
"""

from __future__ import annotations

import itertools
import signal
import subprocess
import sys
import time
from collections.abc import Iterator
from contextlib import ExitStack, suppress
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import httpx
import pytest
import yaml

from inferwatch.demo import alerting, topology
from support import panels
from support.ports import fixed_run
from support.shared import tool
from support.victoria import INTERVAL_S, Server, query, victoria_metrics, vmagent, vmalert
from support.wait import wait_for

pytestmark = [pytest.mark.e2e, pytest.mark.long]

INFERWATCH = [sys.executable, "-P", "-m", "inferwatch"]
CLUSTER = "east"
SCENARIO = f"""name: victoriametrics-e2e
steps:
{panels.FAULTS_STEP}  - at: 1s
    replica: fallback
    inject: {{error_rate: 0.5}}
"""
DEMO_START_S = 180.0
DATA_DEADLINE_S = 60.0
ALERT_DEADLINE_S = 120.0
#: ports past the demo's: the main pair of vmagents, vmalert, the sharded pair's storage and
#: its two vmagents
EXTRA_PORTS = 6


@dataclass
class Stack:
    work: Path
    http: httpx.Client
    storage: Server
    agents: list[Server]
    alertmanager: Server
    #: every target of the generated scrape config, as ``host:port``
    targets: set[str]
    config: Path
    extra: int

    def alerts(self) -> list[dict[str, Any]]:
        response = self.http.get(self.alertmanager.url + "/api/v2/alerts")
        response.raise_for_status()
        alerts: list[dict[str, Any]] = response.json()
        return alerts


def scrape_targets(config: Path) -> set[str]:
    document = yaml.safe_load(config.read_text())
    return {target for job in document["scrape_configs"]
            for group in job["static_configs"] for target in group["targets"]}  # fmt: skip


def _stop_demo(process: subprocess.Popen[Any]) -> None:
    process.send_signal(signal.SIGTERM)
    try:
        process.wait(timeout=20)
    except subprocess.TimeoutExpired:
        process.kill()
        process.wait()


@pytest.fixture(scope="module")
def stack(tmp_path_factory: pytest.TempPathFactory, alertmanager_bin: str) -> Iterator[Stack]:
    binaries = {name: tool(name) for name in ("victoria-metrics", "vmagent", "vmalert")}
    work = tmp_path_factory.mktemp("victoriametrics-e2e")
    count = topology.Ports.count(topology.REPLICAS)
    base = fixed_run(count + EXTRA_PORTS)
    ports = topology.Ports.assign(base)
    extra = base + count
    config = work / "vmagent.yml"
    generated = subprocess.run(
        [*INFERWATCH, "generate", "vmagent", "--base-port", str(base), "--cluster", CLUSTER,
         "--out", str(config)],
        capture_output=True, text=True, timeout=60,
    )  # fmt: skip
    assert generated.returncode == 0, generated.stderr
    chosen = alerting.demo_config()
    rules = alerting.write_rules(work / "rules", chosen)
    (work / "alertmanager.yml").write_text(alerting.alertmanager_config(chosen))
    (work / "scenario.yaml").write_text(SCENARIO)
    with ExitStack() as cleanup, httpx.Client(timeout=10) as http:
        am_argv = topology.alertmanager_argv(alertmanager_bin, work / "alertmanager.yml",
                                             work / "am-data", ports.alertmanager)  # fmt: skip
        alertmanager = Server(am_argv, ports.alertmanager, work / "alertmanager.log", "/-/ready")
        storage = victoria_metrics(binaries["victoria-metrics"], ports.prometheus, work, extra + 2)
        agents = [
            vmagent(binaries["vmagent"], extra + member, work, config, storage.url, member, 2)
            for member in (0, 1)
        ]
        rule_engine = vmalert(binaries["vmalert"], extra + 2, work, rules, storage.url,
                              alertmanager.url)  # fmt: skip
        for server in (alertmanager, storage, *agents, rule_engine):
            cleanup.callback(server.stop)
            server.start()
        demo_log = cleanup.enter_context((work / "demo.log").open("w"))
        demo = subprocess.Popen(
            [*INFERWATCH, "demo", "--no-prometheus", "--base-port", str(base), "--speed", "50",
             "--rate", "5", "--probe-cycle", "3", "--scenario", str(work / "scenario.yaml"),
             "--duration", "900"],
            stdout=demo_log, stderr=subprocess.STDOUT, cwd=work, text=True,
        )  # fmt: skip
        cleanup.callback(_stop_demo, demo)
        yield Stack(work, http, storage, agents, alertmanager, scrape_targets(config), config,
                    extra)  # fmt: skip


def instances_up(stack: Stack, storage: str, by: str = "") -> dict[str, set[str]]:
    """The targets whose ``up`` is 1 in ``storage``, by the value of label ``by``."""
    found: dict[str, set[str]] = {}
    for series in query(stack.http, storage, "up == 1"):
        found.setdefault(series["metric"].get(by, ""), set()).add(series["metric"]["instance"])
    return found


def test_two_vmagents_shard_the_targets_between_them(stack: Stack) -> None:
    """Replication 1: each target is scraped by exactly one of the two, and each has some."""
    binary = tool("vmagent")
    work = stack.work / "sharded"
    work.mkdir()
    storage = victoria_metrics(tool("victoria-metrics"), stack.extra + 3, work)
    agents = [
        vmagent(binary, stack.extra + 4 + member, work, stack.config, storage.url, member, 1,
                f"-remoteWrite.label=scraper={member}")
        for member in (0, 1)
    ]  # fmt: skip
    with ExitStack() as cleanup:
        for server in (storage, *agents):
            cleanup.callback(server.stop)
            server.start()
        split: dict[str, set[str]] = {}

        def all_scraped() -> bool:
            split.clear()
            split.update(instances_up(stack, storage.url, "scraper"))
            return set().union(*split.values()) == stack.targets

        wait_for(all_scraped, "every target up, in the sharded storage", DATA_DEADLINE_S)
    assert set(split) == {"0", "1"}, split
    assert not split["0"] & split["1"], split
    assert all(split.values())


def raw_samples(stack: Stack, expr: str, seconds: float) -> dict[str, list[float]]:
    """The stored sample times of each series of ``expr`` over the last ``seconds`` (a range
    selector's raw samples, after VictoriaMetrics's deduplication), by instance."""
    series = query(stack.http, stack.storage.url, f"{expr}[{seconds:.0f}s]")
    return {s["metric"]["instance"]: [float(t) for t, _ in s["values"]] for s in series}


def test_a_killed_vmagent_leaves_no_gap_with_replication_2(stack: Stack) -> None:
    """Both vmagents scrape every sidecar; one is killed, and every sidecar's
    ``inferwatch_engine_up`` goes on from before the kill to now with no sample missing
    past one interval (with replication 1, half the sidecars' series would stop)."""
    sidecars = {f"127.0.0.1:{port}" for port in _sidecar_ports(stack.config)}
    selector = 'inferwatch_engine_up{job="inferwatch-sidecar"}'
    before = 6 * INTERVAL_S

    def stored_long_enough() -> bool:
        samples = raw_samples(stack, selector, 60)
        oldest = time.time() - before
        return set(samples) == sidecars and all(t[0] < oldest for t in samples.values())

    wait_for(stored_long_enough, "every sidecar's series stored", DEMO_START_S)
    killed_at = time.time()
    stack.agents[0].kill()
    after = 8 * INTERVAL_S
    wait_for(lambda: time.time() > killed_at + after, "time past the kill", after + 5)
    start = killed_at - before
    samples = raw_samples(stack, selector, time.time() - start)
    now = time.time()
    assert set(samples) == sidecars
    for instance, times in samples.items():
        edges = [start, *times, now]
        gaps = [b - a for a, b in itertools.pairwise(edges)]
        assert max(gaps) <= 3 * INTERVAL_S, (instance, killed_at, now, times)


def _sidecar_ports(config: Path) -> list[int]:
    document = yaml.safe_load(config.read_text())
    job = next(j for j in document["scrape_configs"] if j["job_name"] == topology.SIDECAR_JOB)
    return [int(t.rsplit(":", 1)[1]) for g in job["static_configs"] for t in g["targets"]]


def test_vmalert_fires_the_xid_and_slo_burn_alerts_into_alertmanager(stack: Stack) -> None:
    wanted = {"InferwatchGPUXidErrors": "primary-v1", "InferwatchAvailabilitySLOBurn": None}
    seen: dict[str, dict[str, str]] = {}

    def fired() -> bool:
        for alert in stack.alerts():
            labels = alert["labels"]
            name = labels["alertname"]
            if name in wanted and wanted[name] in (None, labels.get("replica")):
                seen[name] = labels
        return set(seen) == set(wanted)

    wait_for(fired, f"{sorted(wanted)} in Alertmanager", ALERT_DEADLINE_S, interval=1)
    assert seen["InferwatchGPUXidErrors"]["cluster"] == CLUSTER
    burn = seen["InferwatchAvailabilitySLOBurn"]
    assert (burn["cluster"], burn["model"]) == (CLUSTER, topology.FALLBACK_MODEL)


def test_snapshot_reads_victoriametrics(stack: Stack, tmp_path: Path) -> None:
    """The fleet board from VictoriaMetrics's API, recording rules listed through its
    vmalert proxy; every panel has data."""
    from inferwatch.alerts import config as alert_config
    from inferwatch.dashboards import queries, writer

    dashboard = writer.dashboards(alert_config.load())["fleet"]
    count = len(queries.panels(dashboard))
    out = tmp_path / "fleet.png"
    result: list[subprocess.CompletedProcess[str]] = []

    def drawn() -> bool:
        result[:] = [subprocess.run(
            [*INFERWATCH, "snapshot", "--prometheus", stack.storage.url, "--from", "2m",
             "--scrape-interval", f"{INTERVAL_S:g}s", "--out", str(out), "--dashboard",
             "fleet", "--var", "replica=primary-v1"],
            capture_output=True, text=True, timeout=120,
        )]  # fmt: skip
        return result[0].stdout.strip() == f"{out}: fleet, {count} of {count} panels with data"

    try:
        wait_for(drawn, "a snapshot with every panel drawn", DATA_DEADLINE_S, interval=5)
    except pytest.fail.Exception:
        pytest.fail(f"{result[0].returncode}: {result[0].stdout} {result[0].stderr}")
    assert result[0].returncode == 0
    assert "Warning" not in result[0].stderr, result[0].stderr
    assert out.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"


def test_every_panel_returns_data_from_victoriametrics(stack: Stack) -> None:
    """The no-dead-panel check of the dashboards test, against VictoriaMetrics: every panel
    of every board has data, recording rules evaluated by vmalert included."""
    from inferwatch.alerts import config as alert_config
    from inferwatch.dashboards import writer

    boards = writer.dashboards(alert_config.load())
    source = panels.Source(stack.storage.url, stack.http)
    dead: list[str] = []

    def all_alive() -> bool:
        dead[:] = panels.dead_panels(source, boards)
        return not dead

    with suppress(pytest.fail.Exception):  # the assertion names the panels still dead
        wait_for(all_alive, "data on every panel", DATA_DEADLINE_S, interval=3)
    assert dead == [], "dead panels: " + "; ".join(dead)


def test_canary_reads_victoriametrics_and_rolls_back_a_failing_candidate(stack: Stack) -> None:
    """``inferwatch canary`` on VictoriaMetrics's query API: the fallback model (its one
    replica failing half its requests) rolls back against the healthy primary-v2 (exit 1)."""
    result: list[subprocess.CompletedProcess[str]] = []

    def decided() -> bool:
        result[:] = [subprocess.run(
            [*INFERWATCH, "canary", "--prometheus", stack.storage.url,
             '--baseline=model_version="v2-fp8"',
             f'--candidate=model="{topology.FALLBACK_MODEL}",model_version="v1"',
             "--window", "1m", "--min-requests", "20", "--min-probes", "1",
             "--min-screened", "1", "--min-tokens", "1"],
            capture_output=True, text=True, timeout=120,
        )]  # fmt: skip
        return result[0].returncode == 1

    try:
        wait_for(decided, "the canary to roll the candidate back", DATA_DEADLINE_S, interval=5)
    except pytest.fail.Exception:
        pytest.fail(f"exit {result[0].returncode}: {result[0].stdout} {result[0].stderr}")
    row = next(line for line in result[0].stdout.splitlines() if "error ratio" in line)
    assert "fail" in row.split(), result[0].stdout
