"""The sidecar and the proxy against llama.cpp's own server (``llama-server --metrics``).

The server loads the tiny Llama as a GGUF with random weights: its text is gibberish, its
slots, limits, usage and ``llamacpp:`` counters are llama.cpp's own. What it counts is the
reference: the sidecar's mapped counters and the proxy's charges must equal it.
"""

from __future__ import annotations

import asyncio
import json
from collections.abc import Iterator
from contextlib import suppress
from typing import Any

import httpx
import pytest
from click.testing import CliRunner
from prometheus_client.parser import text_string_to_metric_families

import support.scripted_engine as harness
from inferwatch import identity
from inferwatch.cli import main
from inferwatch.exporters.engine import adapters
from inferwatch.exporters.engine.collector import EngineCollector
from inferwatch.exporters.sidecar import Sidecar
from inferwatch.probes import golden
from inferwatch.probes.client import Endpoint
from inferwatch.probes.runner import ProbeRunner, Schedule, Target
from inferwatch.probes.verdict import Policy
from inferwatch.proxy import config as proxy_config
from inferwatch.proxy.app import ProxyApp
from inferwatch.proxy.assembly import build
from inferwatch.proxy.tenants import hash_key
from inferwatch.serving import textformat
from inferwatch.serving.page_fetch import EngineScraper
from support import tinymodel
from support.llamacpp import MODEL, LlamaCpp
from support.proxy_stack import samples
from support.realengine import Engine
from support.wait import wait_for

pytestmark = pytest.mark.realengine

KEYS = {
    "acme": "sk-acme-1",
    "globex": "sk-globex-1",
    "initech": "sk-initech-1",
    "umbrella": "sk-umbrella-1",
}
BUDGET = 100_000
#: room for one request that fills the context, far from the 4,096 an unknown engine gets
TIGHT_BUDGET = tinymodel.MAX_MODEL_LEN + 200
#: a prompt whose byte bound (a token a byte) leaves no room for the context after it
NEAR_THE_BOUND = " ".join(["the proxy asks llama.cpp to count"] * 10)
MESSAGES = [{"role": "user", "content": "what does the sidecar read?"}]


@pytest.fixture(scope="module")
def server(llamacpp: LlamaCpp) -> Engine:
    return llamacpp.server()


def engine_tokens(url: str) -> dict[str, float]:
    """llama.cpp's own prompt (computed plus reused from the cache) and generated tokens."""
    page = httpx.get(url + "/metrics", timeout=10).text
    return {
        "prompt": samples(page, "llamacpp:prompt_tokens_total")
        + samples(page, "llamacpp:prompt_tokens_cached_total"),
        "completion": samples(page, "llamacpp:tokens_predicted_total"),
    }


def test_the_sidecar_names_the_model_llamacpp_serves(server: Engine) -> None:
    served = httpx.get(server.url + "/v1/models", timeout=10).json()["data"][0]["id"]
    build = httpx.get(server.url + "/props", timeout=10).json()["build_info"]

    async def scenario() -> tuple[dict[str, str], set[str]]:
        collector = EngineCollector(EngineScraper(server.url + "/metrics", timeout_s=10), {})
        try:
            await collector.collect()  # asks the version endpoints in the background
            await collector.identify()
            families = await collector.collect()
        finally:
            await collector.aclose()
        models = {
            sample.labels["model"]
            for family in families
            if family.name == "inferwatch_engine_prompt_tokens"
            for sample in family.samples
        }
        return collector.identity, models

    labels, models = asyncio.run(scenario())
    assert labels["engine"] == "llamacpp"
    assert labels["model"] == served
    assert labels["engine_version"] == build
    assert models == {served}


def test_the_first_scrape_already_names_the_model_on_engine_up(server: Engine) -> None:
    """The page names no model: were /props read after the first page, its engine_up and
    engine series would say model="unknown" (and engine_version too) and every later one
    the model."""
    served = httpx.get(server.url + "/v1/models", timeout=10).json()["data"][0]["id"]
    build = httpx.get(server.url + "/props", timeout=10).json()["build_info"]

    async def scenario() -> tuple[set[tuple[str, str]], set[str]]:
        collector = EngineCollector(EngineScraper(server.url + "/metrics", timeout_s=10), {})
        try:
            families = await collector.collect()
            status = collector.status_families()
        finally:
            await collector.aclose()
        up = {(s.labels["model"], s.labels["engine_version"]) for f in status
              if f.name == "inferwatch_engine_up" for s in f.samples}  # fmt: skip
        mapped = {s.labels["model"] for f in families for s in f.samples}
        return up, mapped

    up, mapped = asyncio.run(scenario())
    assert up == {(served, build)}
    assert mapped == {served}


def test_scrape_prints_the_model_llamacpp_serves(server: Engine) -> None:
    """llama.cpp's page names no model; only its /props does, read after the page."""
    served = httpx.get(server.url + "/v1/models", timeout=10).json()["data"][0]["id"]
    result = CliRunner().invoke(main, ["scrape", server.url])
    assert result.exit_code == 0, result.output
    assert result.output.splitlines()[0].split() == ["engine:", "llamacpp", "model:", served]


def test_mapped_token_counters_equal_llamacpps_own(server: Engine) -> None:
    with httpx.Client(base_url=server.url, timeout=60) as client:
        for prompt in ("a replica with a dead engine", "the sidecar reads", "the sidecar reads"):
            body = {"model": MODEL, "prompt": prompt, "max_tokens": 4}
            reply = client.post("/v1/completions", json=body)
            assert reply.status_code == 200, reply.text
        page = client.get("/metrics").text
    exposition = textformat.parse(page)
    assert adapters.detect(exposition) == "llamacpp"
    labels = dict.fromkeys(identity.KEYS, "") | {"engine": "llamacpp"}
    families = {f.name: f for f in adapters.normalize(exposition, "llamacpp", labels)}
    computed = samples(page, "llamacpp:prompt_tokens_total")
    cached = samples(page, "llamacpp:prompt_tokens_cached_total")
    generated = samples(page, "llamacpp:tokens_predicted_total")
    own = {
        "inferwatch_engine_prompt_tokens": computed + cached,
        "inferwatch_engine_generation_tokens": generated,
        "inferwatch_engine_prefix_cache_hit_tokens": cached,
    }
    for key, expected in own.items():
        mapped = sum(s.value for s in families[key].samples if s.name.endswith("_total"))
        assert mapped == expected, key
    assert generated >= 12 and cached > 0  # the repeated prompt came from the cache


class Proxy:
    """The tenancy proxy in front of llama-server: ``acme`` without a budget, ``globex`` with."""

    def __init__(self, upstream: str) -> None:
        document: dict[str, Any] = {
            "upstream": {"url": upstream, "reconcile_interval": 0, "read_timeout": 60},
            "tenants": {
                "acme": {"key_sha256": [hash_key(KEYS["acme"])]},
                "globex": {
                    "key_sha256": [hash_key(KEYS["globex"])],
                    "budget": {"tokens": BUDGET, "window": "1h"},
                },
                **{
                    name: {
                        "key_sha256": [hash_key(KEYS[name])],
                        "budget": {"tokens": TIGHT_BUDGET, "window": "1h"},
                    }
                    for name in ("initech", "umbrella")
                },
            },
            "limits": {"over_budget": "reject"},
        }
        self.loop = harness.LoopThread()
        self.app = ProxyApp(build(proxy_config.parse(document, "test.yaml"), access_log=False))
        self.server = harness.ProxyServer(self.loop, self.app)
        self.client = httpx.Client(base_url=self.server.url, timeout=60)

    def post(self, tenant: str, path: str, body: dict[str, Any]) -> httpx.Response:
        headers = {"authorization": f"Bearer {KEYS[tenant]}"}
        return self.client.post(path, json={"model": MODEL, **body}, headers=headers)

    def page(self) -> str:
        return httpx.get(self.server.metrics_url + "/metrics", timeout=10).text

    def reconcile(self) -> dict[str, float]:
        self.loop.run(self.app.reconcile_once, timeout=30)
        return dict(self.app.parts.metrics.drift)

    def charged(self, tenant: str) -> dict[str, float]:
        page = self.page()
        return {
            token_type: samples(
                page, "inferwatch_tenancy_tokens_total", tenant=tenant, token_type=token_type
            )
            for token_type in ("prompt", "completion")
        }

    def close(self) -> None:
        self.client.close()
        self.server.stop()
        self.loop.close()


@pytest.fixture(scope="module")
def proxy(server: Engine) -> Iterator[Proxy]:
    running = Proxy(server.url)
    yield running
    running.close()


def _usage(reply: httpx.Response) -> dict[str, int]:
    """The usage of a plain reply, or of the last frame of a stream that sent one."""
    if not reply.headers["content-type"].startswith("text/event-stream"):
        usage: dict[str, int] = reply.json()["usage"]
        return usage
    frames = [
        json.loads(line[6:]) for line in reply.text.splitlines() if line.startswith("data: {")
    ]
    last: dict[str, dict[str, int]] = frames[-1]
    return last["usage"]


@pytest.mark.parametrize("stream", [False, True], ids=["plain", "streamed"])
@pytest.mark.parametrize(
    "path, body",
    [
        ("/v1/chat/completions", {"messages": MESSAGES, "max_tokens": 6}),
        ("/v1/completions", {"prompt": "the proxy counts", "max_tokens": 6}),
    ],
    ids=["chat", "completions"],
)
def test_proxy_charges_what_llamacpp_counted(
    server: Engine, proxy: Proxy, path: str, body: dict[str, Any], stream: bool
) -> None:
    before, charged_before = engine_tokens(server.url), proxy.charged("acme")
    extra: dict[str, Any] = {"stream": stream}
    if stream:
        extra["stream_options"] = {"include_usage": True}
    reply = proxy.post("acme", path, body | extra)
    assert reply.status_code == 200, reply.text
    usage = _usage(reply)
    answered = {"prompt": usage["prompt_tokens"], "completion": usage["completion_tokens"]}
    assert answered["completion"] == 6  # random weights never stop early on this prompt

    def books() -> tuple[dict[str, float], dict[str, float]]:
        after, charged = engine_tokens(server.url), proxy.charged("acme")
        counted = {t: after[t] - before[t] for t in after}
        return counted, {t: charged[t] - charged_before[t] for t in charged}

    # llama.cpp counts a request once its slot is released, which may be after the reply
    # has gone out; the proxy settles after the last byte too
    with suppress(pytest.fail.Exception):  # the assertion below shows what differs
        wait_for(lambda: books() == (answered, answered), "the books to settle", 30)
    assert books() == (answered, answered)


def test_a_budgeted_tenant_within_the_context_is_served_and_settled(
    server: Engine, proxy: Proxy
) -> None:
    n_ctx = httpx.get(server.url + "/props", timeout=10).json()["default_generation_settings"][
        "n_ctx"
    ]
    prompt = httpx.post(
        server.url + "/tokenize", json={"content": "a budgeted tenant asks"}, timeout=10
    ).json()["tokens"]
    max_tokens = 8
    assert len(prompt) + max_tokens < n_ctx
    before, charged_before = engine_tokens(server.url), proxy.charged("globex")
    reply = proxy.post(
        "globex", "/v1/completions", {"prompt": "a budgeted tenant asks", "max_tokens": max_tokens}
    )
    assert reply.status_code == 200, reply.text
    after, charged = engine_tokens(server.url), proxy.charged("globex")
    counted = {t: after[t] - before[t] for t in after}
    assert counted == {"prompt": len(prompt) + 1, "completion": max_tokens}  # + bos
    assert {t: charged[t] - charged_before[t] for t in charged} == counted
    page = httpx.get(proxy.server.metrics_url + "/metrics", timeout=10).text
    spent = sum(charged.values())  # the reservation settled at what was used
    assert samples(page, "inferwatch_tenancy_budget_remaining_tokens", tenant="globex") == (
        BUDGET - spent
    )


def test_a_budgeted_request_without_max_tokens_runs_to_the_context_and_is_charged(
    server: Engine, proxy: Proxy
) -> None:
    """llama.cpp's default is to generate until the context is full, not the API's 16: the
    cap the proxy sets for the reservation must not turn the request into a refusal."""
    before, charged_before = engine_tokens(server.url), proxy.charged("globex")
    reply = proxy.post("globex", "/v1/completions", {"prompt": "no cap given"})
    assert reply.status_code == 200, reply.text
    after, charged = engine_tokens(server.url), proxy.charged("globex")
    counted = {t: after[t] - before[t] for t in after}
    # random weights may draw the end-of-sequence token early; otherwise the context fills
    if reply.json()["choices"][0]["finish_reason"] == "length":
        assert counted["prompt"] + counted["completion"] == tinymodel.MAX_MODEL_LEN
    else:
        assert counted["prompt"] + counted["completion"] < tinymodel.MAX_MODEL_LEN
    assert {t: charged[t] - charged_before[t] for t in charged} == counted


@pytest.mark.parametrize(
    "tenant, path, body",
    [
        ("initech", "/v1/completions", {"prompt": NEAR_THE_BOUND}),
        ("umbrella", "/v1/chat/completions",
         {"messages": [{"role": "user", "content": NEAR_THE_BOUND}]}),
    ],
    ids=["completions", "chat"],
)  # fmt: skip
def test_a_request_without_max_tokens_reserves_the_rest_of_the_context(
    server: Engine, proxy: Proxy, tenant: str, path: str, body: dict[str, Any]
) -> None:
    """The tenant's budget holds one context (n_ctx from /props) but not 4,096 tokens, nor the
    prompt's byte bound plus the context: admitted only if the proxy reserves n_ctx less the
    prompt as llama.cpp's /tokenize counts it, and charged what llama.cpp counted. Its series
    carry the build /props names as the engine version."""
    props = httpx.get(server.url + "/props", timeout=10).json()
    n_ctx = props["default_generation_settings"]["n_ctx"]
    assert len(NEAR_THE_BOUND.encode()) + n_ctx > TIGHT_BUDGET > n_ctx
    before, charged_before = engine_tokens(server.url), proxy.charged(tenant)
    reply = proxy.post(tenant, path, body)
    assert reply.status_code == 200, reply.text
    usage = reply.json()["usage"]
    assert usage["prompt_tokens"] + usage["completion_tokens"] <= n_ctx
    counted = {"prompt": usage["prompt_tokens"], "completion": usage["completion_tokens"]}

    def books() -> tuple[dict[str, float], dict[str, float]]:
        after, charged = engine_tokens(server.url), proxy.charged(tenant)
        return (
            {t: after[t] - before[t] for t in after},
            {t: charged[t] - charged_before[t] for t in charged},
        )

    with suppress(pytest.fail.Exception):  # the assertion below shows what differs
        wait_for(lambda: books() == (counted, counted), "the books to settle", 30)
    assert books() == (counted, counted)
    versions = {
        sample.labels["engine_version"]
        for family in text_string_to_metric_families(proxy.page())
        for sample in family.samples
        if sample.name == "inferwatch_tenancy_tokens_total" and sample.labels["tenant"] == tenant
    }
    assert versions == {props["build_info"]}


def test_the_proxy_reconciles_with_llamacpps_counters(server: Engine, proxy: Proxy) -> None:
    """Drift against ``llamacpp:`` counters, as against vLLM's: 0 over plain, streamed and
    cached requests (llama.cpp's prompt counter leaves out what came from its cache)."""
    assert proxy.reconcile() == {"prompt": 0.0, "completion": 0.0}  # the baseline
    before = engine_tokens(server.url)
    for stream in (False, True, False):
        extra: dict[str, Any] = {"stream": stream}
        if stream:
            extra["stream_options"] = {"include_usage": True}
        body = {"prompt": "the drift stays at zero", "max_tokens": 5} | extra
        assert proxy.post("acme", "/v1/completions", body).status_code == 200
    # llama.cpp counts a request once its slot is released, maybe after the reply went out
    generated = lambda: engine_tokens(server.url)["completion"] - before["completion"]  # noqa: E731
    wait_for(lambda: generated() == 15, "llama.cpp to count the 15 tokens", 30)
    with suppress(pytest.fail.Exception):  # the proxy settles after the last byte too
        wait_for(lambda: not any(proxy.reconcile().values()), "the drift to settle", 30)
    assert proxy.reconcile() == {"prompt": 0.0, "completion": 0.0}


def test_an_over_long_prompt_is_refused_by_llamacpp_and_charged_nothing(
    server: Engine, proxy: Proxy
) -> None:
    before, charged_before = engine_tokens(server.url), proxy.charged("acme")
    prompt = "an over-long prompt " * tinymodel.MAX_MODEL_LEN
    reply = proxy.post("acme", "/v1/completions", {"prompt": prompt, "max_tokens": 4})
    assert reply.status_code == 400, reply.text
    assert reply.json()["error"]["type"] == "exceed_context_size_error"
    assert engine_tokens(server.url) == before
    assert proxy.charged("acme") == charged_before


def test_probes_fail_on_random_weights_and_take_the_replica_out(server: Engine) -> None:
    target = Target("replica-0", Endpoint(server.url), "direct")
    probes = ProbeRunner(
        golden.load("default"),
        [target],
        schedule=Schedule(cycle_s=0.01, jitter=0.0, timeout_s=30.0),
        policy=Policy(window_cycles=2, baseline_cycles=2),
    )
    engine = EngineCollector(EngineScraper(server.url + "/metrics", timeout_s=10), {})
    sidecar = Sidecar([engine, probes], readiness_max_age=0)

    async def scenario() -> tuple[httpx.Response, str]:
        try:
            for _ in range(3):
                await probes.run_cycle(target)
            transport = httpx.ASGITransport(app=sidecar.app())
            async with httpx.AsyncClient(transport=transport, base_url="http://sidecar") as client:
                return await client.get("/readyz"), (await client.get("/metrics")).text
        finally:
            await sidecar.aclose()

    readyz, page = asyncio.run(scenario())
    conditions = {c["name"]: c for c in readyz.json()["conditions"]}
    assert readyz.status_code == 503
    assert conditions["engine"]["ok"] and not conditions["quality"]["ok"], conditions
    failures = "inferwatch_probe_check_failures_total"
    # the gibberish fails the answer checks (probes over the 1024-token context are refused
    # by llama.cpp and fail on transport)
    assert samples(page, failures) - samples(page, failures, check="transport") > 0
