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

Before that, a histogram whose samples do not use the name its ``# TYPE`` line declares
(Triton's documentation shows ``# TYPE nv_first_response_histogram_ms histogram`` over
samples ``nv_inference_first_response_histogram_ms{le=...}``, ``..._count`` and ``..._sum``)
is put back together under the samples' name, its bare-named buckets read as buckets. The
parser can only file such samples as untyped strays, which no reader takes for a histogram:
left alone the page would read as nothing, silently. Each is counted by family (a parse
problem, every scrape it is seen) and logged once.
"""

from __future__ import annotations

import itertools
import logging
import math
from collections import Counter
from collections.abc import Callable
from dataclasses import dataclass
from typing import NamedTuple

from inferwatch.logs import log_event
from inferwatch.serving.textformat import Exposition, Family, PageSample

logger = logging.getLogger("inferwatch.engine")

#: ``reason`` label values of ``inferwatch_engine_scrape_dropped_series_total``
MALFORMED, LABEL_TOO_LONG, SERIES_LIMIT = "malformed", "label_too_long", "series_limit"
#: the log-once reason of a histogram read under its samples' name
MISNAMED = "misnamed"
_LOGGED_LIMIT = 10_000  # (reason, family) pairs remembered for log-once
_UNTYPED = frozenset({"untyped", "unknown", ""})

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
        #: families whose samples do not use their declared name, by the samples' name
        self.misnamed: Counter[str] = Counter()
        self._logged: set[tuple[str, str]] = set()

    def apply(
        self, exposition: Exposition, wanted: Callable[[str], bool]
    ) -> dict[str, dict[SeriesKey, list[PageSample]]]:
        """Drop, in place, what the families named by ``wanted`` must not pass on; returns the
        series of each family kept, as ``series_of`` groups them (for the next stage)."""
        for name in recover_misnamed_histograms(exposition, wanted):
            self.misnamed[name] += 1  # a family the adapter reads: the catalogue bounds them
            self._log_once(
                MISNAMED,
                name,
                "engine histogram's samples do not use the name its TYPE line declares; "
                "read under the samples' name (logged once per family)",
            )
        kept = {}
        for name, family in list(exposition.families.items()):
            if not wanted(name):
                continue
            found = series_of(family, self.limits)
            problem = malformed(family, found.groups)
            if problem is not None:
                del exposition.families[name]
                series = len(found.groups) + found.too_long + found.over
                self._drop(MALFORMED, family, series, problem)
                continue
            if found.too_long:
                limit = self.limits.label_length
                detail = f"label values longer than {limit} characters (--max-label-length)"
                self._drop(LABEL_TOO_LONG, family, found.too_long, detail)
            if found.over:
                limit = self.limits.series_per_family
                detail = f"more than {limit} series (--max-series-per-family)"
                self._drop(SERIES_LIMIT, family, found.over, detail)
            if found.too_long or found.over:
                family.samples = [sample for group in found.groups.values() for sample in group]
            kept[name] = found.groups
        return kept

    def _drop(self, reason: str, family: Family, series: int, detail: str) -> None:
        self.dropped[reason] += series
        self._log_once(
            reason,
            family.name,
            "engine series dropped (logged once per family and reason)",
            series=series,
            detail=detail,
        )

    def _log_once(self, reason: str, family: str, message: str, **fields: object) -> None:
        if (reason, family) in self._logged or len(self._logged) >= _LOGGED_LIMIT:
            return
        self._logged.add((reason, family))
        log_event(logger, logging.WARNING, message, reason=reason, family=family, **fields)


def recover_misnamed_histograms(exposition: Exposition, wanted: Callable[[str], bool]) -> list[str]:
    """Rebuild, in place, each histogram of the families named by ``wanted`` whose buckets
    are untyped samples of a bare name carrying ``le`` (their ``# TYPE`` declared another
    name); returns the names rebuilt. The ``_count`` and ``_sum`` strays of the same name
    join them, and the buckets take the ``_bucket`` suffix every reader expects."""
    families = exposition.families
    found = [
        name
        for name, family in families.items()
        if family.type in _UNTYPED
        and not name.endswith(("_bucket", "_count", "_sum"))
        and wanted(name)
        and any("le" in labels for _, labels, _, _ in family.samples)
    ]
    for name in found:
        family = families[name]
        bucket = name + "_bucket"
        samples = [
            sample._replace(name=bucket) if "le" in sample.labels else sample
            for sample in family.samples
        ]
        for part in ("_count", "_sum"):
            stray = families.get(name + part)
            if stray is not None and stray.type in _UNTYPED:
                samples += stray.samples
                del families[name + part]
        families[name] = Family(name, "histogram", family.help, family.unit, samples)
    return found


class Series(NamedTuple):
    """A family's samples by series, and the series left out by the bounds."""

    groups: dict[SeriesKey, list[PageSample]]  # label set without ``le``, sorted -> samples
    too_long: int  # series with a label value over the length cap
    over: int  # series past the per-family cap


def series_of(family: Family, limits: Limits) -> Series:
    """The family's samples by series (label set without ``le``), the first
    ``limits.series_per_family`` series with no label value over ``limits.label_length``.

    Samples are grouped by their labels as listed (one tuple per sample); the bounds are
    checked once per new series, series left out cost one set entry each, and only kept
    groups are put in canonical order, so the same series listed with its labels in another
    order still lands in one group."""
    listed: dict[SeriesKey, list[PageSample]] = {}
    left_out: set[SeriesKey] = set()
    too_long = 0
    cap, length = limits.series_per_family, limits.label_length
    for sample in family.samples:
        labels = sample.labels
        if "le" in labels:
            labels = labels.copy()
            del labels["le"]
        items = tuple(labels.items())
        group = listed.get(items)
        if group is not None:
            group.append(sample)
        elif items not in left_out:
            if any(len(value) > length for _, value in items):
                left_out.add(items)
                too_long += 1
            elif len(listed) < cap:
                listed[items] = [sample]
            else:
                left_out.add(items)
    groups: dict[SeriesKey, list[PageSample]] = {}
    for items, samples in listed.items():
        key = tuple(sorted(items))
        if key in groups:
            groups[key] += samples
        else:
            groups[key] = samples
    return Series(groups, too_long, len(left_out) - too_long)


def malformed(family: Family, groups: dict[SeriesKey, list[PageSample]]) -> str | None:
    """What makes the family wrong as data, or None when it is sound."""
    names = _series_names(family)
    for key, samples in groups.items():
        if len({(name, labels.get("le")) for name, labels, _, _ in samples}) != len(samples):
            return f"the same series appears twice ({_describe(samples[0].name, key)})"
        if names is not None:
            problem = _count_problem(names, samples)
            if problem is not None:
                return f"{problem} ({_describe(samples[0].name, key)})"
    return None


class _Names(NamedTuple):
    """The sample names whose values must be counts, in one family."""

    counts: frozenset[str]  # a counter's samples, a histogram's or summary's _count
    bucket: str | None
    sum: str | None


def _series_names(family: Family) -> _Names | None:
    name = family.name
    if family.type == "counter":  # x_total in OpenMetrics, x_total or bare in 0.0.4 (TGI)
        stem = name.removesuffix("_total")
        return _Names(frozenset({name, stem + "_total"}), None, None)
    if family.type == "histogram":
        return _Names(frozenset({name + "_count"}), name + "_bucket", name + "_sum")
    if family.type == "summary":
        return _Names(frozenset({name + "_count"}), None, name + "_sum")
    return None


def _count_problem(names: _Names, samples: list[PageSample]) -> str | None:
    buckets: list[tuple[float, float]] = []
    count = None
    for name, labels, value, _ in samples:
        if name == names.bucket:
            bound = _bound(labels.get("le"))
            if bound is None:
                return f"bucket with le={labels.get('le')!r}"
            if not 0 <= value < math.inf:
                return f"{name} is {value}, which no count can be"
            buckets.append((bound, value))
        elif name in names.counts:
            if not 0 <= value < math.inf:
                return f"{name} is {value}, which no count can be"
            count = value
        elif name == names.sum and math.isnan(value):
            return "_sum is NaN"
    if not buckets:
        return None
    if any(a[0] > b[0] for a, b in itertools.pairwise(buckets)):
        buckets.sort()
    for (_, below), (bound, at) in itertools.pairwise(buckets):
        if at < below:
            return f"bucket le={bound} holds {at}, fewer than the bucket below it ({below})"
    if count is not None and buckets[-1][0] == math.inf and buckets[-1][1] != count:
        return f"_count {count} differs from the +Inf bucket {buckets[-1][1]}"
    return None


def _bound(le: str | None) -> float | None:
    """``le`` as a number (memoised: pages repeat the same few boundaries), None if it is not
    one."""
    if le is None:
        return None
    bound = _BOUNDS.get(le, _UNKNOWN)
    if bound is _UNKNOWN:
        try:
            bound = float(le)
        except ValueError:
            bound = None
        if bound is not None and math.isnan(bound):
            bound = None
        if len(_BOUNDS) < 10_000:
            _BOUNDS[le] = bound
    return bound  # type: ignore[return-value]


_BOUNDS: dict[str, float | None] = {}
_UNKNOWN = object()


def _describe(name: str, key: SeriesKey) -> str:
    labels = ",".join(f'{label}="{value[:64]}"' for label, value in key)
    return f"{name}{{{labels}}}"
