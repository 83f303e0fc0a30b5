"""Property tests of the proxy's accounting over real HTTP, whatever the engine and client do.

Hypothesis scripts the engine's reply byte for byte (random TCP pieces, splits inside ``data:``
lines and multi-byte UTF-8, usage once at the end or cumulative on every frame, or none), breaks
it (connection reset, a malformed frame, silence) and has the client walk away after a random
number of bytes. Whatever happens, /metrics (read with prometheus_client's parser) must show
each request once with the right outcome, the engine's own usage charged exactly for complete
replies, never more than the engine produced for broken or abandoned ones, and the proxy must
serve the next request.
"""

from __future__ import annotations

import json
import math
from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any, NamedTuple

import httpx
import pytest
from hypothesis import HealthCheck, assume, example, given, settings
from hypothesis import event as note_case
from hypothesis import strategies as st
from prometheus_client.parser import text_string_to_metric_families

import support.scripted_engine as se
from inferwatch.proxy import config as proxy_config
from inferwatch.proxy.app import ProxyApp
from inferwatch.proxy.assembly import build
from inferwatch.proxy.tenants import hash_key
from inferwatch.proxy.usage import TEMPLATE_ALLOWANCE, estimate_prompt_tokens
from support.wait import wait_for

pytestmark = pytest.mark.unit

KEYS = {"acme": "sk-acme-1", "globex": "sk-globex-1"}
READ_TIMEOUT = 0.4
MAX_BODY = 64 * 1024
#: token texts of at most 4 characters, so the chars/4 estimate is one token per frame
TEXTS = st.text(alphabet='ab "\\\n\u00e9\u20ac\u65e5\u672c\U0001f642', min_size=1, max_size=4)
MALFORMED = [
    b"data: {not json\n\n",
    b"data: [1, 2]\n\n",
    b"event: x\nbogus line\n\n",
    b'data: {"choices": "\xff\xfe"}\n\n',
    b"data: \xe6\x97\n\n",
]
PROPERTY_SETTINGS = settings(
    max_examples=60,
    deadline=None,
    database=None,
    derandomize=True,
    suppress_health_check=[HealthCheck.too_slow],
)


# ---------------------------------------------------------------- the stack, one per module
@dataclass
class Stack:
    loop: Any
    engine: Any
    app: ProxyApp
    client: httpx.Client
    metrics: httpx.Client  # the separate metrics listener


@pytest.fixture(scope="module")
def stack() -> Iterator[Stack]:
    loop = se.LoopThread()
    engine = se.Engine()
    server, port = loop.run(lambda: se.start_engine(engine))
    document = {
        "upstream": {
            "url": f"http://127.0.0.1:{port}",
            "reconcile_interval": 0,
            "read_timeout": f"{round(READ_TIMEOUT * 1000)}ms",
        },
        "tenants": {name: {"key_sha256": [hash_key(key)]} for name, key in KEYS.items()},
        "limits": {"max_body_bytes": MAX_BODY},
    }
    app = ProxyApp(build(proxy_config.parse(document, "test.yaml"), access_log=False))
    proxy = se.ProxyServer(loop, app)
    client = httpx.Client(base_url=proxy.url, timeout=10)
    metrics = httpx.Client(base_url=proxy.metrics_url, timeout=10)
    yield Stack(loop, engine, app, client, metrics)
    client.close()
    metrics.close()
    proxy.stop()

    async def close_engine() -> None:
        server.close()

    loop.run(close_engine)
    loop.close()


def reset(engine: Any) -> None:
    engine.scripts.clear()
    engine.requests.clear()
    engine.headers_seen.clear()
    engine.aborted = 0


# ---------------------------------------------------------------- reading /metrics
Samples = dict[tuple[str, frozenset[tuple[str, str]]], float]


def scrape(client: httpx.Client) -> Samples:
    reply = client.get("/metrics")
    assert reply.status_code == 200
    return {
        (sample.name, frozenset(sample.labels.items())): sample.value
        for family in text_string_to_metric_families(reply.text)
        for sample in family.samples
    }


def deltas(before: Samples, after: Samples, name: str, *by: str) -> dict[tuple[str, ...], float]:
    """Non-zero increases of ``name`` between two scrapes, summed by the labels ``by``."""
    out: dict[tuple[str, ...], float] = {}
    for key in set(before) | set(after):
        if key[0] != name:
            continue
        labels = dict(key[1])
        group = tuple(labels.get(label, "") for label in by)
        out[group] = out.get(group, 0.0) + after.get(key, 0.0) - before.get(key, 0.0)
    return {group: value for group, value in out.items() if value}


def settled(client: httpx.Client, before: Samples, timeout: float = 5.0) -> Samples:
    """The scrape once exactly one more request was counted (the proxy finishes after the
    client has its last byte, or after the client left)."""

    def counted() -> Samples | None:
        after = scrape(client)
        one = sum(deltas(before, after, "inferwatch_tenancy_requests_total").values()) >= 1
        return after if one else None

    found = wait_for(counted, "one more request counted", timeout, interval=0.002)
    assert found is not None  # wait_for returns only a truthy result
    return found


# ---------------------------------------------------------------- the engine's side
@dataclass(frozen=True)
class Event:
    """One SSE event of the scripted stream, with what the engine meant by it."""

    raw: bytes
    content: bool = False  #: carries one generated token
    completion: int | None = None  #: completion tokens of the usage it carries, if any
    usage_only: bool = False  #: the usage chunk with no choices that include_usage adds
    bad: bool = False


def sse(payload: dict[str, Any]) -> bytes:
    # raw UTF-8 like vLLM's pydantic serialiser, so pieces can split a character
    return b"data: " + json.dumps(payload, ensure_ascii=False).encode() + b"\n\n"


def stream_events(chat: bool, texts: list[str], mode: str, prompt: int) -> list[Event]:
    """A vLLM-shaped stream: role frame (chat), one frame per token, usage chunk, [DONE]."""
    events: list[Event] = []
    kind = "chat.completion.chunk" if chat else "text_completion"

    def frame(choice: dict[str, Any], completion: int) -> Event:
        payload: dict[str, Any] = {"id": "r", "object": kind, "choices": [choice]}
        if mode == "cumulative":
            payload["usage"] = se.usage(prompt, completion)
        elif mode == "final":
            payload["usage"] = None
        has_text = bool(choice.get("text") or choice.get("delta", {}).get("content"))
        reported = completion if mode == "cumulative" else None
        return Event(sse(payload), content=has_text, completion=reported)

    if chat:
        events.append(frame({"index": 0, "delta": {"role": "assistant", "content": ""}}, 0))
    for index, text in enumerate(texts):
        choice = {"index": 0, "delta": {"content": text}} if chat else {"index": 0, "text": text}
        events.append(frame(choice, index + 1))
    if mode != "none":
        final = {"id": "r", "object": kind, "choices": [], "usage": se.usage(prompt, len(texts))}
        events.append(Event(sse(final), completion=len(texts), usage_only=True))
    events.append(Event(b"data: [DONE]\n\n"))
    return events


def reply_body(chat: bool, texts: list[str], mode: str, prompt: int) -> bytes:
    text = "".join(texts)
    choice: dict[str, Any] = (
        {"index": 0, "message": {"role": "assistant", "content": text}}
        if chat
        else {"index": 0, "text": text}
    )
    choice["finish_reason"] = "length"
    body: dict[str, Any] = {"id": "r", "object": "chat.completion", "model": "m"}
    body["choices"] = [choice]
    if mode != "none":
        body["usage"] = se.usage(prompt, len(texts))
    return json.dumps(body, ensure_ascii=False).encode()


# ---------------------------------------------------------------- what must be charged
Tokens = dict[str, int]


class Counted(NamedTuple):
    """What the proxy counted between two scrapes: requests by (tenant, outcome), accounted
    requests by (tenant, usage_source, accounting), tokens by (tenant, usage_source,
    token_type), upstream errors by reason, and the tokens charged by type."""

    outcomes: dict[tuple[str, ...], float]
    accounted: dict[tuple[str, ...], float]
    tokens: dict[tuple[str, ...], float]
    errors: dict[tuple[str, ...], float]
    charged: Tokens


def counted(before: Samples, after: Samples) -> Counted:
    """The counters the stream and the reply properties both judge a request by."""
    tokens = deltas(
        before, after, "inferwatch_tenancy_tokens_total", "tenant", "usage_source", "token_type"
    )
    return Counted(
        deltas(before, after, "inferwatch_tenancy_requests_total", "tenant", "outcome"),
        deltas(
            before,
            after,
            "inferwatch_tenancy_accounted_requests_total",
            "tenant",
            "usage_source",
            "accounting",
        ),
        tokens,
        deltas(before, after, "inferwatch_tenancy_upstream_errors_total", "reason"),
        {token_type: int(value) for (_, _, token_type), value in tokens.items()},
    )


def reported_tokens(prompt: int, completion: int) -> Tokens:
    return {
        "prompt": prompt,
        "cached_prompt": prompt // 2,
        "completion": completion,
        "reasoning": completion // 4,
    }


def stream_charge(events: list[Event], prompt: int, estimate: int) -> tuple[str, Tokens]:
    """What a proxy that saw exactly ``events`` owes: the last usage reported, else one
    token per content frame (every frame here is at most four characters)."""
    reported = [e.completion for e in events if e.completion is not None]
    if reported:
        return "reported", reported_tokens(prompt, max(reported))
    return "estimated", {"prompt": estimate, "completion": sum(e.content for e in events)}


def nonzero(tokens: Tokens) -> Tokens:
    return {key: value for key, value in tokens.items() if value}


def received_events(visible: list[Event], data: bytes) -> list[Event]:
    """The leading visible events that reached the client whole."""
    got: list[Event] = []
    offset = 0
    for event in visible:
        end = offset + len(event.raw)
        if data[offset:end] != event.raw:
            break
        got.append(event)
        offset = end
    return got


# ---------------------------------------------------------------- cases
@dataclass
class Case:
    tenant: str
    chat: bool
    stream: bool
    client_usage: bool
    mode: str  # final | cumulative | none
    texts: list[str]
    prompt_text: str
    engine_prompt: int
    ending: str  # finish | die | stall | malformed | end (the engine stops early, cleanly)
    position: int
    bad: bytes
    cuts: tuple[int, ...]
    leave_after: int | None  # bytes the client reads before hanging up; None: all of them

    @property
    def path(self) -> str:
        return "/v1/chat/completions" if self.chat else "/v1/completions"

    def request(self) -> dict[str, Any]:
        body: dict[str, Any] = {"model": "m", "max_tokens": len(self.texts) + 1}
        if self.chat:
            body["messages"] = [{"role": "user", "content": self.prompt_text}]
        else:
            body["prompt"] = self.prompt_text
        if self.stream:
            body["stream"] = True
            if self.client_usage:
                body["stream_options"] = {"include_usage": True}
        return body


@st.composite
def cases(draw: st.DrawFn) -> Case:
    stream = draw(st.booleans())
    return Case(
        tenant=draw(st.sampled_from(sorted(KEYS))),
        chat=draw(st.booleans()),
        stream=stream,
        client_usage=draw(st.booleans()),
        mode=draw(st.sampled_from(["final", "cumulative", "none"])),
        texts=draw(st.lists(TEXTS, max_size=7)),
        prompt_text=draw(st.sampled_from(["hi", "tell me a story", "\u65e5\u672c\u8a9e " * 9])),
        # within the prompt's ceiling (tests/test_trust_billing.py has the reports above it)
        engine_prompt=draw(st.integers(min_value=1, max_value=TEMPLATE_ALLOWANCE)),
        # slow endings cost a read timeout each: drawn less often
        ending=draw(st.sampled_from(["finish"] * 3 + ["die", "malformed", "end"] * 2 + ["stall"])),
        position=draw(st.integers(min_value=0, max_value=10_000)),
        bad=draw(st.sampled_from(MALFORMED)),
        cuts=tuple(draw(st.lists(st.integers(min_value=1, max_value=2_000), max_size=25))),
        leave_after=draw(st.none() | st.integers(min_value=0, max_value=2_000)),
    )


def _case(**fields: Any) -> Case:
    base: dict[str, Any] = dict(
        tenant="acme",
        chat=True,
        stream=True,
        client_usage=False,
        mode="cumulative",
        texts=["\u65e5\u672c", "\U0001f642", "ab"],
        prompt_text="hi",
        engine_prompt=21,
        ending="finish",
        position=0,
        bad=MALFORMED[0],
        cuts=tuple(range(1, 600, 7)),  # splits inside data: lines and inside characters
        leave_after=None,
    )
    return Case(**{**base, **fields})


# ---------------------------------------------------------------- the properties
@PROPERTY_SETTINGS
@example(case=_case())
@example(case=_case(stream=False, mode="none", ending="stall", leave_after=0))
@example(case=_case(stream=False, ending="end", position=40, chat=False))
@example(case=_case(mode="final", ending="end", position=130, leave_after=None))
@given(case=cases())
def test_accounting_survives_any_chunking_breakage_or_hang_up(stack: Stack, case: Case) -> None:
    reset(stack.engine)
    before = scrape(stack.metrics)
    if case.stream:
        check_stream(stack, case, before)
    else:
        check_reply(stack, case, before)
    # the proxy keeps serving, on a fresh or a still healthy engine connection
    after = stack.client.post(
        case.path,
        json={"model": "m", "prompt": "next", "messages": [{"role": "user", "content": "next"}]},
        headers={"authorization": f"Bearer {KEYS[case.tenant]}"},
    )
    assert after.status_code == 200, after.text
    assert after.json()["usage"]["completion_tokens"] == 8


def check_stream(stack: Stack, case: Case, before: Samples) -> None:
    events = stream_events(case.chat, case.texts, case.mode, case.engine_prompt)
    if case.ending == "malformed":
        # anywhere before [DONE]
        events.insert(case.position % len(events), Event(case.bad, bad=True))
    body = b"".join(e.raw for e in events)
    cut_short = case.ending in ("die", "stall", "end")
    stop_at = case.position % (len(body) + 1) if cut_short else len(body)
    stack.engine.scripts.append(
        se.Script(body, stream=True, cuts=case.cuts, stop_at=stop_at, ending=case.ending)
    )
    # the events the engine sent whole before breaking off, and those the client may see
    sent: list[Event] = []
    offset = 0
    for event in events:
        offset += len(event.raw)
        if event.bad or offset > stop_at:
            break
        sent.append(event)
    visible = [e for e in sent if case.client_usage or not e.usage_only]
    visible_bytes = b"".join(e.raw for e in visible)
    leave_after = None if case.leave_after is None else case.leave_after % (len(visible_bytes) + 1)

    received = b""
    with stack.client.stream(
        "POST",
        case.path,
        json=case.request(),
        headers={"authorization": f"Bearer {KEYS[case.tenant]}", "x-scenario": "scripted"},
    ) as reply:
        assert reply.status_code == 200
        if leave_after != 0:
            for piece in reply.iter_raw():
                received += piece
                if leave_after is not None and len(received) >= leave_after:
                    break
    after = settled(stack.metrics, before)
    forwarded = stack.engine.requests[0]
    assert forwarded["stream_options"]["include_usage"] is True  # forced on, whatever was asked

    outcomes, accounted, tokens, errors, charged = counted(before, after)
    assert len(outcomes) == 1 and set(outcomes.values()) == {1}, outcomes
    ((tenant, outcome),) = outcomes
    assert tenant == case.tenant
    note_case(f"stream, {case.ending}, {'client left' if leave_after is not None else 'read all'}")
    note_case(f"stream outcome: {outcome}")
    assert len(accounted) == 1 and set(accounted.values()) == {1}, accounted
    ((_, source, accounting),) = accounted
    assert {(t, s) for t, s, _ in tokens} <= {(case.tenant, source)}, tokens
    estimate = estimate_prompt_tokens(case.request())
    client_left = leave_after is not None
    # a stream that ends cleanly but inside an event was cut short: malformed
    in_event = stop_at != sum(len(e.raw) for e in sent)
    expected_break = {"die": "reset", "malformed": "malformed_stream", "stall": "timeout"}
    if case.ending == "end" and in_event:
        expected_break["end"] = "malformed_stream"
    # once [DONE] went out the client has the whole stream, whatever the engine does next
    done_sent = any(e.raw == b"data: [DONE]\n\n" for e in sent)
    if outcome == "ok":
        clean = case.ending == "finish" or (case.ending == "end" and not in_event)
        assert clean or done_sent, case.ending
        assert accounting == "complete"
        assert errors == {} or (done_sent and errors == {(expected_break[case.ending],): 1})
        want_source, want = stream_charge(sent, case.engine_prompt, estimate)
        assert (source, charged) == (want_source, nonzero(want))
        # every byte relayed, in order, the usage chunk only if asked for
        assert (
            received == visible_bytes if not client_left else visible_bytes.startswith(received)
        ), (
            received,
            visible_bytes,
        )
    elif outcome == "upstream_error":
        assert case.ending in expected_break and not done_sent
        assert not (case.ending == "stall" and client_left), "timed out a client that had left"
        assert accounting == "error"
        assert errors == {(expected_break[case.ending],): 1}
        seen = received_events(visible, received)
        if case.ending == "die":  # the reset may overtake bytes still in flight
            check_bounds(source, charged, seen, sent, case.engine_prompt, estimate)
        else:
            want_source, want = stream_charge(sent, case.engine_prompt, estimate)
            assert (source, charged) == (want_source, nonzero(want))
        if not client_left:
            relayed = b"".join(e.raw for e in seen)
            last = json.loads(received[len(relayed) :].decode().removeprefix("data: "))
            assert last["error"]["message"].startswith("engine stream failed: ")
            if case.ending != "die":
                assert relayed == visible_bytes
    else:
        assert outcome == "client_cancelled", outcome
        assert client_left, "cancelled although the client read to the end"
        assert accounting == "client_cancelled" and errors == {}
        seen = received_events(visible, received)
        check_bounds(source, charged, seen, sent, case.engine_prompt, estimate)
    if case.ending == "stall":  # the proxy hung up on the engine, which stops generating
        wait_for(lambda: stack.engine.aborted >= 1, "the stalled engine let go", 5, interval=0.01)


def check_bounds(
    source: str,
    charged: Tokens,
    seen: list[Event],
    sent: list[Event],
    prompt: int,
    estimate: int,
) -> None:
    """At least what reached the client, never more than the engine sent."""
    if source == "reported":
        assert any(e.completion is not None for e in sent)
        low = max((e.completion for e in seen if e.completion is not None), default=0)
        high = max(e.completion for e in sent if e.completion is not None)
        completion = charged.get("completion", 0)
        assert low <= completion <= high, (low, completion, high)
        assert charged == nonzero(reported_tokens(prompt, completion))
    else:
        assert source == "estimated"
        assert not any(e.completion is not None for e in seen)
        completion = charged.get("completion", 0)
        low, high = sum(e.content for e in seen), sum(e.content for e in sent)
        assert low <= completion <= high, (low, completion, high)
        assert charged == nonzero({"prompt": estimate, "completion": completion})


def check_reply(stack: Stack, case: Case, before: Samples) -> None:
    """A non-streamed request: the JSON reply in random pieces, cut, stalled or garbled."""
    body = reply_body(case.chat, case.texts, case.mode, case.engine_prompt)
    ending = case.ending
    stop_at = case.position % len(body) if ending in ("die", "stall") else len(body)
    if ending in ("malformed", "end"):  # a garbled or truncated JSON body, properly framed
        body = body[: case.position % len(body)] + (case.bad if ending == "malformed" else b"")
        stop_at = len(body)
        ending = "finish"
    stack.engine.scripts.append(
        se.Script(body, stream=False, cuts=case.cuts, stop_at=stop_at, ending=ending)
    )
    headers = {"authorization": f"Bearer {KEYS[case.tenant]}", "x-scenario": "scripted"}
    # a client that leaves a stalled reply hangs up after a moment
    leaves = case.ending == "stall" and case.leave_after is not None
    timeout = httpx.Timeout(10, read=READ_TIMEOUT / 3 if leaves else 10)
    status: int | None = None
    received = b""
    try:
        reply = stack.client.post(case.path, json=case.request(), headers=headers, timeout=timeout)
        status, received = reply.status_code, reply.content
    except httpx.ReadTimeout:
        assert leaves
    after = settled(stack.metrics, before)

    outcomes, accounted, tokens, errors, charged = counted(before, after)
    sources = {source for _, source, _ in tokens}
    note_case(f"reply, {case.ending}, {'client left' if leaves else 'read all'}")
    estimate = estimate_prompt_tokens(case.request())

    if case.ending == "finish":
        assert status == 200 and received == body
        assert outcomes == {(case.tenant, "ok"): 1} and errors == {}
        if case.mode == "none":
            chars = sum(len(text) for text in case.texts)
            completion = max(1, math.ceil(chars / 4)) if chars else 0
            want_source, want = "estimated", {"prompt": estimate, "completion": completion}
        else:
            want_source, want = "reported", reported_tokens(case.engine_prompt, len(case.texts))
        assert accounted == {(case.tenant, want_source, "complete"): 1}
        assert sources == {want_source} and charged == nonzero(want)
        return
    # broken, stalled or abandoned: the engine took the prompt, so its estimate is charged
    if leaves:
        assert status is None
        assert outcomes == {(case.tenant, "client_cancelled"): 1}
        assert accounted == {(case.tenant, "estimated", "client_cancelled"): 1}
        assert errors == {}
    else:
        reason = {"die": "reset", "stall": "timeout"}.get(case.ending, "protocol")
        assert status == (504 if reason == "timeout" else 502), received
        error = json.loads(received)["error"]
        assert error["message"].startswith("engine "), error
        assert outcomes == {(case.tenant, "upstream_error"): 1}
        assert accounted == {(case.tenant, "estimated", "error"): 1}
        assert errors == {(reason,): 1}
    assert sources == {"estimated"} and charged == {"prompt": estimate}
    if case.ending == "stall":
        wait_for(lambda: stack.engine.aborted >= 1, "the stalled engine let go", 5, interval=0.01)


@settings(max_examples=40, deadline=None, database=None, derandomize=True)
@given(
    body=st.one_of(
        st.binary(max_size=200),
        st.builds(lambda n: b" " * n + b"{}", st.integers(MAX_BODY - 1, 3 * MAX_BODY)),
        st.sampled_from([b"[]", b'"text"', b"null", b"12", b'{"model": "m"', b"\xff{}"]),
    ),
    tenant=st.sampled_from(sorted(KEYS)),
)
def test_bad_request_bodies_get_one_clear_error_and_never_reach_the_engine(
    stack: Stack, body: bytes, tenant: str
) -> None:
    try:
        valid = isinstance(json.loads(body), dict) and len(body) <= MAX_BODY
    except ValueError:
        valid = False
    assume(not valid)  # a real request: the other property covers those
    reset(stack.engine)
    before = scrape(stack.metrics)
    reply = stack.client.post(
        "/v1/chat/completions",
        content=body,
        headers={"authorization": f"Bearer {KEYS[tenant]}", "content-type": "application/json"},
    )
    assert reply.status_code == (413 if len(body) > MAX_BODY else 400)
    error = reply.json()["error"]
    assert error["code"] == "rejected_bad_request" and "\n" not in error["message"]
    after = scrape(stack.metrics)
    assert deltas(before, after, "inferwatch_tenancy_requests_total", "tenant", "outcome") == {
        (tenant, "rejected_bad_request"): 1
    }
    assert deltas(before, after, "inferwatch_tenancy_tokens_total") == {}
    assert stack.engine.requests == []
