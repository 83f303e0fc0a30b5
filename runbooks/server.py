"""The receiver's HTTP face: the Alertmanager webhook, the breaker's reset, and the usual three.

``POST /webhook`` checks the bearer token before it reads a byte of the body, reads at most
``max_body_bytes`` (refused with 413 as soon as it is over, whatever Content-Length said),
parses the whole payload before queueing any of it, and answers 200 at once: the worker acts
afterwards (Alertmanager retries on a slow answer). Every refusal is counted and audited,
and acts on nothing. ``POST /admin/breaker/reset`` (same token) closes open breakers.
"""

from __future__ import annotations

import asyncio
import hashlib
import json
import time
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from typing import Any

from starlette.applications import Starlette
from starlette.requests import Request
from starlette.responses import Response
from starlette.routing import Route

from inferwatch.auth import bearer_ok
from inferwatch.runbooks import payload
from inferwatch.runbooks.dispatch import Dispatcher
from inferwatch.serving.endpoints import healthz, metrics_response, readiness_response
from inferwatch.serving.readiness import Condition

MAX_BODY_BYTES = 1024 * 1024


class _TooLarge(Exception):
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
            return await self._refuse(401, "unauthorized", "missing or wrong bearer token", client)
        try:
            body = await self._read(request)
        except _TooLarge:
            reason = f"body larger than {self.max_body_bytes} bytes"
            return await self._refuse(413, "too_large", reason, client)
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
        if not self.dispatcher.submit(notification, meta):
            return await self._refuse(503, "busy", "queue full; retry later", client)
        self.dispatcher.metrics.webhooks["accepted"] += 1
        return _json(200, {"accepted": len(notification.alerts)})

    async def _read(self, request: Request) -> bytes:
        declared = request.headers.get("content-length", "")
        if declared.isdigit() and int(declared) > self.max_body_bytes:
            raise _TooLarge
        body = bytearray()
        async for chunk in request.stream():
            body += chunk
            if len(body) > self.max_body_bytes:
                raise _TooLarge
        return bytes(body)

    async def _refuse(self, status: int, outcome: str, reason: str, client: str) -> Response:
        self.dispatcher.metrics.webhooks[outcome] += 1
        await self.dispatcher.audit.write(
            {"decision": "rejected", "outcome": outcome, "reason": reason, "client": client}
        )
        return _json(status, {"error": reason})

    async def reset_breaker(self, request: Request) -> Response:
        if not bearer_ok(request.headers.get("authorization"), self.token):
            return _json(401, {"error": "missing or wrong bearer token"})
        closed = self.dispatcher.breaker.reset()
        client = request.client.host if request.client else ""
        await self.dispatcher.audit.write(
            {"decision": "breaker_reset", "closed": closed, "client": client}
        )
        return _json(200, {"closed": [list(key) for key in closed]})

    async def breaker_state(self, request: Request) -> Response:
        if not bearer_ok(request.headers.get("authorization"), self.token):
            return _json(401, {"error": "missing or wrong bearer token"})
        opened = self.dispatcher.breaker.open
        return _json(200, {"open": [[u, g, why] for (u, g), why in sorted(opened.items())]})

    async def metrics(self, request: Request) -> Response:
        families = self.dispatcher.metrics.families(
            self.dispatcher.breaker.open, self.dispatcher.execute
        )
        return metrics_response(request, families)

    async def readyz(self, request: Request) -> Response:
        worker = self._worker is not None and not self._worker.done()
        queue = self.dispatcher.queue
        return readiness_response(
            [
                Condition("worker", worker, "" if worker else "the action worker is not running"),
                Condition("queue", not queue.full(), "" if not queue.full() else "queue full"),
            ]
        )

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
        )


def _json(status: int, body: dict[str, Any]) -> Response:
    return Response(json.dumps(body) + "\n", status_code=status, media_type="application/json")
