"""The statistics a canary verdict rests on, for the data Prometheus can actually give.

Prometheus keeps counters and histogram buckets, not individual requests, so every test here
works on counts over the analysis window:

* a proportion (errors per request, failed probes per probe run, degenerate outputs per
  screened output) is compared with a one-sided Fisher exact test: exact at any sample size,
  so a rare event (a 0.5 % degeneracy rate on a few hundred outputs) is judged as soundly as a
  common one, where a normal approximation would not be;
* a latency quantile is compared through its tail: the requests above the bucket bound that
  holds the baseline's p99 are counted on both sides, and the candidate's share above that
  bound is tested against the baseline's with the same Fisher test. When the candidate's p99
  is higher, more than 1 % of its requests lie above the baseline's p99, which is exactly what
  the test detects; a whole-distribution test (Mann-Whitney over buckets) would miss a
  regression confined to the tail.
"""

from __future__ import annotations

import math
from collections.abc import Sequence

#: relative size below which further hypergeometric terms no longer change the p-value
_NEGLIGIBLE = 1e-17


def _log_comb(n: int, k: int) -> float:
    return math.lgamma(n + 1) - math.lgamma(k + 1) - math.lgamma(n - k + 1)


def fisher_greater(
    candidate_events: int, candidate_n: int, baseline_events: int, baseline_n: int
) -> float:
    """One-sided Fisher exact p-value that the candidate's event rate exceeds the baseline's.

    Conditional on the margins, the candidate's event count is hypergeometric; the p-value is
    the probability of at least the observed count. The tail beyond the observed count on the
    side away from the mode is summed (terms in log space, stopping once they are negligible),
    so a million-request window costs little and a p-value near 1 keeps its precision.
    """
    for value in (candidate_events, candidate_n, baseline_events, baseline_n):
        if value < 0:
            raise ValueError("counts are non-negative")
    if candidate_events > candidate_n or baseline_events > baseline_n:
        raise ValueError("events cannot exceed their sample")
    total = candidate_n + baseline_n
    events = candidate_events + baseline_events
    if candidate_n == 0 or baseline_n == 0 or events == 0:
        return 1.0
    low = max(0, events - baseline_n)
    high = min(events, candidate_n)
    if candidate_events <= low:
        return 1.0
    log_norm = _log_comb(total, candidate_n)

    def pmf(k: int) -> float:
        return math.exp(
            _log_comb(events, k) + _log_comb(total - events, candidate_n - k) - log_norm
        )

    mode = (candidate_n + 1) * (events + 1) // (total + 2)
    # the tail on the observed count's side away from the mode: its terms only shrink, so the
    # sum stops where they vanish, and a p-value near 1 is one minus a small sum rather than a
    # long sum that rounding would spoil
    upper = candidate_events > mode
    ks = range(candidate_events, high + 1) if upper else range(candidate_events - 1, low - 1, -1)
    tail = 0.0
    for k in ks:
        term = pmf(k)
        tail += term
        if term <= tail * _NEGLIGIBLE:
            break
    p = tail if upper else 1.0 - tail
    return min(1.0, max(0.0, p))


def tail_bound(bounds: Sequence[float], cumulative: Sequence[float], quantile: float) -> int | None:
    """Index of the first bucket whose cumulative count reaches ``quantile`` of the total.

    ``bounds`` are the buckets' upper bounds in increasing order ending with +Inf and
    ``cumulative`` their counts (Prometheus' ``le`` semantics). None when the quantile lies in
    the +Inf bucket: no finite bound separates the tail there.
    """
    total = cumulative[-1]
    if total <= 0:
        return None
    for index, count in enumerate(cumulative):
        if count >= quantile * total:
            return None if math.isinf(bounds[index]) else index
    return None
