"""``inferwatch demo --tsdb victoriametrics`` and the drill on it: the fleet as two clusters,
each scraped by its own vmagent into one single-node VictoriaMetrics, the generated rules on
vmalert, which alone sends Alertmanager its alerts (no Prometheus runs).

The drill plays its shortest scenario (``reset-class-xid``) first, then one demo plays the
cheapest fault, an XID on primary-v1 one second in, and its tests read what the demo's
banner announces: one stack at a time.
"""

from __future__ import annotations

import json
import math
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest
import yaml
from click.testing import CliRunner

from inferwatch.cli import main
from inferwatch.demo import alerting, topology
from inferwatch.mixin import recording
from inferwatch.mixin.model import Recording
from support.demo import Demo, running_demo
from support.shared import tool
from support.victoria import query
from support.wait import wait_for

XID_SCENARIO = """name: xid
steps:
  - at: 1s
    replica: primary-v1
    inject: {gpu: [{index: 0, xid: 48}]}
"""
CLUSTERS = ("east", "west")
DATA_DEADLINE_S = 60.0
ALERT_DEADLINE_S = 90.0

pytestmark = pytest.mark.long


@pytest.fixture(scope="module")
def binaries(haproxy_bin: str, alertmanager_bin: str) -> None:
    """Skipped locally (a failure under CI) unless all the stack's binaries are installed."""
    for name in ("victoria-metrics", "vmagent", "vmalert", "redis-server"):
        tool(name)


#: the drill's scenarios played on VictoriaMetrics here: the two shortest, one replica's XID
#: and the mass ECC fault the breaker must contain (every scenario passes on it too, in
#: ~200 s: ``inferwatch drill --tsdb victoriametrics``; the Prometheus drill test plays them
#: all). The mass GPU fault is no pair for the XID one: it is written to come minutes after,
#: when primary-v1's XID alert has left its window, not while it still fires
VM_SCENARIOS = ("reset-class-xid", "mass-ecc-fault")


@pytest.mark.e2e
@pytest.mark.timeout(300)
def test_the_drill_on_victoriametrics_passes_its_shortest_scenarios(
    binaries: None, tmp_path: Path
) -> None:
    report = tmp_path / "drill.json"
    played = [arg for name in VM_SCENARIOS for arg in ("--scenario", name)]
    done = subprocess.run(
        [sys.executable, "-P", "-m", "inferwatch", "drill", "--tsdb", "victoriametrics",
         *played, "--report", str(report)],
        capture_output=True, text=True, timeout=280, cwd=tmp_path,
    )  # fmt: skip
    output = done.stdout + done.stderr
    assert done.returncode == 0, output
    assert "  vmalert " in output and "  prometheus " not in output, output
    result = json.loads(report.read_text())
    assert result["ok"] and result["settings"]["tsdb"] == "victoriametrics", result
    lines = {line["scenario"]: line for line in result["scenarios"]}
    assert list(lines) == list(VM_SCENARIOS), lines
    assert lines["reset-class-xid"]["acted"]["isolate_replica"] == 1, lines
    mass = lines["mass-ecc-fault"]
    assert mass["refused_by_breaker"] > 0 and mass["acted"]["isolate_replica"] == 1, mass
    assert all(line["ok"] and line["checks"]["alert fired"] for line in lines.values()), lines


@pytest.fixture(scope="module")
def demo(binaries: None, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Demo]:
    folder = tmp_path_factory.mktemp("vm-demo")
    (folder / "xid.yaml").write_text(XID_SCENARIO)
    with running_demo(folder, "--tsdb", "victoriametrics", "--scenario", "xid.yaml",
                      "--speed", "20") as running:  # fmt: skip
        yield running


def _targets(url: str) -> list[dict[str, Any]]:
    response = httpx.get(url + "/api/v1/targets", timeout=5)
    response.raise_for_status()
    targets: list[dict[str, Any]] = response.json()["data"]["activeTargets"]
    return targets


@pytest.mark.e2e
def test_each_clusters_vmagent_scrapes_its_own_targets_all_up(demo: Demo) -> None:
    assert "  prometheus " not in demo.output  # VictoriaMetrics takes its place
    found: dict[str, list[dict[str, Any]]] = {}

    def all_up() -> bool:
        for cluster in CLUSTERS:
            found[cluster] = _targets(demo.url("vmagent", cluster))
        return all(t["health"] == "up" for targets in found.values() for t in targets)

    wait_for(all_up, "every target of both vmagents up", DATA_DEADLINE_S, interval=0.5)
    replicas = {c: {t["labels"].get("replica") for t in found[c]} - {None} for c in CLUSTERS}
    assert replicas == {"east": {"primary-v1", "primary-v2"}, "west": {"fallback"}}
    assert all(t["labels"]["cluster"] == c for c in CLUSTERS for t in found[c])
    jobs = {c: {t["labels"]["job"] for t in found[c]} for c in CLUSTERS}
    # what serves the whole fleet is scraped once, with the first cluster
    assert {topology.GATEWAY_JOB, topology.RUNBOOKS_JOB} <= jobs["east"]
    assert not {topology.GATEWAY_JOB, topology.RUNBOOKS_JOB} & jobs["west"]


@pytest.mark.e2e
def test_both_clusters_series_and_a_recording_rule_reach_victoriametrics(demo: Demo) -> None:
    storage = demo.url("victoria")
    (record, *_) = [rule.record for group in recording.groups(alerting.demo_config())
                    for rule in group.rules if isinstance(rule, Recording)]  # fmt: skip
    with httpx.Client(timeout=10) as http:

        def clusters(expr: str) -> set[str]:
            return {s["metric"].get("cluster", "") for s in query(http, storage, expr)}

        wait_for(lambda: clusters('{__name__=~"inferwatch_.+"}') == set(CLUSTERS),
                 "inferwatch_* series of both clusters", DATA_DEADLINE_S, interval=0.5)  # fmt: skip
        wait_for(lambda: clusters(record) == set(CLUSTERS),
                 f"{record}, recorded by vmalert, for both clusters", DATA_DEADLINE_S,
                 interval=0.5)  # fmt: skip
        recorded = query(http, storage, record)
    # each recorded series is one cluster's, with a number a rule computed
    assert {s["metric"]["cluster"] for s in recorded} == set(CLUSTERS), recorded
    assert all(math.isfinite(float(s["value"][1])) for s in recorded), recorded


@pytest.mark.e2e
def test_vmalert_sends_the_xid_alert_to_alertmanager(demo: Demo) -> None:
    vmalert = demo.url("vmalert")

    def xid(alerts: list[dict[str, Any]]) -> dict[str, Any] | None:
        return next((a for a in alerts if a["labels"]["alertname"] == "InferwatchGPUXidErrors"),
                    None)  # fmt: skip

    received = wait_for(lambda: xid(demo.alerts()), "the XID alert in Alertmanager",
                        ALERT_DEADLINE_S, interval=0.5)  # fmt: skip
    assert received["labels"]["replica"] == "primary-v1"
    assert received["labels"]["cluster"] == "east"
    response = httpx.get(vmalert + "/api/v1/alerts", timeout=5)
    response.raise_for_status()
    fired = xid(response.json()["data"]["alerts"])
    assert fired is not None and fired["state"] == "firing", fired


@pytest.mark.unit
def test_the_two_clusters_vmagents_scrape_prometheuss_targets_between_them() -> None:
    """Every target Prometheus would scrape, each once: a cluster's replicas by its vmagent,
    what serves the whole fleet by the first cluster's; each labelled with its cluster."""
    clusters = topology.clusters(topology.REPLICAS, split=True)
    assert list(clusters) == list(CLUSTERS)
    ports = topology.Ports.assign(18000, topology.REPLICAS, clusters)
    assert (list(ports.vmagent.values()), ports.vmalert) == ([18023, 18024], 18025)

    def targets(document: dict[str, Any]) -> dict[str, str]:
        return {target: group["labels"]["cluster"] for job in document["scrape_configs"]
                for group in job["static_configs"] for target in group["targets"]}  # fmt: skip

    scraped: dict[str, str] = {}
    for index, (cluster, members) in enumerate(clusters.items()):
        text = topology.vmagent_config(ports, cluster, members, None, index == 0, index == 0)
        found = targets(yaml.safe_load(text))
        assert set(found.values()) == {cluster}
        assert not set(found) & set(scraped)
        scraped |= found
    everything = targets(yaml.safe_load(topology.prometheus_config(ports, (), True)))
    assert set(scraped) == set(everything)


@pytest.mark.proc
def test_each_clusters_config_with_its_spares_discovery_files_passes_vmagents_check(
    tmp_path: Path,
) -> None:
    """A scale-out scenario's configs: each job also reads a discovery file, as vmagent
    1.79's strict parser takes it."""
    vmagent = tool("vmagent")
    fleet = topology.fleet(["primary-v1b"])
    clusters = topology.clusters(fleet, split=True)
    ports = topology.Ports.assign(18000, fleet, clusters)
    for cluster, members in clusters.items():
        folder = tmp_path / cluster
        topology.write_discovered(folder, ports, [], cluster)
        config = tmp_path / f"{cluster}.yml"
        config.write_text(topology.vmagent_config(ports, cluster, members, folder))
        assert "file_sd_configs" in config.read_text()
        check = subprocess.run([vmagent, "-dryRun", f"-promscrape.config={config}"],
                               capture_output=True, text=True, timeout=60)  # fmt: skip
        assert check.returncode == 0, check.stderr


@pytest.mark.unit
@pytest.mark.parametrize("flag", ["--no-prometheus", "--no-alertmanager"])
def test_victoriametrics_takes_prometheuss_place_and_needs_alertmanager(flag: str) -> None:
    result = CliRunner().invoke(main, ["demo", "--tsdb", "victoriametrics", flag])
    assert result.exit_code == 2, result.output
    assert f"{flag} cannot go with --tsdb victoriametrics" in result.output
