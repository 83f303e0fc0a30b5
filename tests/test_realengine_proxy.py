"""The tenancy proxy in front of a real vLLM: its limits, its counters, its version.

One vLLM (no extra flags) serves every test; the proxy runs in-process on loopback in front
of it. Reconciliation is driven by hand (``reconcile_interval: 0``), and every wait is for
vLLM's counters to catch up with the replies already received.
"""

from __future__ import annotations

import logging
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from typing import Any

import httpx
import pytest
from prometheus_client.parser import text_string_to_metric_families

import support.scripted_engine as se
from inferwatch.probes.metrics import ProbeMetrics
from inferwatch.probes.verdict import Verdicts
from inferwatch.proxy import config as proxy_config
from inferwatch.proxy.app import ProxyApp
from inferwatch.proxy.assembly import build
from inferwatch.proxy.reconcile import engine_token_counters
from inferwatch.proxy.tenants import hash_key
from inferwatch.serving.endpoints import encode_metrics
from support.proxy_stack import KEYS, auth, samples
from support.realengine import MODEL, Engine, Engines
from support.tinymodel import MAX_MODEL_LEN
from support.wait import wait_for

pytestmark = pytest.mark.realengine

CHAT = "/v1/chat/completions"
COMPLETIONS = "/v1/completions"
#: a budget no test here comes near: admission still reserves, and so still sets caps
LARGE_BUDGET = {"tokens": 10_000_000, "window": "1h"}
#: English words of the docs: the tiny tokenizer was trained on them, about 1 token a word
WORDS = tuple(
    [
        "the",
        "proxy",
        "reserves",
        "what",
        "a",
        "request",
        "may",
        "spend",
        "and",
        "settles",
        "it",
        "when",
        "the",
        "reply",
        "ends",
    ]
)


def words(count: int) -> str:
    return " ".join(WORDS[i % len(WORDS)] for i in range(count))


class RealStack:
    """The proxy, in-process, in front of the real engine; acme unbudgeted, globex budgeted."""

    def __init__(self, loop: se.LoopThread, engine: Engine, **overrides: Any) -> None:
        tenants: dict[str, Any] = {
            "acme": {"key_sha256": [hash_key(KEYS["acme"])]},
            "globex": {"key_sha256": [hash_key(KEYS["globex"])], "budget": LARGE_BUDGET},
        }
        document: dict[str, Any] = {
            "upstream": {"url": engine.url, "reconcile_interval": 0, "read_timeout": 120},
            "tenants": tenants,
            "prices": {"default": {"prompt": 1.0, "completion": 2.0}},
            **overrides,
        }
        self.loop = loop
        self.engine = engine
        self.app = ProxyApp(build(proxy_config.parse(document, "test.yaml"), access_log=False))
        self.server = se.ProxyServer(loop, self.app)
        self.client = httpx.Client(base_url=self.server.url, timeout=120)
        self.direct = httpx.Client(base_url=engine.url, timeout=120)

    def metrics(self) -> str:
        return httpx.get(self.server.metrics_url + "/metrics", timeout=10).text

    def engine_counters(self) -> dict[str, float]:
        counters = engine_token_counters(self.direct.get("/metrics").text)
        assert counters is not None
        return counters

    def charged(self) -> dict[str, float]:
        charged = self.app.parts.metrics.charged
        return {"prompt": charged.prompt, "completion": charged.completion}

    def reconcile(self) -> dict[str, float]:
        self.loop.run(self.app.reconcile_once, timeout=30)
        return dict(self.app.parts.metrics.drift)

    def close(self) -> None:
        self.client.close()
        self.direct.close()
        self.server.stop()


@pytest.fixture(scope="module")
def vllm(engines: Engines) -> Engine:
    return engines.vllm()


@pytest.fixture
def stack(loop: se.LoopThread, vllm: Engine) -> Iterator[Any]:
    made: list[RealStack] = []

    def make(**overrides: Any) -> RealStack:
        made.append(RealStack(loop, vllm, **overrides))
        return made[-1]

    yield make
    for one in made:
        one.close()


def chat(content: str, **extra: Any) -> dict[str, Any]:
    return {"model": MODEL, "messages": [{"role": "user", "content": content}], **extra}


def completion(prompt: str, **extra: Any) -> dict[str, Any]:
    return {"model": MODEL, "prompt": prompt, **extra}


def settled(proxy: RealStack, before: dict[str, float], charged: dict[str, float]) -> bool:
    """vLLM's counters grew by what the proxy charged since ``before``/``charged``."""
    engine, now = proxy.engine_counters(), proxy.charged()
    return all(engine[k] - before[k] == now[k] - charged[k] for k in ("prompt", "completion"))


def test_requests_without_a_cap_or_near_a_bound_are_served_as_vllm_serves_them(
    stack: Any,
) -> None:
    """Finding 1: the reservation follows vLLM's context and the API's defaults, and a byte
    bound over a limit is checked with vLLM's own count before anything is refused."""
    proxy = stack(limits={"max_input_tokens": 900})
    budgeted = auth("globex")
    uncapped = proxy.client.post(CHAT, json=chat("hello there"), headers=budgeted)
    assert uncapped.status_code == 200, uncapped.text  # 4096 was injected: vLLM said 400
    reply = proxy.client.post(COMPLETIONS, json=completion("hello there"), headers=budgeted)
    assert reply.status_code == 200, reply.text
    assert reply.json()["usage"]["completion_tokens"] <= 16  # the API's default, not 4096
    # ~640 tokens of prompt whose byte bound (~2,400) is far over the 900-token input limit
    long = words(400)
    counted = proxy.direct.post("/tokenize", json={"model": MODEL, "prompt": long}).json()
    assert counted["count"] < 900 < len(long.encode())
    reply = proxy.client.post(COMPLETIONS, json=completion(long, max_tokens=4), headers=budgeted)
    assert reply.status_code == 200, reply.text
    # over the limit by vLLM's count too: refused, with the exact count in the reason
    over = proxy.client.post(COMPLETIONS, json=completion(words(1000)), headers=budgeted)
    assert over.status_code == 400
    assert "prompt is " in over.json()["error"]["message"]


def test_a_tight_budget_reserves_what_vllm_may_generate(stack: Any) -> None:
    """Finding 1: a completions request without max_tokens reserves 16, not 4096, and a
    chat prompt's byte bound does not make a budget that fits it refuse it."""
    tight = {"tokens": 400, "window": "1h"}
    tenants = {"globex": {"key_sha256": [hash_key(KEYS["globex"])], "budget": tight}}
    proxy = stack(tenants=tenants, limits={"over_budget": "reject"})
    reply = proxy.client.post(
        COMPLETIONS, json=completion("a short prompt"), headers=auth("globex")
    )
    assert reply.status_code == 200, reply.text
    # about 90 tokens by vLLM's count, over 400 as a byte bound: fits the budget
    body = chat(words(90), max_tokens=8)
    reply = proxy.client.post(CHAT, json=body, headers=auth("globex"))
    assert reply.status_code == 200, reply.text


def test_vllm_limits_are_the_only_ones_an_uncapped_request_meets(stack: Any) -> None:
    """An over-length prompt is vLLM's to refuse: through the proxy it gets vLLM's own 400."""
    proxy = stack()
    body = chat(words(MAX_MODEL_LEN + 50))
    direct = proxy.direct.post(CHAT, json=body)
    through = proxy.client.post(CHAT, json=body, headers=auth("globex"))
    assert direct.status_code == through.status_code == 400
    assert through.json()["error"]["message"] == direct.json()["error"]["message"]


def test_choices_reconcile_with_vllms_prompt_counter(stack: Any) -> None:
    """Finding 4: with n=2 vLLM counts the prompt twice, usage once; the drift stays 0."""
    proxy = stack()
    assert proxy.reconcile() == {"prompt": 0.0, "completion": 0.0}  # the baseline
    before, charged = proxy.engine_counters(), proxy.charged()
    for body in (
        chat("two answers please", n=2, max_tokens=5),
        completion("two answers please", n=2, max_tokens=5),
    ):
        reply = proxy.client.post(
            CHAT if "messages" in body else COMPLETIONS, json=body, headers=auth("acme")
        )
        assert reply.status_code == 200, reply.text
        assert len(reply.json()["choices"]) == 2
    wait_for(lambda: settled(proxy, before, charged), "vLLM's counters to settle", 30)
    assert proxy.reconcile() == {"prompt": 0.0, "completion": 0.0}


def test_engine_version_and_cached_prices_follow_the_engine(
    stack: Any, caplog: pytest.LogCaptureFixture
) -> None:
    """Finding 10: series carry vLLM's version, and a cached rate the engine cannot feed is
    said once, in the log."""
    cached = {"default": {"prompt": 1.0, "cached_prompt": 0.1, "completion": 2.0}}
    proxy = stack(prices=cached)
    version = proxy.direct.get("/version").json()["version"]
    with caplog.at_level(logging.WARNING, logger="inferwatch.proxy"):
        for _ in range(2):
            reply = proxy.client.post(CHAT, json=chat("hi", max_tokens=2), headers=auth("acme"))
            assert reply.status_code == 200, reply.text
    page = proxy.metrics()
    assert samples(page, "inferwatch_tenancy_requests_total", engine_version=version) == 2
    warnings = [r for r in caplog.records if "--enable-prompt-tokens-details" in r.getMessage()]
    assert len(warnings) == 1


#: the completed classes of the mixed load: (tenant, path, body), sent 8 at a time
MIXED = {
    "chat": [("acme", CHAT, chat(words(20 + i), max_tokens=6)) for i in range(8)],
    "chat streamed": [
        ("globex", CHAT, chat(words(10 + i), max_tokens=6, stream=True)) for i in range(8)
    ],
    "chat n=2 streamed, usage asked": [
        (
            "acme",
            CHAT,
            chat(words(12), n=2, max_tokens=4, stream=True, stream_options={"include_usage": True}),
        )
    ]
    * 4,
    "completions without max_tokens": [
        ("globex", COMPLETIONS, completion(words(8 + i))) for i in range(8)
    ],
    "completions n=2": [("globex", COMPLETIONS, completion(words(16), n=2, max_tokens=5))] * 4,
    "completions streamed": [
        ("acme", COMPLETIONS, completion(words(30), max_tokens=7, stream=True))
    ]
    * 8,
    # no max_tokens: vLLM fills the context, about 20 tokens after this prompt
    "chat to the end of the context": [("globex", CHAT, chat(words(990)))] * 2,
    "over-length": [
        ("acme", CHAT, chat(words(MAX_MODEL_LEN + 10), max_tokens=4)),
        ("globex", COMPLETIONS, completion(words(MAX_MODEL_LEN + 10))),
    ],
}
#: cancelled streams: each is dropped after its first events
CANCEL_MAX_TOKENS = 64
CANCELLED = [("acme", CHAT, chat(words(40), max_tokens=CANCEL_MAX_TOKENS, stream=True))] * 8
EVENTS_BEFORE_CANCEL = 3
#: a dropped stream's prompt is counted by vLLM's /tokenize, exactly; vLLM generates on until
#: it sees the connection closed, which the proxy never sees. How far on depends on how busy
#: the machine is (about 10 tokens a stream on a busy 2-core machine, 86 with a core hogged),
#: so the bound is the streams' own: what vLLM may generate past the events the client read
CANCEL_COMPLETION_BOUND = (CANCEL_MAX_TOKENS - EVENTS_BEFORE_CANCEL) * len(CANCELLED)


def _send(proxy: RealStack, tenant: str, path: str, body: dict[str, Any]) -> tuple[int, str]:
    """Status and body text through the proxy; a stream is read to its end."""
    with proxy.client.stream("POST", path, json=body, headers=auth(tenant)) as reply:
        return reply.status_code, reply.read().decode()


def _cancel(proxy: RealStack, tenant: str, path: str, body: dict[str, Any]) -> None:
    with proxy.client.stream("POST", path, json=body, headers=auth(tenant)) as reply:
        assert reply.status_code == 200
        events = 0
        for line in reply.iter_lines():
            events += line.startswith("data: ")
            if events == EVENTS_BEFORE_CANCEL:
                return  # leaving the block closes the connection mid-stream


def test_a_mixed_load_reconciles_with_vllms_counters(stack: Any) -> None:
    """The acceptance load: every completed class charges exactly what vLLM counted, no
    request vLLM serves fails through the proxy, the drift settles within 1 % of the
    traffic, and cancelled streams are charged within the bounds stated above: their prompts
    exactly, so that over all of it, cancellations included, the prompt drift is 0."""
    proxy = stack()
    assert proxy.reconcile() == {"prompt": 0.0, "completion": 0.0}
    start = proxy.engine_counters()
    with ThreadPoolExecutor(8) as pool:
        for name, requests in MIXED.items():
            before, charged = proxy.engine_counters(), proxy.charged()
            replies = list(pool.map(lambda r: _send(proxy, *r), requests))
            for (_, path, body), (status, text) in zip(requests, replies, strict=True):
                if status != 200:  # only what vLLM refuses itself may fail
                    direct = proxy.direct.post(path, json=body)
                    assert direct.status_code == status, f"{name}: {status} {text}"
            done = lambda b=before, c=charged: settled(proxy, b, c)  # noqa: E731
            wait_for(done, f"{name}: counters equal", 60)
        drift = proxy.reconcile()
        traffic = sum(proxy.engine_counters()[k] - start[k] for k in ("prompt", "completion"))
        assert abs(sum(drift.values())) <= 0.01 * traffic, (drift, traffic)
        before, charged = proxy.engine_counters(), proxy.charged()
        finished = sum(_outcomes(proxy).values()) + len(CANCELLED)
        list(pool.map(lambda r: _cancel(proxy, *r), CANCELLED))
        # a request is counted by outcome once it has been charged
        wait_for(
            lambda: sum(_outcomes(proxy).values()) == finished,
            lambda: f"cancelled requests to be charged: {_outcomes(proxy)}",
            60,
        )
    engine = wait_for(lambda: _grown(proxy, before), "vLLM to count the cancelled requests")
    now = proxy.charged()
    prompt, generated = (engine[k] - before[k] for k in ("prompt", "completion"))
    assert now["prompt"] - charged["prompt"] == prompt
    assert abs(now["completion"] - charged["completion"] - generated) <= CANCEL_COMPLETION_BOUND
    drift = proxy.reconcile()
    traffic = sum(engine[k] - start[k] for k in ("prompt", "completion"))
    logging.getLogger(__name__).info("drift %s on %s tokens", drift, traffic)
    # the prompt drift over everything is none; the completion's is what vLLM generated for
    # clients already gone, which no reply carried
    assert drift["prompt"] == 0, (drift, traffic)
    assert abs(drift["completion"]) <= 0.01 * traffic + CANCEL_COMPLETION_BOUND, (drift, traffic)


def _outcomes(proxy: RealStack) -> dict[str, float]:
    """The proxy's requests by outcome."""
    found: dict[str, float] = {}
    for family in text_string_to_metric_families(proxy.metrics()):
        for sample in family.samples:
            if sample.name == "inferwatch_tenancy_requests_total":
                outcome = sample.labels["outcome"]
                found[outcome] = found.get(outcome, 0.0) + sample.value
    return found


def _grown(proxy: RealStack, before: dict[str, float]) -> dict[str, float] | None:
    """vLLM's counters once it has aborted every dropped stream."""
    page = proxy.direct.get("/metrics").text
    engine = engine_token_counters(page)
    assert engine is not None
    running = samples(page, "vllm:num_requests_running")
    return engine if running == 0 and engine["completion"] > before["completion"] else None


def test_a_probe_runner_restarted_between_reads_leaves_no_drift(
    stack: Any, page_server: Any, vllm: Engine
) -> None:
    """Finding 5: a probe runner restarts and, by the next read, its new counters have passed
    the old total; the creation time of its counters says it restarted, so the drift is 0."""

    def serve(runner: ProbeMetrics) -> None:
        page_server.page, _ = encode_metrics(runner.families(Verdicts(golden_ids=()), 1.0), "", "")

    def probe_directly(runner: ProbeMetrics, requests: int) -> None:
        """``requests`` probes straight to vLLM, counted on ``runner`` as a runner counts."""
        before = proxy.engine_counters()
        sent = {"prompt": 0, "completion": 0}
        for _ in range(requests):
            usage = proxy.direct.post(COMPLETIONS, json=completion("a probe", max_tokens=3))
            for token_type in sent:
                sent[token_type] += usage.json()["usage"][f"{token_type}_tokens"]
        for token_type, n in sent.items():
            runner.tokens[("replica", "direct", MODEL, "v1", token_type)] += n
        wait_for(lambda: all(proxy.engine_counters()[k] - before[k] == sent[k] for k in sent),
                 "vLLM to count the probes")  # fmt: skip
        serve(runner)

    proxy = stack(upstream={"url": vllm.url, "reconcile_interval": 0, "read_timeout": 120,
                            "probe_metrics": [f"{page_server.url}/page"]})  # fmt: skip
    first = ProbeMetrics("default")
    serve(first)
    assert proxy.reconcile() == {"prompt": 0.0, "completion": 0.0}  # the baseline
    probe_directly(first, 2)
    assert proxy.reconcile() == {"prompt": 0.0, "completion": 0.0}
    restarted = ProbeMetrics("default")  # a new process: its counters begin again
    restarted.tokens_since = first.tokens_since + 60
    probe_directly(restarted, 5)  # more than the old runner's total before the next read
    assert proxy.reconcile() == {"prompt": 0.0, "completion": 0.0}
    probe_directly(restarted, 1)
    assert proxy.reconcile() == {"prompt": 0.0, "completion": 0.0}
