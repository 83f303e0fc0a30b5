"""Send one golden to an OpenAI-compatible endpoint and time the streamed reply.

Requests are streamed so that time to first token is measured the way users feel it, and
marked with the reserved tenant ``_probe`` (header ``X-Inferwatch-Tenant``) so that the
tenancy proxy keeps probe tokens out of customer cost; where tenants are resolved from API
keys instead, give the probe its own key (``api_key``) mapped to ``_probe``. Every failure
comes back as a :class:`Reply` with ``error`` set, never as an exception. A reply that is not
readable JSON at all (nesting past the parser's depth, a number no double can hold) is
``unreadable_reply``: the probe could not run, which says nothing about answer quality.
"""

from __future__ import annotations

import asyncio
import json
import time
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any, Final

import httpx

from inferwatch import __version__
from inferwatch.probes.golden import Golden
from inferwatch.probes.reply import Reply, ToolCall
from inferwatch.wire import PROBE_TENANT, TENANT_HEADER

UNREADABLE: Final = "unreadable_reply"
MAX_BODY_BYTES: Final = 1 << 20
#: of an error answer: bytes read at most, characters kept of its message
MAX_ERROR_BYTES: Final = 16 * 1024
MAX_DETAIL_CHARS: Final = 300


class UnreadableReply(ValueError):
    """JSON that cannot be read back as data (see the module docstring)."""


def _finite(text: str) -> float:
    value = float(text)
    if value in (float("inf"), float("-inf")):
        raise UnreadableReply(f"number {text[:40]} does not fit a double")
    return value


def _integer(text: str) -> int:
    if len(text) > 4000:  # past what int() converts by default (4300 digits)
        raise UnreadableReply(f"an integer of {len(text)} digits")
    return int(text)


def loads(text: str | bytes) -> Any:
    """Parse JSON; ``UnreadableReply`` for JSON nested too deeply or numbers out of range."""
    try:
        return json.loads(text, parse_float=_finite, parse_int=_integer)
    except RecursionError:
        raise UnreadableReply("JSON nested too deeply") from None


def _tokens(value: Any) -> int:
    """A usage count, or 0 for anything that is not a plausible one."""
    return value if type(value) is int and 0 <= value < 1 << 32 else 0


@dataclass(frozen=True)
class Endpoint:
    """Where to send probes: an OpenAI-compatible base URL (``http://pod:8000``)."""

    url: str
    model: str = ""
    api_key: str = ""
    headers: Mapping[str, str] = field(default_factory=dict)

    @property
    def completions_url(self) -> str:
        base = self.url.rstrip("/")
        return base + ("/chat/completions" if base.endswith("/v1") else "/v1/chat/completions")

    @property
    def models_url(self) -> str:
        base = self.url.rstrip("/")
        return base + ("/models" if base.endswith("/v1") else "/v1/models")

    def request_headers(self) -> dict[str, str]:
        headers = {
            "Accept": "text/event-stream, application/json",
            "User-Agent": f"inferwatch-probe/{__version__}",
            TENANT_HEADER: PROBE_TENANT,
            **self.headers,
        }
        if self.api_key:
            headers["Authorization"] = f"Bearer {self.api_key}"
        return headers


class _Assembler:
    """Accumulates streamed (or whole) chat-completion JSON into a reply."""

    def __init__(self) -> None:
        self.content: list[str] = []
        self.calls: dict[int, dict[str, str]] = {}
        self.finish_reason = ""
        self.usage: Mapping[str, Any] = {}
        self.model = ""
        self.fingerprint = ""
        self.first_token_at: float | None = None

    def feed(self, chunk: Mapping[str, Any], now: float) -> None:
        self.model = str(chunk.get("model") or self.model)
        self.fingerprint = str(chunk.get("system_fingerprint") or self.fingerprint)
        if isinstance(chunk.get("usage"), Mapping):
            self.usage = chunk["usage"]
        for choice in chunk.get("choices") or ():
            part = choice.get("delta") or choice.get("message") or {}
            text = part.get("content")
            if text:
                self.content.append(str(text))
                self._first(now)
            for i, call in enumerate(part.get("tool_calls") or ()):
                slot = self.calls.setdefault(int(call.get("index", i)), {"name": "", "args": ""})
                function = call.get("function") or {}
                slot["name"] += str(function.get("name") or "")
                slot["args"] += str(function.get("arguments") or "")
                self._first(now)
            if choice.get("finish_reason"):
                self.finish_reason = str(choice["finish_reason"])

    def _first(self, now: float) -> None:
        if self.first_token_at is None:
            self.first_token_at = now

    def reply(self, status: int, started: float, headers: Mapping[str, str]) -> Reply:
        return Reply(
            status=status,
            content="".join(self.content),
            tool_calls=tuple(
                ToolCall(name=c["name"], arguments=c["args"]) for _, c in sorted(self.calls.items())
            ),
            finish_reason=self.finish_reason,
            prompt_tokens=_tokens(self.usage.get("prompt_tokens")),
            completion_tokens=_tokens(self.usage.get("completion_tokens")),
            ttft_s=None if self.first_token_at is None else self.first_token_at - started,
            total_s=time.perf_counter() - started,
            model=self.model,
            system_fingerprint=self.fingerprint,
            headers=headers,
        )


async def _read(response: httpx.Response, assembler: _Assembler) -> None:
    """Feed a streamed (SSE) or whole JSON body into the assembler; ValueError if malformed."""
    if "text/event-stream" not in response.headers.get("content-type", ""):
        body = await response.aread()
        if len(body) > MAX_BODY_BYTES:
            raise ValueError("body too large")
        assembler.feed(loads(body), time.perf_counter())
        return
    size = 0
    async for line in response.aiter_lines():
        size += len(line)
        if size > MAX_BODY_BYTES:
            raise ValueError("body too large")
        if not line.startswith("data:"):
            continue
        data = line[5:].strip()
        if data == "[DONE]":
            return
        chunk = loads(data)
        if not isinstance(chunk, dict):
            raise ValueError("frame is not an object")
        assembler.feed(chunk, time.perf_counter())


async def error_message(response: httpx.Response) -> str:
    """The message of an error answer (OpenAI's ``{"error": {"message"}}``, vLLM's
    ``{"message"}``, or the text), its first ``MAX_DETAIL_CHARS`` characters."""
    body = b""
    async for chunk in response.aiter_bytes():
        body += chunk
        if len(body) > MAX_ERROR_BYTES:
            break
    text = body[:MAX_ERROR_BYTES].decode("utf-8", "replace")
    try:
        document = json.loads(text)
    except ValueError:
        document = None
    if isinstance(document, Mapping):
        error = document.get("error")
        inner = error.get("message") if isinstance(error, Mapping) else error
        message = inner if isinstance(inner, str) and inner else document.get("message")
        if isinstance(message, str) and message:
            text = message
    return " ".join(text.split())[:MAX_DETAIL_CHARS]


async def send(
    http: httpx.AsyncClient, endpoint: Endpoint, golden: Golden, timeout_s: float
) -> Reply:
    """Run one golden against ``endpoint`` within ``timeout_s`` seconds, all included."""
    started = time.perf_counter()
    assembler = _Assembler()
    status = 0
    headers: Mapping[str, str] = {}
    try:
        async with asyncio.timeout(timeout_s):
            async with http.stream(
                "POST",
                endpoint.completions_url,
                json=golden.request(endpoint.model),
                headers=endpoint.request_headers(),
                timeout=timeout_s,
            ) as response:
                status = response.status_code
                headers = dict(response.headers)
                if status != 200:
                    return Reply(
                        status=status,
                        error=f"http_{status}",
                        total_s=time.perf_counter() - started,
                        headers=headers,
                        detail=await error_message(response),
                    )
                await _read(response, assembler)
    except (TimeoutError, httpx.TimeoutException):
        return Reply(status=status, error="timeout", total_s=time.perf_counter() - started)
    except httpx.TransportError:
        return Reply(status=status, error="connect", total_s=time.perf_counter() - started)
    except UnreadableReply:
        return Reply(status=status, error=UNREADABLE, total_s=time.perf_counter() - started)
    except (ValueError, TypeError, AttributeError, OverflowError, httpx.HTTPError):
        return Reply(status=status, error="bad_response", total_s=time.perf_counter() - started)
    return assembler.reply(status, started, headers)


async def discover_model(http: httpx.AsyncClient, endpoint: Endpoint, timeout_s: float) -> str:
    """The first model id the endpoint serves (``GET /v1/models``); raises on failure."""
    response = await http.get(
        endpoint.models_url, headers=endpoint.request_headers(), timeout=timeout_s
    )
    response.raise_for_status()
    listing = loads(response.content)
    data = (listing.get("data") if isinstance(listing, Mapping) else None) or []
    if not isinstance(data, list) or not data or not isinstance(data[0], Mapping):
        raise ValueError("the endpoint lists no models")
    if not data[0].get("id"):
        raise ValueError("the endpoint lists no models")
    return str(data[0]["id"])
