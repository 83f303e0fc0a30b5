"""The HTTP answers every long-running inferwatch component gives the same way.

``/metrics`` negotiates the exposition format (Prometheus text or OpenMetrics) and gzip from
the scraper's headers; ``/readyz`` is 200 only while every condition holds, with the
conditions as JSON so that ``kubectl describe`` and a person with curl see why; ``/healthz``
says only that the process answers.
"""

from __future__ import annotations

import gzip
import json
from collections.abc import Iterable, Sequence

from prometheus_client.core import Metric
from prometheus_client.exposition import choose_encoder
from starlette.requests import Request
from starlette.responses import PlainTextResponse, Response

from inferwatch.exporters.collector import Condition


class _Families:
    """The minimal registry shape prometheus_client's encoders accept."""

    def __init__(self, families: Iterable[Metric]):
        self._families = families

    def collect(self) -> Iterable[Metric]:
        return self._families


def metrics_response(request: Request, families: Iterable[Metric]) -> Response:
    encoder, content_type = choose_encoder(request.headers.get("accept", ""))
    body = encoder(_Families(families))
    headers = {"Content-Type": content_type}
    if "gzip" in request.headers.get("accept-encoding", ""):
        body = gzip.compress(body, compresslevel=5)
        headers["Content-Encoding"] = "gzip"
    return Response(body, headers=headers)


def readiness_response(conditions: Sequence[Condition]) -> Response:
    ready = all(c.ok for c in conditions)
    body = {
        "ready": ready,
        "conditions": [{"name": c.name, "ok": c.ok, "reason": c.reason} for c in conditions],
    }
    return Response(
        json.dumps(body) + "\n", status_code=200 if ready else 503, media_type="application/json"
    )


async def healthz(request: Request) -> Response:
    return PlainTextResponse("ok\n")
