"""The official openai client through the proxy against the engine simulator.

Tokens the proxy charges must equal the simulator's own vLLM counters
(``vllm:prompt_tokens_total``, ``vllm:generation_tokens_total``) over the same traffic.
"""

from __future__ import annotations

import contextlib
from collections.abc import Callable, Iterator
from typing import Any

import httpx
import openai
import pytest

import support.scripted_engine as harness
from inferwatch.proxy import config as proxy_config
from inferwatch.proxy.app import ProxyApp
from inferwatch.proxy.assembly import build
from inferwatch.proxy.reconcile import engine_token_counters
from inferwatch.proxy.tenants import hash_key
from inferwatch.sim.server import run_in_thread
from inferwatch.sim.simulator import SimConfig
from support.proxy_stack import samples
from support.wait import wait_for

pytestmark = pytest.mark.unit

MODEL = "sim-model"


@contextlib.contextmanager
def _stack(speed: float) -> Iterator[tuple[Any, Any, Any]]:
    sim = run_in_thread(SimConfig(port=0, speed=speed, served_model_names=(MODEL,)))
    loop = harness.LoopThread()
    config = proxy_config.parse(
        {
            "upstream": {"url": sim.url, "reconcile_interval": 0},
            "tenants": {
                "acme": {"key_sha256": [hash_key("sk-acme")]},
                "globex": {"key_sha256": [hash_key("sk-globex")]},
            },
            "versions": {"engine_version": "sim"},
        }
    )
    proxy = harness.ProxyServer(loop, ProxyApp(build(config)))
    try:
        yield sim, proxy, loop
    finally:
        proxy.stop()
        loop.close()
        sim.stop()


@pytest.fixture(scope="module")
def stack() -> Iterator[tuple[Any, Any, Any]]:
    with _stack(speed=50) as parts:
        yield parts


Client = Callable[[Any, str], openai.OpenAI]


@pytest.fixture
def client() -> Iterator[Client]:
    """Makes a tenant's OpenAI client for a proxy; every one is closed when the test ends."""
    made: list[openai.OpenAI] = []

    def make(proxy: Any, key: str) -> openai.OpenAI:
        made.append(openai.OpenAI(base_url=proxy.url + "/v1", api_key=key, max_retries=0,
                                  timeout=30))  # fmt: skip
        return made[-1]

    yield make
    for each in made:
        each.close()


def test_openai_client_streamed_and_not_reconciles_with_the_engine(
    stack: tuple[Any, Any, str], client: Client
) -> None:
    sim, proxy, loop = stack
    loop.run(proxy.app.reconcile_once)  # baseline before the traffic
    engine_before = engine_token_counters(httpx.get(sim.url + "/metrics").text)
    assert engine_before is not None
    charged_before = proxy.app.parts.metrics.charged.total
    acme, globex = client(proxy, "sk-acme"), client(proxy, "sk-globex")
    messages = [{"role": "user", "content": "What is the capital of France?"}]
    reply = acme.chat.completions.create(model=MODEL, messages=messages, max_tokens=12)
    assert reply.usage is not None and reply.usage.completion_tokens > 0
    streamed_text, usage_chunks = [], 0
    for chunk in globex.chat.completions.create(
        model=MODEL, messages=messages, max_tokens=16, stream=True
    ):
        usage_chunks += chunk.usage is not None
        streamed_text += [c.delta.content or "" for c in chunk.choices]
    assert "".join(streamed_text) and usage_chunks == 0  # forced usage stripped again
    with_usage = list(
        acme.completions.create(
            model=MODEL,
            prompt="Count: 1 2 3",
            max_tokens=8,
            stream=True,
            stream_options={"include_usage": True},
        )
    )
    assert with_usage[-1].usage is not None and with_usage[-1].choices == []
    loop.run(proxy.app.reconcile_once)
    page = httpx.get(proxy.metrics_url + "/metrics").text
    engine_after = engine_token_counters(httpx.get(sim.url + "/metrics").text)
    assert engine_after is not None
    engine_tokens = sum(engine_after.values()) - sum(engine_before.values())
    assert engine_tokens > 0
    assert proxy.app.parts.metrics.charged.total - charged_before == engine_tokens
    for token_type in ("prompt", "completion"):
        assert (
            samples(page, "inferwatch_tenancy_reconciliation_drift_tokens", token_type=token_type)
            == 0
        )
    assert (
        samples(
            page,
            "inferwatch_tenancy_tokens_total",
            tenant="globex",
            usage_source="reported",
            engine_version="sim",
        )
        > 0
    )


def test_openai_client_errors_are_clear(stack: tuple[Any, Any, str], client: Client) -> None:
    _, proxy, _ = stack
    with pytest.raises(openai.AuthenticationError, match="API key is not known"):
        client(proxy, "sk-nobody").chat.completions.create(
            model=MODEL, messages=[{"role": "user", "content": "hi"}]
        )


def test_a_client_that_walks_away_is_still_charged(client: Client) -> None:
    with _stack(speed=1) as (sim, proxy, _):  # real-time decoding: the stream outlives the client
        stream = client(proxy, "sk-acme").chat.completions.create(
            model=MODEL,
            messages=[{"role": "user", "content": "Write a long story."}],
            max_tokens=2000,
            stream=True,
        )
        received = 0
        for chunk in stream:
            received += bool(chunk.choices and chunk.choices[0].delta.content)
            if received == 5:
                break
        stream.close()

        def settled() -> tuple[str, str, float] | None:
            page = httpx.get(proxy.metrics_url + "/metrics").text
            cancelled = samples(
                page, "inferwatch_tenancy_accounted_requests_total", accounting="client_cancelled"
            )
            engine_page = httpx.get(sim.url + "/metrics").text
            aborted = samples(engine_page, "vllm:request_success_total", finished_reason="abort")
            return (page, engine_page, aborted) if cancelled and aborted else None

        page, engine_page, aborted = wait_for(
            settled, "the cancelled request on both metrics pages", 10
        )
        assert aborted == 1  # the proxy cancelled the engine's request
        assert (
            samples(
                page,
                "inferwatch_tenancy_accounted_requests_total",
                tenant="acme",
                accounting="client_cancelled",
                usage_source="estimated",
            )
            == 1
        )
        charged = samples(
            page,
            "inferwatch_tenancy_tokens_total",
            tenant="acme",
            token_type="completion",
            usage_source="estimated",
        )
        generated = samples(engine_page, "vllm:generation_tokens_total")
        # an estimate (one token per streamed piece): within a token or two of the engine's count
        assert charged >= 5 and abs(charged - generated) <= 2 and generated < 2000
