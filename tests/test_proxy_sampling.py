"""Live-traffic degeneracy sampling in the proxy, against the engine simulator's faults.

The official openai client sends chat and completion requests, streamed and not, through the
real proxy to the simulator; the simulator's ``degenerate`` faults make its replies empty,
looping or in the wrong script, and the proxy's /metrics must count each signal for the
model version that produced it.
"""

from __future__ import annotations

import asyncio
import contextlib
import math
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import openai
import pytest
from click.testing import CliRunner

import support.scripted_engine as harness
from inferwatch.probes import client as probe_client
from inferwatch.probes import degeneracy, golden
from inferwatch.probes.livesample import LIVE_SIGNALS
from inferwatch.proxy import config as proxy_config
from inferwatch.proxy.app import ProxyApp
from inferwatch.proxy.assembly import build
from inferwatch.proxy.cli import proxy as proxy_command
from inferwatch.proxy.sampling import TranscribingMeter, prompt_text
from inferwatch.proxy.tenants import hash_key
from inferwatch.sim.server import run_in_thread
from inferwatch.sim.simulator import SimConfig
from support.proxy_stack import samples

pytestmark = pytest.mark.unit

MODEL = "sim-model"
ADMIN = "admin-token"
SAMPLED = "inferwatch_quality_sampled_outputs_total"
DEGENERATE = "inferwatch_quality_degenerate_outputs_total"
QUESTION = [{"role": "user", "content": "What is the capital of France?"}]


class Stack:
    def __init__(self, sim: Any, loop: Any, rate: float) -> None:
        self.sim = sim
        document = {
            "upstream": {"url": sim.url, "reconcile_interval": 0},
            # Trusted, so the probe client's tenant header is read (and, as it names the
            # reserved tenant _probe, never honoured: the probe is resolved by its key).
            "identity": {"trusted_sources": ["127.0.0.1/32"]},
            # the probe tenant is only ever resolved from a key, never from the header
            "tenants": {
                "acme": {"key_sha256": [hash_key("sk-acme")]},
                "_probe": {"key_sha256": [hash_key("sk-probe")]},
            },
            "quality_sampling": {"rate": rate},
            "prices": {"default": {"prompt": 1.0, "completion": 2.0}},
        }
        self.server = harness.ProxyServer(loop, ProxyApp(build(proxy_config.parse(document))))
        self.url = self.server.url

    def client(self, version: str) -> openai.OpenAI:
        return openai.OpenAI(
            base_url=self.url + "/v1",
            api_key="sk-acme",
            max_retries=0,
            timeout=30,
            default_headers={"x-model-version": version},
        )

    def traffic(self, version: str) -> None:
        """A non-streamed and a streamed chat, and a streamed completion: three responses."""
        with self.client(version) as api:
            api.chat.completions.create(model=MODEL, messages=QUESTION, max_tokens=64)
            for _ in api.chat.completions.create(
                model=MODEL, messages=QUESTION, max_tokens=64, stream=True
            ):
                pass
            for _ in api.completions.create(
                model=MODEL, prompt="What is the capital of France?", max_tokens=64, stream=True
            ):
                pass

    def metrics(self) -> str:
        return httpx.get(self.server.metrics_url + "/metrics").text

    def faults(self, document: dict[str, Any] | None) -> None:
        method = "POST" if document is not None else "DELETE"
        response = httpx.request(
            method,
            self.sim.url + "/admin/faults",
            json=document,
            headers={"authorization": f"Bearer {ADMIN}"},
        )
        response.raise_for_status()


@contextlib.contextmanager
def _stacks() -> Iterator[dict[float, Stack]]:
    sim = run_in_thread(
        SimConfig(port=0, speed=200, served_model_names=(MODEL,), admin_token=ADMIN)
    )
    loop = harness.LoopThread()
    stacks = {rate: Stack(sim, loop, rate) for rate in (1.0, 0.0)}
    try:
        yield stacks
    finally:
        for stack in stacks.values():
            stack.server.stop()
        loop.close()
        sim.stop()


@pytest.fixture(scope="module")
def stacks() -> Iterator[dict[float, Stack]]:
    with _stacks() as made:
        yield made


def test_healthy_traffic_is_sampled_and_fires_nothing(stacks: dict[float, Stack]) -> None:
    stack = stacks[1.0]
    stack.traffic("healthy")
    page = stack.metrics()
    assert samples(page, SAMPLED, model=MODEL, model_version="healthy") == 3
    for signal in LIVE_SIGNALS:  # zero series exist so that rate() works from the start
        assert f'signal="{signal}"' in page
        assert samples(page, DEGENERATE, model_version="healthy", signal=signal) == 0


@pytest.mark.parametrize("mode", ["repetition", "empty", "wrong_script"])
def test_each_degenerate_fault_raises_its_signal_for_its_version(
    stacks: dict[float, Stack], mode: str
) -> None:
    stack = stacks[1.0]
    stack.faults({"degenerate": mode})
    try:
        stack.traffic(f"broken-{mode}")
    finally:
        stack.faults(None)
    page = stack.metrics()
    version = f"broken-{mode}"
    assert samples(page, SAMPLED, model=MODEL, model_version=version) == 3
    for signal in LIVE_SIGNALS:
        expected = 3 if signal == mode else 0
        assert samples(page, DEGENERATE, model_version=version, signal=signal) == expected
    # other versions are not charged with this version's faults
    assert samples(page, DEGENERATE, model_version="healthy", signal=mode) == 0


def test_rate_zero_samples_nothing(stacks: dict[float, Stack]) -> None:
    stack = stacks[0.0]
    stack.faults({"degenerate": "empty"})
    try:
        stack.traffic("unsampled")
    finally:
        stack.faults(None)
    page = stack.metrics()
    assert f"# HELP {SAMPLED} " in page  # served, empty
    assert samples(page, SAMPLED) == 0 and samples(page, DEGENERATE) == 0
    assert samples(page, "inferwatch_tenancy_requests_total", model_version="unsampled") == 3


def test_the_probe_tenant_is_never_sampled_and_costs_nothing(stacks: dict[float, Stack]) -> None:
    stack = stacks[1.0]
    endpoint = probe_client.Endpoint(
        url=stack.url, model=MODEL, api_key="sk-probe", headers={"x-model-version": "p"}
    )
    probe = golden.load().probes[0]

    async def run_probes() -> list[Any]:
        async with httpx.AsyncClient() as http:
            return [await probe_client.send(http, endpoint, probe, 10) for _ in range(3)]

    stack.faults({"degenerate": "empty"})
    try:
        replies = asyncio.run(run_probes())
    finally:
        stack.faults(None)
    assert [reply.error for reply in replies] == ["", "", ""]
    page = stack.metrics()
    assert samples(page, "inferwatch_tenancy_requests_total", tenant="_probe") == 3
    assert samples(page, "inferwatch_tenancy_tokens_total", tenant="_probe") > 0
    assert samples(page, "inferwatch_tenancy_cost_total", tenant="_probe") == 0
    stack.client("priced").chat.completions.create(model=MODEL, messages=QUESTION, max_tokens=8)
    priced = samples(stack.metrics(), "inferwatch_tenancy_cost_total", model_version="priced")
    assert priced > 0, "the price table is in effect for customers"
    assert samples(page, SAMPLED, model_version="p") == 0
    assert samples(page, DEGENERATE, model_version="p") == 0


def test_collection_is_bounded_and_dropped_after_taking() -> None:
    meter = TranscribingMeter(10, prompt_text({"messages": QUESTION}))
    piece = "word " * 1000
    for _ in range(3):
        meter.observe({"choices": [{"index": 0, "delta": {"content": piece}}]})
    meter.observe({"choices": [{"index": 1, "delta": {"content": "another choice"}}]})
    prompt, completion, has_tool_call = meter.take()
    assert prompt == QUESTION[0]["content"]
    assert completion == (piece * 3)[: degeneracy.MAX_CHARS] and not has_tool_call
    assert meter.take() == ("", "", False)
    # the meter still meters every choice in full
    assert meter.usage().completion == math.ceil((3 * len(piece) + len("another choice")) / 4)


def test_a_tool_call_reply_is_not_empty() -> None:
    meter = TranscribingMeter(10, "weather in Paris?")
    call = {"id": "c1", "type": "function", "function": {"name": "weather", "arguments": "{}"}}
    meter.observe(
        {
            "choices": [
                {
                    "index": 0,
                    "message": {"role": "assistant", "content": None, "tool_calls": [call]},
                }
            ]
        }
    )
    assert meter.take() == ("weather in Paris?", "", True)


def test_prompt_text_is_the_last_user_message_or_the_prompt() -> None:
    messages = [
        {"role": "system", "content": "Be brief."},
        {"role": "user", "content": [{"type": "text", "text": "Bonjour"}]},
        {"role": "assistant", "content": "Salut"},
        {"role": "user", "content": "Et ensuite ?"},
    ]
    assert prompt_text({"messages": messages}) == "Et ensuite ?"
    assert prompt_text({"prompt": ["first", "second"]}) == "first"
    assert prompt_text({"prompt": [1, 2, 3]}) == ""


@pytest.mark.parametrize("rate", [1.5, -0.1, "1%", True])
def test_a_bad_rate_is_a_one_line_error(tmp_path: Path, rate: Any) -> None:
    path = tmp_path / "proxy.yaml"
    path.write_text(f"quality_sampling: {{rate: {rate!r}}}\n".replace("'", '"'))
    with pytest.raises(proxy_config.ConfigError) as caught:
        proxy_config.load(path)
    assert str(caught.value).startswith(f"{path}: quality_sampling.rate: expected a number")
    result = CliRunner().invoke(proxy_command, ["--config", str(path)])
    assert result.exit_code == 2
    assert result.output.strip().splitlines() == [f"Error: {caught.value}"]


def test_sampling_defaults_to_one_percent() -> None:
    assert proxy_config.parse({}).quality_sample_rate == 0.01
    assert proxy_config.parse({"quality_sampling": None}).quality_sample_rate == 0.01
