"""The receiver's HTTP face: the Alertmanager webhook, the breaker's reset, and the usual three.

``POST /webhook`` checks the bearer token before it reads a byte of the body, reads at most
``max_body_bytes`` (refused with 413 as soon as it is over, whatever Content-Length said),
parses the whole payload before queueing any of it, and answers 200 at once: the worker acts
afterwards (Alertmanager retries on a slow answer). Bytes being read and queued count against
the dispatcher's backlog; over it, the answer is 429 with ``Retry-After``, which Alertmanager
retries, so a flood of large notifications waits outside the receiver's memory. A receiver
that does not lead (Kubernetes, another replica holds the Lease) answers 503, and its
``/readyz`` fails so that its Service sends to the leader. Every refusal is counted and acts
on nothing; only an authenticated request's refusal is audited, so that a stranger cannot
fill the audit volume. ``POST /admin/breaker/reset`` (same token) closes open breakers.
"""

from __future__ import annotations

import asyncio
import hashlib
import json
import logging
import time
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from typing import Any

from starlette.applications import Starlette
from starlette.requests import Request
from starlette.responses import Response
from starlette.routing import Route

from inferwatch.auth import bearer_ok
from inferwatch.logs import log_event
from inferwatch.runbooks import payload
from inferwatch.runbooks.breaker import parts
from inferwatch.runbooks.dispatch import Dispatcher
from inferwatch.runbooks.state import StateError
from inferwatch.serving.endpoints import healthz, metrics_response, readiness_response
from inferwatch.serving.readiness import Condition

logger = logging.getLogger("inferwatch.runbooks")

MAX_BODY_BYTES = 1024 * 1024
#: what a 429 or 503 asks Alertmanager to wait before it retries
RETRY_AFTER_S = 5


class _TooLarge(Exception):
    pass


class _Backlogged(Exception):
    pass


class Receiver:
    def __init__(
        self, dispatcher: Dispatcher, token: str, max_body_bytes: int = MAX_BODY_BYTES
    ) -> None:
        self.dispatcher = dispatcher
        self.token = token
        self.max_body_bytes = max_body_bytes
        self._worker: asyncio.Task[None] | None = None

    async def webhook(self, request: Request) -> Response:
        received_at = time.time()
        client = request.client.host if request.client else ""
        if not bearer_ok(request.headers.get("authorization"), self.token):
            self.dispatcher.metrics.webhooks["unauthorized"] += 1
            return _json(401, {"error": "missing or wrong bearer token"})
        if not self.dispatcher.leading():
            reason = "not the leading receiver; retry later"
            return await self._refuse(503, "standby", reason, client, retry=True)
        reserved = [0]  # bytes counted against the backlog, handed to the worker if queued
        try:
            return await self._accept(request, received_at, client, reserved)
        finally:
            if reserved[0]:  # not queued (refused, or the client went away mid-body)
                self.dispatcher.release(reserved[0])

    async def _accept(
        self, request: Request, received_at: float, client: str, reserved: list[int]
    ) -> Response:
        try:
            body = await self._read(request, reserved)
        except _TooLarge:
            reason = f"body larger than {self.max_body_bytes} bytes"
            return await self._refuse(413, "too_large", reason, client)
        except _Backlogged:
            reason = f"backlog over {self.dispatcher.max_backlog_bytes} bytes; retry later"
            return await self._refuse(429, "backlogged", reason, client, retry=True)
        try:
            notification = payload.parse(body)
        except payload.PayloadError as exc:
            return await self._refuse(400, "malformed", str(exc), client)
        meta = {
            "received_at": received_at,
            "payload_sha256": hashlib.sha256(body).hexdigest(),
            "group_key": notification.group_key,
            "am_receiver": notification.receiver,
        }
        if not self.dispatcher.submit(notification, meta, reserved[0]):
            return await self._refuse(503, "busy", "queue full; retry later", client, retry=True)
        reserved[0] = 0  # the worker releases them once it is done with the notification
        self.dispatcher.metrics.webhooks["accepted"] += 1
        return _json(200, {"accepted": len(notification.alerts)})

    async def _read(self, request: Request, reserved: list[int]) -> bytes:
        """The body, each chunk counted against the backlog as it arrives (in ``reserved``)."""
        declared = request.headers.get("content-length", "")
        if declared.isdigit() and int(declared) > self.max_body_bytes:
            raise _TooLarge
        body = bytearray()
        async for chunk in request.stream():
            if not self.dispatcher.reserve(len(chunk)):
                raise _Backlogged
            reserved[0] += len(chunk)
            body += chunk
            if len(body) > self.max_body_bytes:
                raise _TooLarge
        return bytes(body)

    async def _refuse(
        self, status: int, outcome: str, reason: str, client: str, retry: bool = False
    ) -> Response:
        self.dispatcher.metrics.webhooks[outcome] += 1
        await self.dispatcher.audit.write(
            {"decision": "rejected", "outcome": outcome, "reason": reason, "client": client}
        )
        headers = {"retry-after": str(RETRY_AFTER_S)} if retry else None
        return _json(status, {"error": reason}, headers)

    async def reset_breaker(self, request: Request) -> Response:
        if not bearer_ok(request.headers.get("authorization"), self.token):
            return _json(401, {"error": "missing or wrong bearer token"})
        closed = await self.dispatcher.reset_breakers()
        client = request.client.host if request.client else ""
        await self.dispatcher.audit.write(
            {"decision": "breaker_reset", "closed": closed, "client": client}
        )
        return _json(200, {"closed": [list(parts(key)) for key in closed]})

    async def breaker_state(self, request: Request) -> Response:
        if not bearer_ok(request.headers.get("authorization"), self.token):
            return _json(401, {"error": "missing or wrong bearer token"})
        opened = await self.dispatcher.open_breakers()
        return _json(200, {"open": [[*parts(k), why] for k, why in sorted(opened.items())]})

    async def metrics(self, request: Request) -> Response:
        opened = [parts(key) for key in await self.dispatcher.open_breakers()]
        families = self.dispatcher.metrics.families(
            opened, self.dispatcher.execute, self.dispatcher.store.skipped_episodes
        )
        return metrics_response(request, families)

    async def readyz(self, request: Request) -> Response:
        worker = self._worker is not None and not self._worker.done()
        queue = self.dispatcher.queue
        leading = self.dispatcher.leading()
        return readiness_response(
            [
                Condition("worker", worker, "" if worker else "the action worker is not running"),
                Condition("queue", not queue.full(), "" if not queue.full() else "queue full"),
                Condition("leader", leading, "" if leading else "another receiver leads"),
            ]
        )

    async def state_unavailable(self, request: Request, exc: Exception) -> Response:
        """A route that needs the state while the store cannot give it: 503 and one line,
        never a 500 with a traceback (the store's message says where and why)."""
        log_event(logger, logging.ERROR, "state unavailable", path=request.url.path,
                  reason=str(exc)[:500])  # fmt: skip
        headers = {"retry-after": str(RETRY_AFTER_S)}
        return _json(503, {"error": str(exc)[:500]}, headers)

    def app(self) -> Starlette:
        @asynccontextmanager
        async def lifespan(app: Starlette) -> AsyncIterator[None]:
            self._worker = asyncio.create_task(self.dispatcher.run())
            yield
            self._worker.cancel()
            await asyncio.gather(self._worker, return_exceptions=True)
            await self.dispatcher.aclose()

        return Starlette(
            routes=[
                Route("/webhook", self.webhook, methods=["POST"]),
                Route("/admin/breaker", self.breaker_state, methods=["GET"]),
                Route("/admin/breaker/reset", self.reset_breaker, methods=["POST"]),
                Route("/metrics", self.metrics),
                Route("/healthz", healthz),
                Route("/readyz", self.readyz),
            ],
            lifespan=lifespan,
            exception_handlers={StateError: self.state_unavailable},
        )


def _json(status: int, body: dict[str, Any], headers: dict[str, str] | None = None) -> Response:
    return Response(
        json.dumps(body) + "\n", status_code=status, media_type="application/json", headers=headers
    )
