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

llama.cpp's server lists no context length on ``/v1/models`` and has no ``/version``: its
``/props`` tells both, the context of a slot (``default_generation_settings.n_ctx``, what one
request may fill) and the build (``build_info``). Without ``max_tokens`` it generates to the
end of that context on completions as on chat. Its ``/tokenize`` takes ``content`` and
answers the tokens; a chat prompt is first rendered by ``/apply-template``, and both are
tokenized with the special tokens its completion routes add.
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
        #: llama.cpp's context of one slot, for whatever name it is asked by (one model)
        self._slot_context: int | None = None
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
        if self._context:
            self._slot_context = None
        else:
            await self._read_props()
            if self._slot_context is not None:
                return
        version = await self._get(b"/version")
        if isinstance(version, Mapping) and isinstance(version.get("version"), str):
            self.version = version["version"][:128]

    async def _read_props(self) -> None:
        """llama.cpp's slot context and build from ``/props``; unchanged where it says none."""
        props = await self._get(b"/props")
        settings = props.get("default_generation_settings") if isinstance(props, Mapping) else None
        n_ctx = settings.get("n_ctx") if isinstance(settings, Mapping) else None
        if type(n_ctx) is not int or n_ctx <= 0:
            return
        assert isinstance(props, Mapping)
        self._slot_context = n_ctx
        build = props.get("build_info")
        if isinstance(build, str) and build:
            self.version = build[:128]

    @property
    def completes_to_context(self) -> bool:
        """Whether a completion without ``max_tokens`` runs to the end of the context (llama.cpp)
        rather than the API's default of 16 (vLLM)."""
        return self._slot_context is not None

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
        return self._slot_context

    async def count(self, path: str, body: Mapping[str, Any]) -> int | None:
        """The engine's own count of the prompt of a chat or completion body, or None."""
        if not self._tokenize:
            return None
        await self.current()
        if self._slot_context is not None:
            return await self._llamacpp_count(path, body)
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
        reply = await self._post(b"/tokenize", request)
        count = reply.get("count") if reply is not None else None
        return count if type(count) is int and count >= 0 else None

    async def _llamacpp_count(self, path: str, body: Mapping[str, Any]) -> int | None:
        prompt: Any = None
        if path == "/v1/chat/completions" and isinstance(body.get("messages"), list):
            rendered = await self._post(b"/apply-template", dict(body))
            prompt = rendered.get("prompt") if rendered is not None else None
        elif path == "/v1/completions":
            prompt = body.get("prompt")
        if not isinstance(prompt, str):
            return None  # token ids, lists of prompts: nothing the route counts as one
        reply = await self._post(b"/tokenize", {"content": prompt, "add_special": True})
        tokens = reply.get("tokens") if reply is not None else None
        return len(tokens) if isinstance(tokens, list) else None

    async def _post(self, path: bytes, request: Mapping[str, Any]) -> Mapping[str, Any] | None:
        """The engine's JSON object reply to ``request``, or None; a route the engine lacks
        (404, 405) is not asked again."""
        try:
            response = await self._pool.request(
                "POST", path, _JSON_HEADERS, jsoncodec.dumps(request)
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
        return reply if isinstance(reply, Mapping) else None
