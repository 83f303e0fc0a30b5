"""What the engine says about itself: each model's context length, its version, prompt counts.

Admission has to follow the engine's real limits, not guesses: vLLM lists ``max_model_len``
per model on ``/v1/models`` and serves a chat request without ``max_tokens`` up to the end
of the context, so a cap invented by the proxy (or a prompt bound four times too high) turns
a request the engine would serve into a 400. The facts are read on first need and again once
they are older than :data:`REFRESH_S`; a failed read is retried no sooner than that either,
so an engine without the route costs one request per period, not one per client request.

``/version`` (vLLM: ``{"version": "0.32.0"}``) names the engine version the proxy's series
carry when the configuration sets none, the same value the sidecar reads. ``/tokenize``
(vLLM's, with the chat template applied to ``messages``) counts a prompt exactly; admission
asks it only where a byte bound would refuse or clamp a request.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Callable, Mapping
from typing import Any

from inferwatch.proxy import jsoncodec
from inferwatch.proxy.upstream import UpstreamError, UpstreamPool

REFRESH_S = 60.0
#: a reply about the engine itself is small; anything bigger is not what was asked for
MAX_REPLY_BYTES = 1 << 20
_JSON_HEADERS = [(b"content-type", b"application/json")]


class EngineInfo:
    def __init__(self, pool: UpstreamPool, clock: Callable[[], float] = time.monotonic) -> None:
        self._pool = pool
        self._clock = clock
        self._context: dict[str, int] = {}
        self.version = ""
        self._read_at: float | None = None
        self._reading: asyncio.Future[None] | None = None
        self._tokenize = True  # until the engine says it has no such route

    async def _get(self, path: bytes) -> Any:
        try:
            response = await self._pool.request("GET", path, [], b"")
            data = await response.read(MAX_REPLY_BYTES)
        except UpstreamError:
            return None
        if response.status != 200:
            return None
        try:
            return jsoncodec.loads(data)
        except ValueError:
            return None

    async def refresh(self) -> None:
        """Read ``/v1/models`` and ``/version``; what cannot be read keeps its last value."""
        self._read_at = self._clock()
        models = await self._get(b"/v1/models")
        if isinstance(models, Mapping) and isinstance(models.get("data"), list):
            self._context = {
                entry["id"]: entry["max_model_len"]
                for entry in models["data"]
                if isinstance(entry, Mapping)
                and isinstance(entry.get("id"), str)
                and type(entry.get("max_model_len")) is int
                and entry["max_model_len"] > 0
            }
        version = await self._get(b"/version")
        if isinstance(version, Mapping) and isinstance(version.get("version"), str):
            self.version = version["version"][:128]

    async def current(self) -> None:
        """Make sure the facts are at most :data:`REFRESH_S` old; one read at a time."""
        if self._read_at is not None and self._clock() - self._read_at < REFRESH_S:
            return
        if self._reading is None:
            self._reading = asyncio.ensure_future(self.refresh())
            self._reading.add_done_callback(lambda _: setattr(self, "_reading", None))
        await asyncio.shield(self._reading)

    async def context(self, model: str) -> int | None:
        """The engine's context length for ``model`` (its only model when the name is not
        listed, as an engine serving one model answers to any name), or None if unknown."""
        await self.current()
        if model in self._context:
            return self._context[model]
        if len(self._context) == 1:
            return next(iter(self._context.values()))
        return None

    async def count(self, path: str, body: Mapping[str, Any]) -> int | None:
        """The engine's own count of the prompt of a chat or completion body, or None."""
        if not self._tokenize:
            return None
        request: dict[str, Any] = {"model": body.get("model")}
        if path == "/v1/chat/completions" and isinstance(body.get("messages"), list):
            request["messages"] = body["messages"]
            for key in ("tools", "chat_template_kwargs", "add_generation_prompt"):
                if key in body:
                    request[key] = body[key]
        elif path == "/v1/completions" and isinstance(body.get("prompt"), str):
            request["prompt"] = body["prompt"]
        else:
            return None  # token ids, lists of prompts: nothing the route counts as one
        try:
            response = await self._pool.request(
                "POST", b"/tokenize", _JSON_HEADERS, jsoncodec.dumps(request)
            )
            data = await response.read(MAX_REPLY_BYTES)
        except (UpstreamError, ValueError):
            return None
        if response.status in (404, 405):
            self._tokenize = False
            return None
        try:
            reply = jsoncodec.loads(data) if response.status == 200 else None
        except ValueError:
            return None
        count = reply.get("count") if isinstance(reply, Mapping) else None
        return count if type(count) is int and count >= 0 else None
