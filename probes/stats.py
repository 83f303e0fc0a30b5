"""Small statistics for the quality gate: Wilson intervals, Newcombe's difference, percentiles."""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass

Z_95 = 1.959963984540054


def wilson(successes: int, n: int, z: float = Z_95) -> tuple[float, float]:
    """Wilson score interval for a proportion (sound at 0 %, 100 % and small n)."""
    if n == 0:
        return 0.0, 1.0
    p = successes / n
    denominator = 1 + z * z / n
    centre = (p + z * z / (2 * n)) / denominator
    half = z * math.sqrt(p * (1 - p) / n + z * z / (4 * n * n)) / denominator
    return max(0.0, centre - half), min(1.0, centre + half)


@dataclass(frozen=True)
class Difference:
    """``candidate - baseline`` of two proportions with its confidence interval."""

    delta: float
    low: float
    high: float

    @property
    def significant_drop(self) -> bool:
        return self.high < 0


def newcombe(
    baseline_passes: int,
    baseline_n: int,
    candidate_passes: int,
    candidate_n: int,
    z: float = Z_95,
) -> Difference:
    """Newcombe's hybrid score interval (his method 10) for a difference of two proportions.

    Built from the two Wilson intervals, it keeps its coverage near 0 % and 100 %, where
    golden pass rates live and the textbook Wald interval collapses to zero width.
    """
    p1 = baseline_passes / baseline_n if baseline_n else 0.0
    p2 = candidate_passes / candidate_n if candidate_n else 0.0
    l1, u1 = wilson(baseline_passes, baseline_n, z)
    l2, u2 = wilson(candidate_passes, candidate_n, z)
    delta = p2 - p1
    low = delta - math.sqrt((p2 - l2) ** 2 + (u1 - p1) ** 2)
    high = delta + math.sqrt((u2 - p2) ** 2 + (p1 - l1) ** 2)
    return Difference(delta, max(-1.0, low), min(1.0, high))


def percentile(values: Sequence[float], q: float) -> float | None:
    """Linear-interpolated percentile (``q`` in 0..100); None for no values."""
    if not values:
        return None
    ordered = sorted(values)
    rank = (len(ordered) - 1) * q / 100
    low = math.floor(rank)
    high = min(low + 1, len(ordered) - 1)
    return ordered[low] + (ordered[high] - ordered[low]) * (rank - low)
