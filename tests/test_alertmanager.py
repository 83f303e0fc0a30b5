"""The generated Alertmanager config: accepted by amtool, routes alerts where an on-call
engineer expects them, and inhibits on a real Alertmanager what its rules say it does."""

from __future__ import annotations

import asyncio
import contextlib
import functools
import io
import re
import subprocess
import sys
from collections.abc import Callable, Iterator, Mapping
from datetime import UTC, datetime
from pathlib import Path

import httpx
import pytest
import yaml
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from rich.console import Console

from inferwatch.alerts import alertmanager, build, config, writer
from inferwatch.demo import observer, topology, view
from inferwatch.demo.loadgen import LoadStats
from inferwatch.mixin import files as generated
from support.ports import running
from support.wait import wait_for, wait_until

pytestmark = pytest.mark.proc

INFERWATCH = str(Path(sys.executable).parent / "inferwatch")

COMMITTED = writer.default_out() / writer.ALERTMANAGER


def config_file(tmp_path: Path, text: str) -> Path:
    path = tmp_path / "alerts.yaml"
    path.write_text(text)
    return path


def write(folder: Path, chosen: alertmanager.Settings) -> Path:
    path = folder / "alertmanager.yaml"
    path.write_text(writer.MARKER + generated.dump(alertmanager.document(chosen)))
    return path


def test_amtool_accepts_the_committed_config(amtool: str) -> None:
    result = subprocess.run(
        [amtool, "check-config", str(COMMITTED)], capture_output=True, text=True
    )
    assert result.returncode == 0, result.stdout + result.stderr
    assert "SUCCESS" in result.stdout and "4 inhibit rules" in result.stdout


def test_the_committed_config_is_what_the_generator_writes() -> None:
    fresh = writer.render(config.load())[writer.ALERTMANAGER]
    assert fresh == writer.render(config.load())[writer.ALERTMANAGER]  # deterministic
    assert COMMITTED.read_text() == fresh, "stale: run inferwatch generate alerts"
    assert fresh.startswith(writer.MARKER)


def test_the_automation_webhook_is_the_runbook_receiver_with_its_token() -> None:
    doc = yaml.safe_load(COMMITTED.read_text())
    automation = next(r for r in doc["receivers"] if r["name"] == "automation")
    [webhook] = automation["webhook_configs"]
    assert webhook["url"].endswith(":9405/webhook") and webhook["send_resolved"] is True
    assert webhook["http_config"]["authorization"]["type"] == "Bearer"


def test_every_alert_the_config_names_is_a_generated_alert() -> None:
    defined = set(build.alert_names(config.load()))
    assert set(alertmanager.NAMED_ALERTS) - defined == set()
    text = COMMITTED.read_text()
    spelled = set(re.findall(r"Inferwatch[A-Za-z0-9]+", text))
    assert spelled <= defined, spelled - defined


# --- routing --------------------------------------------------------------------------------
# (labels of a representative alert, the receivers amtool says it reaches)
ROUTES = [
    ({"alertname": "InferwatchGPUXidErrors", "severity": "critical", "action": "reset_gpu"},
     "automation,page"),
    ({"alertname": "InferwatchTTFTSLOBurn", "severity": "critical", "long": "1h"},
     "automation,page"),
    ({"alertname": "InferwatchTTFTSLOBurn", "severity": "warning", "long": "1d"},
     "automation,ticket"),
    ({"alertname": "InferwatchTenantBudgetExhaustionPredicted", "severity": "warning"},
     "automation,ticket"),
    ({"alertname": "InferwatchGPUIdleWaste", "severity": "info"}, "none"),
    ({"alertname": "SomeoneElsesAlert"}, "ticket"),  # no severity: still reaches a person
]  # fmt: skip


@pytest.mark.parametrize(("labels", "receivers"), ROUTES)
def test_amtool_routes_each_alert_to_its_receivers(
    amtool: str, labels: Mapping[str, str], receivers: str
) -> None:
    result = subprocess.run(
        [amtool, "config", "routes", "test", f"--config.file={COMMITTED}",
         f"--verify.receivers={receivers}", *(f"{k}={v}" for k, v in labels.items())],
        capture_output=True,
        text=True,
    )  # fmt: skip
    assert result.returncode == 0, result.stdout + result.stderr
    assert result.stdout.strip() == receivers


#: where each severity must land: people by severity, the automation for what needs action
BY_SEVERITY = {"critical": "automation,page", "warning": "automation,ticket", "info": "none"}


def test_every_generated_alert_lands_where_its_severity_says(amtool: str) -> None:
    rules = [
        rule
        for path in sorted(writer.default_out().glob("*.yaml"))
        for group in yaml.safe_load(path.read_text())["groups"]
        for rule in group["rules"]
        if "alert" in rule
    ]
    pairs = sorted({(rule["alert"], rule["labels"]["severity"]) for rule in rules})
    assert {severity for _, severity in pairs} == set(BY_SEVERITY)
    wrong = []
    for alertname, severity in pairs:
        result = subprocess.run(
            [amtool, "config", "routes", "test", f"--config.file={COMMITTED}",
             f"alertname={alertname}", f"severity={severity}", "cluster=c1", "model=m"],
            capture_output=True,
            text=True,
        )  # fmt: skip
        if result.stdout.strip() != BY_SEVERITY[severity]:
            wrong.append((alertname, severity, result.stdout.strip() or result.stderr))
    assert not wrong, wrong


def test_configured_urls_become_the_receivers_webhooks(amtool: str, tmp_path: Path) -> None:
    given = config_file(
        tmp_path,
        "alertmanager:\n"
        "  receivers:\n"
        "    page: [https://pager.example/hook, 'http://10.0.0.5:8080/p']\n"
        "    ticket: [https://tickets.example/hook]\n"
        "    automation: []\n"
        "  bearer_token_file: {page: /run/secrets/pager.token}\n"
        "  group_wait: 10s\n"
        "  repeat_interval: {page: 1h}\n",
    )
    out = tmp_path / "out"
    generated = subprocess.run(
        [INFERWATCH, "generate", "alerts", "--config", str(given), "--out", str(out)],
        capture_output=True,
        text=True,
    )
    assert generated.returncode == 0, generated.stderr
    path = out / writer.ALERTMANAGER
    check = subprocess.run([amtool, "check-config", str(path)], capture_output=True, text=True)
    assert check.returncode == 0, check.stdout + check.stderr
    doc = yaml.safe_load(path.read_text())
    hooks = {r["name"]: [w["url"] for w in r.get("webhook_configs", [])] for r in doc["receivers"]}
    assert hooks == {
        "page": ["https://pager.example/hook", "http://10.0.0.5:8080/p"],
        "ticket": ["https://tickets.example/hook"],
        "automation": [],
        "none": [],
    }
    page = next(r for r in doc["receivers"] if r["name"] == "page")
    assert {
        w["http_config"]["authorization"]["credentials_file"] for w in page["webhook_configs"]
    } == {"/run/secrets/pager.token"}
    ticket = next(r for r in doc["receivers"] if r["name"] == "ticket")
    assert "http_config" not in ticket["webhook_configs"][0]
    assert doc["route"]["group_wait"] == "10s"
    page_route = next(r for r in doc["route"]["routes"] if r["receiver"] == "page")
    assert page_route["repeat_interval"] == "1h"


@pytest.mark.parametrize(
    ("section", "message"),
    [
        ("[]", "alertmanager: expected a mapping"),
        ("{route: {}}", "alertmanager.route: unknown field"),
        ("{receivers: {pager: []}}", "alertmanager.receivers.pager: unknown field"),
        ("{receivers: {page: ['ftp://x/']}}", "alertmanager.receivers.page[0]: expected an http"),
        ("{receivers: {page: ['http://']}}", "alertmanager.receivers.page[0]: expected an http"),
        ("{receivers: {page: [3]}}", "alertmanager.receivers.page[0]: expected a string"),
        ("{receivers: {page: http://x}}", "alertmanager.receivers.page: expected a list"),
        ("{group_wait: 30 seconds}", "alertmanager.group_wait: expected a duration"),
        ("{group_interval: 30}", "alertmanager.group_interval: expected a string"),
        ("{repeat_interval: {page: ''}}", "alertmanager.repeat_interval.page: expected a"),
        ("{repeat_interval: 4h}", "alertmanager.repeat_interval: expected a mapping"),
        ("{repeat_interval: {ticket: 0s}}", "alertmanager.repeat_interval.ticket: must be longer"),
        ("{bearer_token_file: {page: token}}", "alertmanager.bearer_token_file.page: expected an"),
        ("{group_interval: 0m}", "alertmanager.group_interval: must be longer than 0s"),
        ("{receivers: {page: ['http://a b/']}}", "alertmanager.receivers.page[0]: expected an"),
        ("{receivers: {page: ['http://[::1/']}}", "alertmanager.receivers.page[0]: expected an"),
    ],
)
def test_a_bad_section_is_one_line_naming_the_field(
    tmp_path: Path, section: str, message: str
) -> None:
    given = config_file(tmp_path, f"alertmanager: {section}\n")
    result = subprocess.run(
        [INFERWATCH, "generate", "alerts", "--config", str(given), "--out", str(tmp_path / "o")],
        capture_output=True,
        text=True,
    )
    assert result.returncode != 0
    lines = result.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith(f"Error: {given}: {message}"), result.stderr
    assert not (tmp_path / "o").exists()  # nothing written


# --- inhibition on a real Alertmanager --------------------------------------------------------
@contextlib.contextmanager
def running_alertmanager(binary: str, folder: Path) -> Iterator[str]:
    """The generated inhibition rules in a running Alertmanager; receivers send nowhere."""
    path = write(folder, alertmanager.settings(config.load()).silent())
    with running(
        lambda port: topology.alertmanager_argv(binary, path, folder / "data", port),
        folder / "alertmanager.log",
        "/-/ready",
        "Alertmanager",
    ) as url:
        yield url


@pytest.fixture(scope="module")
def alertmanager_url(
    alertmanager_bin: str, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[str]:
    """One Alertmanager for the inhibition cases (each case has a cluster of its own)."""
    with running_alertmanager(alertmanager_bin, tmp_path_factory.mktemp("alertmanager")) as url:
        yield url


REPLICA_A = {"model": "llama", "model_version": "v1", "instance": "10.0.0.1:9400"}
REPLICA_B = {"model": "llama", "model_version": "v1", "instance": "10.0.0.2:9400"}
MODEL_V1 = {"model": "llama", "model_version": "v1"}
MODEL_V2 = {"model": "llama", "model_version": "v2"}

# (case, the alerts posted in order as (alertname, severity, labels), which end up inhibited).
# Every case ends with an alert that is inhibited, posted last: once it shows as suppressed the
# inhibitor has seen every source of the case, so what is still active stays active.
INHIBITION = [
    (
        "critical hides the warning of the same series, not of another",
        [("InferwatchTTFTHigh", "warning", MODEL_V2), ("InferwatchTTFTHigh", "critical", MODEL_V1),
         ("InferwatchTTFTHigh", "warning", MODEL_V1)],
        {2},
    ),
    (
        "a page-window SLO burn hides the ticket-window burn of the same model version",
        [("InferwatchTTFTSLOBurn", "warning", {**MODEL_V2, "long": "1d", "short": "2h"}),
         ("InferwatchTTFTSLOBurn", "critical", {**MODEL_V1, "long": "1h", "short": "5m"}),
         ("InferwatchTTFTSLOBurn", "warning", {**MODEL_V1, "long": "1d", "short": "2h"})],
        {2},
    ),
    (
        "a critical GPU fault hides its own replica's symptoms only",
        [("InferwatchReplicaNotReady", "warning", REPLICA_B),
         ("InferwatchModelReplicasNotReady", "critical", MODEL_V1),
         ("InferwatchGPUXidErrors", "critical", {**REPLICA_A, "gpu_uuid": "GPU-1"}),
         ("InferwatchEngineDown", "critical", REPLICA_A),
         ("InferwatchReplicaNotReady", "warning", REPLICA_A)],
        {3, 4},
    ),
    (
        "a GPU fault never hides a model-wide alert that has no instance label",
        [("InferwatchTTFTHigh", "warning", {"model": "llama"}),
         ("InferwatchGPUUnhealthy", "critical", {"gpu_uuid": "GPU-9"}),
         ("InferwatchGPUUnhealthy", "critical", {**REPLICA_A, "gpu_uuid": "GPU-1"}),
         ("InferwatchProbeFailing", "warning", REPLICA_A)],
        {3},
    ),
    (
        "a warning GPU fault does not hide a replica's symptoms",
        [("InferwatchGPUXidErrors", "warning", {**REPLICA_A, "gpu_uuid": "GPU-1"}),
         ("InferwatchErrorRatioHigh", "warning", REPLICA_A),
         ("InferwatchGPUXidErrors", "critical", {**REPLICA_B, "gpu_uuid": "GPU-2"}),
         ("InferwatchErrorRatioHigh", "warning", REPLICA_B)],
        {3},
    ),
    (
        "an engine that is down hides its model version's latency alerts",
        [("InferwatchTPOTHigh", "warning", MODEL_V2),
         ("InferwatchErrorRatioHigh", "warning", MODEL_V1),
         ("InferwatchEngineDown", "critical", REPLICA_A),
         ("InferwatchTPOTHigh", "warning", MODEL_V1)],
        {3},
    ),
]  # fmt: skip


@pytest.mark.parametrize(
    ("index", "posted", "inhibited"),
    [(i, posted, inhibited) for i, (_, posted, inhibited) in enumerate(INHIBITION)],
    ids=[case for case, _, _ in INHIBITION],
)
def test_alertmanager_inhibits_what_a_worse_alert_explains(
    alertmanager_url: str, index: int, posted: list[tuple[str, str, dict[str, str]]],
    inhibited: set[int],
) -> None:  # fmt: skip
    cluster = f"case-{index}"  # every rule's equal names the cluster: cases stay apart
    alerts = [
        {"labels": {"alertname": name, "severity": severity, "cluster": cluster, **labels}}
        for name, severity, labels in posted
    ]
    for alert in alerts:  # in order, as Prometheus would send them one evaluation at a time
        httpx.post(f"{alertmanager_url}/api/v2/alerts", json=[alert]).raise_for_status()

    def states() -> list[str] | None:
        answer = httpx.get(
            f"{alertmanager_url}/api/v2/alerts", params={"filter": f'cluster="{cluster}"'}
        ).json()
        by_labels = {tuple(sorted(a["labels"].items())): a["status"]["state"] for a in answer}
        found = [by_labels.get(tuple(sorted(a["labels"].items())), "") for a in alerts]
        return found if found[-1] == "suppressed" else None

    found = wait_for(states, f"the last alert of case {index} to be inhibited", timeout=10.0)
    assert {i for i, state in enumerate(found) if state == "suppressed"} == inhibited, found
    assert all(state in ("active", "suppressed") for state in found), found


# --- the demo's view of Alertmanager ----------------------------------------------------------
#: Alertmanager is Go: its runtime reads the clock through the vDSO, never through libc, so
#: LD_PRELOAD's libfaketime cannot move it, dynamically linked (Debian's) or not
GO_CLOCK = "Alertmanager's Go runtime reads the real clock, and the test ends alerts at Python's"


@pytest.mark.real_clock(GO_CLOCK)
def test_the_demo_observer_reports_alerts_firing_inhibited_and_resolved(
    alertmanager_bin: str, tmp_path: Path
) -> None:
    cluster = "demo-view"
    gpu = {
        "alertname": "InferwatchGPUUnhealthy",
        "severity": "critical",
        "cluster": cluster,
        "instance": "127.0.0.1:1",
        "replica": "primary-v1",
        "gpu_uuid": "GPU-1",
    }
    symptom = {"alertname": "InferwatchReplicaNotReady", "severity": "warning",
               "cluster": cluster, "instance": "127.0.0.1:1", "replica": "primary-v1"}  # fmt: skip
    replicas = topology.REPLICAS

    async def observe(alertmanager_url: str) -> list[tuple[observer.FleetState, str]]:
        async with httpx.AsyncClient() as http:
            down = {r.name: "http://127.0.0.1:1" for r in replicas}  # no fleet, only alerts
            watch = observer.Observer(http, replicas, (), down, down, (), alertmanager_url)
            seen = []

            async def poll_until(done: Callable[[observer.FleetState], bool], what: str) -> None:
                async def polled() -> bool:
                    state = await watch.poll(0.0, LoadStats(), 0.0)
                    seen.append((state, "\n".join(view.summary(state))))
                    return done(state)

                def failed() -> str:
                    return f"{what}; last seen: {seen[-1][1] if seen else 'nothing'}"

                await wait_until(polled, failed, 15)  # the observer reads alerts every 2 s

            post = functools.partial(httpx.post, f"{alertmanager_url}/api/v2/alerts")
            post(json=[{"labels": gpu}, {"labels": symptom}]).raise_for_status()
            await poll_until(
                lambda s: {a.inhibited for a in observer_alerts(s)} == {True, False},
                "the observer to see the symptom inhibited by the GPU alert",
            )
            ended = datetime.now(UTC).isoformat()
            post(json=[{"labels": gpu, "endsAt": ended}, {"labels": symptom, "endsAt": ended}])
            await poll_until(lambda s: not observer_alerts(s), "the observer to see both resolved")
            return seen

    with running_alertmanager(alertmanager_bin, tmp_path) as alertmanager_url:
        seen = asyncio.run(observe(alertmanager_url))
    events = [event for state, _ in seen for event in state.events]
    assert "ALERT firing: InferwatchGPUUnhealthy critical primary-v1 -> page" in events, events
    assert any(e.startswith("ALERT resolved: InferwatchReplicaNotReady warning") for e in events)
    # while both fired, the plain summary counted the symptom as inhibited by the GPU fault
    assert any("alerts 1 firing, 1 inhibited: InferwatchGPUUnhealthy critical primary-v1" in line
               for _, line in seen), [line for _, line in seen]  # fmt: skip
    firing = next(state for state, _ in seen if len(observer_alerts(state)) == 2)
    console = Console(width=200, record=True, file=io.StringIO())
    console.print(view.render(firing, view.Context(1.0, None, "http://am")))
    table = console.export_text()
    assert re.search(r"InferwatchGPUUnhealthy +critical +primary-v1 +firing", table), table
    assert re.search(r"InferwatchReplicaNotReady +warning +primary-v1 +inhibited", table), table


def observer_alerts(state: observer.FleetState) -> list[observer.AlertState]:
    return [a for a in state.alerts or () if a.where == "primary-v1"]


def test_people_get_one_group_per_model_and_the_automation_one_per_alert(
    alertmanager_url: str,
) -> None:
    cluster = "grouping"
    alerts = [
        {"labels": {"alertname": "InferwatchGPUXidErrors", "severity": "critical",
                    "cluster": cluster, "model": "llama", "instance": instance}}
        for instance in ("10.0.0.1:9400", "10.0.0.2:9400")
    ]  # fmt: skip
    httpx.post(f"{alertmanager_url}/api/v2/alerts", json=alerts).raise_for_status()

    def groups() -> dict[str, list[int]] | None:
        answer = httpx.get(
            f"{alertmanager_url}/api/v2/alerts/groups", params={"filter": f'cluster="{cluster}"'}
        ).json()
        sizes: dict[str, list[int]] = {}
        for group in answer:
            sizes.setdefault(group["receiver"]["name"], []).append(len(group["alerts"]))
        complete = sum(sizes.get("page", [])) == sum(sizes.get("automation", [])) == 2
        return sizes if complete else None

    sizes = wait_for(groups, "both alerts in their groups")
    assert sizes == {"page": [2], "automation": [1, 1]}, sizes


# mostly well-formed values, so that the URLs get explored on configs that pass the rest
_DURATIONS = st.one_of(
    st.from_regex(r"\A[1-9][0-9]{0,2}(ms|s|m|h|d|w)\Z"),
    st.from_regex(r"\A[1-9][0-9]{0,2}(ms|s|m|h|d|w)\Z"),
    st.sampled_from(["0s", "", "1h30m", "5 m", "1y"]),
)
_URLS = st.one_of(
    st.builds(
        "{}://{}{}".format,
        st.sampled_from(["http", "https", "ftp", ""]),
        st.sampled_from(
            ["127.0.0.1:9095", "hooks.example", "[::1]:80", "[::1", "", "a b", "h\tx", "h:99999"]
        ),
        st.text(max_size=12),
    ),
    st.text(max_size=20),
)


@settings(
    max_examples=40, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture]
)
@given(
    urls=st.lists(_URLS, max_size=3),
    group_wait=_DURATIONS,
    group_interval=_DURATIONS,
    repeat=_DURATIONS,
)
def test_an_accepted_section_always_gives_a_config_amtool_accepts(
    amtool: str, tmp_path: Path, urls: list[str], group_wait: str, group_interval: str,
    repeat: str,
) -> None:  # fmt: skip
    section = {
        "receivers": {"page": urls},
        "group_wait": group_wait,
        "group_interval": group_interval,
        "repeat_interval": {"page": repeat},
    }
    given = config_file(tmp_path, yaml.safe_dump({"alertmanager": section}))
    try:
        loaded = config.load(given)
    except config.ConfigError as exc:
        assert "\n" not in str(exc) and str(exc).startswith(f"{given}: alertmanager")
        return
    path = write(tmp_path, alertmanager.settings(loaded))
    check = subprocess.run([amtool, "check-config", str(path)], capture_output=True, text=True)
    assert check.returncode == 0, (section, check.stdout + check.stderr)


def test_the_demo_refuses_a_bad_alert_config_in_one_line_before_starting(tmp_path: Path) -> None:
    bad = config_file(tmp_path, "alertmanager: {receivers: {page: ['http://a b/']}}\n")
    result = subprocess.run(
        [INFERWATCH, "demo", "--alert-config", str(bad)],
        capture_output=True,
        text=True,
        timeout=60,
        cwd=tmp_path,
    )
    assert result.returncode != 0
    assert result.stdout == ""  # nothing was started
    assert result.stderr.strip().splitlines() == [
        f"Error: {bad}: alertmanager.receivers.page[0]: expected an http(s) URL "
        "(scheme://host[:port][/path][?query]), got 'http://a b/'"
    ]
