"""The report's reconciliation: do its token totals match the engines' own counters?

Over the report's window the engines' prompt and generated token counters grow by what every
proxy charged plus the traffic that reaches the engines around the proxies (quality probes
sent straight to an engine, the sidecars' warm-up requests): the same rule the proxy's drift
gauge follows (:mod:`inferwatch.proxy.reconcile`), here over the whole fleet and the report's
window, read from Prometheus.

The counters' growth comes from ``increase()``, which only sees the samples inside the window
and extrapolates from them to its edges: at each edge up to about one scrape interval of
traffic is miscounted, whatever the window's length. The gap is therefore judged against the
proxy's own drift tolerance plus that edge allowance (the engines' token rate at each edge
times the scrape interval), never expected to be zero.
"""

from __future__ import annotations

from dataclasses import dataclass

from inferwatch import catalog
from inferwatch.canary.prometheus import Prometheus, count, finite

_ENGINE = ("engine_prompt_tokens", "engine_generation_tokens")


@dataclass(frozen=True)
class Reconciliation:
    logged: int  # prompt + completion tokens in the report
    engines: int  # what the engines' counters grew by over the window
    around: int  # of which traffic that did not pass a proxy (direct probes, warm-up)
    edges: int  # tokens increase() may miscount at the window's two edges
    tolerance: float  # the gap allowed, the edges included

    @property
    def gap(self) -> int:
        """Logged minus what the proxies must have sent (positive: more billed than served)."""
        return self.logged - (self.engines - self.around)

    @property
    def ok(self) -> bool:
        return abs(self.gap) <= self.tolerance

    def fields(self) -> dict[str, int | float | bool]:
        return {
            "logged_tokens": self.logged,
            "engine_tokens": self.engines,
            "around_proxy_tokens": self.around,
            "gap_tokens": self.gap,
            "edge_tokens": self.edges,
            "tolerance_tokens": self.tolerance,
            "reconciled": self.ok,
        }


def _sum(key: str, matchers: str = "") -> str:
    return f"{catalog.load()[key].name}{{{matchers}}}"


def reconcile(
    prometheus: Prometheus,
    start: float,
    end: float,
    logged: int,
    *,
    drift_tokens: float,
    scrape_interval_s: float,
    tolerance: float | None = None,
) -> Reconciliation:
    """The engines' side over ``[start, end)``, read at ``end``; ``tolerance`` (None: the
    drift tolerance plus the edge allowance) is the gap allowed."""
    seconds = max(1, round(end - start))

    def growth(key: str, matchers: str = "") -> int:
        expr = f"sum(increase({_sum(key, matchers)}[{seconds}s]))"
        return count(prometheus.scalar(expr, end))

    engines = sum(growth(key) for key in _ENGINE)
    around = growth("probe_tokens", 'route="direct"') + growth("warmup_tokens")
    # the engines' token rate over a few scrapes inside each edge
    rate_window = max(1, round(4 * scrape_interval_s))
    rates = [
        finite(prometheus.scalar(f"sum(rate({_sum(key)}[{rate_window}s]))", at))
        for key in _ENGINE
        for at in (start + rate_window, end)
    ]
    edges = round(scrape_interval_s * sum(rates))
    allowed = drift_tokens + edges if tolerance is None else tolerance
    return Reconciliation(logged, engines, around, edges, allowed)
