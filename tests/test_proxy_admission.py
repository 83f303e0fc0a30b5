"""Admission over real HTTP: budgets under concurrency, the input limit, per-tenant caps."""

from __future__ import annotations

import dataclasses
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers

from inferwatch.proxy.admission import BudgetLedger
from inferwatch.proxy.tenants import hash_key
from support.proxy_stack import CHAT, KEYS, Engine, Stack, auth, samples
from support.wait import wait_for

pytestmark = pytest.mark.unit

MakeStack = Callable[..., Stack]


def tokens_of(page: str, tenant: str) -> float:
    return sum(
        samples(page, "inferwatch_tenancy_tokens_total", tenant=tenant, token_type=kind)
        for kind in ("prompt", "completion")
    )


def finished(app: Any) -> None:
    """Wait until the proxy has settled every request (it does so after the last byte)."""
    wait_for(
        lambda: not (app.parts.admission.gate.in_flight or app._handlers),
        "every request settled",
        10,
        interval=0.002,
    )


# ---------------------------------------------------------------- budgets under concurrency
MAX_BURST = 10
# The scripted engine counts the JSON of the messages, which (control characters aside) never
# exceeds the proxy's byte bound, so nothing may be overspent at all.
TOLERANCE = 0
request_mix = st.lists(
    st.tuples(
        # content; not control characters, which the scripted engine counts as the six
        # characters of their JSON escape (a tokenizer takes at most one token a byte)
        st.text(st.characters(codec="utf-8", exclude_categories=["Cc"]), min_size=1, max_size=40),
        st.one_of(st.none(), st.integers(0, 120)),  # max_tokens (None: not sent)
        st.booleans(),  # stream
        st.sampled_from(["", "", "cut", "error_500", "no_usage", "disconnect"]),
    ),
    min_size=2,
    max_size=MAX_BURST,
)


@pytest.fixture(scope="module")
def budgeted(stack: MakeStack) -> Stack:
    return stack(
        tenants={
            "acme": {
                "key_sha256": [hash_key(KEYS["acme"])],
                "budget": {"tokens": 10_000, "window": "1h", "tolerance": TOLERANCE},
            }
        },
        limits={"default_max_tokens": 64},
    )


@settings(
    max_examples=25,
    deadline=None,
    suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.too_slow],
)
@given(mix=request_mix, budget=st.integers(40, 600))
def test_concurrent_requests_never_overspend_the_budget(
    budgeted: Stack, mix: list[tuple[str, int | None, bool, str]], budget: int
) -> None:
    """However a burst mixes sizes, caps, streams, failures and clients hanging up, the
    window's spend stays within budget + tolerance, and every reservation is released (and
    settled to what was used) when its request ends."""
    app = budgeted.app
    tenant = app.config.tenants["acme"]
    assert tenant.budget is not None
    limit = dataclasses.replace(tenant.budget, tokens=budget)
    app.config.tenants["acme"] = dataclasses.replace(tenant, budget=limit)  # type: ignore[index]
    app.parts.admission.ledger = app.parts.accounting.ledger = (
        BudgetLedger()
    )  # admission and settlement share it
    before = tokens_of(budgeted.metrics(), "acme")

    def send(item: tuple[str, int | None, bool, str]) -> int:
        content, max_tokens, stream, scenario = item
        body: dict[str, Any] = {"model": "m", "messages": [{"role": "user", "content": content}]}
        if max_tokens is not None:
            body["max_tokens"] = max_tokens
        if stream:
            body["stream"] = True
        # held at the engine, so that the whole burst is admitted before anything is charged
        headers = auth("acme", **{"x-delay-ms": "60", "x-scenario": scenario})
        if scenario != "disconnect":
            return budgeted.client.post(CHAT, json=body, headers=headers).status_code
        # the client hangs up after the first bytes of a slow stream
        headers["x-scenario"] = "slow_stream"
        with budgeted.client.stream(
            "POST", CHAT, json={**body, "stream": True}, headers=headers
        ) as r:
            status = r.status_code
            if status == 200:
                next(r.iter_raw())
        return status

    with ThreadPoolExecutor(len(mix)) as pool:
        statuses = list(pool.map(send, mix))
    assert set(statuses) <= {200, 400, 429, 500, 502}
    finished(app)
    spent = app.parts.admission.ledger.used("acme", limit)
    assert spent <= budget + TOLERANCE
    assert app.parts.admission.ledger.reserved("acme", limit) == 0
    assert tokens_of(budgeted.metrics(), "acme") - before == spent


def test_a_request_without_max_tokens_is_sent_with_the_default_cap_clamped_to_the_remainder(
    stack: MakeStack, engine: Engine
) -> None:
    budget = {"tokens": 200, "window": "1h"}
    proxy = stack(
        tenants={"acme": {"key_sha256": [hash_key(KEYS["acme"])], "budget": budget}},
        limits={"default_max_tokens": 50},
    )
    body = {"model": "m", "messages": [{"role": "user", "content": "hi"}]}
    assert proxy.client.post(CHAT, json=body, headers=auth("acme")).status_code == 200
    assert engine.engine.requests[-1]["max_tokens"] == 50  # the default cap, sent
    asked = {**body, "max_tokens": 10_000}
    assert proxy.client.post(CHAT, json=asked, headers=auth("acme")).status_code == 200
    used = proxy.app.parts.admission.ledger.used("acme", proxy.app.config.tenants["acme"].budget)  # type: ignore[arg-type]
    sent = engine.engine.requests[-1]["max_tokens"]
    assert 0 < sent < 200 - 10  # clamped to what the prompt leaves of the remainder
    assert used <= 200
    strict = stack(
        tenants={"acme": {"key_sha256": [hash_key(KEYS["acme"])], "budget": budget}},
        limits={"over_budget": "reject"},
    )
    refused = strict.client.post(CHAT, json=asked, headers=auth("acme"))
    assert refused.status_code == 429
    assert "cannot cover this request" in refused.json()["error"]["message"]
    assert refused.headers["retry-after"]


def test_choices_multiply_the_reservation(stack: MakeStack, engine: Engine) -> None:
    proxy = stack(
        tenants={
            "acme": {
                "key_sha256": [hash_key(KEYS["acme"])],
                "budget": {"tokens": 100, "window": "1h"},
            }
        },
        limits={"over_budget": "reject"},
    )
    body = {"model": "m", "messages": [{"role": "user", "content": "hi"}], "max_tokens": 30}
    assert proxy.client.post(CHAT, json=body, headers=auth("acme")).status_code == 200
    proxy.app.parts.admission.ledger = proxy.app.parts.accounting.ledger = BudgetLedger()
    many = proxy.client.post(CHAT, json={**body, "n": 4}, headers=auth("acme"))
    assert many.status_code == 429  # 4 choices of 30 tokens cannot fit in 100


def test_the_tolerance_is_the_only_room_past_the_budget(stack: MakeStack) -> None:
    body = {"model": "m", "messages": [{"role": "user", "content": "hi"}], "max_tokens": 30}
    # the request reserves 3 + 4 + 3 (prompt bound) + 30 = 40 tokens
    for tolerance, status in ((0, 429), (5, 200)):
        budget = {"tokens": 35, "window": "1h", "tolerance": tolerance}
        proxy = stack(
            tenants={"acme": {"key_sha256": [hash_key(KEYS["acme"])], "budget": budget}},
            limits={"over_budget": "reject"},
        )
        assert proxy.client.post(CHAT, json=body, headers=auth("acme")).status_code == status


# ---------------------------------------------------------------- the input limit
LIMIT = 40


@pytest.fixture(scope="module")
def tokenizer_file(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A small byte-level BPE tokenizer.json, trained here with the tokenizers library."""
    tokenizer = Tokenizer(models.BPE())
    tokenizer.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tokenizer.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(
        vocab_size=400, initial_alphabet=pre_tokenizers.ByteLevel.alphabet(), show_progress=False
    )
    corpus = ["the quick brown fox jumps over the lazy dog", "hello there, how are you?"] * 50
    tokenizer.train_from_iterator(corpus, trainer)
    path = tmp_path_factory.mktemp("tok") / "tokenizer.json"
    tokenizer.save(str(path))
    return path


@pytest.fixture(scope="module")
def limited(stack: MakeStack, tokenizer_file: Path) -> dict[str, Stack]:
    return {
        "bound": stack(limits={"max_input_tokens": LIMIT}),
        "tokenizer": stack(limits={"max_input_tokens": LIMIT, "tokenizer": str(tokenizer_file)}),
    }


hard_text = st.text(
    st.characters(categories=["P", "S", "Lo", "Zs"], codec="utf-8"), min_size=1, max_size=60
)
#: where a piece of prompt can hide in a chat request
PLACES = ("content", "parts", "system", "tool_schema", "name", "prompt_list")


def place(piece: str, where: str) -> tuple[str, dict[str, Any]]:
    user = {"role": "user", "content": "ok"}
    if where == "content":
        return CHAT, {"messages": [{"role": "user", "content": piece}]}
    if where == "parts":
        parts = [{"type": "text", "text": "ok"}, {"type": "text", "text": piece}]
        return CHAT, {"messages": [{"role": "user", "content": parts}]}
    if where == "system":
        return CHAT, {"messages": [{"role": "system", "content": piece}, user]}
    if where == "name":
        return CHAT, {"messages": [{"role": "user", "content": "ok", "name": piece}]}
    if where == "tool_schema":
        tool = {"type": "function", "function": {"name": "f", "description": piece}}
        return CHAT, {"messages": [user], "tools": [tool]}
    return "/v1/completions", {"prompt": ["ok", piece]}


@settings(
    max_examples=60,
    deadline=None,
    suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.too_slow],
)
@given(piece=hard_text, where=st.sampled_from(PLACES), mode=st.sampled_from(["bound", "tokenizer"]))
def test_prompts_over_the_limit_are_refused_wherever_the_text_hides(
    limited: dict[str, Stack], tokenizer_file: Path, piece: str, where: str, mode: str
) -> None:
    """Punctuation, symbols, emoji and CJK that a real byte-level BPE tokenizer counts past
    the limit get the 400, in any part of the request; with the tokenizer configured, a
    prompt within the limit (by that tokenizer) is served."""
    real = len(Tokenizer.from_file(str(tokenizer_file)).encode(piece).ids)
    path, body = place(piece, where)
    reply = limited[mode].client.post(
        path, json={"model": "m", "max_tokens": 1, **body}, headers=auth("acme")
    )
    if real > LIMIT:
        assert reply.status_code == 400, (real, reply.text)
        assert reply.json()["error"]["code"] == "rejected_too_long"
    elif mode == "tokenizer" and where != "tool_schema" and real + 20 < LIMIT:
        assert reply.status_code == 200, reply.text  # 20: framing and the other parts


def test_media_parts_are_not_counted_as_text(limited: dict[str, Stack]) -> None:
    image = {"type": "image_url", "image_url": {"url": "data:image/png;base64," + "A" * 100_000}}
    content = [{"type": "text", "text": "what is this?"}, image]
    body = {"model": "m", "max_tokens": 1, "messages": [{"role": "user", "content": content}]}
    assert limited["bound"].client.post(CHAT, json=body, headers=auth("acme")).status_code == 200
    content[0]["text"] = "?" * 100  # the text beside it still counts
    assert limited["bound"].client.post(CHAT, json=body, headers=auth("acme")).status_code == 400


@pytest.mark.parametrize("depth", [1000, 5000])
def test_a_deeply_nested_tool_schema_is_a_clear_400(limited: dict[str, Stack], depth: int) -> None:
    nested = b"[" * depth + b'"x"' + b"]" * depth
    raw = b'{"model":"m","messages":[],"tools":' + nested + b"}"
    reply = limited["bound"].client.post(
        CHAT, content=raw, headers={**auth("acme"), "content-type": "application/json"}
    )
    assert reply.status_code == 400
    assert "nested too deeply" in reply.json()["error"]["message"]


# ---------------------------------------------------------------- per-tenant concurrency
def test_a_tenant_cap_holds_when_queued_requests_are_handed_slots(
    stack: MakeStack, engine: Engine
) -> None:
    proxy = stack(
        tenants={
            "acme": {"key_sha256": [hash_key(KEYS["acme"])], "max_concurrency": 1},
            "globex": {"key_sha256": [hash_key(KEYS["globex"])]},
        },
        limits={"max_concurrency": 2, "queue_timeout": 5},
    )
    engine.engine.peak.clear()
    body = {"model": "m", "messages": [{"role": "user", "content": "hi"}], "max_tokens": 2}

    def send(tenant: str, delay: int) -> int:
        headers = auth(tenant, **{"x-delay-ms": str(delay), "x-test-tag": tenant})
        return proxy.client.post(CHAT, json=body, headers=headers).status_code

    with ThreadPoolExecutor(6) as pool:
        hogs = [pool.submit(send, "globex", 400) for _ in range(2)]
        gate = proxy.app.parts.admission.gate
        wait_for(lambda: gate.in_flight >= 2, "globex to hold both global slots", interval=0.005)
        acme = [pool.submit(send, "acme", 100) for _ in range(4)]
        results = [f.result() for f in acme]
        assert [h.result() for h in hogs] == [200, 200]
    assert engine.engine.peak["acme"] == 1, "queued requests of a capped tenant ran together"
    assert results.count(200) >= 1 and set(results) <= {200, 429}
    page = proxy.metrics()
    refused = samples(
        page, "inferwatch_tenancy_requests_total", tenant="acme", outcome="rejected_concurrency"
    )
    assert refused == results.count(429)
