"""Instant queries against Prometheus' HTTP API: bounded, under one deadline, one-line errors.

A Prometheus (or whatever answers at its address) is not trusted: every reply is read up to
``MAX_REPLY_BYTES``, every query of one analysis shares one overall deadline (a server that
trickles bytes never outlasts it), and a reply that is not the instant vector asked for, or
holds a sample value that is not a number, is a ``PrometheusError``, which the CLI reports as
"could not run", never as a verdict.
"""

from __future__ import annotations

import json
import math
from typing import Any

import httpx

from inferwatch.serving.bounded_request import Deadline, RequestFailed, fetch
from inferwatch.serving.prometheus_api import DEADLINE_S, checked_url

MAX_REPLY_BYTES = 8 << 20


class PrometheusError(RuntimeError):
    """Prometheus cannot be reached, refused a query or answered nonsense (one line)."""


Sample = tuple[dict[str, str], float]


class Prometheus:
    def __init__(
        self, url: str, client: httpx.Client | None = None, deadline_s: float = DEADLINE_S
    ) -> None:
        try:
            checked_url(url)
        except ValueError as exc:
            raise PrometheusError(str(exc)) from None
        self.url = url.rstrip("/")
        # identity: httpx inflates a compressed network chunk in one call, past any cap
        self._client = client or httpx.Client(headers={"Accept-Encoding": "identity"})
        self._owned = client is None
        self.deadline = Deadline(deadline_s)

    def close(self) -> None:
        """Close the connections of the client made here (a caller's own client is theirs)."""
        if self._owned:
            self._client.close()

    def __enter__(self) -> Prometheus:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def query(self, expr: str, at: float) -> list[Sample]:
        """The instant vector ``expr`` evaluates to at ``at`` (unix seconds)."""
        try:
            status, body = fetch(
                self._client,
                "POST",
                f"{self.url}/api/v1/query",
                what=f"Prometheus at {self.url}",
                deadline=self.deadline,
                max_bytes=MAX_REPLY_BYTES,
                data={"query": expr, "time": f"{at:.3f}"},
            )
        except RequestFailed as exc:
            raise PrometheusError(str(exc)) from None
        return _samples(self.url, expr, body, status)

    def scalar(self, expr: str, at: float) -> float | None:
        """The single value of ``expr`` (a ``sum``), None when it has no sample."""
        samples = self.query(expr, at)
        if len(samples) > 1:
            raise PrometheusError(f"{self.url}: {len(samples)} samples where one was expected")
        return samples[0][1] if samples else None


def _samples(url: str, expr: str, body: bytes, status: int) -> list[Sample]:
    """The samples of a query reply; anything but an instant vector of numbers raises."""
    try:
        document: Any = json.loads(body)
    except (ValueError, RecursionError):
        raise PrometheusError(f"{url}: HTTP {status}, not a Prometheus API reply") from None
    if not isinstance(document, dict) or document.get("status") != "success":
        error = document.get("error") if isinstance(document, dict) else None
        shown = error if isinstance(error, str) else f"HTTP {status}"
        raise PrometheusError(f"{url}: query refused: {' '.join(shown.split())[:200]}")
    data = document.get("data")
    if not isinstance(data, dict) or data.get("resultType") != "vector":
        raise PrometheusError(f"{url}: expected an instant vector for {expr}")
    result = data.get("result")
    if not isinstance(result, list):
        raise PrometheusError(f"{url}: malformed reply: result is not a list")
    samples: list[Sample] = []
    for item in result:
        try:
            metric, (_, text) = item["metric"], item["value"]
            labels = {str(k): str(v) for k, v in metric.items()} if isinstance(metric, dict) else {}
            if not isinstance(metric, dict) or not isinstance(text, str):
                raise TypeError
            value = float(text)
        except (KeyError, IndexError, TypeError, ValueError, AttributeError):
            raise PrometheusError(f"{url}: malformed sample in reply") from None
        samples.append((labels, value))
    return samples


def count(value: float | None) -> int:
    """A counter increase as a count (``increase`` extrapolates to fractions); no sample is
    0. A count that is not a finite number is a malformed answer, never a zero."""
    if value is None:
        return 0
    if not math.isfinite(value):
        raise PrometheusError(f"Prometheus answered a count of {value}")
    return max(0, round(value))


def finite(value: float | None) -> float:
    """A value that must be a number (a sum of costs); no sample is 0."""
    if value is None:
        return 0.0
    if not math.isfinite(value):
        raise PrometheusError(f"Prometheus answered {value} where a number was expected")
    return value
