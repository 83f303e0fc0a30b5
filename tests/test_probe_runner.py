"""The probe runner, its metrics and readiness, and the HTTP server, against a fake engine.

The fake engine (an httpx MockTransport) speaks the OpenAI chat-completions streaming
protocol the way vLLM does: SSE frames with deltas, a finish_reason frame, a usage frame
(``stream_options.include_usage``) and ``[DONE]``. End-to-end tests against the simulator
are in test_probe_sim.py.
"""

from __future__ import annotations

import asyncio
import json
import random
from collections.abc import AsyncIterator, Callable
from typing import Any, TypeVar

import httpx
import pytest
from prometheus_client.parser import text_string_to_metric_families
from starlette.testclient import TestClient

from inferwatch import wire
from inferwatch.exporters.collector import MetricSource, ReadinessSource
from inferwatch.probes import client, golden
from inferwatch.probes.runner import ProbeRunner, Schedule, Target
from inferwatch.probes.server import ProbeServer
from inferwatch.probes.verdict import Policy
from support.wait import wait_for, wait_until

pytestmark = [pytest.mark.anyio, pytest.mark.unit]

GOLDENS = golden.load()
FAST = Schedule(cycle_s=0, jitter=0, timeout_s=5, tokens_per_hour=10_000_000)


@pytest.fixture
def anyio_backend() -> str:
    return "asyncio"


class FakeEngine:
    """Answers golden prompts correctly unless ``fault`` says otherwise."""

    def __init__(self, model: str = "llama-test", fingerprint: str = "fp-1") -> None:
        self.model = model
        self.fingerprint = fingerprint
        self.fault = ""
        self.answers = GOLDENS.by_prompt_key()
        self.in_flight = 0
        self.max_in_flight = 0
        self.tenants: list[str | None] = []

    def _content(self, probe: golden.Golden | None, max_tokens: int) -> tuple[str, str]:
        answer = (probe.answer if probe else None) or "I am not sure."
        if self.fault == "empty":
            return "", "stop"
        if self.fault == "repetition":
            return (answer + " ") * max_tokens, "length"
        if self.fault == "wrong_script":
            return "คำตอบ " + answer, "stop"
        if self.fault == "wrong_answer":
            return "I cannot answer that.", "stop"
        return answer, "stop"

    def _frames(self, body: dict[str, Any]) -> list[dict[str, Any]]:
        last_user = [m["content"] for m in body["messages"] if m["role"] == "user"][-1]
        probe = self.answers.get(golden.prompt_key(last_user))
        base = {"id": "c1", "model": self.model, "system_fingerprint": self.fingerprint}
        frames = [{**base, "choices": [{"index": 0, "delta": {"role": "assistant"}}]}]
        if probe and probe.tool_call and body.get("tools") and not self.fault:
            call = {
                "index": 0,
                "id": "t1",
                "type": "function",
                "function": {"name": probe.tool_call.name, "arguments": ""},
            }
            frames.append({**base, "choices": [{"index": 0, "delta": {"tool_calls": [call]}}]})
            args = {"index": 0, "function": {"arguments": probe.tool_call.arguments}}
            frames.append({**base, "choices": [{"index": 0, "delta": {"tool_calls": [args]}}]})
            finish, words = "tool_calls", 8
        else:
            text, finish = self._content(probe, body["max_tokens"])
            words = max(1, len(text.split()))
            for piece in text.split(" ") if text else []:
                frames.append(
                    {**base, "choices": [{"index": 0, "delta": {"content": piece + " "}}]}
                )
        frames.append({**base, "choices": [{"index": 0, "delta": {}, "finish_reason": finish}]})
        frames.append(
            {
                **base,
                "choices": [],
                "usage": {
                    "prompt_tokens": 20,
                    "completion_tokens": words,
                    "total_tokens": 20 + words,
                },
            }
        )
        return frames

    async def handle(self, request: httpx.Request) -> httpx.Response:
        if request.url.path == "/v1/models":
            return httpx.Response(200, json={"object": "list", "data": [{"id": self.model}]})
        self.tenants.append(request.headers.get(wire.TENANT_HEADER))
        if self.fault == "http_503":
            return httpx.Response(503, json={"error": "overloaded"})
        self.in_flight += 1
        self.max_in_flight = max(self.max_in_flight, self.in_flight)
        try:
            await asyncio.sleep(0)
            frames = self._frames(json.loads(request.content))
        finally:
            self.in_flight -= 1
        sse = "".join(f"data: {json.dumps(f)}\n\n" for f in frames) + "data: [DONE]\n\n"
        return httpx.Response(200, text=sse, headers={"content-type": "text/event-stream"})


def _runner(engines: dict[str, FakeEngine], **kwargs: Any) -> ProbeRunner:
    async def route(request: httpx.Request) -> httpx.Response:
        return await engines[request.url.host].handle(request)

    targets = [Target(name, client.Endpoint(f"http://{name}:8000")) for name in engines]
    kwargs.setdefault("schedule", FAST)
    return ProbeRunner(
        GOLDENS,
        targets,
        http=httpx.AsyncClient(transport=httpx.MockTransport(route)),
        rng=random.Random(0),
        **kwargs,
    )


async def _cycles(runner: ProbeRunner, target: Target, n: int) -> None:
    for _ in range(n):
        await runner.run_cycle(target)


def test_runner_is_a_sidecar_collector_and_readiness_source() -> None:
    runner = _runner({"a": FakeEngine()})
    assert isinstance(runner, MetricSource) and isinstance(runner, ReadinessSource)


async def test_healthy_replica_passes_and_marks_probe_traffic() -> None:
    engine = FakeEngine()
    runner = _runner({"a": engine})
    outcomes = await runner.run_cycle(runner.targets[0])
    assert len(outcomes) == len(GOLDENS) and all(o.passed for o in outcomes)
    assert set(engine.tenants) == {"_probe"}
    await _cycles(runner, runner.targets[0], 3)
    key, state, _ = runner.verdict_for(runner.targets[0])
    assert state == "pass" and key is not None and key.model_version == "unknown"
    assert key.model == "llama-test"  # discovered from /v1/models
    assert runner.readiness()[0].ok
    await runner.aclose()


@pytest.mark.parametrize(
    "fault", ["empty", "repetition", "wrong_script", "wrong_answer", "http_503"]
)
async def test_each_fault_fails_the_verdict_within_three_cycles(fault: str) -> None:
    engine = FakeEngine()
    runner = _runner({"a": engine})
    target = runner.targets[0]
    await _cycles(runner, target, 4)
    engine.fault = fault
    states = []
    for _ in range(3):
        await runner.run_cycle(target)
        states.append(runner.verdict_for(target)[1])
    assert "fail" in states, states
    condition = runner.readiness()[0]
    assert condition.name == "quality" and not condition.ok and "a:" in condition.reason
    await runner.aclose()


async def test_one_probe_in_flight_per_target_while_targets_run_in_parallel() -> None:
    engines = {"a": FakeEngine(), "b": FakeEngine()}
    runner = _runner(engines)
    task = asyncio.create_task(runner.run())
    await wait_until(
        lambda: sum(runner.metrics.runs.values()) >= 3 * len(GOLDENS),
        "three probe rounds",
        interval=0.01,
    )
    task.cancel()
    with pytest.raises(asyncio.CancelledError):
        await task
    assert all(e.max_in_flight == 1 for e in engines.values())
    assert all(len(e.tenants) > len(GOLDENS) for e in engines.values())
    await runner.aclose()


async def test_token_budget_skips_probes_and_is_reported() -> None:
    runner = _runner({"a": FakeEngine()}, schedule=Schedule(0, 0, 5, tokens_per_hour=400))
    outcomes = await runner.run_cycle(runner.targets[0])
    assert 0 < len(outcomes) < len(GOLDENS)
    assert runner.metrics.skipped[("a", "budget")] == len(GOLDENS) - len(outcomes)
    await runner.aclose()


async def test_model_version_is_the_deployments_never_the_engines_fingerprint() -> None:
    engine = FakeEngine()
    runner = _runner({"a": engine}, policy=Policy(baseline_cycles=1))
    await _cycles(runner, runner.targets[0], 1)
    engine.fingerprint = "fp-2"  # an engine build id, which may change under one version
    await _cycles(runner, runner.targets[0], 1)
    key, state, _ = runner.verdict_for(runner.targets[0])
    assert key is not None and key.model_version == "unknown" and state == "pass"
    assert [k.model_version for k in runner.verdicts.series()] == ["unknown"]
    await runner.aclose()


def _samples(text: str) -> dict[tuple[str, tuple[tuple[str, str], ...]], float]:
    return {
        (s.name, tuple(sorted(s.labels.items()))): s.value
        for family in text_string_to_metric_families(text)
        for s in family.samples
    }


@pytest.fixture
def served() -> AsyncIterator[tuple[TestClient, dict[str, FakeEngine], ProbeRunner]]:
    engines = {"a": FakeEngine(), "b": FakeEngine()}
    runner = _runner(engines, schedule=Schedule(cycle_s=0.05, jitter=0.2, timeout_s=5))
    server = ProbeServer(runner, {"default": GOLDENS}, http=runner.http)
    with TestClient(server.app()) as test_client:
        yield test_client, engines, runner


_T = TypeVar("_T")


def on_the_servers_loop(test_client: TestClient, read: Callable[[], _T]) -> _T:
    """Read the runner's state where it changes, on the server's loop: from the test's own
    thread a window (a deque) can change while a verdict iterates it."""
    assert test_client.portal is not None
    return test_client.portal.call(read)


def test_server_metrics_readyz_and_quality_failure(
    served: tuple[TestClient, dict[str, FakeEngine], ProbeRunner],
) -> None:
    test_client, engines, runner = served
    assert test_client.get("/healthz").text == "ok\n"
    wait_for(
        lambda: (
            on_the_servers_loop(test_client, lambda: sum(runner.metrics.runs.values()))
            >= 8 * len(GOLDENS)
        ),
        "four probe rounds",
    )
    ready = test_client.get("/readyz")
    assert ready.status_code == 200 and ready.json()["ready"] is True
    samples = _samples(test_client.get("/metrics").text)
    labels = (
        ("model", "llama-test"),
        ("model_version", "unknown"),
        ("route", "direct"),
        ("set", "default"),
        ("target", "a"),
    )
    assert samples[("inferwatch_probe_pass_ratio", labels)] == 1.0
    assert samples[("inferwatch_probe_verdict", tuple(sorted((*labels, ("state", "pass")))))] == 1
    assert any(
        name == "inferwatch_probe_tokens_total" and v > 0 for (name, _), v in samples.items()
    )
    assert any(name == "inferwatch_probe_duration_seconds_count" for name, _ in samples)
    engines["b"].fault = "empty"
    wait_for(
        lambda: (
            on_the_servers_loop(test_client, lambda: runner.verdict_for(runner.targets[1]))[1]
            == "fail"
        ),
        "b's verdict to fail",
    )
    ready = test_client.get("/readyz")
    assert ready.status_code == 503
    quality = next(c for c in ready.json()["conditions"] if c["name"] == "quality")
    assert quality["ok"] is False and quality["reason"].startswith("b:")
    samples = _samples(test_client.get("/metrics").text)
    empty = [
        (k, v)
        for k, v in samples.items()
        if k[0] == "inferwatch_probe_check_failures_total" and ("check", "empty") in k[1]
    ]
    assert empty and all(("target", "b") in k[1] for k, _ in empty)


def test_probe_endpoint_is_blackbox_style(
    served: tuple[TestClient, dict[str, FakeEngine], ProbeRunner],
) -> None:
    test_client, engines, _ = served
    response = test_client.get(
        "/probe",
        params={"target": "http://a:8000", "module": "default"},
        headers={"X-Prometheus-Scrape-Timeout-Seconds": "10"},
    )
    samples = _samples(response.text)
    assert samples[("inferwatch_probe_success", ())] == 1
    assert samples[("inferwatch_probe_result", (("probe", "arith-add"),))] == 1
    assert sum(1 for name, _ in samples if name == "inferwatch_probe_result") == len(GOLDENS)
    engines["a"].fault = "wrong_script"
    response = test_client.get(
        "/probe",
        params=[("target", "http://a:8000"), ("probe", "arith-add"), ("probe", "ja-capital")],
    )
    samples = _samples(response.text)
    assert samples[("inferwatch_probe_success", ())] == 0
    # Thai is a wrong script for the English prompt and for the Japanese one alike.
    assert samples[("inferwatch_probe_request_check_failures", (("check", "wrong_script"),))] == 2
    assert sum(1 for name, _ in samples if name == "inferwatch_probe_result") == 2


@pytest.mark.parametrize(
    ("params", "status", "message"),
    [
        ({"target": "a:8000"}, 400, "not an http(s) URL"),
        ({"target": "http://elsewhere:8000"}, 403, "neither a probed target"),
        ({"target": "http://a:8000", "module": "nope"}, 400, "unknown module"),
        ({"target": "http://a:8000", "probe": "nope"}, 400, "no probes ['nope']"),
    ],
)
def test_probe_endpoint_rejects_bad_requests(
    served: tuple[TestClient, dict[str, FakeEngine], ProbeRunner],
    params: dict[str, str],
    status: int,
    message: str,
) -> None:
    response = served[0].get("/probe", params=params)
    assert response.status_code == status and message in response.text


async def test_an_unreachable_target_is_skipped_and_counted_not_crashed() -> None:
    def refuse(request: httpx.Request) -> httpx.Response:
        raise httpx.ConnectError("connection refused", request=request)

    target = Target("down", client.Endpoint("http://down:8000"))
    runner = ProbeRunner(
        GOLDENS,
        [target],
        schedule=FAST,
        http=httpx.AsyncClient(transport=httpx.MockTransport(refuse)),
    )
    assert await runner.run_cycle(target) == []
    assert runner.metrics.skipped[("down", "discovery")] == len(GOLDENS)
    assert runner.verdict_for(target)[1] == "warming"
    await runner.aclose()
