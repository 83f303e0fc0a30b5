"""Replica isolation, no cluster permission: set the sidecar's ``isolated`` readiness condition.

The labels fill a URL template (``http://{instance}/admin/isolation`` by default, the
sidecar's own listener); its ``/readyz`` then answers 503 and every Service and gateway drops
the replica. The receiver fills it from its replica inventory's entry (never from an alert's
label alone), and the URL's host and port must be that entry's ``instance``, so the admin
token goes only to a listed sidecar. Only host-and-port characters may reach the URL, and
every reply is read up to :data:`MAX_REPLY_BYTES`.
Apply is a POST (a no-op when the sidecar is already isolated), verify reads ``/readyz``
back, and revert is a DELETE for this alert's fingerprint only.

Settings (``actions.isolate_replica`` in the config): ``token_file``, else the environment
variable ``INFERWATCH_RUNBOOKS_SIDECAR_TOKEN``, holds the sidecars' admin token; ``timeout``
bounds each request.
"""

from __future__ import annotations

import json
import os
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any, ClassVar
from urllib.parse import urlsplit, urlunsplit

import httpx

from inferwatch.auth import load_token
from inferwatch.runbooks.actions.base import ActionError, Alert, Outcome, Step
from inferwatch.runbooks.actions.params import fill

TOKEN_ENV = "INFERWATCH_RUNBOOKS_SIDECAR_TOKEN"
DEFAULT_URL = "http://{instance}/admin/isolation"
MAX_REPLY_BYTES = 64 * 1024


class IsolateReplica:
    name: ClassVar[str] = "isolate_replica"

    def __init__(self, token_file: str | None = None, timeout: float = 2.0) -> None:
        path = Path(token_file) if token_file else None
        token = load_token(None if path else os.environ.get(TOKEN_ENV), path, what="sidecar token")
        if token is None:
            raise ValueError(f"token_file or ${TOKEN_ENV} is required (the sidecars' admin token)")
        self._client = httpx.AsyncClient(
            timeout=timeout, headers={"authorization": f"Bearer {token}"}
        )

    def plan(self, alert: Alert, params: Mapping[str, Any]) -> Sequence[Step]:
        unknown = set(params) - {"admin_url"}
        if unknown:
            raise ActionError(f"unknown parameters {sorted(unknown)}")
        url = fill(str(params.get("admin_url", DEFAULT_URL)), alert.labels, url_safe=True)
        parts = urlsplit(url)
        if parts.scheme not in ("http", "https") or not parts.hostname or parts.username:
            raise ActionError(f"admin_url {url!r} is not an http(s) URL")
        if parts.netloc != alert.labels.get("instance"):
            raise ActionError(f"admin_url {url!r} is not the replica's instance")
        summary = alert.annotations.get("summary", "")
        reason = f"{alert.labels['alertname']}: {summary}".rstrip(": ")[:256]
        return [
            Step(
                action=self.name,
                target=f"sidecar {url}",
                unit="replica",
                # the receiver sets the inventory's population; this is for a plan read alone
                group=alert.labels.get("model", "replicas"),
                desired={"isolated": True, "fingerprint": alert.fingerprint, "reason": reason},
                reason=reason,
            )
        ]

    async def apply(self, step: Step) -> Outcome:
        body = {"reason": step.desired["reason"], "fingerprint": step.desired["fingerprint"]}
        return await self._call("POST", _url(step), json=body)

    async def verify(self, step: Step) -> Outcome:
        parts = urlsplit(_url(step))
        readyz = urlunsplit((parts.scheme, parts.netloc, "/readyz", "", ""))
        try:
            status, data = await self._bounded("GET", readyz)
            conditions = {c["name"]: c for c in json.loads(data)["conditions"]}
        except (httpx.HTTPError, ValueError, KeyError, TypeError) as exc:
            return Outcome(False, False, f"cannot read {readyz}: {type(exc).__name__}: {exc}"[:300])
        isolated = conditions.get("isolated", {}).get("ok") is False
        observed = {"readyz_status": status, "isolated": isolated}
        if isolated and status == 503:
            return Outcome(True, False, "/readyz fails on the isolated condition", observed)
        return Outcome(False, False, "/readyz does not show the replica isolated", observed)

    async def revert(self, step: Step) -> Outcome:
        outcome = await self._call(
            "DELETE", _url(step), params={"fingerprint": step.desired["fingerprint"]}
        )
        if outcome.observed.get("status") == 409:
            return Outcome(
                True, False, "isolated for another alert; left isolated", outcome.observed
            )
        return outcome

    async def aclose(self) -> None:
        await self._client.aclose()

    async def _bounded(self, method: str, url: str, **kwargs: Any) -> tuple[int, bytes]:
        """Status and body of one request, the body read up to :data:`MAX_REPLY_BYTES`."""
        async with self._client.stream(method, url, **kwargs) as reply:
            data = bytearray()
            async for chunk in reply.aiter_bytes():
                data += chunk
                if len(data) > MAX_REPLY_BYTES:
                    raise ValueError(f"reply larger than {MAX_REPLY_BYTES} bytes")
            return reply.status_code, bytes(data)

    async def _call(self, method: str, url: str, **kwargs: Any) -> Outcome:
        try:
            status, data = await self._bounded(method, url, **kwargs)
            state = json.loads(data) if status in (200, 409) else {}
        except (httpx.HTTPError, ValueError) as exc:
            return Outcome(False, False, f"{method} {url}: {type(exc).__name__}: {exc}"[:300])
        if not isinstance(state, dict):
            state = {}
        observed = {"status": status, **{k: state.get(k) for k in ("isolated", "fingerprint")}}
        if status == 409:
            return Outcome(False, False, "isolated for another alert", observed)
        if status != 200:
            return Outcome(False, False, f"{method} {url}: HTTP {status}", observed)
        changed = state.get("changed") is True
        detail = "changed" if changed else "already in the desired state"
        if method == "POST" and not changed and state.get("fingerprint") != _fp(kwargs):
            detail = f"already isolated for alert {state.get('fingerprint')!r}"
        return Outcome(True, changed, detail, observed)


def _fp(kwargs: Mapping[str, Any]) -> Any:
    return kwargs.get("json", {}).get("fingerprint")


def _url(step: Step) -> str:
    return step.target.removeprefix("sidecar ")
