"""Counters that stay monotonic when one source series resets, as ``rate()`` reads them.

The engine adapters sum counters over series the output does not keep (vLLM's data-parallel
``engine`` ranks, SGLang's ``dp_rank``). When one rank restarts, its counters start again
from zero, and the sum drops by everything that rank had counted: Prometheus reads that as a
reset of the whole counter and ``rate()`` shows a spike of the fleet's entire history. So the
compensation happens per source series, before the sum, the way ``rate()`` does it per series:
each series' last value is remembered, and when a value is lower than the last one, the last
one is added to that series' offset. A series that goes missing while its family is still on
the page (a rank that is restarting) keeps its last value, so the sum does not dip either;
such held series are forgotten, the longest absent first, once they outnumber both the ones
still reported and ``HELD_FLOOR``.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass

from inferwatch.exporters.engine.checks import SeriesKey as Labels
from inferwatch.serving.textformat import Exposition, Family, PageSample

#: the cumulative samples of each family type (a counter's: all but ``_created``)
_SUFFIXES = {
    "counter": ("",),
    "histogram": ("_bucket", "_count", "_sum"),
    "summary": ("_count", "_sum"),
}

#: sample name, ``le``, the series' other labels
SeriesKey = tuple[str, str | None, Labels]

#: series held while absent, at least (more while more are reported)
HELD_FLOOR = 1024


@dataclass(slots=True)
class _Series:
    name: str
    labels: dict[str, str]
    last: float
    seen: int  # the scrape that last reported it
    offset: float = 0.0


class ResetCompensation:
    """Per-series offsets for the cumulative families of one engine's pages."""

    def __init__(self) -> None:
        self._families: dict[str, dict[SeriesKey, _Series]] = {}
        self._scrapes = 0

    def clear(self) -> None:
        """Forget every series (a different engine answers at the URL)."""
        self._families.clear()

    def apply(
        self, exposition: Exposition, series: Mapping[str, dict[Labels, list[PageSample]]]
    ) -> None:
        """Rewrite, in place, the cumulative samples of the families in ``series`` (each
        family's samples by series, as ``engine_checks.series_of`` groups them)."""
        self._scrapes += 1
        for name, groups in series.items():
            family = exposition.families[name]
            if family.type in _SUFFIXES:
                self._family(family, groups, self._families.setdefault(name, {}))

    def _family(
        self,
        family: Family,
        groups: dict[Labels, list[PageSample]],
        known: dict[SeriesKey, _Series],
    ) -> None:
        suffixes = _SUFFIXES[family.type]
        present: dict[SeriesKey, _Series] = {}
        samples: list[PageSample] = []
        for labels_key, group in groups.items():
            for sample in group:
                name, labels, value, timestamp = sample
                if name.endswith("_created") or not name.endswith(suffixes):
                    samples.append(sample)  # a creation time, a summary's quantiles
                    continue
                key = (name, labels.get("le"), labels_key)
                series = known.pop(key, None)
                if series is None:
                    series = _Series(name, labels, value, self._scrapes)
                elif value < series.last:
                    series.offset += series.last
                series.last, series.seen = value, self._scrapes
                present[key] = series
                if series.offset:
                    sample = PageSample(name, labels, value + series.offset, timestamp)
                samples.append(sample)
        # Left in ``known``: series not on this page, held at their last value.
        held = sorted(known.items(), key=lambda item: item[1].seen, reverse=True)
        for key, series in held[: max(len(present), HELD_FLOOR)]:
            samples.append(PageSample(series.name, series.labels, series.last + series.offset))
            present[key] = series
        family.samples = samples
        known.clear()
        known.update(present)
