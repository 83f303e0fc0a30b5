"""The /metrics writer against prometheus_client's own encoders: byte-identical output for
any families, each format a scraper can ask for, and the library's encoder for anything the
writer leaves to it."""

from __future__ import annotations

import math
from typing import Any

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from prometheus_client import CollectorRegistry, Counter, Enum, Gauge, Histogram, Info, Summary
from prometheus_client.core import (
    CounterMetricFamily,
    GaugeMetricFamily,
    HistogramMetricFamily,
    Metric,
)
from prometheus_client.exposition import choose_encoder
from prometheus_client.samples import Exemplar

from inferwatch.serving import exposition
from inferwatch.serving.endpoints import Families, encode_metrics

pytestmark = pytest.mark.unit

#: what Prometheus 2 and 3 send, a plain client, text 1.0.0, and OpenMetrics 0.0.1
ACCEPTS = [
    "application/openmetrics-text;version=1.0.0,application/openmetrics-text;version=0.0.1;"
    "q=0.75,text/plain;version=0.0.4;q=0.5,*/*;q=0.1",
    "application/vnd.google.protobuf;proto=io.prometheus.client.MetricFamily;"
    "encoding=delimited;q=0.5,application/openmetrics-text;version=1.0.0;q=0.4,"
    "application/openmetrics-text;version=0.0.1;q=0.3,text/plain;version=1.0.0;q=0.2,"
    "text/plain;version=0.0.4;q=0.1,*/*;q=0.05",
    "",
    "*/*",
    "text/plain;version=1.0.0",
    "application/openmetrics-text",
]


def library(families: list[Metric], accept: str) -> bytes:
    encoder, _ = choose_encoder(accept)
    return encoder(Families(families).registry())


def written(families: list[Metric], accept: str) -> bytes | None:
    encoder, _ = choose_encoder(accept)
    fast = exposition.fast_encoder(encoder)
    assert fast is not None
    return fast(families)


names = st.from_regex(r"[a-zA-Z_][a-zA-Z0-9_]{0,20}", fullmatch=True).filter(
    lambda name: not name.startswith("__")
)
#: any text, the characters the formats escape (backslash, newline, quote) among them
values = st.text(st.characters(codec="utf-8") | st.sampled_from(["\\", "\n", '"']), max_size=12)
numbers = st.floats(allow_nan=True, allow_infinity=True) | st.integers(-(10**20), 10**20)


@st.composite
def families(draw: Any) -> list[Metric]:
    out: list[Metric] = []
    for index in range(draw(st.integers(0, 4))):
        name = f"{draw(names)}_{index}"
        labels = draw(st.lists(names, max_size=3, unique=True))
        documentation = draw(values)
        kind = draw(st.sampled_from(["counter", "gauge", "histogram"]))
        row = st.lists(values, min_size=len(labels), max_size=len(labels))
        rows = draw(st.lists(st.tuples(row, numbers), max_size=4))
        if kind == "counter":
            family: Metric = CounterMetricFamily(name, documentation, labels=labels)
            for row, value in rows:
                family.add_metric(row, abs(value) if not math.isnan(value) else value)
        elif kind == "gauge":
            family = GaugeMetricFamily(name, documentation, labels=labels)
            for row, value in rows:
                family.add_metric(row, value)
        else:
            family = HistogramMetricFamily(name, documentation, labels=labels)
            for row, value in rows:
                family.add_metric(row, [("1.0", 1), ("+Inf", 2)], sum_value=value)
        out.append(family)
    return out


@settings(max_examples=300, suppress_health_check=[HealthCheck.too_slow])
@given(families(), st.sampled_from(ACCEPTS))
def test_any_families_are_written_as_the_library_writes_them(
    drawn: list[Metric], accept: str
) -> None:
    assert written(drawn, accept) == library(drawn, accept)
    # and again, from the remembered line starts
    assert written(drawn, accept) == library(drawn, accept)


def test_every_kind_of_family_the_client_library_makes_is_written_the_same() -> None:
    """Counters (with ``_created``), gauges, histograms, summaries, info and enum (stateset)
    families from real prometheus_client metrics."""
    registry = CollectorRegistry()
    Counter("requests", "Requests.\nSecond line \\ end", ["route"], registry=registry).labels(
        'a"b'
    ).inc(3)
    Gauge("depth", "Queue depth.", registry=registry).set(-0.0)
    Histogram("latency_seconds", "Latency.", ["model"], registry=registry).labels("m").observe(0.2)
    Summary("sizes_bytes", "Sizes.", registry=registry).observe(12)
    Info("build", "Build.", registry=registry).info({"version": "1.2", "commit": "ab\ncd"})
    Enum("state", "State.", states=["up", "down"], registry=registry).state("down")
    drawn = list(registry.collect())
    for accept in ACCEPTS:
        body = written(drawn, accept)
        assert body is not None
        assert body == library(drawn, accept)


def left_out(kind: str) -> Metric:
    if kind == "metric-name-with-colon":
        return GaugeMetricFamily("job:requests:rate5m", "A recording rule's name.", value=1)
    if kind == "utf8-label-name":
        family = GaugeMetricFamily("ok", "A label of the new character set.", labels=["a.b"])
        family.add_metric(["x"], 1)
        return family
    family = CounterMetricFamily("timed", "A timestamp.", labels=[])
    family.add_metric([], 1, timestamp=1700000000.5)
    return family


@pytest.mark.parametrize("kind", ["metric-name-with-colon", "utf8-label-name", "timestamp"])
def test_what_the_writer_leaves_out_is_the_librarys_to_write(kind: str) -> None:
    family = left_out(kind)
    for accept in ACCEPTS:
        assert written([family], accept) is None
        body, _ = encode_metrics([family], accept, "")
        assert body == library([family], accept)


def test_an_exemplar_is_written_by_the_library_in_openmetrics_and_dropped_in_text() -> None:
    family = CounterMetricFamily("hits", "Hits.", labels=["a"])
    family.add_metric(["x"], 2, exemplar=Exemplar({"trace_id": "abc"}, 1.0))
    prometheus, plain = ACCEPTS[0], ACCEPTS[2]
    assert written([family], prometheus) is None
    assert b"trace_id" in encode_metrics([family], prometheus, "")[0]
    assert written([family], plain) == library([family], plain)


def test_a_scraper_asking_for_another_escaping_gets_the_librarys_encoder() -> None:
    encoder, _ = choose_encoder("application/openmetrics-text;version=1.0.0;escaping=allow-utf-8")
    assert exposition.fast_encoder(encoder) is None


def test_the_remembered_line_starts_stay_bounded(monkeypatch: pytest.MonkeyPatch) -> None:
    """A page of ever-new label values cannot grow the memo past its bound."""
    monkeypatch.setattr(exposition, "_MEMO_LIMIT", 100)
    for round_ in range(5):
        family = GaugeMetricFamily("g", "G.", labels=["v"])
        for i in range(60):
            family.add_metric([f"{round_}-{i}"], i)
        assert written([family], ACCEPTS[2]) == library([family], ACCEPTS[2])
        assert len(exposition._text_starts) <= 100
