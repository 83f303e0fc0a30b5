"""The shortcuts the scrape path takes for speed, kept in one place.

Two kinds: ``remember``, the one bounded-cache rule every memo of names and label sets keeps
(they are pure functions of their keys, learned from pages: a hostile page of ever-new keys
must not grow memory, and relearning after a clear costs one slower scrape); and prometheus_client
output samples built straight from tuples, which is what ``add_metric`` would build, several
times faster, for the histograms the engine adapters write on every scrape (counters and
gauges get their ``OutputSample`` made directly, as ``add_metric`` would).
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import TypeVar

from prometheus_client.core import Metric
from prometheus_client.samples import Sample as OutputSample
from prometheus_client.utils import floatToGoString

__all__ = ["OutputSample", "add_histogram", "format_boundary", "remember"]

K = TypeVar("K")
V = TypeVar("V")


def remember(memo: dict[K, V], key: K, value: V, limit: int) -> V:
    """Store ``value`` in ``memo``, first forgetting everything if it holds ``limit`` entries.

    Memos stay plain dicts, so lookups keep the speed of exact-dict subscripts and ``get``
    (a dict subclass would slow every ``memo[key]`` down); only storing checks the bound.
    """
    if len(memo) >= limit:
        memo.clear()
    memo[key] = value
    return value


#: how prometheus_client writes ``le`` (1.0, 2.5, +Inf); it is untyped, hence the annotation
format_boundary: Callable[[float], str] = floatToGoString

_new_tuple = tuple.__new__
#: what an ``OutputSample`` holds after its value (timestamp, exemplar, ...: the fields vary
#: between prometheus_client releases)
_SAMPLE_DEFAULTS = tuple(OutputSample._field_defaults[name] for name in OutputSample._fields[3:])

_SeriesNames = tuple[str, str, str, tuple[dict[str, str], ...], dict[str, str]]
_HISTOGRAM_SERIES: dict[tuple[str, tuple[tuple[str, str], ...], tuple[str, ...]], _SeriesNames] = {}
HISTOGRAM_SERIES_LIMIT = 10_000


def add_histogram(
    family: Metric,
    labels: dict[str, str],
    les: tuple[str, ...],
    counts: Sequence[float],
    total: float,
) -> None:
    """The samples ``HistogramMetricFamily.add_metric`` would add, built several times faster
    (it runs for every bucket of every histogram on every scrape): samples are made straight
    from tuples, skipping the namedtuple's Python-level constructor, and their names and
    label sets come from ``_histogram_series``."""
    bucket, count, sum_, bucket_labels, labels = _histogram_series(family.name, labels, les)
    new, defaults = _new_tuple, _SAMPLE_DEFAULTS
    family.samples += [
        new(OutputSample, (bucket, le_labels, n) + defaults)  # noqa: RUF005
        for le_labels, n in zip(bucket_labels, counts, strict=True)
    ]
    family.samples.append(new(OutputSample, (count, labels, counts[-1]) + defaults))  # noqa: RUF005
    family.samples.append(new(OutputSample, (sum_, labels, total) + defaults))  # noqa: RUF005


def _histogram_series(name: str, labels: dict[str, str], les: tuple[str, ...]) -> _SeriesNames:
    """The sample names of one output histogram series (bucket, count, sum), the label set of
    each bucket and that of count and sum. Memoised across scrapes, since the same series
    come back every time: the label dicts are shared by the families of successive pages,
    which is why the families ``normalize`` returns must be treated as read-only."""
    key = (name, tuple(labels.items()), les)
    series = _HISTOGRAM_SERIES.get(key)
    if series is None:
        bucket_labels = tuple({**labels, "le": le} for le in les)
        series = (name + "_bucket", name + "_count", name + "_sum", bucket_labels, labels)
        remember(_HISTOGRAM_SERIES, key, series, HISTOGRAM_SERIES_LIMIT)
    return series
