"""Self-observed histograms and the quantile estimate the views use."""

from __future__ import annotations

import math

import pytest

from inferwatch.serving.histogram import TTFT_BUCKETS, Histogram, histogram_quantile

pytestmark = pytest.mark.unit


def test_observations_land_in_prometheus_le_buckets() -> None:
    histogram = Histogram((0.1, 1.0))
    for value in (0.05, 0.1, 0.5, 3.0):
        histogram.observe(value)
    assert histogram.buckets() == [("0.1", 2), ("1.0", 3), ("+Inf", 4)]
    assert histogram.total == 3.65


def test_merge_adds_counts_and_sums() -> None:
    a, b = Histogram(TTFT_BUCKETS), Histogram(TTFT_BUCKETS)
    a.observe(0.003)
    b.observe(0.003)
    b.observe(20.0)
    a.merge(b)
    assert a.buckets()[-1] == ("+Inf", 3)
    assert dict(a.buckets())["0.005"] == 2


def test_quantile_interpolates_like_prometheus() -> None:
    # 10 observations in (0, 1], 10 in (1, 2]: the median is the top of the first bucket,
    # p75 half way through the second, as histogram_quantile() computes them.
    buckets = [(1.0, 10.0), (2.0, 20.0), (math.inf, 20.0)]
    assert histogram_quantile(buckets, 0.5) == 1.0
    assert histogram_quantile(buckets, 0.75) == 1.5


def test_quantile_in_the_inf_bucket_is_the_last_finite_bound() -> None:
    assert histogram_quantile([(1.0, 1.0), (math.inf, 10.0)], 0.99) == 1.0


def test_quantile_of_nothing_is_nan() -> None:
    assert math.isnan(histogram_quantile([(1.0, 0.0), (math.inf, 0.0)], 0.5))
    assert math.isnan(histogram_quantile([], 0.5))
