"""``inferwatch demo``: the whole stack starts, shows its signals, plays faults and stops cleanly.

The end-to-end tests run the real command as a subprocess with stdout on a pipe (the plain
plain summary) and check what a user relies on: exit code 0, replicas and tenants with
traffic, a scripted fault visible as a readiness flip, URLs that work as printed, and no child
process or work directory left behind (checked by the pids and the directory the demo prints
at start). They wait for the lines they need, each with a deadline, never for a fixed time.
"""

from __future__ import annotations

import asyncio
import dataclasses
import json
import os
import re
import signal
import socket
import subprocess
import sys
import threading
import time
from collections.abc import Callable, Iterator
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any, cast

import httpx
import openai
import pytest
import yaml
from click.testing import CliRunner

from inferwatch import wire
from inferwatch.cli import main
from inferwatch.clikit import BadInput, CannotRun
from inferwatch.demo import (
    alerting,
    automation,
    processes,
    routing,
    scenario,
    sharedstate,
    topology,
)
from inferwatch.demo import engines as external
from inferwatch.demo.loadgen import LoadStats
from inferwatch.demo.observer import (
    AlertState,
    AuditTail,
    FleetState,
    Observer,
    ReplicaState,
    TenantState,
)
from inferwatch.demo.signals import History, Scrape, quantiles, rate
from inferwatch.demo.view import decisions_summary, summary
from inferwatch.exitcodes import ExitCode
from inferwatch.exporters import gpu
from inferwatch.proxy.usage import estimate_prompt_tokens
from inferwatch.runbooks import breaker, inventory, registry
from inferwatch.runbooks import config as runbook_config
from inferwatch.runbooks.actions.base import Alert, Step
from inferwatch.runbooks.audit import AuditLog
from inferwatch.runbooks.config import Config
from inferwatch.runbooks.dispatch import Dispatcher
from inferwatch.runbooks.haproxy_runtime import RuntimeApiError, ServerState
from inferwatch.runbooks.state import State
from support.demo import alive, pids
from support.output import Output
from support.ports import launch, pick_port
from support.wait import wait_for

DEMO = [sys.executable, "-P", "-m", "inferwatch", "demo"]
REPLICAS = [r.name for r in topology.REPLICAS]
SPARES = [r.name for r in topology.SPARES]
FAULT = """
name: fallback-gpu
steps:
  - {at: 1s, replica: fallback, inject: {gpu: [{index: 0, xid: 79}]}}
  - {at: 6s, replica: fallback, crash: true}
  - {at: 9s, replica: fallback, repair: true}
"""
# The test waits for each event the scenario must cause (a restarted engine and sidecar are
# seen ready again however long that takes on a loaded machine), then stops the demo.


# --- rates and quantiles from /metrics deltas -------------------------------------------------
def page(count: float, buckets: dict[str, float], series: str = "a") -> str:
    lines = ["# TYPE work_total counter", f'work_total{{s="{series}"}} {count}']
    lines.append("# TYPE latency_seconds histogram")
    lines += [f'latency_seconds_bucket{{s="{series}",le="{le}"}} {n}' for le, n in buckets.items()]
    return "\n".join(lines) + "\n"


@pytest.mark.unit
@pytest.mark.parametrize(
    ("find", "words"),
    [(routing.binary, "haproxy is not installed: the gateway the load goes through "
                      "(scripts/install-haproxy, or the Debian package haproxy)"),
     (sharedstate.binary, "redis-server is not installed: the proxies' shared budgets "
                          "(scripts/install-redis, or the Debian package redis-server)")],
)  # fmt: skip
def test_a_missing_external_binary_is_one_line_saying_how_to_install_it(
    find: Any, words: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("PATH", str(tmp_path))
    monkeypatch.setattr(processes, "SEARCH_PATH", str(tmp_path))
    with pytest.raises(CannotRun) as refused:
        find()
    assert str(refused.value) == words
    (tmp_path / words.split()[0]).write_text("#!/bin/sh\n")
    (tmp_path / words.split()[0]).chmod(0o755)
    assert find() == str(tmp_path / words.split()[0])


@pytest.mark.unit
def test_rate_is_the_counter_increase_per_second_and_a_reset_counts_from_zero() -> None:
    old = Scrape.parse(10.0, page(100, {"+Inf": 0}))
    assert rate(old, Scrape.parse(12.0, page(130, {"+Inf": 0})), "work_total") == 15.0
    assert rate(old, Scrape.parse(12.0, page(8, {"+Inf": 0})), "work_total") == 4.0


@pytest.mark.unit
def test_quantiles_describe_only_the_observations_between_the_scrapes() -> None:
    # 100 old observations all in the slowest bucket; the 10 new ones are all fast
    old = Scrape.parse(0.0, page(0, {"0.1": 0, "1.0": 0, "10.0": 100, "+Inf": 100}))
    new = Scrape.parse(5.0, page(0, {"0.1": 10, "1.0": 10, "10.0": 110, "+Inf": 110}))
    p50, p99 = quantiles(old, new, "latency_seconds", (0.5, 0.99))
    assert p50 == pytest.approx(0.05) and p99 is not None and p99 <= 0.1
    assert quantiles(new, new, "latency_seconds", (0.5,)) == (None,)


@pytest.mark.unit
def test_history_spans_about_one_window() -> None:
    history = History(window=10.0)
    for second in range(30):
        history.add(Scrape.parse(float(second), page(second, {"+Inf": 0})))
    span = history.span()
    assert span is not None and span[1].at - span[0].at == 10.0


@pytest.mark.unit
def test_a_sidecar_that_stops_answering_for_a_while_neither_hides_nor_invents_a_flip() -> None:
    replica = topology.REPLICAS[0]
    observer = Observer(cast(httpx.AsyncClient, None), [replica], [], {}, {}, ())  # no reads

    def events(ready: bool | None) -> list[str]:
        return observer._changes([ReplicaState(replica, reachable=ready is not None, ready=ready)])

    assert events(False) == []  # the first look is no change
    assert events(None) == []  # restarting: no answer
    assert events(True) == [f"{replica.name}: /readyz NOT READY -> ready"]
    assert events(None) == []
    assert events(True) == []  # ready, no answer, ready: nothing happened


@pytest.mark.unit
# --- scenarios --------------------------------------------------------------------------------
@pytest.mark.parametrize("name", scenario.shipped())
def test_shipped_scenarios_load_and_name_only_demo_replicas(name: str) -> None:
    timeline = scenario.load(name, REPLICAS, SPARES)
    assert timeline.steps and timeline.description
    assert [s.at for s in timeline.steps] == sorted(s.at for s in timeline.steps)
    assert {"bad-rollout", "gpu-failure", "overload"} <= set(scenario.shipped())


@pytest.mark.unit
def test_the_docs_list_every_shipped_scenario_and_the_default() -> None:
    page = Path(__file__).resolve().parent.parent / "docs" / "simulator.md"
    text = page.read_text(encoding="utf-8")
    listed = re.findall(r"^\| `([a-z-]+)` \|", text, re.M)
    assert set(scenario.shipped()) <= set(listed)
    assert scenario.DEFAULT in scenario.shipped()
    assert f"Without `--scenario` it plays `{scenario.DEFAULT}`" in text


@pytest.mark.unit
@pytest.mark.parametrize(
    ("document", "message"),
    [
        ("steps: [{at: 5s, replica: v3, clear: true}]", "steps[0]: unknown replica 'v3'"),
        ("steps: [{at: 5s, replica: fallback, inject: {slow: 2}}]", "unknown fault 'slow'"),
        ("steps: [{at: soon, rate: 2}]", "steps[0].at: expected a duration such as"),
        ("steps: [{at: 1m30s, rate: 2, clear: true}]", "needs exactly one of"),
        ("steps: [{at: 5s, replica: primary-v1, start: true}]", "start takes a spare"),
        (
            "steps: [{at: 5s, replica: primary-v1b, start: true}, "
            "{at: 9s, replica: primary-v1b, start: true}]",
            "steps[1].start: primary-v1b is already started",
        ),
        (
            "steps: [{at: 9s, replica: primary-v1b, start: true}, "
            "{at: 5s, replica: primary-v1b, clear: true}]",
            "steps[1]: primary-v1b is a spare, not started before this step",
        ),
        ("steps: [{at: 5s, replica: primary-v1b, start: 1}]", "steps[0].start: expected true"),
        (
            "steps: [{at: 5s, replica: primary-v1b, start: true, inject: {slow: 2}}]",
            "unknown fault 'slow'",
        ),
    ],
)
def test_a_bad_scenario_file_is_one_line_naming_the_step(
    tmp_path: Path, document: str, message: str
) -> None:
    path = tmp_path / "bad.yaml"
    path.write_text(document)
    with pytest.raises(scenario.ScenarioError, match=re.escape(message)):
        scenario.load(str(path), REPLICAS, SPARES)


@pytest.mark.unit
def test_a_start_step_names_its_spare_and_the_faults_it_starts_with() -> None:
    document = yaml.safe_load(
        "steps: [{at: 5s, rate: 4}, {at: 20s, replica: primary-v1b, start: true, "
        "inject: {slow_factor: 10}}, {at: 30s, replica: primary-v1b, clear: true}]"
    )
    timeline = scenario.parse(document, "test", REPLICAS, SPARES)
    start = timeline.steps[1]
    assert (start.action, start.replicas, start.faults) == (
        "start",
        ("primary-v1b",),
        {"slow_factor": 10},
    )
    assert timeline.spares == ("primary-v1b",)
    assert "primary-v1b started" in start.describe()
    # a scenario without a start step has no spare in its fleet
    assert scenario.load("gpu-failure", REPLICAS, SPARES).spares == ()
    assert topology.fleet(()) == topology.REPLICAS


@pytest.mark.unit
def test_a_spare_is_in_maintenance_at_the_gateway_and_no_scrape_target_until_it_starts(
    tmp_path: Path,
) -> None:
    from inferwatch.gateway import haproxy as gateway

    fleet = topology.fleet(SPARES)
    ports = topology.Ports.assign(18000, fleet)
    config = gateway.render(routing.layout(ports, tmp_path, fleet))
    spare = topology.replica("primary-v1b")
    assert re.search(
        rf"^    server v1:primary-v1b 127\.0\.0\.1:{ports.proxy[spare.name]} weight 67 "
        rf"check port {ports.sidecar[spare.name]} {gateway.OBSERVE} disabled$",
        config,
        re.M,
    ), config
    # the fleet without spares renders as before: no server of a spare
    assert "primary-v1b" not in gateway.render(routing.layout(ports, tmp_path))
    document = yaml.safe_load(
        topology.prometheus_config(ports, (), False, fleet, tmp_path / "discovered")
    )
    proxies = [name for r in topology.REPLICAS for name in topology.proxy_names(r)]
    expected = {
        "inferwatch-sidecar": REPLICAS,
        "inferwatch-proxy": list(map(topology.owner, proxies)),
    }
    *replica_jobs, gateway, advisor = document["scrape_configs"]
    assert advisor["job_name"] == topology.ADVISOR_JOB
    # HAProxy serves every replica: its exporter is one target with the cluster label only
    assert gateway == {
        "job_name": topology.GATEWAY_JOB,
        "static_configs": [
            {"targets": [f"127.0.0.1:{ports.gateway_metrics}"],
             "labels": {"cluster": topology.CLUSTER}}
        ],
    }  # fmt: skip
    for job in replica_jobs:
        static = [g["labels"]["replica"] for g in job["static_configs"]]
        assert static == expected[job["job_name"]], job
        (files,) = job["file_sd_configs"]
        assert files["files"] == [str(tmp_path / "discovered" / f"{job['job_name']}.json")]
    topology.write_discovered(tmp_path / "discovered", ports, [])
    assert json.loads((tmp_path / "discovered" / "inferwatch-sidecar.json").read_text()) == []
    topology.write_discovered(tmp_path / "discovered", ports, [spare.name])
    groups = json.loads((tmp_path / "discovered" / "inferwatch-proxy.json").read_text())
    assert groups == [
        {
            "targets": [f"127.0.0.1:{ports.proxy_metrics[spare.name]}"],
            "labels": {"cluster": topology.CLUSTER, "replica": spare.name},
        }
    ]
    plain = yaml.safe_load(topology.prometheus_config(topology.Ports.assign(None)))
    assert all("file_sd_configs" not in job for job in plain["scrape_configs"])


@pytest.mark.unit
def test_the_advisor_is_scraped_at_its_port_or_discovered_once_it_binds(tmp_path: Path) -> None:
    """It reads the query API, so it starts after Prometheus: given ports (``--base-port``)
    are its own, else Prometheus finds it in a file written once it said its port."""
    targets = tmp_path / "advisor.json"
    given = topology.Ports.assign(18000)
    jobs = yaml.safe_load(topology.prometheus_config(given, advisor=targets))["scrape_configs"]
    (advisor,) = [job for job in jobs if job["job_name"] == topology.ADVISOR_JOB]
    assert advisor["static_configs"] == [
        {"targets": [f"127.0.0.1:{given.advisor}"], "labels": {"cluster": topology.CLUSTER}}
    ]
    unbound = topology.prometheus_config(topology.Ports.assign(None), advisor=targets)
    jobs = yaml.safe_load(unbound)["scrape_configs"]
    (advisor,) = [job for job in jobs if job["job_name"] == topology.ADVISOR_JOB]
    assert advisor["file_sd_configs"] == [
        {"files": [str(targets)], "refresh_interval": topology.INTERVAL}
    ]
    topology.write_advisor(targets, 4321)
    assert json.loads(targets.read_text()) == [
        {"targets": ["127.0.0.1:4321"], "labels": {"cluster": topology.CLUSTER}}
    ]
    # a cluster whose scraper does not scrape what serves the whole fleet has no advisor job
    other = yaml.safe_load(topology.vmagent_config(given, "west", gateway=False))
    assert topology.ADVISOR_JOB not in [job["job_name"] for job in other["scrape_configs"]]


@pytest.mark.unit
def test_with_alerting_prometheus_scrapes_the_runbook_receiver_it_feeds() -> None:
    ports = topology.Ports.assign(18000)
    jobs = yaml.safe_load(topology.prometheus_config(ports, (), True))["scrape_configs"]
    (receiver,) = [job for job in jobs if job["job_name"] == topology.RUNBOOKS_JOB]
    assert receiver["static_configs"] == [
        {"targets": [f"127.0.0.1:{ports.runbooks}"], "labels": {"cluster": topology.CLUSTER}}
    ]
    # without Alertmanager no receiver runs: no target that would only ever be down
    jobs = yaml.safe_load(topology.prometheus_config(ports, (), False))["scrape_configs"]
    assert topology.RUNBOOKS_JOB not in [job["job_name"] for job in jobs]


@pytest.mark.unit
def test_a_started_replica_reports_each_cold_start_phase_once_in_order() -> None:
    spare = topology.replica("primary-v1b")
    observer = Observer(cast(httpx.AsyncClient, None), [], [], {}, {}, ())  # no reads
    observer.watch(spare, "http://sidecar", "http://proxy")

    def events(**phases: float) -> list[str]:
        return observer._changes([ReplicaState(spare, reachable=True, phases=phases)])

    assert events() == []
    assert events(process_start=100.0, engine_reachable=100.5) == [
        "primary-v1b: sidecar started, engine starting",
        "primary-v1b: engine answering, model loading (0.5s after start)",
    ]
    assert events(process_start=100.0, engine_reachable=100.5) == []
    later = events(process_start=100.0, engine_reachable=100.5, engine_healthy=130.0,
                   warmup_done=132.0)  # fmt: skip
    assert later == [
        "primary-v1b: model loaded, warming up (30.0s after start)",
        "primary-v1b: warm-up done, ready for traffic (32.0s after start)",
    ]


# --- engines the user runs (--engine-url) -----------------------------------------------------
def models_page(body: object, status: int = 200) -> httpx.Client:
    return httpx.Client(transport=httpx.MockTransport(lambda _: httpx.Response(status, json=body)))


@pytest.mark.unit
def test_an_engine_is_asked_for_its_model_and_context_and_an_unclear_answer_is_one_line() -> None:
    vllm = {"data": [{"id": "tiny", "object": "model", "max_model_len": 1024, "root": "/m"}]}
    with models_page(vllm) as http:
        assert external.discover("http://e:8000", http) == external.Engine(
            "http://e:8000", "tiny", 1024
        )
    llama_cpp = {"data": [{"id": "tiny.gguf", "meta": {"n_ctx_train": 1024}}]}  # no context
    with models_page(llama_cpp) as http:
        assert external.discover("http://e:8080", http).max_model_len is None
    for body, status, reason in (({"data": []}, 200, "lists no model"),
                                 ({"data": [{"id": ""}]}, 200, "lists no model"),
                                 ({"detail": "Not Found"}, 404, "answered 404")):  # fmt: skip
        with models_page(body, status) as http, pytest.raises(CannotRun, match=reason):
            external.discover("http://e:8000", http)
    assert external.base_url("http://127.0.0.1:8000/v1/") == "http://127.0.0.1:8000"
    with pytest.raises(BadInput, match=r"--engine-url 'localhost:8000': expected http\(s\)"):
        external.base_url("localhost:8000")


@pytest.mark.unit
def test_engines_become_replicas_of_their_models_with_no_simulator_port(tmp_path: Path) -> None:
    served = [external.Engine("http://a:1", "m1", 1024), external.Engine("http://b:2", "m1", None),
              external.Engine("http://c:3", "m2", None)]  # fmt: skip
    fleet = external.replicas(served)
    assert [(r.name, r.role, r.model, r.weight, r.engine_url) for r in fleet] == [
        ("engine-1", "primary", "m1", 0.5, "http://a:1"),
        ("engine-2", "primary", "m1", 0.5, "http://b:2"),
        ("engine-3", "fallback", "m2", 1.0, "http://c:3"),
    ]
    assert {r.version for r in fleet} == {"unknown"}  # the deployment's to say, not the demo's
    ports = topology.Ports.assign(None, fleet)
    # a sidecar each, two proxies (client and metrics ports) per primary replica, one for the
    # fallback, and the fleet-wide seven (Redis and the advisor among them)
    assert ports.sim == {} and topology.Ports.count(fleet) == 3 + 2 * 5 + 7
    assert set(ports.sidecar) == {"engine-1", "engine-2", "engine-3"}
    assert set(ports.proxy) == {"engine-1", "engine-1.b", "engine-2", "engine-2.b", "engine-3"}
    # the simulated fleet keeps its layout (the committed HAProxy example is made from it)
    assert topology.Ports.assign(18000).sim == {"primary-v1": 18000, "primary-v2": 18001,
                                                "fallback": 18002}  # fmt: skip
    with pytest.raises(BadInput, match="http://d:4 serves m3, a third model"):
        external.replicas([*served, external.Engine("http://d:4", "m3", None)])
    alone = external.replicas(served[:1])
    assert topology.models(alone) == {"primary": "m1", "fallback": "m1"}
    prices = yaml.safe_load(topology.proxy_config(alone[0], "http://a:1", "", replicas=alone))
    assert prices["prices"]["models"] == {"m1": dict(topology.PRICES["primary"])}


@pytest.mark.unit
def test_load_for_an_engine_fits_its_context_and_is_unchanged_without_one() -> None:
    small = [external.Engine("http://a:1", "m", 1024), external.Engine("http://b:1", "m", 4096)]
    for tenant in external.fitted(topology.TENANTS, small):
        longest = tenant.prompt_words[1] * external.TOKENS_PER_WORD + tenant.max_tokens[1]
        assert longest <= 1024 * external.CONTEXT_SHARE, tenant
        assert tenant.prompt_words[0] <= tenant.prompt_words[1]
    unstated = [external.Engine("http://a:1", "m", None)]
    assert external.fitted(topology.TENANTS, unstated) == topology.TENANTS
    roomy = [external.Engine("http://a:1", "m", 131072)]
    assert external.fitted(topology.TENANTS, roomy) == topology.TENANTS


@pytest.mark.unit
@pytest.mark.parametrize(
    ("args", "message"),
    [
        (["--engine-url", "ftp://a:1"], "--engine-url 'ftp://a:1': expected http(s)://HOST:PORT"),
        (["--scenario", "gpu-failure"], "scenario gpu-failure: inject at 20s needs the simulator"),
        (["--speed", "2"], "--speed sets the simulators' clock"),
        ([], "--engine-url http://127.0.0.1:9: no answer on /v1/models"),
    ],
)
def test_engine_url_arguments_that_cannot_work_are_one_line_before_anything_starts(
    args: list[str], message: str
) -> None:
    # port 9 (discard) has no listener; only the last case gets as far as asking it
    result = CliRunner().invoke(main, ["demo", "--engine-url", "http://127.0.0.1:9", *args])
    code = ExitCode.CANNOT_RUN if "no answer" in message else ExitCode.BAD_INPUT
    assert result.exit_code == code, result.output
    (line,) = result.output.strip().splitlines()
    assert line.startswith(f"Error: {message}"), line


@pytest.mark.unit
def test_a_scenario_of_load_steps_only_runs_on_an_engine(tmp_path: Path) -> None:
    path = tmp_path / "ramp.yaml"
    path.write_text("steps: [{at: 5s, rate: 6}, {at: 20s, rate: 1}]")
    external.check_scenario(scenario.load(str(path), REPLICAS))
    path.write_text("steps: [{at: 5s, rate: 6}, {at: 9s, replica: fallback, crash: true}]")
    with pytest.raises(BadInput, match="crash at 9s needs the simulator's fault injection"):
        external.check_scenario(scenario.load(str(path), REPLICAS))


# --- the demo as a user runs it ---------------------------------------------------------------
def workdir(output: str) -> Path:
    match = re.search(r"work dir (\S+)", output)
    assert match, output
    return Path(match[1])


def assert_clean(output: str, expected_processes: int) -> None:
    started = pids(output)
    assert len(started) >= expected_processes, output
    assert [pid for pid in started if alive(pid)] == []
    assert not workdir(output).exists()


@pytest.fixture
def reaper() -> Iterator[list[int]]:
    """Kills whatever the demo reported if a test fails before the demo cleaned up."""
    reported: list[int] = []
    yield reported
    for pid in reported:
        if alive(pid):
            os.kill(pid, signal.SIGKILL)


def replica_throughput(line: str) -> str:
    match = re.search(r" (\S+) tok/s ", line)
    assert match, line
    return match[1]


def tenant_tokens(line: str) -> str:
    match = re.search(r"\] tenant \S+ (\S+) tok ", line)
    assert match, line
    return match[1]


class Demo:
    """``inferwatch demo`` as a user runs it, stdout on a pipe, read line by line as it comes."""

    def __init__(self, args: list[str], cwd: Path, reaper: list[int]) -> None:
        self.process = subprocess.Popen(
            [*DEMO, *args], stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, cwd=cwd
        )
        assert self.process.stdout is not None
        reaper.append(self.process.pid)  # and its children, as they are reported
        self.out = Output(self.process.stdout, on_line=lambda line: reaper.extend(pids(line)))

    @property
    def output(self) -> str:
        return self.out.text

    def stop(self, signum: signal.Signals = signal.SIGINT) -> tuple[int, str]:
        """Signal the demo, wait for it to clean up; (exit code, stderr)."""
        self.process.send_signal(signum)
        code = self.process.wait(timeout=60)
        self.out.wait_text(lambda out: "stopped " in out and "removed " in out, "the last line", 10)
        assert self.process.stderr is not None
        with self.process.stderr as stderr:
            return code, stderr.read()


SCENARIO_EVENTS = (
    r"fallback: /readyz ready -> NOT READY \(gpu: .*XID 79",
    r"routing: fallback traffic now goes to primary-v1",
    r"fallback: engine_up 1 -> 0",
    r"sim fallback started again",
    r"sidecar fallback restarted",
    r"fallback: /readyz NOT READY -> ready",
)


def seen(pattern: str) -> Callable[[str], bool]:
    return lambda output: re.search(pattern, output) is not None


def summaries(output: str, kind: str, name: str) -> list[str]:
    """The plain summary's lines about one replica or tenant (``kind``), oldest first."""
    return re.findall(rf"^\[ *[\d.]+s\] {kind} {name} .*$", output, re.M)


def busy(output: str) -> bool:
    """Every replica has shown throughput and every tenant of the demo's load has been charged
    tokens."""
    replicas = [summaries(output, "replica", name) for name in REPLICAS]
    tenants = [summaries(output, "tenant", t.name) for t in topology.TENANTS if t.share]
    return all(
        {replica_throughput(line) for line in lines} - {"-", "0"} for lines in replicas
    ) and all(lines and tenant_tokens(lines[-1]) not in ("0", "-") for lines in tenants)


@pytest.mark.e2e
def test_demo_runs_a_scenario_and_stops_cleanly(tmp_path: Path, reaper: list[int]) -> None:
    faults = tmp_path / "fault.yaml"
    faults.write_text(FAULT)
    demo = Demo(["--speed", "50", "--rate", "5", "--refresh", "1", "--scenario", str(faults)],
                tmp_path, reaper)  # fmt: skip
    # the scripted faults are seen where an operator would see them, and the repair undoes them
    for event in SCENARIO_EVENTS:
        demo.out.wait_text(seen(event), event, 90)
    demo.out.wait_text(busy, "traffic on every replica and tenant", 60)
    code, errors = demo.stop()
    output = demo.output
    assert code == 0, output + errors
    assert "\x1b" not in output  # not a terminal: plain lines only
    for kind, count in (("sim", 3), ("sidecar", 3), ("proxy", 5), ("redis", 1)):
        assert (
            len(re.findall(rf"^  {kind} .* (http|redis)://127\.0\.0\.1:\d+", output, re.M)) == count
        )
    assert re.search(r"\] replica primary-v1 .* req/s \(\S+ probes\) ", output), output
    assert_clean(output, expected_processes=14)  # 12, the restarted engine and sidecar


def printed_urls(output: str) -> dict[str, str]:
    """The URLs the start-up lines give for the first replica, by what they are for."""
    sim = re.search(r"^  sim +primary-v1 +(\S+) .*DCGM page (\S+) \(--gpu dcgm=URL\)", output, re.M)
    proxy = re.search(r"^  proxy +primary-v1 .*\(base URL (\S+)\)", output, re.M)
    curl = re.search(r"try: curl -s (\S+) -H 'Authorization: Bearer (\S+)' .* -d '(.*)'$",
                     output, re.M)  # fmt: skip
    gateway = re.search(r"^  haproxy +(\S+) .*OpenAI API at (\S+), .*its /metrics at (\S+)$",
                        output, re.M)  # fmt: skip
    assert sim and proxy and curl and gateway, output
    return {"engine": sim[1], "dcgm": sim[2], "openai": proxy[1], "curl": curl[1],
            "key": curl[2], "body": curl[3], "gateway": gateway[1], "gateway_api": gateway[2],
            "gateway_metrics": gateway[3]}  # fmt: skip


@pytest.mark.e2e
@pytest.mark.parametrize("signum", [signal.SIGINT, signal.SIGTERM], ids=lambda s: s.name)
def test_the_default_run_announces_its_scenario_and_its_urls_work_as_printed(
    tmp_path: Path, reaper: list[int], signum: signal.Signals
) -> None:
    demo = Demo(["--speed", "50", "--no-prometheus", "--refresh", "1"], tmp_path, reaper)
    demo.out.wait_text(lambda out: summaries(out, "replica", "primary-v1"), "a summary", 60)
    urls = printed_urls(demo.output)
    scraped = CliRunner().invoke(main, ["scrape", urls["engine"]])
    backend = gpu.open_backend(f"dcgm={urls['dcgm']}")
    families = asyncio.run(backend.collect())
    with openai.OpenAI(base_url=urls["openai"], api_key=urls["key"], max_retries=0) as tenant:
        answer = tenant.chat.completions.create(**json.loads(urls["body"]), max_tokens=8)
    reply = httpx.post(urls["curl"], content=urls["body"],
                       headers={"Authorization": f"Bearer {urls['key']}",
                                "Content-Type": "application/json"}, timeout=30)  # fmt: skip
    metrics = httpx.get(urls["gateway_metrics"], timeout=10)
    code, errors = demo.stop(signum)
    output = demo.output
    assert code == 0, output + errors
    assert f"stopping ({signum.name})" in output
    # the gateway's row gives the URL clients call (the curl's), its /metrics as detail
    assert urls["gateway_api"] == urls["gateway"] + "/v1", output
    assert urls["curl"] == urls["gateway_api"] + "/chat/completions", output
    assert metrics.status_code == 200 and "haproxy_process_" in metrics.text
    assert_clean(output, expected_processes=12)
    assert scraped.exit_code == 0 and scraped.output.startswith("engine: vllm"), scraped.output
    up = [s.value for f in families for s in f.samples if s.name == "inferwatch_gpu_backend_up"]
    assert 1.0 in up
    assert answer.choices and reply.status_code == 200, reply.text
    # no --scenario: the default story, said on screen before it starts
    assert f"no --scenario given: playing {scenario.DEFAULT}, healthy until 20s" in output
    assert "--scenario none for a quiet run" in output
    assert re.search(rf"\] scenario {scenario.DEFAULT}: ", output), output


def tenant_budget(line: str) -> tuple[float, int, int]:
    """(tokens charged, requests rejected, proxies that charged it) of a budgeted tenant."""
    match = re.search(r"\] tenant \S+ (\S+) tok \S+ ok \d+ rejected (\d+) errors \d+ "
                      r"budget left \S+ over (\d+) proxies$", line)  # fmt: skip
    assert match, line
    return tokens(match[1]), int(match[2]), int(match[3])


def tokens(shown: str) -> float:
    """A count as the view shows it: ``812``, ``40.2k``, ``1.3M``."""
    scale = {"k": 1e3, "M": 1e6}.get(shown[-1], 1.0)
    return float(shown.rstrip("kM")) * scale


def flood(url: str, key: str, body: dict[str, object]) -> tuple[int, int]:
    """Rounds of concurrent requests for one tenant through the gateway until its budget
    refuses a whole round; (the most prompt tokens the engine counted in an answer, requests
    sent)."""
    headers = {"Authorization": f"Bearer {key}"}
    counted, sent = 0, 0
    with httpx.Client(timeout=30) as http, ThreadPoolExecutor(CONCURRENCY) as pool:
        for _ in range(ROUNDS):
            answers = list(pool.map(lambda _: http.post(url, json=body, headers=headers),
                                    range(CONCURRENCY)))  # fmt: skip
            sent += len(answers)
            for answer in answers:
                if answer.status_code == 200:
                    counted = max(counted, answer.json()["usage"]["prompt_tokens"])
            # a round ends with its reservations settled: one the budget refuses whole means
            # the window has no room left for another request
            if all(a.status_code == 429 and "token budget" in a.text for a in answers):
                return counted, sent
    raise AssertionError(f"{sent} requests and none refused by the budget")


#: the test's flood of the budgeted tenant: concurrent requests per round, rounds at most
CONCURRENCY, ROUNDS = 8, 40


@pytest.mark.e2e
def test_scenario_none_is_a_quiet_run_and_a_budget_holds_across_the_proxies(
    tmp_path: Path, reaper: list[int]
) -> None:
    hooli = next(t for t in topology.TENANTS if t.name == "hooli")
    assert hooli.share == 0 and hooli.budget_tokens and hooli.budget_window == "1m"
    demo = Demo(["--speed", "50", "--no-prometheus", "--refresh", "1", "--scenario", "none"],
                tmp_path, reaper)  # fmt: skip
    demo.out.wait_text(lambda out: len(summaries(out, "tenant", "hooli")) >= 2, "two summaries", 60)
    model = topology.replica("primary-v1").model
    body: dict[str, object] = {
        "model": model,
        "messages": [{"role": "user", "content": " ".join(["budget"] * 600)}],
        "max_tokens": 64,
    }
    began = time.time()
    # the four proxies of the primary replicas share hooli's budget in Redis: it is refused
    # once the fleet spent it, not once each proxy did (4x the budget)
    counted, sent = flood(printed_urls(demo.output)["curl"], hooli.key, body)
    ended = time.time()
    demo.out.wait_text(
        lambda out: tenant_budget(summaries(out, "tenant", "hooli")[-1])[1] > 0,
        "hooli refused over its budget in the view",
        30,
    )
    line = summaries(demo.output, "tenant", "hooli")[-1]
    code, errors = demo.stop()
    assert code == 0, demo.output + errors
    assert "scenario" not in demo.output
    spent, _, proxies = tenant_budget(line)
    assert proxies == 4, line
    # each budget window (aligned to the minute) the flood touched allows the budget; on top,
    # at most one reservation: the prompt (as estimated or as the engine counted it) and its cap
    windows = int(ended // 60) - int(began // 60) + 1
    largest = max(counted, estimate_prompt_tokens(body)) + cast(int, body["max_tokens"])
    assert spent <= windows * hooli.budget_tokens + largest, (windows, sent, line)
    assert_clean(demo.output, expected_processes=13)  # 3 engines, 3 sidecars, 5 proxies,
    # Redis and HAProxy


@pytest.mark.e2e
def test_a_component_that_cannot_start_is_named_and_everything_is_cleaned_up(
    tmp_path: Path, reaper: list[int]
) -> None:
    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))  # bound, not listening: connections to it are refused
        base = taken.getsockname()[1]  # the first replica's simulator wants this port
        result = subprocess.run(
            [*DEMO, "--duration", "5", "--no-prometheus", "--base-port", str(base)],
            capture_output=True,
            text=True,
            timeout=60,
            cwd=tmp_path,
        )
    reaper += pids(result.stdout)
    assert result.returncode == ExitCode.PORT_TAKEN, result.stderr
    errors = result.stderr.strip().splitlines()
    assert len(errors) == 1, result.stderr
    assert errors[0].startswith("Error: sim primary-v1 failed to start: "), result.stderr
    assert "address already in use" in errors[0].lower()
    assert_clean(result.stdout, expected_processes=3)  # the engines, started together


@pytest.mark.proc
@pytest.mark.parametrize(
    ("spec", "message"),
    [
        ("no-such-scenario", "Error: unknown scenario 'no-such-scenario'; shipped: bad-rollout"),
        ("missing.yaml", "Error: scenario missing.yaml: cannot read"),
    ],
)
def test_a_bad_scenario_is_one_error_line_before_anything_starts(
    tmp_path: Path, spec: str, message: str
) -> None:
    result = subprocess.run(
        [*DEMO, "--scenario", spec], capture_output=True, text=True, timeout=30, cwd=tmp_path
    )
    assert result.returncode != 0
    assert result.stdout == ""  # nothing was started
    assert result.stderr.strip().splitlines() == [result.stderr.strip()]
    assert result.stderr.startswith(message)


# --- the runbook receiver the demo runs --------------------------------------------------------
def xid_alert(replica: str, sidecar_port: int) -> Alert:
    """An XID alert as the demo's Prometheus labels it (no model, no namespace on GPU series)."""
    labels = {"alertname": "InferwatchGPUXidErrors", "severity": "critical", "cluster": "demo",
              "replica": replica, "instance": f"127.0.0.1:{sidecar_port}",
              "job": "inferwatch-sidecar", "gpu_uuid": "GPU-1", "xid": "79",
              "action": "reboot_node"}  # fmt: skip
    return Alert("firing", labels, {"summary": "XID"}, "2026-12-01T09:00:00.123456789Z",
                 "0001-01-01T00:00:00Z", f"fp-{replica}")  # fmt: skip


def demo_mapping(workdir: Path, execute: bool = False) -> Config:
    automation.write_tokens(workdir)
    # writes the config it starts the receiver on
    settings = automation.Settings(execute, workdir / routing.RUNTIME, sidecars=SIDECARS)
    automation.component(workdir, 9405, settings)
    return runbook_config.load(workdir / automation.CONFIG)


#: the sidecar ports the demo's receiver is configured with in these tests
SIDECARS = {"primary-v1": 9401, "primary-v2": 9402, "fallback": 9403}


def _busy_fleet(dropped: int, alerts: int) -> FleetState:
    """The demo's fleet with every signal known (the longest cells) and ``alerts`` firing."""
    replicas = [
        ReplicaState(r, reachable=True, ready=False, failing=(("gpu", "XID 79"), ("quality", "")),
                     engine_up=True, gpu_healthy=True, gpu_utilization=0.93,
                     gpu_temperature=71.0, requests_per_s=123.4, probe_requests_per_s=0.3,
                     tokens_per_s=45678.0, errors_per_s=1.5, ttft=(0.41, 2.1), tpot=(0.009, 0.038),
                     running=64.0, waiting=128.0, kv_usage=0.97, probe_pass=0.5,
                     probe_verdict="fail")
        for r in topology.REPLICAS
    ]  # fmt: skip
    tenants = [TenantState(t, ok=123456, rejected=2345, errors=12, tokens=1.2e9, cost=12345.6,
                           budget_left=0.42, proxies=4) for t in topology.TENANTS]  # fmt: skip
    firing = tuple(
        AlertState(str(i), f"InferwatchSomethingVeryLongNamed{i}", "critical", "primary-v2",
                   False, ("page",), None)
        for i in range(alerts)
    )  # fmt: skip
    load = LoadStats(sent=1234567, ok=1234000, rejected=500, failed=67, dropped=dropped)
    return FleetState(1234.5, replicas, tenants, load, 22.0, (17, 17), firing, ())


@pytest.mark.unit
def test_the_plain_summary_is_short_stamped_lines_one_per_replica_and_tenant() -> None:
    lines = summary(_busy_fleet(dropped=0, alerts=12))
    assert all(line.startswith("[1234.5s] ") for line in lines), lines
    assert max(map(len, lines)) <= SHORT, max(lines, key=len)
    for replica in topology.REPLICAS:
        (line,) = [line for line in lines if line.startswith(f"[1234.5s] replica {replica.name} ")]
        assert " 45.7k tok/s " in line and "probes fail 50%" in line, line
    for tenant in topology.TENANTS:
        (line,) = [line for line in lines if line.startswith(f"[1234.5s] tenant {tenant.name} ")]
        assert " 1.2G tok " in line, line
    assert "[1234.5s] alerts 12 firing, 0 inhibited: " in lines[-2] and "and 10 more" in lines[-2]
    assert "dropped" not in lines[0], lines[0]
    # the client dropping arrivals (too many in flight) is said once there are some
    assert summary(_busy_fleet(dropped=42, alerts=0))[0].endswith(" failed 67 dropped 42")


#: the longest plain summary line: what a log viewer or CI page shows unwrapped
SHORT = 200


@pytest.mark.unit
def test_the_receiver_audits_a_dry_run_for_the_faulted_replica_and_the_view_says_so(
    tmp_path: Path,
) -> None:
    mapping = demo_mapping(tmp_path)
    assert not mapping.execute
    actions = {"isolate_replica": registry.create(
        "isolate_replica", mapping.action_settings["isolate_replica"])}  # fmt: skip
    audit = AuditLog(tmp_path / automation.AUDIT_LOG)
    targets = inventory.build(mapping.inventory)
    dispatcher = Dispatcher(mapping, actions, audit, execute=mapping.execute, inventory=targets)
    tail = AuditTail(tmp_path / automation.AUDIT_LOG)
    assert tail.read() == []  # nothing decided yet

    async def decide() -> None:
        await dispatcher.handle(xid_alert("primary-v1", 9401), {"am_receiver": "automation"})
        unmapped = Alert("firing", {"alertname": "InferwatchGPUUnhealthy"}, {}, "", "", "fp-u")
        await dispatcher.handle(unmapped, {})
        await dispatcher.aclose()

    asyncio.run(decide())
    with (tmp_path / automation.AUDIT_LOG).open("ab") as log:
        log.write(b"not json\n" + b'{"decision": "rejected", "outcome": "unauthorized", ')
    decisions = tail.read()
    assert [d.describe() for d in decisions] == [
        "dry-run: isolate_replica primary-v1 (InferwatchGPUXidErrors)"
    ]  # the unmapped alert is no decision of an action; the half line waits for its end
    assert tail.bad_lines == 1
    with (tmp_path / automation.AUDIT_LOG).open("ab") as log:
        log.write(b'"reason": "missing or wrong bearer token"}\n')
    rejected = tail.read()
    assert [d.describe() for d in rejected] == [
        "rejected a webhook (unauthorized): missing or wrong bearer token"
    ]
    assert decisions_summary([*decisions, *rejected]).startswith("runbooks last rejected")
    assert decisions_summary([]) == "runbooks no decision yet"


@pytest.mark.unit
def test_the_demo_mapping_counts_each_models_replicas_for_the_breaker(tmp_path: Path) -> None:
    mapping = demo_mapping(tmp_path, execute=True)
    assert mapping.execute
    assert mapping.namespace_allowed({"namespace": topology.NAMESPACE})
    assert mapping.namespace_allowed({})  # GPU alerts carry no namespace
    assert not mapping.namespace_allowed({"namespace": "prod"})
    targets = inventory.build(mapping.inventory)
    found = {
        name: asyncio.run(targets.resolve("isolate_replica", xid_alert(name, port).labels))
        for name, port in SIDECARS.items()
    }
    sizes = {entry.population: size for entry, size in filter(None, found.values())}
    assert sizes == {topology.PRIMARY_MODEL: 2, topology.FALLBACK_MODEL: 1}
    action = registry.create("isolate_replica", mapping.action_settings["isolate_replica"])
    state = State()

    def steps(replica: str, port: int) -> list[Step]:
        alert = xid_alert(replica, port)
        (rule,) = mapping.rules_for(alert.labels)
        return list(action.plan(alert, rule.params))

    def allowed(replica: str) -> bool:
        planned = steps(replica, SIDECARS[replica])
        entry, _ = found[replica] or (None, 0)
        assert entry is not None
        grouped = [dataclasses.replace(s, group=entry.population) for s in planned]
        if not breaker.check(state, mapping.breaker, grouped, sizes, 0).allowed:
            return False
        breaker.record(state, mapping.breaker, grouped, 0)
        return True

    first = steps("primary-v1", 9401)
    assert first[0].target == "sidecar http://127.0.0.1:9401/admin/isolation"
    assert allowed("primary-v1")
    assert not allowed("primary-v2")  # not both primary replicas
    assert not allowed("fallback")  # nor the only fallback one
    token = (tmp_path / automation.SIDECAR_TOKEN).read_text().strip()
    assert len(token) >= 16 and (tmp_path / automation.TOKEN).read_text().strip() != token
    assert (tmp_path / automation.TOKEN).stat().st_mode & 0o077 == 0


@pytest.mark.proc
def test_the_demo_alertmanager_sends_only_the_automation_to_the_receiver(
    tmp_path: Path, amtool: str
) -> None:
    token = tmp_path / automation.TOKEN
    text = alerting.alertmanager_config(alerting.demo_config(), automation.webhook_url(9405), token)
    receivers = {r["name"]: r for r in yaml.safe_load(text)["receivers"]}
    (hook,) = receivers["automation"]["webhook_configs"]
    assert hook["url"] == "http://127.0.0.1:9405/webhook"
    assert hook["http_config"]["authorization"]["credentials_file"] == str(token)
    assert [n for n, r in receivers.items() if "webhook_configs" in r] == ["automation"]
    config = tmp_path / "alertmanager.yml"
    config.write_text(text)
    token.write_text("x" * 24)
    checked = subprocess.run([amtool, "check-config", str(config)], capture_output=True, text=True)
    assert checked.returncode == 0, checked.stdout + checked.stderr


def recorded(paths: list[Path]) -> list[str]:
    """Each recorded series (its name and the labels its rule sets) of the rule files."""
    return [f"{rule['record']}{sorted(rule.get('labels', {}).items())}"
            for path in paths for group in yaml.safe_load(path.read_text())["groups"]
            for rule in group["rules"] if "record" in rule]  # fmt: skip


@pytest.mark.proc
def test_the_demos_prometheus_records_every_series_the_committed_boards_read_once(
    tmp_path: Path, promtool: str
) -> None:
    """The boards a user imports into Grafana read the default config's 5m recording rules;
    the demo's own config records over 20s: both are recorded, and no series twice."""
    demo = recorded(alerting.write_rules(tmp_path / "demo", alerting.demo_config()))
    committed = recorded(topology.generated_rule_files())
    assert set(committed) <= set(demo) and len(demo) == len(set(demo))
    assert any(":rate20s[" in series for series in demo)
    paths = sorted((tmp_path / "demo").glob("*.yaml"))
    checked = subprocess.run([promtool, "check", "rules", *map(str, paths)],
                             capture_output=True, text=True)  # fmt: skip
    assert checked.returncode == 0, checked.stdout + checked.stderr
    # with the default config itself, its rules are written once
    default = recorded(alerting.write_rules(tmp_path / "default", alerting.config.load()))
    assert sorted(default) == sorted(committed)


@pytest.mark.unit
def test_routing_reads_where_haproxy_sends_each_model_from_its_server_states() -> None:
    primary, fallback = topology.PRIMARY_MODEL, topology.FALLBACK_MODEL

    def state(backend: str, name: str, op: int, weight: int, initial: int) -> ServerState:
        return ServerState(backend, name, op, weight, initial)

    states = {
        primary: [state("p", "v1:primary-v1", 2, 67, 67),
                  state("p", "v2-fp8:primary-v2", 2, 33, 33),
                  state("p", "fallback:fallback", 2, 0, 0)],
        fallback: [state("f", "v1:fallback", 2, 100, 100),
                   state("f", "fallback:primary-v1", 2, 0, 0)],
    }  # fmt: skip
    assert routing.describe(routing.serving(states, primary)) == "primary-v1 67%, primary-v2 33%"
    states[primary][1] = state("p", "v2-fp8:primary-v2", 2, 0, 33)  # shifted off by the receiver
    states[primary][0] = state("p", "v1:primary-v1", 0, 67, 67)  # and v1 failing its checks
    # nothing of its own is usable: the frontend sends the model to its fallback's backend
    assert routing.serving(states, primary) == {"fallback": 100}
    assert not routing.fails_open(states)
    states[fallback][0] = state("f", "v1:fallback", 0, 100, 100)
    # nor is the fallback's: the gateway fails open to the model's own replicas
    assert routing.fails_open(states)
    assert routing.serving(states, primary) == {}


@pytest.mark.unit
def test_the_drill_mapping_isolates_a_stalled_engine_by_pod_and_shifts_a_degenerate_version(
    tmp_path: Path,
) -> None:
    automation.write_tokens(tmp_path)
    settings = automation.Settings(
        True, tmp_path / routing.RUNTIME, kube_host="http://127.0.0.1:9", cooldown="5s"
    )
    document = automation.document(tmp_path / automation.SIDECAR_TOKEN, settings)
    mapping = runbook_config.parse(document, "drill mapping")
    # the stalled-engine alert is summed per pod: no replica label, the pod names the replica
    stalled = {
        "alertname": "InferwatchEngineStalled",
        "severity": "critical",
        "pod": "primary-v2",
        "instance": "127.0.0.1:9402",
        "namespace": topology.NAMESPACE,
    }
    (rule,) = mapping.rules_for(stalled)
    assert (rule.action, rule.cooldown) == ("isolate_replica", 5.0)
    degenerate = {"alertname": "InferwatchDegenerateOutputRising", "severity": "warning",
                  "model": topology.PRIMARY_MODEL, "model_version": "v2-fp8"}  # fmt: skip
    (shift,) = mapping.rules_for(degenerate)
    assert shift.action == "shift_traffic" and shift.rollback_after == 10.0
    assert mapping.action_settings["shift_traffic"]["runtime"] == str(tmp_path / routing.RUNTIME)
    xid = {"alertname": "InferwatchGPUXidErrors", "severity": "critical", "replica": "fallback",
           "action": "reset_gpu"}  # fmt: skip
    assert [r.action for r in mapping.rules_for(xid)] == [
        "isolate_replica", "kubernetes_xid_remediation"]  # fmt: skip
    nodes = mapping.inventory["nodes"]["static"]
    assert nodes == [{"node": r.node, "pool": automation.GPUS} for r in topology.REPLICAS]
    # the demo (no Kubernetes API) has no reset rule and no GPU population
    demo = runbook_config.parse(
        automation.document(
            tmp_path / automation.SIDECAR_TOKEN, automation.Settings(False, tmp_path / "s")
        ),
        "demo",
    )
    assert [r.action for r in demo.rules_for(xid)] == ["isolate_replica"]
    assert "nodes" not in demo.inventory


@pytest.mark.proc
def test_a_started_spare_takes_no_traffic_until_its_readyz_passes(haproxy_bin: str) -> None:
    """The real HAProxy: the spare's server stays in maintenance, :func:`routing.enable`
    points it at the spare's bound ports and returns only once a check has found it down
    (its /readyz answers 503), and it is up once its /readyz answers 200. After each of
    ``enable``'s commands the server is one HAProxy sends no request to (in maintenance or
    drain, or down): a server taken out of maintenance straight to ready counted as up until
    its first check, and a client request reached a replica still starting."""
    from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
    from tempfile import TemporaryDirectory


    ready = threading.Event()

    class Ready(BaseHTTPRequestHandler):
        def do_GET(self) -> None:
            self.send_response(200 if ready.is_set() else 503)
            self.send_header("content-length", "0")
            self.end_headers()

        def log_message(self, format: str, *args: object) -> None:
            pass

    spare = topology.replica("primary-v1b")
    fleet = topology.fleet(SPARES)
    ports = topology.Ports.assign(None, fleet)
    backend = wire.backend_name(spare.model)
    name = f"{spare.version}:{spare.name}"
    sidecar = ThreadingHTTPServer(("127.0.0.1", 0), Ready)
    threading.Thread(target=sidecar.serve_forever, args=(0.05,), daemon=True).start()
    # the spare's sidecar, bound before the gateway is told; no request reaches its proxy here
    ports.sidecar[spare.name] = ports.proxy[spare.name] = sidecar.server_address[1]
    with TemporaryDirectory(prefix="iw-") as folder:  # a short unix socket path
        workdir = Path(folder)

        def argv(port: int) -> list[str]:  # HAProxy's ports: another pair when one was taken
            ports.gateway_metrics, ports.gateway = port, pick_port()
            return list(routing.component(haproxy_bin, ports, workdir, fleet).argv)

        process, _ = launch(argv, workdir / "haproxy.log", "/metrics", "haproxy")
        try:
            api = routing.runtime(workdir)

            async def state() -> int:
                servers = await api.servers(backend)
                return next(s.op_state for s in servers if s.name == name)

            async def admin_state() -> int:
                rows = (await api.command(f"show servers state {backend}")).splitlines()
                row = next(r.split() for r in rows if f" {name} " in r)
                return int(row[6])

            async def in_maintenance() -> bool:
                """The server's srv_admin_state has FMAINT (0x01), set by ``disabled``."""
                return await admin_state() & 0x01 == 1

            class Watched:
                """The Runtime API, checking the spare after each command ``enable`` sends."""

                def __init__(self) -> None:
                    self.commands: list[str] = []

                async def command(self, line: str) -> str:
                    answer = await api.command(line)
                    self.commands.append(line)
                    # maintenance (0x01) or drain (0x08) sends no new request, nor does down
                    held = await admin_state() & 0x09 or await state() != 2
                    assert held, f"{name} would take a request after {line!r}"
                    return answer

                async def servers(self, backend: str) -> list[ServerState]:
                    return await api.servers(backend)

            async def parked() -> bool:
                assert await state() == 0 and await in_maintenance()
                return True

            async def scenario_step() -> None:
                await asyncio.sleep(2.5)  # checks ran meanwhile: still in maintenance
                assert await state() == 0 and await in_maintenance()
                assert spare.name not in routing.serving(await routing.backends(api), spare.model)
                watched = Watched()
                await routing.enable(watched, spare, ports, 10)  # type: ignore[arg-type]
                assert watched.commands[-1].endswith("state ready"), watched.commands
                assert await admin_state() & 0x09 == 0  # in service: no maintenance, no drain
                assert await state() != 2  # down: its /readyz does not pass yet
                assert spare.name not in routing.serving(await routing.backends(api), spare.model)

            # the Runtime API answers once haproxy has started
            wait_for(
                lambda: asyncio.run(parked()),
                "haproxy's runtime API",
                10,
                interval=0.05,
                ignore=(RuntimeApiError,),
            )
            asyncio.run(scenario_step())
            ready.set()
            asyncio.run(routing.wait_all_up(api, 10, [spare]))
        finally:
            process.terminate()
            process.wait(10)
            sidecar.shutdown()
            sidecar.server_close()


@pytest.mark.unit
def test_an_answer_from_a_replicas_second_proxy_counts_for_the_replica() -> None:
    """The drill checks where traffic goes by replica: both proxies of one are that replica."""
    from inferwatch.demo.loadgen import LoadGenerator

    def answer(request: httpx.Request) -> httpx.Response:
        return httpx.Response(
            200, headers={"X-Served-By": "v1:primary-v1.b"}, text="data: [DONE]\n"
        )

    async def one() -> str:
        async with httpx.AsyncClient(transport=httpx.MockTransport(answer)) as http:
            load = LoadGenerator(http, "http://gw", {"primary": "m"}, topology.TENANTS[:1], 1.0)
            await load._one(topology.TENANTS[0])
            return load.history[-1].replica

    assert asyncio.run(one()) == "primary-v1"


def _arrivals(rate: float, seconds: float, late: Callable[[float], float]) -> list[float]:
    """The schedule ``next_arrival`` keeps for a client that wakes ``late(due)`` after each
    arrival is due (its event loop busy with other work)."""
    import random

    from inferwatch.demo.loadgen import next_arrival

    rng, due, sent = random.Random(7), 0.0, []
    while due < seconds:
        due = next_arrival(due, due + late(due), rate, rng) if sent else rng.expovariate(rate)
        sent.append(due)
    return sent[:-1]


@pytest.mark.unit
def test_a_client_that_wakes_late_still_sends_the_rate_asked_for() -> None:
    """Gaps are drawn from the schedule, not from each late wake-up: a client 50 ms late on
    every arrival at 20 req/s sent half the rate when each gap started at its wake-up."""
    on_time = _arrivals(20, 100, lambda due: 0.0)
    late = _arrivals(20, 100, lambda due: 0.05)
    assert abs(len(on_time) - 2000) < 100, len(on_time)
    assert len(late) == len(on_time)


@pytest.mark.unit
def test_a_stalled_client_catches_up_on_at_most_a_second_of_arrivals() -> None:
    """A 10 s stall at t=5 s sends a burst of about one second's requests, not ten seconds'."""
    from inferwatch.demo.loadgen import MAX_BACKLOG_S

    sent = _arrivals(20, 30, lambda due: 10.0 if 5.0 <= due < 5.06 else 0.0)
    burst = [t for t in sent if 5.0 <= t < 15.0]
    assert 0 < len(burst) <= 20 * MAX_BACKLOG_S * 2, len(burst)
    assert abs(len(sent) - 20 * (30 - 10 + MAX_BACKLOG_S)) < 60, len(sent)


@pytest.mark.unit
def test_a_scale_out_that_is_slow_to_start_holds_back_no_later_step() -> None:
    """A spare's cold start takes seconds (more on a busy machine): the load-ramp's rate steps
    after its ``start`` step were applied only once the spare's processes were up."""
    import io

    from inferwatch.demo import run
    from inferwatch.demo.loadgen import LoadGenerator
    from inferwatch.demo.scenario import Scenario, Step

    spare = topology.SPARES[0]
    starting = asyncio.Event()

    async def cold_start(replica: topology.Replica, step: Step, http: httpx.AsyncClient) -> None:
        starting.set()
        await asyncio.Event().wait()  # still coming up

    scenario = Scenario(
        "scale-out", "", (Step(0, "start", (spare.name,)), Step(0.01, "rate", rate=9))
    )

    async def play() -> float:
        options = run.Options(
            None, scenario, 1.0, 1.0, None, None, None, alerting.demo_config(), 1.0, 1.0, "", ""
        )
        demo = run.Demo(options, io.StringIO(), live=False)
        demo.t0 = time.monotonic()
        demo._start_spare = cold_start  # type: ignore[method-assign]
        async with httpx.AsyncClient() as http:
            load = LoadGenerator(http, "http://gw", {"primary": "m"}, topology.TENANTS[:1], 1.0)
            async with asyncio.timeout(10):
                await demo._play(scenario, http, load)
            assert starting.is_set()
            for task in demo.joining:
                task.cancel()
            return load.rate

    assert asyncio.run(play()) == 9
