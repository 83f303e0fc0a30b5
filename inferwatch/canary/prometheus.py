"""Instant queries against Prometheus' HTTP API, bounded and with one-line errors."""

from __future__ import annotations

import json
from typing import Any

import httpx

MAX_REPLY_BYTES = 8 << 20
TIMEOUT_S = 15.0


class PrometheusError(RuntimeError):
    """Prometheus cannot be reached or refused a query (one line, for the CLI)."""


Sample = tuple[dict[str, str], float]


class Prometheus:
    def __init__(self, url: str, client: httpx.Client | None = None) -> None:
        if not url.startswith(("http://", "https://")):
            raise PrometheusError(f"--prometheus must be an http(s) URL, not {url!r}")
        self.url = url.rstrip("/")
        self._client = client or httpx.Client(timeout=TIMEOUT_S)

    def query(self, expr: str, at: float) -> list[Sample]:
        """The instant vector ``expr`` evaluates to at ``at`` (unix seconds)."""
        try:
            with self._client.stream(
                "POST", f"{self.url}/api/v1/query", data={"query": expr, "time": f"{at:.3f}"}
            ) as reply:
                body = bytearray()
                for chunk in reply.iter_bytes():
                    body += chunk
                    if len(body) > MAX_REPLY_BYTES:
                        raise PrometheusError(f"{self.url}: reply over {MAX_REPLY_BYTES} bytes")
                status = reply.status_code
        except httpx.HTTPError as exc:
            raise PrometheusError(f"cannot reach Prometheus at {self.url}: {exc}") from None
        try:
            document: Any = json.loads(body)
        except ValueError:
            raise PrometheusError(
                f"{self.url}: HTTP {status}, not a Prometheus API reply"
            ) from None
        if not isinstance(document, dict) or document.get("status") != "success":
            error = document.get("error", f"HTTP {status}") if isinstance(document, dict) else ""
            raise PrometheusError(f"{self.url}: query refused: {error}")
        data = document.get("data")
        if not isinstance(data, dict) or data.get("resultType") != "vector":
            raise PrometheusError(f"{self.url}: expected an instant vector for {expr}")
        samples: list[Sample] = []
        for item in data.get("result", []):
            try:
                samples.append((dict(item["metric"]), float(item["value"][1])))
            except (KeyError, IndexError, TypeError, ValueError):
                raise PrometheusError(f"{self.url}: malformed sample in reply") from None
        return samples

    def scalar(self, expr: str, at: float) -> float | None:
        """The single value of ``expr`` (a ``sum``), None when it has no sample."""
        samples = self.query(expr, at)
        return samples[0][1] if samples else None
