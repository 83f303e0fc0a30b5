"""Rates and quantiles between two scrapes of one /metrics page, computed as Prometheus does.

A rate is the counter's increase over the interval divided by its length, per series, where a
series that went down was reset and counts from zero. A quantile is read from the increase of
each histogram bucket over the interval (``histogram_quantile`` over ``rate(..._bucket)``), so it
describes the last few seconds rather than everything since the process started.
"""

from __future__ import annotations

import math
from collections import deque
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass

from inferwatch.serving import textformat
from inferwatch.serving.histogram import histogram_quantile
from inferwatch.serving.textformat import PageSample

Labels = Mapping[str, str]
Where = Callable[[Labels], bool]
SeriesKey = frozenset[tuple[str, str]]


@dataclass(frozen=True)
class Scrape:
    """The samples of one page, by sample name, and when it was read (monotonic seconds)."""

    at: float
    samples: Mapping[str, Sequence[PageSample]]

    @classmethod
    def parse(cls, at: float, text: str | bytes) -> Scrape:
        by_name: dict[str, list[PageSample]] = {}
        for family in textformat.parse(text).families.values():
            for sample in family.samples:
                by_name.setdefault(sample.name, []).append(sample)
        return cls(at, by_name)

    def series(self, name: str, where: Where | None = None) -> dict[SeriesKey, float]:
        return {
            frozenset(s.labels.items()): s.value
            for s in self.samples.get(name, ())
            if where is None or where(s.labels)
        }

    def values(self, name: str, where: Where | None = None) -> list[tuple[Labels, float]]:
        return [
            (s.labels, s.value)
            for s in self.samples.get(name, ())
            if where is None or where(s.labels)
        ]

    def total(self, name: str, where: Where | None = None) -> float | None:
        """The sum over matching series; None when there are none."""
        values = [value for _, value in self.values(name, where)]
        return sum(values) if values else None


def increase(old: Scrape, new: Scrape, name: str, where: Where | None = None) -> float | None:
    """Summed per-series increase of a counter between two scrapes (resets count from 0)."""
    now = new.series(name, where)
    if not now:
        return None
    before = old.series(name, where)
    total = 0.0
    for key, value in now.items():
        previous = before.get(key, 0.0)
        total += value - previous if value >= previous else value
    return total


def rate(old: Scrape, new: Scrape, name: str, where: Where | None = None) -> float | None:
    """Per-second increase; None without samples or without time between the scrapes."""
    elapsed = new.at - old.at
    grown = increase(old, new, name, where)
    if grown is None or elapsed <= 0:
        return None
    return grown / elapsed


def quantiles(
    old: Scrape, new: Scrape, histogram: str, qs: Iterable[float]
) -> tuple[float | None, ...]:
    """Quantiles of the observations a histogram received between two scrapes (all series)."""
    by_bound: dict[float, float] = {}
    now = new.samples.get(histogram + "_bucket", ())
    before = old.series(histogram + "_bucket")
    for sample in now:
        previous = before.get(frozenset(sample.labels.items()), 0.0)
        grown = sample.value - previous if sample.value >= previous else sample.value
        bound = float(sample.labels["le"])
        by_bound[bound] = by_bound.get(bound, 0.0) + grown
    buckets = sorted(by_bound.items())
    results: list[float | None] = []
    for q in qs:
        value = histogram_quantile(buckets, q) if buckets and buckets[-1][1] > 0 else math.nan
        results.append(None if math.isnan(value) else value)
    return tuple(results)


class History:
    """The scrapes of one source over the last ``window`` seconds."""

    def __init__(self, window: float) -> None:
        self.window = window
        self._scrapes: deque[Scrape] = deque()

    def add(self, scrape: Scrape) -> None:
        self._scrapes.append(scrape)
        while len(self._scrapes) > 2 and scrape.at - self._scrapes[1].at >= self.window:
            self._scrapes.popleft()

    @property
    def latest(self) -> Scrape | None:
        return self._scrapes[-1] if self._scrapes else None

    def span(self) -> tuple[Scrape, Scrape] | None:
        """The oldest and newest scrape kept, when there are two."""
        if len(self._scrapes) < 2:
            return None
        return self._scrapes[0], self._scrapes[-1]
