"""The OpenAI-compatible HTTP surface, shaped like vLLM's responses and SSE framing.

Streams are ``data: {json}\\n\\n`` events ending with ``data: [DONE]``; with
``stream_options.include_usage`` the last event before ``[DONE]`` is a chunk with empty
``choices`` and the ``usage`` object. A client that disconnects aborts its request (the
engine counts it with ``finished_reason="abort"``).
"""

from __future__ import annotations

import hmac
import json
import logging
import time
from collections.abc import AsyncIterator
from typing import Any

from prometheus_client import CONTENT_TYPE_LATEST
from starlette.requests import Request
from starlette.responses import JSONResponse, Response, StreamingResponse

from inferwatch.logs import log_event
from inferwatch.sim.answers import EOS
from inferwatch.sim.engine import Finished
from inferwatch.sim.faults import FaultError
from inferwatch.sim.simulator import VLLM_VERSION, ApiError, Job, Simulator

logger = logging.getLogger("inferwatch.sim")


def _sim(request: Request) -> Simulator:
    sim: Simulator = request.app.state.sim
    return sim


def error_response(status: int, message: str, kind: str = "BadRequestError") -> JSONResponse:
    body = {"error": {"message": message, "type": kind, "param": None, "code": status}}
    return JSONResponse(body, status_code=status)


def _dumps(payload: dict[str, Any]) -> str:
    return f"data: {json.dumps(payload, separators=(',', ':'))}\n\n"


def _usage(job: Job) -> dict[str, Any]:
    request = job.request
    prompt, completion = len(request.prompt), len(request.output)
    return {
        "prompt_tokens": prompt,
        "total_tokens": prompt + completion,
        "completion_tokens": completion,
        "prompt_tokens_details": {"cached_tokens": request.cached_tokens},
    }


def _finish_reason(job: Job, reason: str) -> str:
    return "tool_calls" if job.tool_call_name and reason == "stop" else reason


def _tool_call(job: Job, arguments: str, first: bool) -> dict[str, Any]:
    call: dict[str, Any] = {"index": 0, "function": {"arguments": arguments}}
    if first:
        call.update(id=f"call_{job.id.split('-')[-1][:24]}", type="function")
        call["function"]["name"] = job.tool_call_name
    return call


async def chat_completions(request: Request) -> Response:
    return await _complete(request, chat=True)


async def completions(request: Request) -> Response:
    return await _complete(request, chat=False)


async def _complete(http: Request, chat: bool) -> Response:
    sim = _sim(http)
    try:
        body = await http.json()
    except ValueError:
        return error_response(400, "the request body is not valid JSON")
    try:
        job = sim.prepare(body, chat)
        sim.submit(job)
    except ApiError as exc:
        return error_response(exc.status, str(exc), exc.kind)
    created = int(time.time())
    if body.get("stream"):
        options = body.get("stream_options") or {}
        usage = isinstance(options, dict) and bool(options.get("include_usage"))
        return StreamingResponse(
            _stream(job, chat, created, sim.model_name, usage), media_type="text/event-stream"
        )
    return await _whole(job, chat, created, sim.model_name)


async def _events(job: Job) -> AsyncIterator[tuple[str, bool, str | None]]:
    """(piece, first, finish reason or None) per token; raises ApiError if the engine failed."""
    assert job.stream is not None
    done = False
    try:
        while True:
            event = await job.stream.get()
            if isinstance(event, Finished):
                done = True
                if event.reason in ("error", "abort"):
                    raise ApiError(
                        500, f"the request ended with {event.reason}", "InternalServerError"
                    )
                return
            yield event.piece, event.first, event.request.finish_reason if event.finished else None
    finally:
        if not done:
            job.engine.abort(job.request)


async def _whole(job: Job, chat: bool, created: int, model: str) -> Response:
    text: list[str] = []
    reason = "stop"
    try:
        async for piece, _, finish in _events(job):
            text.append(piece)
            reason = finish or reason
    except ApiError as exc:
        return error_response(exc.status, str(exc), exc.kind)
    content = "".join(text)
    common = {"id": job.id, "created": created, "model": model, "usage": _usage(job)}
    if not chat:
        choice = {"index": 0, "text": content, "logprobs": None, "finish_reason": reason,
                  "stop_reason": None, "prompt_logprobs": None}  # fmt: skip
        return JSONResponse({**common, "object": "text_completion", "choices": [choice]})
    message: dict[str, Any] = {"role": "assistant", "content": content, "tool_calls": []}
    if job.tool_call_name:
        message["content"] = None
        message["tool_calls"] = [_tool_call(job, content, first=True)]
        del message["tool_calls"][0]["index"]
    choice = {"index": 0, "message": message, "logprobs": None,
              "finish_reason": _finish_reason(job, reason), "stop_reason": None}  # fmt: skip
    return JSONResponse({**common, "object": "chat.completion", "choices": [choice]})


async def _stream(
    job: Job, chat: bool, created: int, model: str, usage: bool
) -> AsyncIterator[str]:
    base = {"id": job.id, "object": "chat.completion.chunk" if chat else "text_completion",
            "created": created, "model": model}  # fmt: skip
    if chat:
        delta = {"role": "assistant", "content": ""}
        yield _dumps(
            {
                **base,
                "choices": [{"index": 0, "delta": delta, "logprobs": None, "finish_reason": None}],
            }
        )
    try:
        async for piece, first, finish in _events(job):
            reason = None if finish is None else _finish_reason(job, finish)
            choice: dict[str, Any]
            if not chat:
                choice = {
                    "index": 0,
                    "text": piece,
                    "logprobs": None,
                    "finish_reason": reason,
                    "stop_reason": None,
                }
            elif job.tool_call_name:
                calls = [_tool_call(job, piece, first)] if piece != EOS else None
                tool_delta = {"tool_calls": calls} if calls else {}
                choice = {
                    "index": 0,
                    "delta": tool_delta,
                    "logprobs": None,
                    "finish_reason": reason,
                }
            else:
                choice = {
                    "index": 0,
                    "delta": {"content": piece},
                    "logprobs": None,
                    "finish_reason": reason,
                }
            yield _dumps({**base, "choices": [choice]})
    except ApiError as exc:
        yield _dumps(
            {"error": {"message": str(exc), "type": exc.kind, "param": None, "code": exc.status}}
        )
    else:
        if usage:
            yield _dumps({**base, "choices": [], "usage": _usage(job)})
    yield "data: [DONE]\n\n"


async def models(request: Request) -> Response:
    """One card per served name, as vLLM lists them."""
    sim = _sim(request)
    created = int(time.time())
    cards = [
        {
            "id": name,
            "object": "model",
            "created": created,
            "owned_by": "vllm",
            "root": sim.capacity.model.name,
            "parent": None,
            "max_model_len": sim.capacity.max_model_len,
        }
        for name in sim.served_names
    ]
    return JSONResponse({"object": "list", "data": cards})


async def health(request: Request) -> Response:
    sim = _sim(request)
    if sim.healthy:
        return Response(status_code=200)
    if sim.loading:
        return error_response(503, "the model is still loading", "ServiceUnavailableError")
    return error_response(503, "the engine is not responding", "ServiceUnavailableError")


async def version(request: Request) -> Response:
    return JSONResponse({"version": VLLM_VERSION})


async def metrics(request: Request) -> Response:
    return Response(_sim(request).metrics.render(), media_type=CONTENT_TYPE_LATEST)


async def gpu_metrics(request: Request) -> Response:
    return Response(
        _sim(request).dcgm_text(), media_type="text/plain; version=0.0.4; charset=utf-8"
    )


#: the largest fault document the admin endpoint reads
ADMIN_MAX_BYTES = 64 * 1024


async def _bounded_body(request: Request, limit: int) -> bytes:
    chunks, size = [], 0
    async for chunk in request.stream():
        size += len(chunk)
        if size > limit:
            raise FaultError(f"a fault document is at most {limit} bytes")
        chunks.append(chunk)
    return b"".join(chunks)


def _fault_document(body: bytes) -> Any:
    """The JSON of a fault document; NaN and Infinity (which Python's json accepts) are not
    JSON, and nesting past the parser's depth is refused like any other bad body."""

    def refuse(constant: str) -> None:
        raise FaultError(f"{constant} is not a number a fault can take")

    try:
        return json.loads(body, parse_constant=refuse)
    except (ValueError, RecursionError) as exc:
        if isinstance(exc, FaultError):
            raise
        raise FaultError("the body is not valid JSON") from None


async def admin_faults(request: Request) -> Response:
    """GET shows, POST merges, DELETE clears faults; needs ``Authorization: Bearer <token>``."""
    sim = _sim(request)
    token = sim.config.admin_token
    if not token:
        return error_response(
            403, "the admin endpoint is off; start the simulator with --admin-token"
        )
    supplied = request.headers.get("authorization", "")
    if not hmac.compare_digest(supplied.encode(), f"Bearer {token}".encode()):
        response = error_response(401, "a valid bearer token is required", "AuthenticationError")
        response.headers["WWW-Authenticate"] = "Bearer"
        return response
    if request.method == "POST":
        try:
            document = _fault_document(await _bounded_body(request, ADMIN_MAX_BYTES))
            sim.apply_faults(document)
        except FaultError as exc:
            return error_response(413 if "bytes" in str(exc) else 400, str(exc))
        log_event(logger, logging.WARNING, "faults injected", faults=json.dumps(document))
    elif request.method == "DELETE":
        sim.clear_faults()
        log_event(logger, logging.INFO, "faults cleared")
    return JSONResponse(sim.faults_state())
