"""The sidecar's isolation flag: a person or the runbook receiver takes a replica out of service.

``POST /admin/isolation`` with ``{"reason": ..., "fingerprint": ...}`` sets the ``isolated``
readiness condition, so ``/readyz`` answers 503 and every Service and gateway that checks it
drops the pod, with no cluster permission needed. ``DELETE`` clears it; given
``?fingerprint=``, only an isolation set for that alert is cleared (409 otherwise), so the
rollback of one alert never undoes another's. Both are idempotent and answer the state, with
``changed`` saying whether this request changed it. The flag lives in the sidecar process:
it outlives the receiver that set it, and two receivers setting it change it once.
"""

from __future__ import annotations

import json
import time
from dataclasses import dataclass
from typing import Any

from starlette.requests import Request
from starlette.responses import Response
from starlette.routing import Route

from inferwatch.auth import bearer_ok
from inferwatch.serving.readiness import Condition

CONDITION = "isolated"
#: an admin request body larger than this is refused unread
MAX_BODY_BYTES = 4096
MAX_FIELD_CHARS = 256


@dataclass(frozen=True)
class IsolationState:
    reason: str
    fingerprint: str
    since: float


class Isolation:
    """The flag, its readiness condition and its admin endpoint."""

    def __init__(self, token: str | None) -> None:
        self.token = token
        self.state: IsolationState | None = None

    def readiness(self) -> list[Condition]:
        if self.state is None:
            return [Condition(CONDITION, True)]
        return [Condition(CONDITION, False, self.state.reason)]

    def routes(self) -> list[Route]:
        return [Route("/admin/isolation", self.endpoint, methods=["GET", "POST", "DELETE"])]

    async def endpoint(self, request: Request) -> Response:
        if self.token is None:
            return _answer(403, {"error": "admin endpoint disabled: no admin token configured"})
        if not bearer_ok(request.headers.get("authorization"), self.token):
            return _answer(401, {"error": "missing or wrong bearer token"})
        if request.method == "GET":
            return _answer(200, self._body(changed=False))
        if request.method == "DELETE":
            return self._clear(request.query_params.get("fingerprint"))
        try:
            reason, fingerprint = await _read_request(request)
        except ValueError as exc:
            return _answer(400, {"error": str(exc)})
        changed = self.state is None
        if changed:
            self.state = IsolationState(reason, fingerprint, time.time())
        return _answer(200, self._body(changed=changed))

    def _clear(self, fingerprint: str | None) -> Response:
        if self.state is None:
            return _answer(200, self._body(changed=False))
        if fingerprint is not None and fingerprint != self.state.fingerprint:
            return _answer(409, {"error": "isolated for another alert", **self._body(False)})
        self.state = None
        return _answer(200, self._body(changed=True))

    def _body(self, changed: bool) -> dict[str, Any]:
        state = self.state
        if state is None:
            return {"isolated": False, "changed": changed}
        return {
            "isolated": True,
            "changed": changed,
            "reason": state.reason,
            "fingerprint": state.fingerprint,
            "since": state.since,
        }


async def _read_request(request: Request) -> tuple[str, str]:
    body = bytearray()
    async for chunk in request.stream():
        body += chunk
        if len(body) > MAX_BODY_BYTES:
            raise ValueError(f"body larger than {MAX_BODY_BYTES} bytes")
    try:
        document = json.loads(body or b"{}")
    except ValueError:
        raise ValueError("body is not JSON") from None
    if not isinstance(document, dict):
        raise ValueError("body must be a JSON object")
    fields = []
    for name in ("reason", "fingerprint"):
        value = document.get(name, "")
        if not isinstance(value, str) or len(value) > MAX_FIELD_CHARS:
            raise ValueError(f"{name} must be a string of at most {MAX_FIELD_CHARS} characters")
        fields.append(value)
    if not fields[0]:
        raise ValueError("reason is required")
    return fields[0], fields[1]


def _answer(status: int, body: dict[str, Any]) -> Response:
    return Response(json.dumps(body) + "\n", status_code=status, media_type="application/json")
