"""What an engine page must hold as data before its series reach the sidecar's output.

The parser keeps every line it can read; this is the second gate, per family of the families
the engine's adapter reads. A family that is readable but wrong as data (the same series
twice, histogram buckets that fall, a NaN or negative count, a ``_count`` that disagrees with
the ``+Inf`` bucket) is dropped whole: summing or passing it on would put a wrong number on a
dashboard with nothing to say so. Bounds keep a hostile or buggy engine from exploding the
output: series with a label value over the length cap are dropped, and so are series past
the per-family cap (a histogram's buckets, ``_count`` and ``_sum`` count as one series), the
first ones on the page kept. Every drop is counted by reason and logged the first time it
happens to a family, not on every scrape.
"""

from __future__ import annotations

import itertools
import logging
import math
from collections import Counter
from collections.abc import Callable
from dataclasses import dataclass

from inferwatch.exporters.textformat import Exposition, Family, Sample
from inferwatch.logs import log_event

log = logging.getLogger("inferwatch.engine")

#: ``reason`` label values of ``inferwatch_engine_scrape_dropped_series_total``
MALFORMED, LABEL_TOO_LONG, SERIES_LIMIT = "malformed", "label_too_long", "series_limit"
_MONOTONIC_TYPES = frozenset({"counter", "histogram", "summary"})
_LOGGED_LIMIT = 10_000  # (reason, family) pairs remembered for log-once

SeriesKey = tuple[tuple[str, str], ...]


@dataclass(frozen=True)
class Limits:
    """Bounds on what one engine page may put into the output."""

    series_per_family: int = 1000
    label_length: int = 256


class PageChecks:
    """Applies the rules to each scraped page and keeps the drop counts."""

    def __init__(self, limits: Limits | None = None):
        self.limits = limits or Limits()
        self.dropped: Counter[str] = Counter()
        self._logged: set[tuple[str, str]] = set()

    def apply(self, exposition: Exposition, wanted: Callable[[str], bool]) -> None:
        """Drop, in place, what the families named by ``wanted`` must not pass on."""
        for name, family in list(exposition.families.items()):
            if not wanted(name):
                continue
            groups = series_of(family)
            problem = malformed(family.type, groups)
            if problem is not None:
                del exposition.families[name]
                self._drop(MALFORMED, family, len(groups), problem)
                continue
            self._bound(family, groups)

    def _bound(self, family: Family, groups: dict[SeriesKey, list[Sample]]) -> None:
        limit = self.limits.label_length
        too_long = [key for key in groups if any(len(value) > limit for _, value in key)]
        for key in too_long:
            del groups[key]
        over = max(len(groups) - self.limits.series_per_family, 0)
        if not too_long and not over:
            return
        if too_long:
            self._drop(
                LABEL_TOO_LONG,
                family,
                len(too_long),
                f"label values longer than {limit} characters (--max-label-length)",
            )
        if over:
            kept = list(groups)[: self.limits.series_per_family]
            groups = {key: groups[key] for key in kept}
            self._drop(
                SERIES_LIMIT,
                family,
                over,
                f"more than {self.limits.series_per_family} series (--max-series-per-family)",
            )
        family.samples = [sample for samples in groups.values() for sample in samples]

    def _drop(self, reason: str, family: Family, series: int, detail: str) -> None:
        self.dropped[reason] += series
        if (reason, family.name) in self._logged or len(self._logged) >= _LOGGED_LIMIT:
            return
        self._logged.add((reason, family.name))
        log_event(
            log,
            logging.WARNING,
            "engine series dropped (logged once per family and reason)",
            reason=reason,
            family=family.name,
            series=series,
            detail=detail,
        )


def series_of(family: Family) -> dict[SeriesKey, list[Sample]]:
    """The family's samples by series (label set without ``le``), in page order."""
    groups: dict[SeriesKey, list[Sample]] = {}
    for sample in family.samples:
        labels = sample.labels
        if "le" in labels:
            key = tuple(sorted(item for item in labels.items() if item[0] != "le"))
        else:
            key = tuple(sorted(labels.items()))
        group = groups.get(key)
        if group is None:
            groups[key] = [sample]
        else:
            group.append(sample)
    return groups


def malformed(type_: str, groups: dict[SeriesKey, list[Sample]]) -> str | None:
    """What makes the family wrong as data, or None when it is sound."""
    for key, samples in groups.items():
        names = {(name, labels.get("le")) for name, labels, _, _ in samples}
        if len(names) != len(samples):
            return f"the same series appears twice ({_describe(samples[0].name, key)})"
        if type_ in _MONOTONIC_TYPES:
            problem = _count_problem(type_, samples)
            if problem is not None:
                return f"{problem} ({_describe(samples[0].name, key)})"
    return None


def _count_problem(type_: str, samples: list[Sample]) -> str | None:
    buckets: list[tuple[float, float]] = []
    count = None
    for name, labels, value, _ in samples:
        if name.endswith("_created"):
            continue
        if name.endswith("_sum"):
            if math.isnan(value):
                return "_sum is NaN"
            continue
        if type_ == "summary" and not name.endswith("_count"):
            continue  # a quantile: NaN before the first observation, as prometheus_client has it
        if not 0 <= value < math.inf:
            return f"{name} is {value}, which no count can be"
        if name.endswith("_bucket"):
            bound = _bound(labels.get("le"))
            if bound is None:
                return f"bucket with le={labels.get('le')!r}"
            buckets.append((bound, value))
        elif name.endswith("_count"):
            count = value
    buckets.sort()
    for (_, below), (bound, at) in itertools.pairwise(buckets):
        if at < below:
            return f"bucket le={bound} holds {at}, fewer than the bucket below it ({below})"
    if buckets and count is not None and buckets[-1][0] == math.inf and buckets[-1][1] != count:
        return f"_count {count} differs from the +Inf bucket {buckets[-1][1]}"
    return None


def _bound(le: str | None) -> float | None:
    if le is None:
        return None
    try:
        bound = float(le)
    except ValueError:
        return None
    return None if math.isnan(bound) else bound


def _describe(name: str, key: SeriesKey) -> str:
    labels = ",".join(f'{label}="{value[:64]}"' for label, value in key)
    return f"{name}{{{labels}}}"
