"""Hostile input over real HTTP: pathological JSON both ways, label floods, slow clients."""

from __future__ import annotations

import contextlib
import json
import math
import socket
import time
from collections.abc import Callable
from typing import Any

import httpx
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

import support.scripted_engine as se
from support.proxy_stack import CHAT, Engine, Stack, auth, samples
from support.wait import wait_for

pytestmark = pytest.mark.unit

MakeStack = Callable[..., Stack]
SLOW = settings(
    max_examples=40,
    deadline=None,
    suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.too_slow],
)


def settle(proxy: Stack) -> None:
    app = proxy.app
    wait_for(
        lambda: not (app.parts.admission.gate.in_flight or app._handlers),
        "every request settled",
        10,
        interval=0.002,
    )


# ---------------------------------------------------------------- pathological requests
POISONS: dict[str, Callable[[int], str]] = {
    "nested_lists": lambda n: "[" * n + "]" * n,
    "nested_objects": lambda n: '{"a":' * n + "1" + "}" * n,
    "big_int": lambda n: "9" * n,
    "negative_big_int": lambda n: "-1" + "0" * n,
    "huge_float": lambda n: f"1e{n}",
    "constant": lambda n: ["NaN", "Infinity", "-Infinity"][n % 3],
}
FIELDS = ("seed", "metadata", "logit_bias", "temperature", "content")


def request_with(poison: str, where: str, stream: bool) -> bytes:
    body: dict[str, Any] = {"model": "m", "max_tokens": 2, "stream": stream}
    content = '"hi"' if where != "content" else poison
    messages = f'[{{"role":"user","content":{content}}}]'
    rest = json.dumps(body)[1:-1]
    field = f',"{where}":{poison}' if where != "content" else ""
    return f'{{"messages":{messages},{rest}{field}}}'.encode()


@SLOW
@given(
    kind=st.sampled_from(sorted(POISONS)),
    size=st.integers(1, 6000),
    where=st.sampled_from(FIELDS),
    stream=st.booleans(),
)
def test_pathological_json_requests_get_a_clear_400_or_are_served_exactly(
    proxy: Stack, engine: Engine, kind: str, size: int, where: str, stream: bool
) -> None:
    """Nesting past any parser's depth, numbers past a double, constants JSON lacks and
    integers past 64 bits: a one-line 400 that never reaches the engine, or a request that
    is served and charged with every integer reaching the engine digit for digit."""
    poison = POISONS[kind](size)
    raw = request_with(poison, where, stream)
    seen = len(engine.engine.requests)
    before = samples(proxy.metrics(), "inferwatch_tenancy_accounted_requests_total")
    reply = proxy.client.post(
        CHAT, content=raw, headers={**auth("acme"), "content-type": "application/json"}
    )
    assert reply.status_code in (200, 400), reply.text[:300]
    if reply.status_code == 400:
        error = reply.json()["error"]
        assert error["code"] == "rejected_bad_request" and "\n" not in error["message"]
        assert len(engine.engine.requests) == seen
        return
    settle(proxy)
    assert samples(proxy.metrics(), "inferwatch_tenancy_accounted_requests_total") == before + 1
    if kind.endswith("big_int") and where == "seed":
        assert engine.engine.requests[-1]["seed"] == int(poison)
    finite = kind != "constant" and (kind != "huge_float" or math.isfinite(float(poison)))
    assert finite, "a number JSON cannot carry was passed on"


def test_integers_past_64_bits_survive_re_serialisation(proxy: Stack, engine: Engine) -> None:
    seed = 2**70 + 1
    bias = {"50256": -(2**65)}
    body = {"model": "m", "messages": [{"role": "user", "content": "hi"}], "max_tokens": 2}
    for stream in (False, True):  # streamed bodies are rewritten (usage forced on)
        reply = proxy.client.post(
            CHAT,
            content=json.dumps({**body, "stream": stream, "seed": seed, "logit_bias": bias}),
            headers={**auth("acme"), "content-type": "application/json"},
        )
        assert reply.status_code == 200
        assert engine.engine.requests[-1]["seed"] == seed
        assert engine.engine.requests[-1]["logit_bias"] == bias


# ---------------------------------------------------------------- pathological replies
def frame(payload: str) -> bytes:
    return b"data: " + payload.encode() + b"\n\n"


CONTENT = '{"choices":[{"index":0,"delta":{"content":"tok "}}]}'
USAGE = '{"choices":[],"usage":{"prompt_tokens":%s,"completion_tokens":%s}}'
EVENT_POISONS = {
    # parsers give up: a counted upstream error, the estimate charged
    "deep": ('{"choices":[],"x":' + "[" * 3000 + "]" * 3000 + "}", "error"),
    # usage that is not a count is ignored: the estimate is charged, the stream completes
    "huge_usage": (USAGE % ("1" + "0" * 30, "5"), "complete"),
    "float_usage": (USAGE % ("1e400", "2"), "complete"),
    # engines write NaN log-probabilities: tolerated
    "nan_logprobs": ('{"choices":[{"index":0,"delta":{},"logprobs":NaN}]}', "complete"),
}


@pytest.mark.parametrize("kind", sorted(EVENT_POISONS))
def test_pathological_stream_events_are_counted_and_charged_never_a_500(
    proxy: Stack, engine: Engine, kind: str
) -> None:
    event, accounting = EVENT_POISONS[kind]
    body = frame(CONTENT) + frame(event) + frame(CONTENT) + frame("[DONE]")
    engine.engine.scripts.append(se.Script(body, stream=True))
    before = proxy.metrics()
    request = {"model": "m", "messages": [{"role": "user", "content": "hi"}], "stream": True}
    reply = proxy.client.post(
        CHAT, json=request, headers=auth("acme", **{"x-scenario": "scripted"})
    )
    assert reply.status_code == 200
    settle(proxy)
    after = proxy.metrics()
    name = "inferwatch_tenancy_accounted_requests_total"
    assert (
        samples(after, name, accounting=accounting)
        == samples(before, name, accounting=accounting) + 1
    )
    tokens = samples(after, "inferwatch_tenancy_tokens_total") - samples(
        before, "inferwatch_tenancy_tokens_total"
    )
    assert 0 < tokens < 1000
    if accounting == "error":
        errors = "inferwatch_tenancy_upstream_errors_total"
        assert samples(after, errors, reason="malformed_stream") == (
            samples(before, errors, reason="malformed_stream") + 1
        )
        assert "engine stream failed" in reply.text


def test_a_pathological_json_reply_is_a_counted_upstream_error(
    proxy: Stack, engine: Engine
) -> None:
    deep = b'{"choices":' + b"[" * 5000 + b"]" * 5000 + b"}"
    engine.engine.scripts.append(se.Script(deep, stream=False))
    before = proxy.metrics()
    request = {"model": "m", "messages": [{"role": "user", "content": "hi"}]}
    reply = proxy.client.post(
        CHAT, json=request, headers=auth("acme", **{"x-scenario": "scripted"})
    )
    assert reply.status_code == 502
    settle(proxy)
    after = proxy.metrics()
    errors = "inferwatch_tenancy_upstream_errors_total"
    assert (
        samples(after, errors, reason="protocol") == samples(before, errors, reason="protocol") + 1
    )
    name = "inferwatch_tenancy_accounted_requests_total"
    assert samples(after, name, accounting="error") == samples(before, name, accounting="error") + 1


# ---------------------------------------------------------------- label slots
def test_junk_model_and_version_values_release_their_slots_when_idle(
    stack: MakeStack, loop: se.LoopThread
) -> None:
    # no slot goes idle during the flood, however slow the machine; then every one does
    proxy = stack(labels={"max_version_values": 3, "value_idle": "1h"})
    body = {"messages": [{"role": "user", "content": "hi"}], "max_tokens": 1}

    def send(model: str, version: str) -> None:
        reply = proxy.client.post(
            CHAT,
            json={**body, "model": model},
            headers=auth("acme", **{"x-model-version": version}),
        )
        assert reply.status_code == 200

    for index in range(6):  # a flood of junk fills every slot
        send(f"junk-{index}", f"junk-{index}")
    settle(proxy)
    flooded = proxy.metrics()
    assert samples(flooded, "inferwatch_tenancy_requests_total", model="other") == 3
    assert samples(flooded, "inferwatch_tenancy_value_label_folds_total", label="model") == 3
    total = samples(flooded, "inferwatch_tenancy_tokens_total")
    slots = proxy.app.parts.value_labels

    async def idle_now() -> None:  # on the proxy's loop, as its housekeeping would
        for labels in slots:
            labels.idle_seconds = 0.0
        proxy.app.evict_idle_tenants()

    loop.run(idle_now)
    assert not (len(slots[0]) or len(slots[1]))  # idle label slots released
    send("real-model", "rev-42")  # the real release gets its own labels again
    settle(proxy)
    page = proxy.metrics()
    assert samples(page, "inferwatch_tenancy_requests_total", model="real-model") == 1
    assert samples(page, "inferwatch_tenancy_requests_total", model_version="rev-42") == 1
    # the released junk folded into other: no token left the totals
    assert samples(page, "inferwatch_tenancy_tokens_total") > total
    assert samples(page, "inferwatch_tenancy_requests_total", model="junk-0") == 0
    assert samples(page, "inferwatch_tenancy_requests_total") == 7


# ---------------------------------------------------------------- slow clients
def connect(proxy: Stack) -> socket.socket:
    host, port = proxy.url.removeprefix("http://").split(":")
    return socket.create_connection((host, int(port)), timeout=10)


def closed_within(sock: socket.socket, seconds: float) -> tuple[bool, bytes]:
    sock.settimeout(seconds)
    data = b""
    try:
        while piece := sock.recv(65536):
            data += piece
    except TimeoutError:
        return False, data
    return True, data


def test_a_trickled_request_head_is_cut_off_while_others_are_served(stack: MakeStack) -> None:
    proxy = stack(limits={"header_timeout": "500ms"})
    started = time.monotonic()
    with connect(proxy) as slow:
        slow.sendall(b"POST /v1/chat/completions HTTP/1.1\r\nhost: x\r\nx-pad: ")
        assert httpx.get(proxy.url + "/healthz").status_code == 200  # others are served
        slow.settimeout(0.1)  # a byte every 0.1 s, the trickle

        def cut_off() -> bool:
            try:
                slow.sendall(b"a")  # a byte at a time does not buy time
            except OSError:
                return True
            with contextlib.suppress(TimeoutError):
                return slow.recv(1) == b""
            return False

        wait_for(cut_off, "a trickled head to be cut off", 6, interval=0)
    assert time.monotonic() - started < 6


def test_an_oversized_request_head_gets_431(stack: MakeStack) -> None:
    proxy = stack(limits={"max_header_bytes": 2048})
    with connect(proxy) as sock:
        sock.sendall(b"GET /v1/models HTTP/1.1\r\nhost: x\r\nx-big: " + b"a" * 4096 + b"\r\n\r\n")
        closed, data = closed_within(sock, 5)
    assert closed and data.startswith(b"HTTP/1.1 431")


def test_a_body_that_never_arrives_gets_408(stack: MakeStack, engine: Engine) -> None:
    proxy = stack(limits={"body_timeout": "500ms"})
    seen = len(engine.engine.requests)
    with connect(proxy) as sock:
        sock.sendall(
            b"POST /v1/chat/completions HTTP/1.1\r\nhost: x\r\nauthorization: Bearer sk-acme-1"
            b'\r\ncontent-type: application/json\r\ncontent-length: 100\r\n\r\n{"model"'
        )
        sock.settimeout(5)
        data = b""
        while b"within" not in data and (piece := sock.recv(65536)):
            data += piece
    assert data.startswith(b"HTTP/1.1 408")
    assert b"not received within 0.5s" in data
    assert len(engine.engine.requests) == seen
