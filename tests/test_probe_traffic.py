"""Probe traffic kept apart: probes sent straight to the engine reconcile with its counters.

In the shipped pod layout the sidecar probes its engine directly while tenants go through the
proxy. The engine counts both; the proxy charges only the tenants and reads the probe runner's
``inferwatch_probe_tokens_total{route="direct"}``, so its drift settles at 0.
"""

from __future__ import annotations

import contextlib
from collections.abc import Callable, Iterator
from typing import Any

import httpx
import openai
import pytest
from prometheus_client.core import Metric
from prometheus_client.parser import text_string_to_metric_families
from starlette.applications import Starlette
from starlette.requests import Request
from starlette.responses import Response
from starlette.routing import Route

import support.scripted_engine as harness
from inferwatch.probes import golden
from inferwatch.probes.client import Endpoint
from inferwatch.probes.metrics import ProbeMetrics
from inferwatch.probes.runner import ProbeRunner, Schedule, Target
from inferwatch.probes.verdict import Verdicts
from inferwatch.proxy import config as proxy_config
from inferwatch.proxy.app import ProxyApp
from inferwatch.proxy.assembly import build
from inferwatch.proxy.reconcile import Direct, Reconciler, direct_tokens
from inferwatch.proxy.tenants import hash_key
from inferwatch.proxy.usage import Usage
from inferwatch.serving.endpoints import encode_metrics, metrics_response
from inferwatch.sim.server import run_in_thread
from inferwatch.sim.simulator import SimConfig
from support.wait import wait_for

pytestmark = pytest.mark.proc

MODEL = "sim-model"
DRIFT = "inferwatch_tenancy_reconciliation_drift_tokens"


def value(text: str, name: str, **labels: str) -> float:
    return sum(
        sample.value
        for family in text_string_to_metric_families(text)
        for sample in family.samples
        if sample.name == name and all(sample.labels.get(k) == v for k, v in labels.items())
    )


# --- the probe runner's page ------------------------------------------------------------------
def probe_tokens_line(target: str, route: str, token_type: str, n: int) -> str:
    labels = f'target="{target}",route="{route}",model="m",model_version="v1",type="{token_type}"'
    return f"inferwatch_probe_tokens_total{{{labels}}} {n}\n"


ENGINE_UP = "# TYPE inferwatch_engine_up gauge\ninferwatch_engine_up 1\n"
PAGE = (
    "# TYPE inferwatch_probe_tokens_total counter\n"
    + probe_tokens_line("r0", "direct", "prompt", 120)
    + probe_tokens_line("r0", "direct", "completion", 30)
    + probe_tokens_line("gw", "router", "prompt", 500)
    + ENGINE_UP
)


def test_only_direct_tokens_count_as_traffic_around_the_proxy() -> None:
    # router-route probes pass through the proxy, which charges them to _probe already
    direct = direct_tokens(PAGE)
    assert direct is not None and direct.tokens == {"prompt": 120.0, "completion": 30.0}
    assert direct_tokens(ENGINE_UP) is None
    assert direct_tokens(b"<html>502</html>") is None


def test_direct_tokens_close_the_gap_and_a_runner_restart_starts_a_new_baseline() -> None:
    reconciler = Reconciler()
    engine, direct = {"prompt": 1000.0, "completion": 500.0}, {"prompt": 50.0, "completion": 5.0}
    assert reconciler.update(engine, Usage(), Direct(direct)) == {"prompt": 0.0, "completion": 0.0}
    # 100/40 tenant tokens through the proxy, 30/10 probe tokens straight to the engine
    engine, direct = {"prompt": 1130.0, "completion": 550.0}, {"prompt": 80.0, "completion": 15.0}
    charged = Usage(prompt=100, completion=40)
    assert reconciler.update(engine, charged, Direct(direct)) == {"prompt": 0.0, "completion": 0.0}
    reconciler = Reconciler()
    reconciler.update(engine, charged, Direct(direct))
    restarted = Direct({"prompt": 7.0, "completion": 1.0})  # the sidecar restarted: from 0
    assert reconciler.update(engine, charged, restarted) == {"prompt": 0.0, "completion": 0.0}
    engine = {"prompt": 1140.0, "completion": 553.0}
    grown = Direct({"prompt": 17.0, "completion": 4.0})
    assert reconciler.update(engine, charged, grown) == {"prompt": 0.0, "completion": 0.0}


def test_a_restart_whose_new_counters_passed_the_old_ones_is_still_a_restart() -> None:
    """The runner restarted between two reads and sent more than its old total since: only the
    creation time of its counters tells, and without it the drift would stay off for good."""
    reconciler = Reconciler()
    engine, charged = {"prompt": 1000.0, "completion": 500.0}, Usage()
    reconciler.update(engine, charged, Direct({"prompt": 50.0, "completion": 5.0}, started=10.0))
    # the old runner's last 20/2 tokens and the new runner's 80/9 all reached the engine
    engine = {"prompt": 1100.0, "completion": 511.0}
    restarted = Direct({"prompt": 80.0, "completion": 9.0}, started=500.0)
    assert reconciler.update(engine, charged, restarted) == {"prompt": 0.0, "completion": 0.0}
    engine = {"prompt": 1110.0, "completion": 512.0}
    grown = Direct({"prompt": 90.0, "completion": 10.0}, started=500.0)
    assert reconciler.update(engine, charged, grown) == {"prompt": 0.0, "completion": 0.0}


def test_a_runners_page_says_since_when_it_counts() -> None:
    metrics = ProbeMetrics("default")
    metrics.tokens[("r0", "direct", "m", "v1", "prompt")] = 5
    page, _ = encode_metrics(metrics.families(Verdicts(golden_ids=()), 1.0), "", "")  # served
    direct = direct_tokens(page)
    assert direct is not None and direct.tokens["prompt"] == 5
    assert direct.started == pytest.approx(metrics.tokens_since)


# --- the pod layout on loopback: simulator, direct probes, proxy -----------------------------
def probe_page(families: Callable[[], list[Metric]]) -> Starlette:
    """A probe runner's families at /metrics, as the sidecar embeds them (probes on demand)."""

    async def metrics(request: Request) -> Response:
        return metrics_response(request, families())

    return Starlette(routes=[Route("/metrics", metrics)])


@contextlib.contextmanager
def pod(probe_metrics: bool) -> Iterator[tuple[Any, Any, Any, ProbeRunner]]:
    """Simulator, a proxy in front of it, and a runner probing the engine directly (as the
    sidecar does) and through the proxy (as a router probe would, as tenant ``_probe``)."""
    sim = run_in_thread(SimConfig(port=0, speed=50, served_model_names=(MODEL,)))
    loop = harness.LoopThread()
    runners: list[ProbeRunner] = []
    probes = harness.AppServer(loop, probe_page(lambda: runners[0].families()))
    upstream: dict[str, Any] = {"url": sim.url, "reconcile_interval": 0}
    if probe_metrics:
        upstream["probe_metrics"] = [probes.url + "/metrics"]
    config = proxy_config.parse(
        {
            "upstream": upstream,
            # the router probe is the reserved tenant _probe by its key, never by its header
            "tenants": {
                "acme": {"key_sha256": [hash_key("sk-acme")]},
                "_probe": {"key_sha256": [hash_key("sk-probe")]},
            },
            "prices": {"default": {"prompt": 1.0, "completion": 2.0}},
        }
    )
    proxy = harness.ProxyServer(loop, ProxyApp(build(config)))
    targets = [
        Target("replica-0", Endpoint(sim.url), "direct", "v1"),
        # the model named: a discovery request (/v1/models) is no engine request
        Target("gateway", Endpoint(proxy.url, model=MODEL, api_key="sk-probe"), "router", "v1"),
    ]
    schedule = Schedule(cycle_s=0, jitter=0, timeout_s=10)
    runners.append(ProbeRunner(golden.load("default"), targets, schedule=schedule))
    try:
        yield sim, proxy, loop, runners[0]
    finally:
        proxy.stop()
        probes.stop()
        loop.run(runners[0].aclose)
        loop.close()
        sim.stop()


def tenant_and_probe_traffic(proxy: Any, loop: Any, runner: ProbeRunner) -> None:
    messages = [{"role": "user", "content": "What is the capital of France?"}]
    with openai.OpenAI(base_url=proxy.url + "/v1", api_key="sk-acme", max_retries=0) as tenant:
        for stream in (False, True):
            reply = tenant.chat.completions.create(
                model=MODEL, messages=messages, max_tokens=12, stream=stream
            )
            if stream:
                assert [chunk for chunk in reply]  # type: ignore[union-attr]
    for target in runner.targets:
        outcomes = loop.run(lambda: runner.run_cycle(target), timeout=60)  # noqa: B023
        assert outcomes and all(o.reply.ok for o in outcomes)


def metered_requests(proxy: Any) -> dict[str, float]:
    page = httpx.get(proxy.metrics_url + "/metrics").text
    return {
        tenant: value(page, "inferwatch_tenancy_requests_total", tenant=tenant, outcome="ok")
        for tenant in ("acme", "_probe")
    }


def probe_tokens(runner: ProbeRunner, route: str) -> dict[str, float]:
    totals = {"prompt": 0.0, "completion": 0.0}
    for (_, key_route, *_, token_type), n in runner.metrics.tokens.items():
        if key_route == route:
            totals[token_type] += n
    return totals


@pytest.mark.parametrize("probe_metrics", [True, False], ids=["probe-metrics", "unconfigured"])
def test_drift_settles_at_zero_when_the_proxy_reads_the_direct_probes(
    probe_metrics: bool,
) -> None:
    with pod(probe_metrics) as (sim, proxy, loop, runner):
        loop.run(proxy.app.reconcile_once)  # the baseline, before any traffic
        tenant_and_probe_traffic(proxy, loop, runner)
        probe_runs = {route: sum(n for key, n in runner.metrics.runs.items() if key[1] == route)
                      for route in ("direct", "router")}  # fmt: skip
        expected = {"acme": 2, "_probe": probe_runs["router"]}
        # The proxy charges a request once its reply has gone out: the client can see the
        # last byte a moment before the charge lands, so wait for it (with a deadline).
        wait_for(
            lambda: metered_requests(proxy) == expected,
            f"the proxy to meter {expected}",
            20,
            interval=0.02,
        )
        loop.run(proxy.app.reconcile_once)
        page = httpx.get(proxy.metrics_url + "/metrics").text
        engine_page = httpx.get(sim.url + "/metrics").text
    direct, routed = probe_tokens(runner, "direct"), probe_tokens(runner, "router")
    # the engine's requests are the tenants' and the probes', as the demo shows them
    finished = value(engine_page, "vllm:request_success_total")
    assert finished == expected["acme"] + expected["_probe"] + probe_runs["direct"]
    assert min(direct.values()) > 0 and min(routed.values()) > 0
    # router probes pass the proxy: metered as _probe, at no cost; tenants pay for their own
    for token_type, spent in routed.items():
        tokens = "inferwatch_tenancy_tokens_total"
        assert value(page, tokens, tenant="_probe", token_type=token_type) == spent, token_type
    assert value(page, "inferwatch_tenancy_cost_total", tenant="_probe") == 0
    assert value(page, "inferwatch_tenancy_cost_total", tenant="acme") > 0
    for token_type, spent in direct.items():
        drift = value(page, DRIFT, token_type=token_type)
        # without the runner's page the direct probes look like engine traffic nobody charged
        assert drift == (0 if probe_metrics else -spent), token_type
    assert value(page, "inferwatch_tenancy_reconciliation_errors_total") == 0


def test_an_unreadable_probe_page_is_a_counted_error_not_a_wrong_drift(unused_port: int) -> None:
    sim = run_in_thread(SimConfig(port=0, speed=50, served_model_names=(MODEL,)))
    loop = harness.LoopThread()
    config = proxy_config.parse(
        {
            "upstream": {
                "url": sim.url,
                "reconcile_interval": 0,
                "probe_metrics": [f"http://127.0.0.1:{unused_port}/metrics", sim.url + "/metrics"],
            }
        }
    )
    app = ProxyApp(build(config))
    try:
        loop.run(app.reconcile_once)
        assert app.parts.metrics.reconciliation_errors == {"probe_unreachable": 1}
        app.parts.direct_traffic.urls = (sim.url + "/metrics",)  # an engine page: no probe counters
        loop.run(app.reconcile_once)
        assert app.parts.metrics.reconciliation_errors["no_probe_counters"] == 1
        assert app.parts.metrics.drift == {}  # never published from half the picture
    finally:
        loop.run(app.stop_background)
        loop.close()
        sim.stop()


def test_a_bad_probe_metrics_entry_names_the_field() -> None:
    with pytest.raises(proxy_config.ConfigError, match=r"upstream\.probe_metrics: expected"):
        proxy_config.parse({"upstream": {"probe_metrics": ["ftp://x/metrics"]}})
