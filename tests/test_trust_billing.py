"""Who is billed, at the proxy: nothing a client or an engine says is taken on trust.

A valid API key decides the tenant whatever headers come with it; the headers a gateway sets
count only from a trusted source; the engine's usage is charged within what was relayed and
what was reserved; every field a chat template renders counts against the input limit, and
every spelling of the completion cap is normalised or refused; only what the engine served
takes a label slot.
"""

from __future__ import annotations

import json
from collections import Counter
from collections.abc import Callable
from typing import Any

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from prometheus_client.parser import text_string_to_metric_families

import support.scripted_engine as se
from inferwatch.proxy.counting import MAX_TOKEN_BYTES
from inferwatch.proxy.tenants import hash_key
from inferwatch.proxy.usage import TEMPLATE_ALLOWANCE
from support import tinymodel
from support.proxy_stack import CHAT, KEYS, Stack, auth, samples
from support.wait import wait_for

pytestmark = pytest.mark.unit

MakeStack = Callable[..., Stack]


def chat(**extra: object) -> dict[str, object]:
    return {"model": "m", "messages": [{"role": "user", "content": "hi"}], "max_tokens": 3, **extra}


# ---------------------------------------------------------------- tenant and gateway headers
def test_a_valid_key_wins_over_a_trusted_tenant_header(stack: MakeStack) -> None:
    gateway = stack(identity={"trusted_sources": ["127.0.0.1/32"]})
    headers = auth("acme", **{"x-inferwatch-tenant": "globex"})
    assert gateway.client.post(CHAT, json=chat(), headers=headers).status_code == 200
    page = gateway.metrics()
    assert samples(page, "inferwatch_tenancy_tokens_total", tenant="globex") == 0
    assert samples(page, "inferwatch_tenancy_requests_total", tenant="acme", outcome="ok") == 1
    # an unknown key leaves the decision to the gateway's header, as before
    unknown = {"authorization": "Bearer sk-nobody", "x-inferwatch-tenant": "team-blue"}
    assert gateway.client.post(CHAT, json=chat(), headers=unknown).status_code == 200
    assert samples(gateway.metrics(), "inferwatch_tenancy_requests_total", tenant="team-blue")


def test_split_and_version_headers_count_only_from_a_trusted_source(stack: MakeStack) -> None:
    elsewhere = stack(
        identity={"trusted_sources": ["10.0.0.0/8"]}, versions={"model_version": "v1"}
    )
    headers = auth("acme", **{"x-model-version": "cheap", "x-inferwatch-split": "header"})
    assert elsewhere.client.post(CHAT, json=chat(), headers=headers).status_code == 200
    page = elsewhere.metrics()
    assert samples(page, "inferwatch_tenancy_requests_total", model_version="cheap") == 0
    assert samples(page, "inferwatch_tenancy_requests_total", model_version="v1", split="unknown")
    gateway = stack(
        identity={"trusted_sources": ["127.0.0.1/32"]}, versions={"model_version": "v1"}
    )
    assert gateway.client.post(CHAT, json=chat(), headers=headers).status_code == 200
    page = gateway.metrics()
    assert samples(page, "inferwatch_tenancy_requests_total", model_version="cheap", split="header")
    for name in gateway.app.config.gateway_headers:  # none of them reaches the engine
        assert name not in gateway.engine.headers_seen[-1]


# ---------------------------------------------------------------- the engine's usage, bounded
PROMPT_COUNT = 10  # the byte bound of chat()'s prompt: 3 + 4 framing, "hi" 2 bytes + 1
PROMPT_CEILING = PROMPT_COUNT + TEMPLATE_ALLOWANCE
PROMPT_ESTIMATE = 8  # chars/4 with the same framing: what stands in for a prompt not counted
MISSING = object()  # the usage object leaves the field out
ANOMALIES = "inferwatch_tenancy_engine_usage_anomalies_total"


def sse(payload: object) -> bytes:
    return b"data: " + json.dumps(payload).encode() + b"\n\n"


def usage_object(prompt: object, completion: object) -> dict[str, object]:
    fields = {"prompt_tokens": prompt, "completion_tokens": completion}
    return {key: value for key, value in fields.items() if value is not MISSING}


def streamed(pieces: int, usage: dict[str, object] | None) -> se.Script:
    """A chat stream of ``pieces`` content frames, then ``usage`` (None: no usage chunk)."""
    frames = [{"choices": [{"index": 0, "delta": {"role": "assistant", "content": ""}}]}]
    frames += [{"choices": [{"index": 0, "delta": {"content": "tok "}}]}] * pieces
    if usage is not None:
        frames.append({"choices": [], "usage": usage})
    return se.Script(b"".join(map(sse, frames)) + b"data: [DONE]\n\n")


def whole(text: str, usage: dict[str, object] | None) -> se.Script:
    reply: dict[str, object] = {
        "choices": [{"index": 0, "message": {"role": "assistant", "content": text}}]
    }
    if usage is not None:
        reply["usage"] = usage
    return se.Script(json.dumps(reply).encode(), stream=False)


def charge(proxy: Stack, script: se.Script, **body: object) -> tuple[dict[str, float], Counter]:
    """Tokens charged for one request the engine answers with ``script``, by token type, and
    the anomalies it counted."""

    def read() -> tuple[dict[str, float], Counter]:
        page = proxy.metrics()
        tokens = {
            kind: samples(page, "inferwatch_tenancy_tokens_total", token_type=kind)
            for kind in ("prompt", "completion")
        }
        anomalies: Counter = Counter()
        for family in text_string_to_metric_families(page):
            for sample in family.samples:
                if sample.name == ANOMALIES:
                    anomalies[sample.labels["token_type"], sample.labels["reason"]] += int(
                        sample.value
                    )
        return tokens, anomalies

    before, anomalies_before = read()
    proxy.engine.scripts.append(script)
    reply = proxy.client.post(
        CHAT, json=chat(**body), headers=auth("acme", **{"x-scenario": "scripted"})
    )
    assert reply.status_code == 200, reply.text
    if body.get("stream"):
        assert reply.text.endswith("data: [DONE]\n\n")
    wait_for(lambda: not proxy.app._handlers, "the request charged", 10, interval=0.002)
    after, anomalies_after = read()
    tokens = {kind: after[kind] - before[kind] for kind in after}
    return tokens, anomalies_after - anomalies_before


@pytest.fixture(scope="module")
def billed(stack: MakeStack) -> Stack:
    return stack()


@pytest.mark.parametrize(
    ("reported", "charged", "anomaly"),
    [
        (1, 400, ("completion", "below_floor")),  # 400 chunks relayed, one token claimed
        (2**32 - 1, 410, ("completion", "above_ceiling")),  # the cap: max_tokens 410, n 1
        (-5, 400, ("completion", "invalid")),
        ("400", 400, ("completion", "invalid")),
        (399.5, 400, ("completion", "invalid")),
        (True, 400, ("completion", "invalid")),
        (MISSING, 400, ("completion", "below_floor")),
        (400, 400, None),  # the honest report is charged as it is
    ],
    ids=["one", "2^32-1", "negative", "string", "float", "bool", "field-missing", "honest"],
)
def test_streamed_completion_is_charged_within_what_was_relayed_and_reserved(
    billed: Stack, reported: object, charged: int, anomaly: tuple[str, str] | None
) -> None:
    tokens, anomalies = charge(
        billed, streamed(400, usage_object(21, reported)), stream=True, max_tokens=410
    )
    assert tokens == {"prompt": 21, "completion": charged}
    assert anomalies == (Counter({anomaly: 1}) if anomaly else Counter())


def test_a_stream_without_usage_is_estimated_within_its_bounds(billed: Stack) -> None:
    tokens, anomalies = charge(billed, streamed(400, None), stream=True, max_tokens=300)
    # at most the cap, even though 400 pieces came (an engine ignoring max_tokens)
    assert tokens == {"prompt": PROMPT_ESTIMATE, "completion": 300}
    assert anomalies == Counter()


@pytest.mark.parametrize(
    ("reported", "charged", "anomaly"),
    [
        (2**32 - 1, PROMPT_CEILING, "above_ceiling"),
        (-1, PROMPT_ESTIMATE, "invalid"),
        ("many", PROMPT_ESTIMATE, "invalid"),
        (12.0, PROMPT_ESTIMATE, "invalid"),
        (MISSING, PROMPT_ESTIMATE, "invalid"),
    ],
    ids=["2^32-1", "negative", "string", "float", "missing"],
)
def test_reported_prompt_tokens_are_bounded_by_the_prompts_count(
    billed: Stack, reported: object, charged: int, anomaly: str
) -> None:
    tokens, anomalies = charge(billed, whole("tok " * 3, usage_object(reported, 3)))
    assert tokens == {"prompt": charged, "completion": 3}
    assert anomalies == Counter({("prompt", anomaly): 1})


def test_a_whole_reply_is_charged_at_least_its_texts_tokens(
    stack: MakeStack, tmp_path_factory: pytest.TempPathFactory
) -> None:
    folder = tinymodel.write(tmp_path_factory.mktemp("model"))
    counted = stack(limits={"tokenizer": str(folder / "tokenizer.json")})
    text = "the quick brown fox jumps over the lazy dog " * 40
    floor = counted.app.parts.admission.counter.floor(text)
    assert floor > 40
    tokens, anomalies = charge(counted, whole(text, usage_object(21, 1)), max_tokens=2000)
    assert tokens == {"prompt": 21, "completion": floor}
    assert anomalies == Counter({("completion", "below_floor"): 1})
    # without a tokenizer the floor is the byte floor: one token per MAX_TOKEN_BYTES
    tokens, _ = charge(stack(), whole(text, usage_object(21, 1)), max_tokens=2000)
    assert tokens["completion"] == -(-len(text) // MAX_TOKEN_BYTES)


def test_an_echoed_prompt_is_no_completion_floor(stack: MakeStack) -> None:
    proxy = stack()
    prompt = "the quick brown fox " * 200
    script = se.Script(
        json.dumps(
            {"choices": [{"index": 0, "text": prompt + "tok"}], "usage": usage_object(900, 1)}
        ).encode(),
        stream=False,
    )
    before = samples(proxy.metrics(), "inferwatch_tenancy_tokens_total", token_type="completion")
    proxy.engine.scripts.append(script)
    body = {"model": "m", "prompt": prompt, "max_tokens": 1, "echo": True}
    headers = auth("acme", **{"x-scenario": "scripted"})
    assert proxy.client.post("/v1/completions", json=body, headers=headers).status_code == 200
    wait_for(lambda: not proxy.app._handlers, "the request charged", 10, interval=0.002)
    after = samples(proxy.metrics(), "inferwatch_tenancy_tokens_total", token_type="completion")
    assert after - before == 1
    assert samples(proxy.metrics(), ANOMALIES, reason="below_floor") == 0


COUNTS = st.one_of(
    st.integers(min_value=-(2**40), max_value=2**40),
    st.sampled_from([2**32 - 1, 2**32, 0]),
    st.floats(allow_nan=False, allow_infinity=False),
    st.text(max_size=5),
    st.booleans(),
    st.none(),
    st.just(MISSING),
)


def _valid(value: object) -> bool:
    return type(value) is int and 0 <= value < 2**32


@settings(
    max_examples=60,
    deadline=None,
    database=None,
    suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.too_slow],
)
@given(
    prompt=COUNTS,
    completion=COUNTS,
    pieces=st.integers(min_value=0, max_value=30),
    room=st.integers(min_value=0, max_value=30),
    sent=st.booleans(),
)
def test_whatever_usage_the_engine_reports_the_charge_stays_within_bounds(
    billed: Stack, prompt: object, completion: object, pieces: int, room: int, sent: bool
) -> None:
    cap = pieces + room
    usage = usage_object(prompt, completion) if sent else None
    tokens, anomalies = charge(billed, streamed(pieces, usage), stream=True, max_tokens=cap)
    assert pieces <= tokens["completion"] <= cap
    assert 0 <= tokens["prompt"] <= PROMPT_CEILING
    if _valid(completion) and pieces <= completion <= cap and sent:  # type: ignore[operator]
        assert tokens["completion"] == completion
        assert not [reason for (kind, reason) in anomalies if kind == "completion"]
    if _valid(prompt) and prompt <= PROMPT_CEILING and sent:  # type: ignore[operator]
        assert tokens["prompt"] == prompt
        assert not [reason for (kind, reason) in anomalies if kind == "prompt"]
    elif sent:  # charged otherwise than reported, and said so
        assert [reason for (kind, reason) in anomalies if kind == "prompt"]
    if not sent:
        assert anomalies == Counter()


# ---------------------------------------------------------------- what counts as input
BIG = "lorem ipsum " * 20_000  # 240 KB
#: every place a chat template (or vLLM's handling around it) can put text into the prompt
RENDERED: dict[str, Callable[[dict[str, Any]], None]] = {
    "chat_template_kwargs": lambda b: b.update(chat_template_kwargs={"notes": BIG}),
    "chat_template_kwargs_key": lambda b: b.update(chat_template_kwargs={BIG: True}),
    "chat_template": lambda b: b.update(chat_template=BIG + "{{ messages }}"),
    "documents": lambda b: b.update(documents=[{"title": "t", "text": BIG}]),
    "tools": lambda b: b.update(tools=[{"type": "function", "function": {"name": "f",
                                        "parameters": {BIG: {"type": "string"}}}}]),
    "tool_calls": lambda b: b["messages"].append(
        {"role": "assistant", "tool_calls": [{"id": "1", "type": "function",
         "function": {"name": "f", "arguments": {BIG: 1}}}]}),
    "name": lambda b: b["messages"][0].update(name=BIG),
    "unknown_field": lambda b: b.update(house_template_input={"prefix": BIG}),
}  # fmt: skip


@pytest.fixture(scope="module")
def limited(stack: MakeStack) -> Stack:
    return stack(limits={"max_input_tokens": 200, "max_body_bytes": 1 << 20})


@pytest.mark.parametrize("place", sorted(RENDERED))
def test_every_field_a_template_renders_counts_against_the_input_limit(
    limited: Stack, place: str
) -> None:
    body = chat()
    RENDERED[place](body)
    reply = limited.client.post(CHAT, json=body, headers=auth("acme"))
    assert reply.status_code == 400, reply.text
    assert reply.json()["error"]["code"] == "rejected_too_long"
    assert limited.client.post(CHAT, json=chat(), headers=auth("acme")).status_code == 200


def test_decoding_parameters_are_not_counted_as_input(limited: Stack) -> None:
    schema = {"type": "object", "properties": {f"field_{i}": {"type": "string"} for i in range(99)}}
    body = chat(guided_json=schema, stop=["\n\n"] * 50, logit_bias={str(i): 1 for i in range(99)})
    assert limited.client.post(CHAT, json=body, headers=auth("acme")).status_code == 200


# ---------------------------------------------------------------- every spelling of the cap
@pytest.fixture(scope="module")
def budgeted(stack: MakeStack) -> Stack:
    return stack(tenants={"acme": {"key_sha256": [hash_key(KEYS["acme"])],
                                   "budget": {"tokens": 10_000_000, "window": "1h"}}})  # fmt: skip


@pytest.mark.parametrize("field", ["max_tokens", "max_completion_tokens", "n", "best_of"])
@pytest.mark.parametrize("value", ["5000", 50.5, -1, True, [5], {"v": 5}, "five"])
def test_a_count_that_is_no_whole_number_is_refused(
    budgeted: Stack, field: str, value: object
) -> None:
    sent = len(budgeted.engine.requests)
    body = chat(**{field: value})
    reply = budgeted.client.post(CHAT, json=body, headers=auth("acme"))
    assert reply.status_code == 400, reply.text
    assert reply.json()["error"]["message"].startswith(f"{field} must be")
    assert len(budgeted.engine.requests) == sent  # never forwarded


@pytest.mark.parametrize("field", ["max_tokens", "max_completion_tokens"])
def test_an_integral_float_cap_is_sent_as_the_integer(budgeted: Stack, field: str) -> None:
    body = chat(**{field: 4.0})
    assert budgeted.client.post(CHAT, json=body, headers=auth("acme")).status_code == 200
    forwarded = budgeted.engine.requests[-1]
    assert type(forwarded[field]) is int and forwarded[field] == 4


def test_a_clamped_cap_leaves_no_twin_uncapped(stack: MakeStack) -> None:
    tight = stack(tenants={"acme": {"key_sha256": [hash_key(KEYS["acme"])],
                                    "budget": {"tokens": 60, "window": "1h"}}})  # fmt: skip
    body = chat(max_tokens=5, max_completion_tokens=5000)
    assert tight.client.post(CHAT, json=body, headers=auth("acme")).status_code == 200
    forwarded = tight.engine.requests[-1]
    # the larger twin decided the reservation; both went out at the clamped cap
    assert forwarded["max_tokens"] == forwarded["max_completion_tokens"] < 60


# ---------------------------------------------------------------- label slots
def test_only_values_the_engine_served_take_a_label_slot(stack: MakeStack) -> None:
    proxy = stack(labels={"max_version_values": 20, "value_idle": "1h"})
    refused = {"x-scenario": "unknown_model"}
    for index in range(300):
        body = chat(model=f"junk-{index}")
        reply = proxy.client.post(CHAT, json=body, headers=auth("acme", **refused))
        assert reply.status_code == 404
    assert len(proxy.app.parts.value_labels[0]) == 0  # no slot taken
    page = proxy.metrics()
    assert samples(page, "inferwatch_tenancy_requests_total", model="other") == 300
    assert samples(page, "inferwatch_tenancy_value_label_folds_total", label="model") == 0
    # a real model is recorded by name, at once
    served = proxy.client.post(CHAT, json=chat(model="llama-3.1-8b"), headers=auth("acme"))
    assert served.status_code == 200
    page = proxy.metrics()
    assert samples(page, "inferwatch_tenancy_requests_total", model="llama-3.1-8b") == 1
    assert samples(page, "inferwatch_tenancy_tokens_total", model="llama-3.1-8b") > 0
    assert samples(page, "inferwatch_tenancy_tokens_total", model="other") == 0


def test_a_deeply_nested_cap_is_refused_in_one_line(budgeted: Stack) -> None:
    raw = '{"model": "m", "messages": [], "max_tokens": ' + "[" * 5000 + "]" * 5000 + "}"
    reply = budgeted.client.post(
        CHAT, content=raw, headers=auth("acme", **{"content-type": "application/json"})
    )
    assert reply.status_code == 400
    assert "\n" not in reply.json()["error"]["message"]
