"""The proxy over real HTTP against a scriptable engine: accounting, admission, bad input."""

from __future__ import annotations

import json
import logging
import socket
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest
from prometheus_client.parser import text_string_to_metric_families

import support.scripted_engine as se
from inferwatch.proxy import config as proxy_config
from inferwatch.proxy.app import ProxyApp
from inferwatch.proxy.assembly import build
from inferwatch.proxy.tenants import hash_key
from support.proxy_stack import CHAT, KEYS, auth, samples
from support.wait import wait_for

pytestmark = pytest.mark.proc


def chat(content: str = "hello there", **extra: Any) -> dict[str, Any]:
    return {
        "model": "m",
        "messages": [{"role": "user", "content": content}],
        "max_tokens": 6,
        **extra,
    }


@pytest.fixture
def engine(loop: Any) -> Iterator[Any]:
    engine = se.Engine()
    server, port = loop.run(lambda: se.start_engine(engine))
    engine.url = f"http://127.0.0.1:{port}"
    yield engine

    async def close() -> None:
        server.close()

    loop.run(close)


class Stack:
    def __init__(self, loop: Any, engine: Any, overrides: dict[str, Any]) -> None:
        document: dict[str, Any] = {
            "upstream": {"url": engine.url, "reconcile_interval": 0, "read_timeout": 2},
            "tenants": {name: {"key_sha256": [hash_key(key)]} for name, key in KEYS.items()},
            "prices": {"default": {"prompt": 1.0, "cached_prompt": 0.5, "completion": 2.0}},
        }
        for section, values in overrides.items():
            if isinstance(values, dict) and isinstance(document.get(section), dict):
                document[section] = {**document[section], **values}
            else:
                document[section] = values
        self.app = ProxyApp(build(proxy_config.parse(document, "test.yaml")))
        self.server = se.ProxyServer(loop, self.app)
        self.url = self.server.url
        self.engine = engine
        self.client = httpx.Client(base_url=self.url, timeout=10)

    def metrics(self) -> str:
        return httpx.get(self.server.metrics_url + "/metrics", timeout=10).text

    def close(self) -> None:
        self.client.close()
        self.server.stop()


@pytest.fixture
def stack(loop: Any, engine: Any) -> Iterator[Callable[..., Stack]]:
    made: list[Stack] = []

    def make(**overrides: Any) -> Stack:
        made.append(Stack(loop, engine, overrides))
        return made[-1]

    yield make
    for item in made:
        item.close()


class _Records(logging.Handler):
    def __init__(self) -> None:
        super().__init__(logging.INFO)
        self.lines: list[dict[str, Any]] = []

    def emit(self, record: logging.LogRecord) -> None:
        self.lines.append(record.inferwatch_fields)  # type: ignore[attr-defined]


@pytest.fixture
def access_log() -> Iterator[_Records]:
    """The proxy's access-log events, whatever logging setup earlier tests left behind."""
    logger = logging.getLogger("inferwatch.proxy.access")
    records = _Records()
    logger.addHandler(records)
    logger.setLevel(logging.INFO)
    yield records
    logger.removeHandler(records)
    logger.setLevel(logging.NOTSET)


def test_non_streamed_usage_is_charged_with_cost_and_versions(
    stack: Callable[..., Stack], access_log: _Records
) -> None:
    proxy = stack(versions={"engine_version": "0.33.0"})
    reply = proxy.client.post(
        CHAT,
        json=chat(),
        headers=auth("acme", **{"x-model-version": "rev-7", "x-prompt-version": "p3"}),
    )
    assert reply.status_code == 200
    usage = reply.json()["usage"]
    text = proxy.metrics()
    who = {
        "tenant": "acme",
        "model": "m",
        "model_version": "rev-7",
        "engine_version": "0.33.0",
        "prompt_version": "p3",
        "usage_source": "reported",
    }
    tokens = "inferwatch_tenancy_tokens_total"
    assert samples(text, tokens, token_type="prompt", **who) == usage["prompt_tokens"]
    assert (
        samples(text, tokens, token_type="cached_prompt", **who)
        == usage["prompt_tokens_details"]["cached_tokens"]
    )
    assert samples(text, tokens, token_type="completion", **who) == usage["completion_tokens"]
    cached = usage["prompt_tokens_details"]["cached_tokens"]
    expected_cost = (
        (usage["prompt_tokens"] - cached) * 1.0 + cached * 0.5 + usage["completion_tokens"] * 2.0
    ) / 1e6
    assert samples(text, "inferwatch_tenancy_cost_total", **who) == pytest.approx(expected_cost)
    # the engine never sees the tenant's key nor the version headers
    seen = proxy.engine.headers_seen[-1]
    assert "authorization" not in seen and "x-model-version" not in seen
    line = access_log.lines[-1]
    assert line["tenant"] == "acme" and line["model_version"] == "rev-7"
    assert line["prompt_version"] == "p3" and line["engine_version"] == "0.33.0"
    assert line["prompt_tokens"] == usage["prompt_tokens"] and line["status"] == 200
    assert line["cost"] == pytest.approx(expected_cost)


@pytest.mark.parametrize("client_asks", [False, True])
def test_streams_force_usage_and_strip_it_unless_asked(
    stack: Callable[..., Stack], client_asks: bool
) -> None:
    proxy = stack()
    body = chat(stream=True, **({"stream_options": {"include_usage": True}} if client_asks else {}))
    with proxy.client.stream("POST", CHAT, json=body, headers=auth("acme")) as reply:
        raw = reply.read().decode()
    events = [line[6:] for line in raw.split("\n\n") if line.startswith("data: ")]
    assert events[-1] == "[DONE]"
    frames = [json.loads(e) for e in events[:-1]]
    usage_frames = [f for f in frames if not f["choices"]]
    assert len(usage_frames) == (1 if client_asks else 0)
    assert proxy.engine.requests[-1]["stream_options"]["include_usage"] is True
    text = proxy.metrics()
    assert (
        samples(
            text,
            "inferwatch_tenancy_tokens_total",
            tenant="acme",
            token_type="completion",
            usage_source="reported",
        )
        == 6
    )
    assert samples(text, "inferwatch_tenancy_time_to_first_token_seconds_count", tenant="acme") == 1


def test_cumulative_usage_on_every_frame_is_not_double_counted(
    stack: Callable[..., Stack],
) -> None:
    proxy = stack(upstream={"continuous_usage": True})
    with proxy.client.stream(
        "POST", CHAT, json=chat(stream=True, max_tokens=9), headers=auth("acme")
    ) as reply:
        reply.read()
    assert proxy.engine.requests[-1]["stream_options"]["continuous_usage_stats"] is True
    text = proxy.metrics()
    assert samples(text, "inferwatch_tenancy_tokens_total", token_type="completion") == 9
    assert samples(text, "inferwatch_tenancy_tokens_total", token_type="prompt") == (
        se.prompt_tokens(proxy.engine.requests[-1])
    )


def test_a_response_without_usage_is_estimated_and_labelled(stack: Callable[..., Stack]) -> None:
    proxy = stack()
    for stream in (False, True):
        reply = proxy.client.post(
            CHAT,
            json=chat("x" * 40, stream=stream),
            headers=auth("acme", **{"x-scenario": "no_usage"}),
        )
        assert reply.status_code == 200
    text = proxy.metrics()
    estimated = {"tenant": "acme", "usage_source": "estimated"}
    # 6 tokens of "tok " = 24 characters -> 6 tokens either way; 40 characters -> 10 + framing
    assert (
        samples(text, "inferwatch_tenancy_tokens_total", token_type="completion", **estimated) == 12
    )
    assert samples(
        text, "inferwatch_tenancy_tokens_total", token_type="prompt", **estimated
    ) == 2 * (3 + 4 + 10)
    assert (
        samples(
            text, "inferwatch_tenancy_accounted_requests_total", accounting="complete", **estimated
        )
        == 2
    )


@pytest.mark.parametrize("scenario", ["malformed", "cut"])
def test_a_broken_upstream_stream_ends_with_an_error_event_and_is_charged(
    stack: Callable[..., Stack], scenario: str
) -> None:
    proxy = stack(upstream={"continuous_usage": True})
    with proxy.client.stream(
        "POST", CHAT, json=chat(stream=True), headers=auth("acme", **{"x-scenario": scenario})
    ) as reply:
        raw = reply.read().decode()
    assert reply.status_code == 200  # headers were sent before the engine broke
    last = json.loads(raw.strip().split("\n\n")[-1][6:])
    assert "engine stream failed" in last["error"]["message"]
    text = proxy.metrics()
    assert (
        samples(
            text,
            "inferwatch_tenancy_accounted_requests_total",
            tenant="acme",
            accounting="error",
            usage_source="reported",
        )
        == 1
    )
    assert samples(text, "inferwatch_tenancy_tokens_total", token_type="completion") == 2
    reason = "malformed_stream" if scenario == "malformed" else "reset"
    assert samples(text, "inferwatch_tenancy_upstream_errors_total", reason=reason) == 1
    # the proxy stays usable afterwards
    assert proxy.client.post(CHAT, json=chat(), headers=auth("acme")).status_code == 200


def test_client_disconnect_mid_stream_charges_tokens_so_far_and_aborts_the_engine(
    stack: Callable[..., Stack],
) -> None:
    proxy = stack(upstream={"continuous_usage": True})
    with proxy.client.stream(
        "POST",
        CHAT,
        json=chat(stream=True, max_tokens=200),
        headers=auth("acme", **{"x-scenario": "slow_stream"}),
    ) as reply:
        lines = reply.iter_lines()
        received = sum(1 for _, line in zip(range(10), lines, strict=False) if line)
    assert received == 5  # five events (each followed by a blank line) before walking away
    wait_for(lambda: proxy.engine.aborted, "the engine to see the request aborted", 5)
    assert proxy.engine.aborted == 1
    generated = proxy.engine.generation_total
    assert generated < 200
    text = proxy.metrics()
    cancelled = {"tenant": "acme", "usage_source": "reported"}
    assert (
        samples(
            text,
            "inferwatch_tenancy_accounted_requests_total",
            accounting="client_cancelled",
            **cancelled,
        )
        == 1
    )
    charged = samples(text, "inferwatch_tenancy_tokens_total", token_type="completion", **cancelled)
    # charged: every token that reached the proxy, at least the five the client saw; the
    # engine notices the closed connection a write or two later, like vLLM does
    assert 5 <= charged <= generated <= charged + 3
    assert samples(text, "inferwatch_tenancy_requests_total", outcome="client_cancelled") == 1


def test_slow_and_dead_upstreams_give_clear_errors(stack: Callable[..., Stack]) -> None:
    proxy = stack(upstream={"read_timeout": "1500ms"})  # well under the scripted 5 s stall
    assert proxy.client.post(CHAT, json=chat(), headers=auth("acme")).status_code == 200
    # on the pooled connection the first request left behind: a timeout is not retried
    reply = proxy.client.post(
        CHAT, json=chat(), headers=auth("acme", **{"x-scenario": "slow_headers"})
    )
    assert reply.status_code == 504
    assert "no response headers" in reply.json()["error"]["message"]
    slow = [h for h in proxy.engine.headers_seen if h.get("x-scenario") == "slow_headers"]
    assert len(slow) == 1
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        dead = sock.getsockname()[1]
    dead_proxy = stack(upstream={"url": f"http://127.0.0.1:{dead}"})
    reply = dead_proxy.client.post(CHAT, json=chat(), headers=auth("acme"))
    assert reply.status_code == 502
    assert "engine request failed" in reply.json()["error"]["message"]
    text = dead_proxy.metrics()
    assert samples(text, "inferwatch_tenancy_requests_total", outcome="upstream_error") == 1
    assert samples(text, "inferwatch_tenancy_upstream_errors_total", reason="connect") == 1
    assert dead_proxy.client.get("/readyz").status_code == 503
    assert dead_proxy.client.get("/healthz").status_code == 200
    # the timed-out request reached the engine: its prompt is charged, marked as an error
    assert (
        samples(
            proxy.metrics(),
            "inferwatch_tenancy_accounted_requests_total",
            accounting="error",
            usage_source="estimated",
        )
        == 1
    )


def test_bad_requests_are_refused_before_the_engine(stack: Callable[..., Stack]) -> None:
    proxy = stack(limits={"max_body_bytes": 4096, "max_input_tokens": 50})
    client = proxy.client
    not_json = client.post(CHAT, content=b"{nope", headers=auth("acme"))
    assert not_json.status_code == 400 and "not JSON" in not_json.json()["error"]["message"]
    huge = client.post(CHAT, content=b"x" * 10_000, headers=auth("acme"))
    assert huge.status_code == 413
    too_long = client.post(CHAT, json=chat("word " * 100), headers=auth("globex"))
    assert too_long.status_code == 400
    assert "over this endpoint's limit of 50 input tokens" in too_long.json()["error"]["message"]
    # the engine was only asked to count the over-long prompt (the bound says up to 509)
    assert proxy.engine.requests == [{"model": "m", "messages": chat("word " * 100)["messages"]}]
    text = proxy.metrics()
    assert (
        samples(
            text, "inferwatch_tenancy_requests_total", tenant="globex", outcome="rejected_too_long"
        )
        == 1
    )
    assert (
        samples(
            text, "inferwatch_tenancy_requests_total", tenant="acme", outcome="rejected_bad_request"
        )
        == 2
    )


def test_unknown_keys_are_rejected_or_attributed_by_policy(stack: Callable[..., Stack]) -> None:
    strict = stack()
    assert strict.client.post(CHAT, json=chat()).status_code == 401
    bad_key = strict.client.post(CHAT, json=chat(), headers={"authorization": "Bearer sk-x"})
    assert bad_key.status_code == 401 and "not known" in bad_key.json()["error"]["message"]
    lenient = stack(identity={"unknown": "attribute"})
    assert lenient.client.post(CHAT, json=chat()).status_code == 200
    assert samples(lenient.metrics(), "inferwatch_tenancy_tokens_total", tenant="unknown") > 0


def test_tenant_header_is_honoured_only_from_trusted_sources(stack: Callable[..., Stack]) -> None:
    untrusted = stack(identity={"trusted_sources": ["10.0.0.0/8"]})
    reply = untrusted.client.post(
        CHAT, json=chat(), headers=auth("acme", **{"x-inferwatch-tenant": "globex"})
    )
    assert reply.status_code == 200
    text = untrusted.metrics()
    assert samples(text, "inferwatch_tenancy_tokens_total", tenant="globex") == 0
    assert samples(text, "inferwatch_tenancy_tokens_total", tenant="acme") > 0
    assert "x-inferwatch-tenant" not in untrusted.engine.headers_seen[-1]
    trusted = stack(identity={"trusted_sources": ["127.0.0.1/32"]})
    reply = trusted.client.post(CHAT, json=chat(), headers={"x-inferwatch-tenant": "team-blue"})
    assert reply.status_code == 200
    assert samples(trusted.metrics(), "inferwatch_tenancy_tokens_total", tenant="team-blue") > 0


def test_x_forwarded_for_does_not_make_a_local_client_trusted(
    stack: Callable[..., Stack],
) -> None:
    proxy = stack(identity={"trusted_sources": ["10.0.0.0/8"]})
    spoofed = {"x-inferwatch-tenant": "globex", "x-forwarded-for": "10.1.2.3"}
    headers = auth("acme", **spoofed)
    assert proxy.client.post(CHAT, json=chat(), headers=headers).status_code == 200
    text = proxy.metrics()
    assert samples(text, "inferwatch_tenancy_tokens_total", tenant="globex") == 0
    assert samples(text, "inferwatch_tenancy_tokens_total", tenant="acme") > 0


def test_budgets_refuse_with_retry_after_once_spent(stack: Callable[..., Stack]) -> None:
    # each request reserves 19 prompt tokens (the byte bound) + 6 max_tokens and uses 19
    proxy = stack(
        tenants={
            "acme": {
                "key_sha256": [hash_key(KEYS["acme"])],
                "budget": {"tokens": 60, "window": "1h"},
            },
            "globex": {"key_sha256": [hash_key(KEYS["globex"])]},
        },
        limits={"over_budget": "reject"},
    )
    statuses = [proxy.client.post(CHAT, json=chat(), headers=auth("acme")) for _ in range(3)]
    assert [r.status_code for r in statuses[:2]] == [200, 200]
    refused = statuses[2]
    assert refused.status_code == 429
    assert 1 <= int(refused.headers["retry-after"]) <= 3600
    assert "budget" in refused.json()["error"]["message"]
    assert proxy.client.post(CHAT, json=chat(), headers=auth("globex")).status_code == 200
    text = proxy.metrics()
    assert (
        samples(text, "inferwatch_tenancy_requests_total", tenant="acme", outcome="rejected_budget")
        == 1
    )
    used = samples(text, "inferwatch_tenancy_tokens_total", tenant="acme", token_type="prompt")
    used += samples(text, "inferwatch_tenancy_tokens_total", tenant="acme", token_type="completion")
    assert 60 - 25 < used <= 60
    assert samples(text, "inferwatch_tenancy_budget_remaining_tokens", tenant="acme") == 60 - used


def test_a_tenant_at_its_concurrency_cap_cannot_starve_others(
    stack: Callable[..., Stack],
) -> None:
    proxy = stack(
        tenants={
            "acme": {
                "key_sha256": [hash_key(KEYS["acme"])],
                "max_concurrency": 1,
                "priority": "low",
            },
            "globex": {"key_sha256": [hash_key(KEYS["globex"])], "priority": "high"},
        }
    )
    with proxy.client.stream(
        "POST",
        CHAT,
        json=chat(stream=True, max_tokens=50),
        headers=auth("acme", **{"x-scenario": "slow_stream"}),
    ) as slow:
        lines = slow.iter_lines()  # held: a dropped iterator closes the response
        next(lines)
        second = proxy.client.post(CHAT, json=chat(), headers=auth("acme"))
        assert second.status_code == 429 and second.headers["retry-after"] == "1"
        assert proxy.client.post(CHAT, json=chat(), headers=auth("globex")).status_code == 200
        assert sum(1 for line in lines if line) == 50  # the rest of the slow stream, complete
    assert (
        samples(
            proxy.metrics(),
            "inferwatch_tenancy_requests_total",
            tenant="acme",
            outcome="rejected_concurrency",
        )
        == 1
    )


def test_other_paths_pass_through_and_metrics_pass_promtool(
    stack: Callable[..., Stack], promtool: str, tmp_path: Path
) -> None:
    import subprocess

    proxy = stack()
    models = proxy.client.get("/v1/models", headers=auth("acme"))
    assert models.json()["data"][0]["id"] == "m"
    assert proxy.client.get("/v1/models").status_code == 401
    embed = proxy.client.post(
        "/v1/embeddings", json={"model": "m", "input": "abc"}, headers=auth("acme")
    )
    assert embed.status_code == 200
    page = proxy.metrics()
    assert (
        samples(page, "inferwatch_tenancy_tokens_total", token_type="prompt")
        == embed.json()["usage"]["prompt_tokens"]
    )
    (tmp_path / "m.prom").write_text(page)
    check = subprocess.run(
        [promtool, "check", "metrics"], input=page, text=True, capture_output=True
    )
    assert check.returncode == 0, check.stderr
    # query strings reach the engine as sent, on metered and passed-through paths alike
    assert proxy.client.get("/v1/models?limit=2&x=%2F", headers=auth("acme")).status_code == 200
    assert proxy.client.post(CHAT + "?v=1", json=chat(), headers=auth("acme")).status_code == 200
    assert proxy.engine.targets_seen[-2:] == ["/v1/models?limit=2&x=%2F", CHAT + "?v=1"]


def test_reconciliation_drift_is_zero_when_all_traffic_is_metered(
    stack: Callable[..., Stack], loop: Any
) -> None:
    proxy = stack()
    loop.run(proxy.app.reconcile_once)
    for stream in (False, True, False):
        proxy.client.post(CHAT, json=chat("abc " * 20, stream=stream), headers=auth("globex"))
    loop.run(proxy.app.reconcile_once)
    text = proxy.metrics()
    assert samples(text, "inferwatch_tenancy_reconciliation_drift_tokens", token_type="prompt") == 0
    assert (
        samples(text, "inferwatch_tenancy_reconciliation_drift_tokens", token_type="completion")
        == 0
    )
    # traffic that bypasses the proxy shows up as drift
    httpx.post(proxy.engine.url + CHAT, json=chat(max_tokens=4))
    loop.run(proxy.app.reconcile_once)
    assert (
        samples(
            proxy.metrics(),
            "inferwatch_tenancy_reconciliation_drift_tokens",
            token_type="completion",
        )
        == -4
    )


def test_a_client_that_hangs_up_at_done_completed_its_request(
    stack: Callable[..., Stack],
) -> None:
    """Clients close the stream once they read ``[DONE]``; an engine that is slower to end its
    response (here: never) must not turn that complete request into a cancelled one."""
    proxy = stack(upstream={"read_timeout": "1500ms"})
    usage = {"prompt_tokens": 7, "completion_tokens": 2, "total_tokens": 9}
    events = [
        {
            "id": "r",
            "object": "chat.completion.chunk",
            "choices": [{"index": 0, "delta": {"content": c}}],
        }
        for c in ("Hi", "!")
    ] + [{"id": "r", "object": "chat.completion.chunk", "choices": [], "usage": usage}]
    body = b"".join(b"data: " + json.dumps(e).encode() + b"\n\n" for e in events)
    proxy.engine.scripts.append(se.Script(body + b"data: [DONE]\n\n", ending="stall"))
    with proxy.client.stream(
        "POST", CHAT, json=chat(stream=True), headers=auth("acme", **{"x-scenario": "scripted"})
    ) as reply:
        for line in reply.iter_lines():
            if line == "data: [DONE]":
                break  # and hang up, as the openai client does

    def accounted() -> str:
        text = proxy.metrics()
        return text if samples(text, "inferwatch_tenancy_requests_total", tenant="acme") else ""

    text = wait_for(accounted, "the request to be accounted", 10)
    assert samples(text, "inferwatch_tenancy_requests_total", tenant="acme", outcome="ok") == 1
    complete = {"tenant": "acme", "accounting": "complete"}
    assert samples(text, "inferwatch_tenancy_accounted_requests_total", **complete) == 1
    assert (
        samples(text, "inferwatch_tenancy_tokens_total", tenant="acme", token_type="completion")
        == 2
    )


def test_the_gateways_split_labels_requests_tokens_and_cost(stack: Callable[..., Stack]) -> None:
    """x-inferwatch-split becomes the split label, bounded: the gateway's values as they are,
    anything else as other, none (traffic that bypassed the gateway) as unknown."""
    proxy = stack()
    sent = {"weight": 3, "header": 2, "user": 1, "bogus": 2, "x" * 5000: 1, None: 2}
    for value, count in sent.items():
        headers = auth("acme") if value is None else auth("acme", **{"x-inferwatch-split": value})
        for _ in range(count):
            assert proxy.client.post(CHAT, json=chat(), headers=headers).status_code == 200
    text = proxy.metrics()
    requests = {
        split: samples(text, "inferwatch_tenancy_requests_total", tenant="acme", split=split)
        for split in ("weight", "header", "user", "other", "unknown")
    }
    assert requests == {"weight": 3, "header": 2, "user": 1, "other": 3, "unknown": 2}
    splits_seen = {
        family_sample.labels["split"]
        for family in text_string_to_metric_families(text)
        for family_sample in family.samples
        if family_sample.name.startswith("inferwatch_tenancy_") and "split" in family_sample.labels
    }
    assert splits_seen == set(requests)
    for split, count in requests.items():
        tokens = samples(text, "inferwatch_tenancy_tokens_total", split=split, token_type="prompt")
        cost = samples(text, "inferwatch_tenancy_cost_total", split=split)
        assert tokens > 0 and cost > 0, split
        assert (
            samples(text, "inferwatch_tenancy_request_duration_seconds_count", split=split) == count
        )


def test_proxy_serves_metrics_and_readiness_like_every_component(
    stack: Callable[..., Stack],
) -> None:
    """The proxy's listeners answer through the shared exposition module: OpenMetrics and
    gzip by negotiation, /readyz as the same JSON of conditions the sidecar serves."""
    proxy = stack()
    assert proxy.client.post(CHAT, json=chat(), headers=auth("acme")).status_code == 200
    metrics_url = proxy.server.metrics_url + "/metrics"
    plain = httpx.get(metrics_url, timeout=10)
    assert plain.headers["content-type"].startswith("text/plain; version=0.0.4")
    negotiated = httpx.get(
        metrics_url,
        headers={
            "Accept": "application/openmetrics-text; version=1.0.0",
            "Accept-Encoding": "gzip",
        },
        timeout=10,
    )
    assert negotiated.headers["content-type"].startswith("application/openmetrics-text")
    assert negotiated.headers["content-encoding"] == "gzip"
    assert negotiated.text.rstrip().endswith("# EOF")
    assert "inferwatch_tenancy_requests_total" in negotiated.text
    ready = proxy.client.get("/readyz")
    assert ready.status_code == 200
    assert ready.json() == {
        "ready": True,
        "conditions": [{"name": "engine", "ok": True, "reason": ""}],
    }
