"""Property tests of the proxy's usage accounting: any chunking, cancellation or breakage."""

from __future__ import annotations

import json
from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from inferwatch.proxy.usage import (
    EventStream,
    MalformedEvent,
    Usage,
    UsageMeter,
    estimate_prompt_tokens,
)

pytestmark = pytest.mark.unit

PROMPT = 37


def _usage(completion: int) -> dict[str, Any]:
    return {
        "prompt_tokens": PROMPT,
        "completion_tokens": completion,
        "total_tokens": PROMPT + completion,
        "prompt_tokens_details": {"cached_tokens": 16},
        "completion_tokens_details": {"reasoning_tokens": completion // 3},
    }


def _stream(tokens: int, cumulative: bool, final_usage: bool, crlf: bool) -> list[bytes]:
    """Events of an OpenAI chat stream, as vLLM writes them."""
    events = []
    for index in range(tokens):
        frame: dict[str, Any] = {"choices": [{"index": 0, "delta": {"content": "ab"}}]}
        if cumulative:
            frame["usage"] = _usage(index + 1)
        events.append(frame)
    if final_usage:
        events.append({"choices": [], "usage": _usage(tokens)})
    newline = b"\r\n" if crlf else b"\n"
    raw = [b"data: " + json.dumps(e).encode() + newline * 2 for e in events]
    return [*raw, b"data: [DONE]" + newline * 2]


def _split(data: bytes, cuts: list[int]) -> list[bytes]:
    points = sorted({c % (len(data) + 1) for c in cuts})
    pieces, last = [], 0
    for point in [*points, len(data)]:
        pieces.append(data[last:point])
        last = point
    return pieces


def _relay(pieces: list[bytes], meter: UsageMeter) -> bytes:
    stream = EventStream()
    out = []
    for piece in pieces:
        for raw, payload in stream.feed(piece):
            if isinstance(payload, dict):
                meter.observe(payload)
            out.append(raw)
    assert stream.pending == b""
    return b"".join(out)


streams = st.tuples(
    st.integers(min_value=0, max_value=40),
    st.booleans(),
    st.booleans(),
    st.booleans(),
    st.lists(st.integers(min_value=0, max_value=10_000), max_size=30),
)


@settings(max_examples=300, deadline=None)
@given(streams)
def test_any_chunking_charges_the_final_usage_once(
    case: tuple[int, bool, bool, bool, list[int]],
) -> None:
    tokens, cumulative, final_usage, crlf, cuts = case
    events = _stream(tokens, cumulative, final_usage, crlf)
    data = b"".join(events)
    meter = UsageMeter(prompt_estimate=5)
    relayed = _relay(_split(data, cuts), meter)
    assert relayed == data  # every byte forwarded, in order, nothing invented
    usage = meter.usage()
    if final_usage or (cumulative and tokens):
        assert meter.source == "reported"
        assert usage == Usage.from_openai(_usage(tokens))
    else:
        assert meter.source == "estimated"
        assert usage == Usage(prompt=5, completion=tokens)


@settings(max_examples=300, deadline=None)
@given(streams, st.integers(min_value=0))
def test_cancelling_anywhere_charges_what_was_seen_and_never_more(
    case: tuple[int, bool, bool, bool, list[int]], stop_at: int
) -> None:
    tokens, cumulative, final_usage, crlf, cuts = case
    data = b"".join(_stream(tokens, cumulative, final_usage, crlf))
    stop = stop_at % (len(data) + 1)
    meter = UsageMeter(prompt_estimate=5)
    _relay_partial = EventStream()
    seen_frames = 0
    for piece in _split(data[:stop], cuts):
        for _, payload in _relay_partial.feed(piece):
            if isinstance(payload, dict):
                meter.observe(payload)
                seen_frames += bool(payload.get("choices"))
    usage = meter.usage()
    assert usage.completion <= tokens
    if cumulative and seen_frames:
        assert meter.source == "reported"
        assert usage.completion == seen_frames  # the high-water mark, not a sum of frames
        assert usage.prompt == PROMPT
    elif meter.source == "estimated":
        assert usage.completion == seen_frames
        assert usage.prompt == 5


@settings(max_examples=200, deadline=None)
@given(
    st.integers(min_value=1, max_value=20),
    st.integers(min_value=0),
    st.sampled_from([b"data: {not json\n\n", b"data: [1, 2]\n\n", b"bogus line\n\n"]),
    st.lists(st.integers(min_value=0, max_value=5000), max_size=10),
)
def test_a_broken_event_fails_loudly_and_keeps_the_usage_before_it(
    tokens: int, position: int, broken: bytes, cuts: list[int]
) -> None:
    events = _stream(tokens, cumulative=True, final_usage=False, crlf=False)
    index = position % len(events)
    data = b"".join([*events[:index], broken, *events[index:]])
    meter = UsageMeter(prompt_estimate=5)
    stream = EventStream()
    with pytest.raises(MalformedEvent):
        for piece in _split(data, cuts):
            for _, payload in stream.feed(piece):
                if isinstance(payload, dict):
                    meter.observe(payload)
    assert meter.usage().completion == min(index, tokens)


def test_usage_parsing_rejects_what_is_not_a_count() -> None:
    assert Usage.from_openai(None) is None
    assert Usage.from_openai({"prompt_tokens": "many"}) is None
    assert Usage.from_openai({"prompt_tokens": True, "completion_tokens": -1}) is None
    embeddings = Usage.from_openai({"prompt_tokens": 9, "total_tokens": 9})
    assert embeddings == Usage(prompt=9)


def test_prompt_estimates_cover_chat_completion_and_token_ids() -> None:
    chat = {"messages": [{"role": "user", "content": "x" * 400}]}
    assert estimate_prompt_tokens(chat) == 3 + 4 + 100
    parts = {"messages": [{"role": "user", "content": [{"type": "text", "text": "y" * 40}]}]}
    assert estimate_prompt_tokens(parts) == 3 + 4 + 10
    assert estimate_prompt_tokens({"prompt": "z" * 80}) == 20
    assert estimate_prompt_tokens({"prompt": [1, 2, 3]}) == 3
    assert estimate_prompt_tokens({"input": ["aaaa", "bbbbbbbb"]}) == 3


def test_events_the_standard_json_module_accepts_are_metered_as_before() -> None:
    # -Infinity log-probabilities and integers past 64 bits: orjson refuses both
    frame = (
        b'data: {"choices": [{"index": 0, "delta": {"content": "ab"}, '
        b'"logprobs": {"content": [{"token": "ab", "logprob": -Infinity}]}}], '
        b'"seed": 123456789012345678901234567890, "usage": '
        + json.dumps(_usage(1)).encode()
        + b"}\n\n"
    )
    meter = UsageMeter(prompt_estimate=5)
    for _, payload in EventStream().feed(frame):
        assert isinstance(payload, dict)
        assert payload["seed"] == 123456789012345678901234567890
        meter.observe(payload)
    assert meter.usage() == Usage(prompt=PROMPT, cached_prompt=16, completion=1, reasoning=0)
    with pytest.raises(MalformedEvent):
        list(EventStream().feed(b"data: {NaNa}\n\n"))
