"""Histograms that inferwatch observes itself (the tenancy proxy, the probes).

Bucket boundaries follow the OpenTelemetry GenAI semantic conventions, so a dashboard can put
the client's view (proxy, probes) next to the engine's on the same buckets. A bucket may carry
an exemplar, the trace id of its latest traced observation: the OpenMetrics exposition writes
it (``# {trace_id="..."} value timestamp``) and Prometheus with exemplar storage keeps it,
so a latency panel links to a trace that fell in that bucket.
"""

from __future__ import annotations

import bisect
import math
import time
from dataclasses import dataclass, field

from prometheus_client.samples import Exemplar

__all__ = [
    "DURATION_BUCKETS",
    "EXEMPLAR_LABEL",
    "TTFT_BUCKETS",
    "TTFT_BUCKETS_LONG",
    "Histogram",
    "histogram_quantile",
]

#: gen_ai.server.time_to_first_token
TTFT_BUCKETS = (
    0.001, 0.005, 0.01, 0.02, 0.04, 0.06, 0.08, 0.1, 0.25, 0.5, 0.75, 1.0, 2.5, 5.0, 7.5, 10.0,
)  # fmt: skip
#: the same, extended to a minute for long prompts queued behind others (as Envoy AI Gateway)
TTFT_BUCKETS_LONG = (*TTFT_BUCKETS, 15.0, 20.0, 30.0, 45.0, 60.0)
#: gen_ai.server.request.duration and gen_ai.client.operation.duration
DURATION_BUCKETS = (
    0.01, 0.02, 0.04, 0.08, 0.16, 0.32, 0.64, 1.28, 2.56, 5.12, 10.24, 20.48, 40.96, 81.92,
)  # fmt: skip
#: the exemplar's label, the name Grafana's trace links read by default
EXEMPLAR_LABEL = "trace_id"


@dataclass
class Histogram:
    """Counts per bucket and a sum; rendered cumulatively, as Prometheus expects."""

    bounds: tuple[float, ...]
    counts: list[int] = field(default_factory=list)
    total: float = 0.0
    #: per bucket, the latest traced observation's exemplar (None until one is traced)
    exemplars: list[Exemplar | None] | None = None

    def __post_init__(self) -> None:
        if not self.counts:
            self.counts = [0] * (len(self.bounds) + 1)

    def observe(self, value: float, trace_id: str = "") -> None:
        """Count ``value``; a ``trace_id`` becomes its bucket's exemplar."""
        index = bisect.bisect_left(self.bounds, value)
        self.counts[index] += 1
        self.total += value
        if trace_id:
            if self.exemplars is None:
                self.exemplars = [None] * len(self.counts)
            self.exemplars[index] = Exemplar({EXEMPLAR_LABEL: trace_id}, value, time.time())

    def merge(self, other: Histogram) -> None:
        self.counts = [a + b for a, b in zip(self.counts, other.counts, strict=True)]
        self.total += other.total
        if other.exemplars is not None:
            mine = self.exemplars or [None] * len(self.counts)
            self.exemplars = [a or b for a, b in zip(other.exemplars, mine, strict=True)]

    def buckets(self) -> list[tuple[str, float] | tuple[str, float, Exemplar]]:
        """(le, cumulative count) pairs, ``+Inf`` last, with the bucket's exemplar if any."""
        cumulative = 0
        out: list[tuple[str, float] | tuple[str, float, Exemplar]] = []
        exemplars = self.exemplars or [None] * len(self.counts)
        bounds = (*map(repr, self.bounds), "+Inf")
        for bound, count, exemplar in zip(bounds, self.counts, exemplars, strict=True):
            cumulative += count
            out.append((bound, cumulative) if exemplar is None else (bound, cumulative, exemplar))
        return out


def histogram_quantile(buckets: list[tuple[float, float]], q: float) -> float:
    """Prometheus' histogram_quantile over (upper bound, cumulative count) pairs, sorted.

    Linear interpolation inside the bucket that holds the rank; NaN when there is nothing.
    """
    if not buckets or buckets[-1][1] == 0:
        return math.nan
    rank = q * buckets[-1][1]
    lower_bound, lower_count = 0.0, 0.0
    for bound, count in buckets:
        if count >= rank:
            if math.isinf(bound):
                return lower_bound
            width = count - lower_count
            return lower_bound + (bound - lower_bound) * (
                (rank - lower_count) / width if width else 0
            )
        lower_bound, lower_count = bound, count
    return math.nan
