"""Token usage of one request, read from what the engine sends back.

The OpenAI schema reports ``usage`` once per response, or, for streams that asked for it, in
an extra chunk with no choices just before ``data: [DONE]``. Some engines (vLLM with
``continuous_usage_stats``, or ``--enable-force-include-usage``) attach the *cumulative* usage
to every chunk: the meter keeps the high-water mark of each field, so a usage object seen once
or a hundred times is charged once. When no usage arrives at all, the meter falls back to an
estimate from the text it saw, and says so (``source == "estimated"``).

Token types follow the OpenTelemetry GenAI conventions: ``cached_prompt`` is part of
``prompt`` and ``reasoning`` is part of ``completion``; pricing uses the disjoint parts.

The engine's word is not taken as it is: what is charged lies within what the proxy saw and
what admission allowed (:class:`Bounds`). Completion tokens are at least the content pieces
relayed (each streamed piece of text is one token or more) or, for a reply that came whole,
a floor of its text's tokens; they are at most the completion cap times the choices asked
for, and prompt tokens at most the prompt's count plus what a chat template adds. A count
that is no count at all (negative, fractional, a string) is replaced by the estimate. Each
field charged at a bound instead of as reported is an engine anomaly, counted.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Iterator, Mapping
from dataclasses import dataclass, field
from typing import Any, Literal

from inferwatch.proxy.jsoncodec import loads

UsageSource = Literal["reported", "estimated"]
TOKEN_TYPES = ("prompt", "cached_prompt", "completion", "reasoning")
#: Rule of thumb for English BPE vocabularies; per-message framing per OpenAI's cookbook.
CHARS_PER_TOKEN = 4
TOKENS_PER_MESSAGE = 4


@dataclass
class Usage:
    prompt: int = 0
    cached_prompt: int = 0
    completion: int = 0
    reasoning: int = 0

    def items(self) -> Iterator[tuple[str, int]]:
        yield "prompt", self.prompt
        yield "cached_prompt", self.cached_prompt
        yield "completion", self.completion
        yield "reasoning", self.reasoning

    @property
    def total(self) -> int:
        return self.prompt + self.completion

    @classmethod
    def from_openai(cls, raw: Any) -> Usage | None:
        """Parse an OpenAI ``usage`` object; None when absent or not a usage object."""
        if not isinstance(raw, Mapping):
            return None
        prompt = _count(raw.get("prompt_tokens"))
        completion = _count(raw.get("completion_tokens"))
        if prompt is None and completion is None:
            return None
        prompt_details = raw.get("prompt_tokens_details")
        completion_details = raw.get("completion_tokens_details")
        cached = (
            _count(prompt_details.get("cached_tokens"))
            if isinstance(prompt_details, Mapping)
            else None
        )
        reasoning = (
            _count(completion_details.get("reasoning_tokens"))
            if isinstance(completion_details, Mapping)
            else None
        )
        return cls(prompt or 0, cached or 0, completion or 0, reasoning or 0)

    def raise_to(self, other: Usage) -> None:
        """Keep the larger value of each field (cumulative frames never add up twice)."""
        self.prompt = max(self.prompt, other.prompt)
        self.cached_prompt = max(self.cached_prompt, other.cached_prompt)
        self.completion = max(self.completion, other.completion)
        self.reasoning = max(self.reasoning, other.reasoning)


#: more tokens than any one request can use: a count above it is garbage, not usage
MAX_REPORTED_TOKENS = 1 << 32
#: prompt tokens a chat template may add beyond the per-message framing the proxy counts
#: (Llama 3.1's default system header is about 25; tool-use preambles run longer)
TEMPLATE_ALLOWANCE = 256
#: what the usage fields of a reply are called, by the token type they report
_FIELDS = {"prompt": "prompt_tokens", "completion": "completion_tokens"}


def _no_floor(text: str) -> int:
    return 0


@dataclass
class Bounds:
    """What admission knows a request may cost; None where no bound is known."""

    #: the prompt's count (an upper bound, or the tokenizer's) plus :data:`TEMPLATE_ALLOWANCE`
    prompt_ceiling: int | None = None
    #: the completion cap the engine applies, times the choices asked for
    completion_ceiling: int | None = None
    #: tokens at least in a whole reply's text (the tokenizer's count, or a byte floor)
    text_floor: Callable[[str], int] = field(default=_no_floor)


def _count(value: Any) -> int | None:
    if (
        isinstance(value, bool)
        or not isinstance(value, int)
        or not 0 <= value < MAX_REPORTED_TOKENS
    ):
        return None
    return value


def estimate_text_tokens(text: str) -> int:
    return math.ceil(len(text) / CHARS_PER_TOKEN)


def content_text(content: Any) -> str:
    """Text of a message ``content``: a string, or a list of parts with ``text``."""
    if isinstance(content, str):
        return content
    if isinstance(content, list):
        return " ".join(
            part["text"]
            for part in content
            if isinstance(part, Mapping) and isinstance(part.get("text"), str)
        )
    return ""


def estimate_prompt_tokens(body: Mapping[str, Any]) -> int:
    """Estimated prompt tokens of a chat, completion or embedding request body."""
    messages = body.get("messages")
    if isinstance(messages, list):
        total = 3  # every reply is primed with an assistant header
        for message in messages:
            if isinstance(message, Mapping):
                total += TOKENS_PER_MESSAGE + estimate_text_tokens(
                    content_text(message.get("content"))
                )
        return total
    prompt = body.get("prompt", body.get("input"))
    if isinstance(prompt, str):
        return estimate_text_tokens(prompt)
    if isinstance(prompt, list):
        if all(isinstance(item, int) for item in prompt):
            return len(prompt)  # already token ids
        return sum(
            len(item) if isinstance(item, list) else estimate_text_tokens(str(item))
            for item in prompt
        )
    return 0


class UsageMeter:
    """Accumulates one response's usage, from a JSON body or stream events."""

    def __init__(self, prompt_estimate: int) -> None:
        self.prompt_estimate = prompt_estimate
        #: the estimate is a count (the tokenizer's or the engine's), not 4 characters a token
        self.prompt_counted = False
        self.reported: Usage | None = None
        #: the usage said how many prompt tokens were cached (vLLM only sends it with
        #: ``--enable-prompt-tokens-details``; without it no cached token can be priced apart)
        self.prompt_details = False
        self.bounds = Bounds()
        #: (token type, reason) of every field charged otherwise than reported, once known
        self.anomalies: list[tuple[str, str]] = []
        self._invalid: set[str] = set()
        self._completion_chars = 0
        self._content_events = 0
        self._whole_floor = 0
        #: what the engine says it served and why each choice ended (for the request's span)
        self.response_model = ""
        self.finish_reasons: list[str] = []

    def observe(self, payload: Mapping[str, Any], whole: bool = False) -> bool:
        """Take in a response body (``whole``) or one stream event; True if it carried usage."""
        raw_usage = payload.get("usage")
        usage = Usage.from_openai(raw_usage) if raw_usage is not None else None
        if not self.response_model and type(payload.get("model")) is str:
            self.response_model = payload["model"][:256]
        choices = payload.get("choices")
        if type(choices) is list:
            for choice in choices:
                if type(choice) is dict:
                    self._observe_choice(choice)
                    if whole:
                        self._whole_floor += self.bounds.text_floor(_choice_text(choice))
        if isinstance(raw_usage, Mapping):
            for token_type, name in _FIELDS.items():
                value = raw_usage.get(name)
                # every usage names its prompt; a reply without completion_tokens has none
                if (value is not None or token_type == "prompt") and _count(value) is None:
                    self._invalid.add(token_type)
        if usage is None:
            return False
        if isinstance(raw_usage, Mapping) and isinstance(
            raw_usage.get("prompt_tokens_details"), Mapping
        ):
            self.prompt_details = True
        if self.reported is None:
            self.reported = usage
        else:
            self.reported.raise_to(usage)
        return True

    def _observe_choice(self, choice: Mapping[str, Any]) -> None:
        reason = choice.get("finish_reason")
        if (
            type(reason) is str
            and reason not in self.finish_reasons
            and len(self.finish_reasons) < 8
        ):
            self.finish_reasons.append(reason[:64])
        delta = choice.get("delta") or choice.get("message")
        size = 0
        text = choice.get("text")
        if type(text) is str:
            size += len(text)
        if type(delta) is dict:
            for key in ("content", "reasoning_content"):
                text = delta.get(key)
                if type(text) is str:
                    size += len(text)
            if "tool_calls" in delta:
                size += len(_tool_call_text(delta["tool_calls"]))
        if size:
            self._completion_chars += size
            self._content_events += 1

    @property
    def source(self) -> UsageSource:
        return "estimated" if self.reported is None else "reported"

    @property
    def content_events(self) -> int:
        """Events (or bodies) so far that carried generated text: the first marks TTFT."""
        return self._content_events

    def usage(self) -> Usage:
        """What to charge: the reported usage within its bounds, else the estimate."""
        # a streamed chunk carries at least one token; chars/4 covers long chunks
        estimate = max(self._content_events, math.ceil(self._completion_chars / CHARS_PER_TOKEN))
        bounds = self.bounds
        floor = max(self._content_events, self._whole_floor)
        if self.reported is None:
            self.anomalies = [(token_type, "invalid") for token_type in sorted(self._invalid)]
            return Usage(
                prompt=_at_most(self.prompt_estimate, bounds.prompt_ceiling),
                completion=_at_most(max(estimate, floor), bounds.completion_ceiling),
            )
        usage = Usage(**vars(self.reported))
        anomalies = self.anomalies = []
        for token_type in sorted(self._invalid):  # no count at all: the estimate stands in
            anomalies.append((token_type, "invalid"))
            if token_type == "prompt":
                usage.prompt = max(usage.prompt, self.prompt_estimate)
            else:
                usage.completion = max(usage.completion, estimate)
        if usage.completion < floor:
            usage.completion = floor
            anomalies.append(("completion", "below_floor"))
        for token_type, ceiling in (
            ("prompt", bounds.prompt_ceiling),
            ("completion", bounds.completion_ceiling),
        ):
            if ceiling is not None and getattr(usage, token_type) > ceiling:
                setattr(usage, token_type, ceiling)
                anomalies.append((token_type, "above_ceiling"))
        # the parts never exceed their whole
        usage.cached_prompt = min(usage.cached_prompt, usage.prompt)
        usage.reasoning = min(usage.reasoning, usage.completion)
        return usage


def _at_most(value: int, ceiling: int | None) -> int:
    return value if ceiling is None else min(value, ceiling)


def _tool_call_text(calls: Any) -> str:
    """The generated text of tool calls: names and arguments."""
    parts: list[str] = []
    if type(calls) is list:
        for call in calls:
            function = call.get("function") if type(call) is dict else None
            if type(function) is dict:
                parts.extend(
                    value for key in ("name", "arguments")
                    if type(value := function.get(key)) is str
                )  # fmt: skip
    return "".join(parts)


def _choice_text(choice: Mapping[str, Any]) -> str:
    """All the text a whole reply's choice generated (content, reasoning, tool calls)."""
    message = choice.get("message")
    text = choice.get("text")
    parts = [text] if type(text) is str else []
    if type(message) is dict:
        parts.extend(
            value for key in ("content", "reasoning_content")
            if type(value := message.get(key)) is str
        )  # fmt: skip
        parts.append(_tool_call_text(message.get("tool_calls")))
    return "".join(parts)


class MalformedEvent(ValueError):
    """An upstream stream event that is not an SSE data line with a JSON object."""


class EventStream:
    """Splits an SSE byte stream into events, whatever the chunk boundaries.

    ``feed`` yields each complete event as ``(raw_bytes, payload)``: the raw bytes, separator
    included, are what gets forwarded; the payload is the parsed JSON object, the string
    ``"[DONE]"``, or None for comments and events without data.
    """

    def __init__(self) -> None:
        self._buffer = b""

    def feed(self, chunk: bytes) -> Iterator[tuple[bytes, dict[str, Any] | str | None]]:
        """Yield each event completed by ``chunk``; a malformed one raises when reached."""
        data = self._buffer + chunk if self._buffer else chunk
        crlf = b"\r" in data
        start = 0
        try:
            while True:
                end = _event_end(data, start, crlf)
                if end < 0:
                    break
                raw = data[start:end]
                start = end
                yield raw, _parse_event(raw)
        finally:  # also when an event is malformed: it is consumed, the rest stays
            self._buffer = data[start:]

    @property
    def pending(self) -> bytes:
        """Bytes of an unfinished event (a stream that ends here was cut short)."""
        return self._buffer


def _event_end(data: bytes, start: int, crlf: bool) -> int:
    """Index just past the blank line ending the event that begins at ``start``, or -1.

    ``crlf`` says whether ``data`` holds any carriage return, which most streams never do.
    """
    if not crlf:
        index = data.find(b"\n\n", start)
        return index + 2 if index >= 0 else -1
    best = -1
    for separator in (b"\n\n", b"\r\n\r\n", b"\r\r"):
        index = data.find(separator, start)
        if index >= 0 and (best < 0 or index + len(separator) < best):
            best = index + len(separator)
    return best


def _parse_event(raw: bytes) -> dict[str, Any] | str | None:
    text: bytes | None
    if raw.startswith(b"data: {") and raw.count(b"\n") == 2 and raw.endswith(b"\n\n"):
        text = raw[6:-2]  # the usual shape: one data line holding a JSON object
    else:
        text = _event_data(raw)
        if text is None:
            return None
        if text.strip() == b"[DONE]":
            return "[DONE]"
    try:
        payload = loads(text)
    except ValueError:
        raise MalformedEvent(f"event data is not JSON: {text[:80]!r}") from None
    if not isinstance(payload, dict):
        raise MalformedEvent(f"event data is not a JSON object: {text[:80]!r}")
    return payload


def _event_data(raw: bytes) -> bytes | None:
    """The joined data lines of an event, None if it has none; fails on lines SSE lacks."""
    lines = raw.replace(b"\r\n", b"\n").replace(b"\r", b"\n").split(b"\n")
    data: list[bytes] = []
    for line in lines:
        if line.startswith(b"data:"):
            value = line[5:]
            data.append(value[1:] if value.startswith(b" ") else value)
        elif (
            line
            and not line.startswith(b":")
            and not line.startswith((b"event:", b"id:", b"retry:"))
        ):
            raise MalformedEvent(f"unexpected line in event stream: {line[:80]!r}")
    return b"\n".join(data) if data else None
