"""The HTTP answers every long-running inferwatch component gives the same way.

``/metrics`` negotiates the exposition format (Prometheus text or OpenMetrics) and gzip from
the scraper's headers; ``/readyz`` is 200 only while every condition holds, with the
conditions as JSON so that ``kubectl describe`` and a person with curl see why; ``/healthz``
says only that the process answers. The bodies are built here once; the starlette apps
(sidecar, probe runner, runbook receiver) and the proxy's raw ASGI metrics listener only
wrap them in a response.
"""

from __future__ import annotations

import gzip
import json
from collections.abc import Callable, Iterable, Sequence

from prometheus_client import CollectorRegistry, generate_latest
from prometheus_client.core import Metric
from prometheus_client.exposition import choose_encoder
from starlette.requests import Request
from starlette.responses import PlainTextResponse, Response

from inferwatch.serving.exposition import fast_encoder
from inferwatch.serving.readiness import Condition

__all__ = [
    "HEALTHZ_BODY",
    "Families",
    "encode_metrics",
    "healthz",
    "metrics_response",
    "readiness",
    "readiness_response",
    "text",
]

HEALTHZ_BODY = b"ok\n"


class Families:
    """Families as a prometheus_client collector: a fixed list, or a callable read at each
    ``collect()`` (what a registry and the encoders take)."""

    def __init__(self, families: Iterable[Metric] | Callable[[], Iterable[Metric]]):
        self._families = families

    def collect(self) -> Iterable[Metric]:
        return self._families() if callable(self._families) else self._families

    def registry(self) -> CollectorRegistry:
        """A registry holding only these families."""
        registry = CollectorRegistry(auto_describe=False)
        registry.register(self)
        return registry


def text(families: Iterable[Metric]) -> str:
    """Families in the Prometheus text format (goldens, benchmarks, checks)."""
    return generate_latest(Families(families).registry()).decode()


def encode_metrics(
    families: Iterable[Metric], accept: str, accept_encoding: str
) -> tuple[bytes, dict[str, str]]:
    """The /metrics body and headers for a scraper's ``Accept`` and ``Accept-Encoding``."""
    encoder, content_type = choose_encoder(accept)
    families = list(families)
    fast = fast_encoder(encoder)
    body = fast(families) if fast is not None else None
    if body is None:
        body = encoder(Families(families).registry())
    headers = {"Content-Type": content_type}
    if "gzip" in accept_encoding:
        body = gzip.compress(body, compresslevel=5)
        headers["Content-Encoding"] = "gzip"
    return body, headers


def readiness(conditions: Sequence[Condition]) -> tuple[int, bytes]:
    """The /readyz status and JSON body."""
    ready = all(c.ok for c in conditions)
    body = {
        "ready": ready,
        "conditions": [{"name": c.name, "ok": c.ok, "reason": c.reason} for c in conditions],
    }
    return (200 if ready else 503), (json.dumps(body) + "\n").encode()


def metrics_response(request: Request, families: Iterable[Metric]) -> Response:
    body, headers = encode_metrics(
        families, request.headers.get("accept", ""), request.headers.get("accept-encoding", "")
    )
    return Response(body, headers=headers)


def readiness_response(conditions: Sequence[Condition]) -> Response:
    status, body = readiness(conditions)
    return Response(body, status_code=status, media_type="application/json")


async def healthz(request: Request) -> Response:
    return PlainTextResponse(HEALTHZ_BODY)
