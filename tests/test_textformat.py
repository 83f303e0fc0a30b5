"""The exposition parser against prometheus_client's own parsers, real captures and bad input."""

from __future__ import annotations

import math
import re
from collections.abc import Callable, Iterable
from pathlib import Path

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from prometheus_client import CollectorRegistry, Counter, Enum, Gauge, Histogram, Info, Summary
from prometheus_client.exposition import generate_latest
from prometheus_client.metrics_core import Metric
from prometheus_client.openmetrics import exposition as om_exposition
from prometheus_client.openmetrics import parser as om_parser
from prometheus_client.parser import text_string_to_metric_families
from prometheus_client.registry import Collector

from inferwatch.exporters.engine import adapters as engines
from inferwatch.serving import textformat
from inferwatch.serving.textformat import Exposition, parse
from support.shared import shared_path

pytestmark = pytest.mark.unit

ENGINE_CAPTURES = sorted(shared_path("fixtures/engines").glob("*.prom"))
DCGM_CAPTURES = sorted(shared_path("fixtures/gpu/dcgm").glob("*.prom"))
CAPTURES = ENGINE_CAPTURES + DCGM_CAPTURES
VLLM = shared_path("fixtures/engines/vllm-generated-0.33.0-1engine.prom")

Flat = tuple[str, tuple[tuple[str, str], ...], float, float | None]


# ---------------------------------------------------------------------------------------------
# Helpers: flatten samples, NaN-aware comparison, and prometheus_client's view of a page


def flat(exposition: Exposition) -> list[Flat]:
    return [
        (s.name, tuple(s.labels.items()), s.value, s.timestamp)
        for family in exposition.families.values()
        for s in family.samples
    ]


def same_number(a: float | None, b: float | None) -> bool:
    if a is None or b is None:
        return a is b
    if math.isnan(a):
        return math.isnan(b)
    return a == b or math.isclose(a, b, rel_tol=1e-12)


def assert_same_samples(ours: list[Flat], theirs: list[Flat]) -> None:
    assert [(s[0], dict(s[1])) for s in ours] == [(s[0], dict(s[1])) for s in theirs]
    for mine, ref in zip(ours, theirs, strict=True):
        assert same_number(mine[2], ref[2]), (mine, ref)
        assert same_number(mine[3], ref[3]), (mine, ref)


def declared_counters(text: str) -> set[str]:
    return set(re.findall(r"^# TYPE (\S+) counter", text, re.M))


def reference_004(text: str) -> tuple[list[Metric], list[Flat]]:
    """prometheus_client's 0.0.4 parser, with its counter renaming undone: it reports the
    samples of a counter declared without ``_total`` as ``<name>_total``, though the page
    says ``<name>``."""
    metrics = list(text_string_to_metric_families(text))
    as_written = declared_counters(text)
    samples = []
    for metric in metrics:
        for s in metric.samples:
            name = s.name
            if metric.type == "counter" and metric.name in as_written:
                name = metric.name
            ts = None if s.timestamp is None else float(s.timestamp)
            samples.append((name, tuple(s.labels.items()), float(s.value), ts))
    return metrics, samples


def reference_openmetrics(text: str) -> tuple[list[Metric], list[Flat]]:
    metrics = list(om_parser.text_string_to_metric_families(text))
    samples = [
        (
            s.name,
            tuple(s.labels.items()),
            float(s.value),
            None if s.timestamp is None else float(s.timestamp),
        )
        for metric in metrics
        for s in metric.samples
    ]
    return metrics, samples


def family_key_004(metric: Metric, text: str) -> str:
    """The name our parser files a 0.0.4 family under: the one its # TYPE line declares."""
    if metric.type == "counter" and metric.name not in declared_counters(text):
        return metric.name + "_total"
    return metric.name


# ---------------------------------------------------------------------------------------------
# Real captures


@pytest.mark.parametrize("path", CAPTURES, ids=lambda p: p.name)
def test_real_capture_matches_prometheus_client(path: Path) -> None:
    text = path.read_text(encoding="utf-8")
    exposition = parse(text)
    metrics, reference = reference_004(text)

    assert exposition.malformed_lines == 0
    assert exposition.lines == sum(1 for line in text.splitlines() if line)
    assert_same_samples(flat(exposition), reference)
    for metric in metrics:
        family = exposition.families[family_key_004(metric, text)]
        assert (family.type, family.help) == (metric.type, metric.documentation)


def test_vllm_families_are_keyed_as_declared() -> None:
    families = parse(VLLM.read_bytes()).families

    assert families["vllm:prompt_tokens_total"].type == "counter"
    assert families["vllm:prompt_tokens_created"].type == "gauge"
    ttft = families["vllm:time_to_first_token_seconds"]
    assert ttft.type == "histogram"
    assert {s.name for s in ttft.samples} == {
        "vllm:time_to_first_token_seconds_bucket",
        "vllm:time_to_first_token_seconds_sum",
        "vllm:time_to_first_token_seconds_count",
    }
    inf_bucket = [s for s in ttft.samples if s.labels.get("le") == "+Inf"]
    assert inf_bucket[0].labels == {
        "engine": "0",
        "le": "+Inf",
        "model_name": "meta-llama/Llama-3.1-8B-Instruct",
    }
    assert "vllm:time_to_first_token_seconds_bucket" not in families


def test_http_summary_keeps_its_created_gauge_apart() -> None:
    families = parse(VLLM.read_text(encoding="utf-8")).families

    summary = families["http_request_size_bytes"]
    assert summary.type == "summary"
    assert {s.name for s in summary.samples} == {
        "http_request_size_bytes_count",
        "http_request_size_bytes_sum",
    }
    assert families["http_request_size_bytes_created"].type == "gauge"


def test_dcgm_counter_without_total_keeps_its_written_name() -> None:
    capture = shared_path("fixtures/gpu/dcgm/dcgm-l4-kops-gpu-operator.prom")
    families = parse(capture.read_text()).families

    energy = families["DCGM_FI_DEV_TOTAL_ENERGY_CONSUMPTION"]
    assert energy.type == "counter"
    assert [s.name for s in energy.samples] == ["DCGM_FI_DEV_TOTAL_ENERGY_CONSUMPTION"]
    assert energy.samples[0].labels["Hostname"] == "i-030791dc5a37cd257"


def test_returned_labels_are_private_to_each_sample() -> None:
    text = VLLM.read_text(encoding="utf-8")
    first = parse(text)
    first.families["vllm:num_requests_running"].samples[0].labels["engine"] = "changed"

    again = parse(text).families["vllm:num_requests_running"].samples[0]
    assert again.labels["engine"] == "0"


def test_first_and_later_scrapes_agree() -> None:
    text = VLLM.read_text(encoding="utf-8")
    textformat.clear_caches()
    first = flat(parse(text))
    assert_same_samples(flat(parse(text)), first)


# ---------------------------------------------------------------------------------------------
# Format features


OPENMETRICS_PAGE = """\
# HELP req Requests.
# TYPE req counter
req_total{path="/a"} 3.0 # {trace_id="abc"} 1.0 1700000000.5
req_created{path="/a"} 1.7e+09
# HELP lat_seconds Latency.
# TYPE lat_seconds histogram
# UNIT lat_seconds seconds
lat_seconds_bucket{le="0.5"} 1.0
lat_seconds_bucket{le="+Inf"} 2.0 # {trace_id="def"} 0.7
lat_seconds_count 2.0
lat_seconds_sum 1.2
lat_seconds_created 1.7e+09
# TYPE build info
build_info{version="1.2"} 1.0
temp_celsius 21.5 1700000000.25
# EOF
"""


def test_openmetrics_groups_suffixes_and_ignores_exemplars() -> None:
    exposition = parse(OPENMETRICS_PAGE)

    assert exposition.openmetrics
    assert exposition.malformed_lines == 0
    req = exposition.families["req"]
    assert (req.type, req.help) == ("counter", "Requests.")
    assert [(s.name, s.value) for s in req.samples] == [("req_total", 3.0), ("req_created", 1.7e9)]
    latency = exposition.families["lat_seconds"]
    assert (latency.type, latency.unit) == ("histogram", "seconds")
    assert [s.value for s in latency.samples] == [1.0, 2.0, 2.0, 1.2, 1.7e9]
    assert exposition.families["build"].samples[0].labels == {"version": "1.2"}
    untyped = exposition.families["temp_celsius"]
    assert untyped.type == "unknown"
    assert untyped.samples[0].timestamp == 1700000000.25  # OpenMetrics: seconds
    _, reference = reference_openmetrics(OPENMETRICS_PAGE)
    assert_same_samples(flat(exposition), reference)


def test_lines_after_eof_are_counted_not_used() -> None:
    exposition = parse("a 1\n# EOF\nb 2\n", openmetrics=True)

    assert list(exposition.families) == ["a"]
    assert exposition.malformed_lines == 1


def test_text_004_timestamps_are_milliseconds() -> None:
    sample = parse("up 1 1700000000123\n").families["up"].samples[0]

    assert sample.timestamp == pytest.approx(1700000000.123)
    assert not parse("up 1 1700000000123\n").openmetrics


def test_escapes_special_values_and_loose_layout() -> None:
    text = (
        "# HELP esc Help with \\\\ and \\n escapes.\r\n"
        "# TYPE esc gauge\r\n"
        "\r\n"
        'esc{path="C:\\\\dir",quote="say \\"hi\\"",nl="a\\nb",} NaN\r\n'
        'esc{path="x"} +Inf\n'
        '  esc { path = "y" , } -Inf\n'
        "\n"
        "esc\t2\t1000\n"
    )
    exposition = parse(text)
    family = exposition.families["esc"]

    assert exposition.malformed_lines == 0
    assert family.help == "Help with \\ and \n escapes."
    assert family.samples[0].labels == {"path": "C:\\dir", "quote": 'say "hi"', "nl": "a\nb"}
    assert math.isnan(family.samples[0].value)
    assert [s.value for s in family.samples[1:3]] == [math.inf, -math.inf]
    assert family.samples[2].labels == {"path": "y"}
    assert (family.samples[3].value, family.samples[3].timestamp) == (2.0, 1.0)
    _, reference = reference_004(text.replace("\r\n", "\n"))
    assert_same_samples(flat(exposition), reference)


def test_quoted_utf8_names() -> None:
    registry = CollectorRegistry()
    Counter("requests.served", "Served.", ["route.name"], registry=registry).labels("/a").inc()
    text = generate_latest(registry, escaping=om_exposition.ALLOWUTF8).decode()
    assert '{"requests.served_total","route.name"="/a"}' in text

    exposition = parse(text)
    family = exposition.families["requests.served_total"]
    assert family.type == "counter"
    assert family.samples[0].labels == {"route.name": "/a"}
    _, reference = reference_004(text)
    assert_same_samples(flat(exposition), reference)


def test_undeclared_samples_become_untyped_families() -> None:
    families = parse('foo{a="1"} 1\nfoo{a="2"} 2\nfoo_count 3\n').families

    assert [(f.name, f.type, len(f.samples)) for f in families.values()] == [
        ("foo", "untyped", 2),
        ("foo_count", "untyped", 1),
    ]


def test_contradicting_or_unknown_type_lines_are_malformed() -> None:
    exposition = parse("# TYPE a gauge\n# TYPE a counter\n# TYPE b bogus\n# TYPE\na 1\n")

    assert exposition.malformed_lines == 3
    assert exposition.families["a"].type == "gauge"
    assert exposition.families["a"].samples[0].value == 1.0


def test_plain_comments_are_not_malformed() -> None:
    assert parse("# just a note\n#\n# HELPFUL text\nup 1\n").malformed_lines == 0


# ---------------------------------------------------------------------------------------------
# The family filter


@pytest.mark.parametrize(
    "wanted",
    [
        {"vllm:time_to_first_token_seconds", "vllm:num_requests_running", "python_info"},
        lambda name: (
            name in ("vllm:time_to_first_token_seconds", "vllm:num_requests_running", "python_info")
        ),
    ],
    ids=["container", "predicate"],
)
def test_wanted_keeps_only_the_named_families(wanted: textformat.Wanted) -> None:
    text = VLLM.read_text(encoding="utf-8")
    full = parse(text).families

    filtered = parse(text, wanted=wanted).families

    assert list(filtered) == [
        "python_info",
        "vllm:num_requests_running",
        "vllm:time_to_first_token_seconds",
    ]
    for name, family in filtered.items():
        assert family == full[name]


def test_wanted_drops_grouped_samples_of_unwanted_families() -> None:
    text = '# TYPE h histogram\nh_bucket{le="+Inf"} 1\nh_sum 1\nh_count 1\nbroken{ 1\nkeep 2\n'

    exposition = parse(text, wanted={"keep", "broken"})

    assert list(exposition.families) == ["keep"]
    assert exposition.malformed_lines == 1  # lines of wanted or unknown families are checked


# ---------------------------------------------------------------------------------------------
# Property 1: the same samples as prometheus_client on pages prometheus_client renders

# No underscores after the m<index>_ prefix, so no name ends in a suffix such as _total; no
# colons, which prometheus_client's OpenMetrics output rewrites in sample names but not in
# # TYPE lines (the real vLLM captures cover colons).
NAME_PART = st.from_regex(r"[a-zA-Z][a-zA-Z0-9]{0,10}", fullmatch=True)
LABEL_NAME = st.from_regex(r"[a-zA-Z][a-zA-Z0-9_]{0,8}", fullmatch=True).filter(
    lambda name: name not in ("le", "quantile")
)
TRICKY = st.sampled_from(list('\\"\n{},= #\t\r\x85\u2028é漢_'))
LABEL_VALUE = st.text(st.characters(codec="utf-8") | TRICKY, max_size=12)
HELP = st.text(st.characters(codec="utf-8", exclude_characters="\r") | TRICKY, max_size=20).map(
    str.strip
)
AMOUNT = st.floats(min_value=0, max_value=1e12)
ANY_FLOAT = st.floats(allow_nan=True, allow_infinity=True)


@st.composite
def registries(draw: st.DrawFn) -> CollectorRegistry:
    """A registry of instrumented metrics with random names, labels, help and values."""
    registry = CollectorRegistry()
    for index in range(draw(st.integers(1, 5))):
        name = f"m{index}_{draw(NAME_PART)}"
        help_text = draw(HELP)
        labelnames = draw(st.lists(LABEL_NAME, max_size=3, unique=True))
        kind = draw(st.sampled_from(["counter", "gauge", "histogram", "summary", "info", "enum"]))
        children = draw(st.lists(st.tuples(*[LABEL_VALUE] * len(labelnames)), max_size=3))
        if kind == "counter":
            metric: Counter | Gauge | Histogram | Summary = Counter(
                name, help_text, labelnames, registry=registry
            )
        elif kind == "gauge":
            metric = Gauge(name, help_text, labelnames, registry=registry)
        elif kind == "histogram":
            bounds = draw(st.lists(st.floats(1e-3, 1e6), min_size=1, max_size=4, unique=True))
            metric = Histogram(
                name, help_text, labelnames, registry=registry, buckets=sorted(bounds)
            )
        elif kind == "summary":
            metric = Summary(name, help_text, labelnames, registry=registry)
        elif kind == "info":
            info = Info(name, help_text, registry=registry)
            values = draw(st.tuples(*[LABEL_VALUE] * len(labelnames)))
            info.info(dict(zip(labelnames, values, strict=True)))
            continue
        else:
            states = draw(st.lists(LABEL_VALUE, min_size=1, max_size=3, unique=True))
            Enum(name, help_text, states=states, registry=registry).state(
                draw(st.sampled_from(states))
            )
            continue
        for values in children if labelnames else [()]:
            child = metric.labels(*values) if labelnames else metric
            if isinstance(child, Counter):
                child.inc(draw(AMOUNT))
            elif isinstance(child, Gauge):
                child.set(draw(ANY_FLOAT))
            else:
                for _ in range(draw(st.integers(0, 3))):
                    child.observe(draw(AMOUNT))
    registry.register(draw(hand_built_families()))
    return registry


@st.composite
def hand_built_families(draw: st.DrawFn) -> Collector:
    """Families instrumented metrics cannot produce: quantiles and sample timestamps."""
    timestamp = draw(st.none() | st.integers(0, 2_000_000_000_000).map(lambda ms: ms / 1000))
    gauge = Metric("hand_gauge", draw(HELP), "gauge")
    for value in draw(st.lists(LABEL_VALUE, max_size=3, unique=True)):
        gauge.add_sample("hand_gauge", {"k": value}, draw(ANY_FLOAT), timestamp)
    summary = Metric("hand_summary", draw(HELP), "summary")
    for quantile in draw(st.lists(st.sampled_from(["0.5", "0.9", "0.99"]), unique=True)):
        summary.add_sample("hand_summary", {"quantile": quantile}, draw(AMOUNT))
    summary.add_sample("hand_summary_count", {}, draw(st.integers(0, 10**6)))
    summary.add_sample("hand_summary_sum", {}, draw(AMOUNT))

    class HandBuilt(Collector):
        def collect(self) -> Iterable[Metric]:
            return [gauge, summary]

    return HandBuilt()


PROPERTY_SETTINGS = settings(
    max_examples=200, deadline=None, suppress_health_check=[HealthCheck.too_slow]
)


@PROPERTY_SETTINGS
@given(registry=registries(), utf8=st.booleans())
def test_same_samples_as_prometheus_client_text_004(
    registry: CollectorRegistry, utf8: bool
) -> None:
    escaping = om_exposition.ALLOWUTF8 if utf8 else om_exposition.UNDERSCORES
    text = generate_latest(registry, escaping=escaping).decode()
    metrics, reference = reference_004(text)

    exposition = parse(text)

    assert exposition.malformed_lines == 0
    assert not exposition.openmetrics
    assert_same_samples(flat(exposition), reference)
    for metric in metrics:
        family = exposition.families[family_key_004(metric, text)]
        assert (family.type, family.help) == (metric.type, metric.documentation)


@PROPERTY_SETTINGS
@given(registry=registries())
def test_same_samples_as_prometheus_client_openmetrics(registry: CollectorRegistry) -> None:
    text = om_exposition.generate_latest(registry).decode()
    metrics, reference = reference_openmetrics(text)

    exposition = parse(text)

    assert exposition.malformed_lines == 0
    assert exposition.openmetrics
    assert_same_samples(flat(exposition), reference)
    for metric in metrics:
        family = exposition.families[metric.name]
        assert (family.type, family.help, family.unit) == (
            metric.type,
            metric.documentation,
            metric.unit,
        )


# ---------------------------------------------------------------------------------------------
# Property 2: never raises


@settings(max_examples=200, deadline=None)
@given(page=st.binary(max_size=400))
def test_arbitrary_bytes_never_raise(page: bytes) -> None:
    exposition = parse(page)
    assert 0 <= exposition.malformed_lines <= exposition.lines


# Fragments of real syntax, so that generated text reaches the careful parser's corners.
EXPOSITION_PIECES = st.sampled_from(
    [
        *("# TYPE ", "# HELP ", "# UNIT ", "# EOF", "counter", "histogram", "_bucket", "le="),
        *'#{}",=\\ \t\n\r_:aAz09.+-eE',
        "NaN",
    ]
)


@settings(max_examples=200, deadline=None)
@given(
    page=st.lists(EXPOSITION_PIECES | st.text(max_size=4), max_size=60).map("".join),
    om=st.booleans(),
)
def test_arbitrary_text_never_raises(page: str, om: bool) -> None:
    exposition = parse(page, openmetrics=om)
    assert 0 <= exposition.malformed_lines <= exposition.lines


# ---------------------------------------------------------------------------------------------
# Property 3: one corrupt line costs that line only

VLLM_LINES = VLLM.read_text(encoding="utf-8").splitlines()
LABELLED = [i for i, line in enumerate(VLLM_LINES) if not line.startswith("#") and "{" in line]
TYPE_LINES = [i for i, line in enumerate(VLLM_LINES) if line.startswith("# TYPE")]


def _cut_label_set(line: str) -> str:
    return line[: line.index("}") - 1] + line[line.index("}") + 1 :]


def _drop_closing_quote(line: str) -> str:
    end = line.index("}")
    return line[: end - 1] + line[end:]


def _break_name(line: str) -> str:
    return line[:4] + "-" + line[4:]


def _duplicate_label(line: str) -> str:
    brace = line.index("{")
    first_pair = line[brace + 1 : line.index('"', line.index('"', brace) + 1) + 1]
    return line.replace("{", "{" + first_pair + ",", 1)


def _drop_value(line: str) -> str:
    return line.rpartition(" ")[0]


def _garbage_value(line: str) -> str:
    return line.rpartition(" ")[0] + " twelve"


def _underscore_value(line: str) -> str:
    return line.rpartition(" ")[0] + " 1_000"


def _extra_tokens(line: str) -> str:
    return line + " 17 18"


SAMPLE_CORRUPTIONS: list[Callable[[str], str]] = [
    _cut_label_set,
    _drop_closing_quote,
    _break_name,
    _duplicate_label,
    _drop_value,
    _garbage_value,
    _underscore_value,
    _extra_tokens,
]


def _sample_key(sample: Flat) -> tuple[str, tuple[tuple[str, str], ...], float]:
    return sample[0], tuple(sorted(sample[1])), sample[2]


@settings(max_examples=200, deadline=None)
@given(index=st.sampled_from(LABELLED), corrupt=st.sampled_from(SAMPLE_CORRUPTIONS))
def test_one_corrupt_sample_line_costs_only_that_sample(
    index: int, corrupt: Callable[[str], str]
) -> None:
    intact = VLLM_LINES[index]
    lines = list(VLLM_LINES)
    lines[index] = corrupt(intact)

    exposition = parse("\n".join(lines).encode())

    assert exposition.malformed_lines == 1
    expected = sorted(map(_sample_key, flat(parse("\n".join(VLLM_LINES)))))
    expected.remove(_sample_key(flat(parse(intact))[0]))
    assert sorted(map(_sample_key, flat(exposition))) == expected


@settings(max_examples=50, deadline=None)
@given(index=st.sampled_from(TYPE_LINES))
def test_one_corrupt_type_line_keeps_every_sample(index: int) -> None:
    lines = list(VLLM_LINES)
    lines[index] = lines[index].rpartition(" ")[0] + " histogrammm"

    exposition = parse("\n".join(lines))

    assert exposition.malformed_lines == 1
    expected = sorted(map(_sample_key, flat(parse("\n".join(VLLM_LINES)))))
    assert sorted(map(_sample_key, flat(exposition))) == expected


def test_invalid_utf8_costs_only_its_line() -> None:
    page = VLLM.read_bytes().replace(b"vllm:num_requests_running{", b"vllm:num_\xffrunning{", 1)

    exposition = parse(page)

    assert exposition.malformed_lines == 1
    assert "vllm:num_requests_running" in exposition.families
    assert exposition.families["vllm:num_requests_running"].samples == []
    assert len(flat(exposition)) == len(flat(parse(VLLM.read_bytes()))) - 1


# ---------------------------------------------------------------------------------------------
# Property 4: the family filter only leaves families out


def assert_filtered_view(text: str, wanted: Callable[[str], bool]) -> None:
    """parse(wanted=...) is the unfiltered parse restricted to the wanted families, and it
    finds no more malformed lines (those of unwanted families are not checked)."""
    full = parse(text)
    filtered = parse(text, wanted=wanted)

    expected = {name: family for name, family in full.families.items() if wanted(name)}
    assert list(filtered.families) == list(expected)
    for name, family in filtered.families.items():
        ref = expected[name]
        assert (family.type, family.help, family.unit) == (ref.type, ref.help, ref.unit)
        assert_same_samples(flat(Exposition({name: family})), flat(Exposition({name: ref})))
    assert filtered.lines == full.lines
    assert filtered.openmetrics == full.openmetrics
    assert filtered.malformed_lines <= full.malformed_lines


@pytest.mark.parametrize("engine", engines.ENGINES)
@pytest.mark.parametrize(
    "path", ENGINE_CAPTURES, ids=lambda p: p.name
)
def test_engine_filter_on_every_capture(path: Path, engine: str) -> None:
    assert_filtered_view(path.read_text(encoding="utf-8"), engines.wanted(engine))


@PROPERTY_SETTINGS
@given(registry=registries(), openmetrics_page=st.booleans(), data=st.data())
def test_filter_on_rendered_pages(
    registry: CollectorRegistry, openmetrics_page: bool, data: st.DataObject
) -> None:
    render = om_exposition.generate_latest if openmetrics_page else generate_latest
    text = render(registry).decode()
    names = sorted(parse(text).families)
    kept = data.draw(st.sets(st.sampled_from(names)) if names else st.just(set()))
    assert_filtered_view(text, kept.__contains__)


# Lines over a few related names, so that declarations, grouping suffixes, undeclared samples,
# repeated or contradicting TYPE lines and # EOF meet in every order.
SOUP_NAMES = ["a", "a_total", "a_created", "a_bucket", "a_sum", "b", "b_count"]
SOUP_LINES = st.one_of(
    st.builds(
        "# {} {} {}".format,
        st.sampled_from(["HELP", "TYPE", "UNIT"]),
        st.sampled_from(SOUP_NAMES),
        st.sampled_from(["counter", "gauge", "histogram", "summary", "info", "x \\n y"]),
    ),
    st.builds(
        "{}{} {}".format,
        st.sampled_from([*SOUP_NAMES, "a_total_total", "a_info"]),
        st.sampled_from(["", '{l="1"}', '{le="+Inf"}', "{", '{l="1"', " x"]),
        st.sampled_from(["1", "2.5", "NaN", "x", "1 17"]),
    ),
    st.sampled_from(["", "# note", "# EOF", "#", "  "]),
)


@settings(max_examples=300, deadline=None)
@given(
    lines=st.lists(SOUP_LINES, max_size=25),
    kept=st.sets(st.sampled_from(SOUP_NAMES)),
    crlf=st.booleans(),
    om=st.none() | st.booleans(),
)
def test_filter_on_line_soup(lines: list[str], kept: set[str], crlf: bool, om: bool | None) -> None:
    text = ("\r\n" if crlf else "\n").join(lines)
    full = parse(text, openmetrics=om)
    filtered = parse(text, wanted=kept, openmetrics=om)

    assert list(filtered.families) == [name for name in full.families if name in kept]
    for name, family in filtered.families.items():
        ref = full.families[name]
        assert (family.type, family.help, family.unit) == (ref.type, ref.help, ref.unit)
        assert_same_samples(flat(Exposition({name: family})), flat(Exposition({name: ref})))
    assert filtered.malformed_lines <= full.malformed_lines
    assert filtered.lines == full.lines


def test_lines_of_a_dropped_family_are_not_checked() -> None:
    text = '# TYPE h histogram\nh_bucket{le="1"} 1\nh_bucket{le="2" 2\nh_sum x\nkeep 1\n'

    assert parse(text).malformed_lines == 2
    filtered = parse(text, wanted={"keep"})
    assert filtered.malformed_lines == 0
    assert [s.value for s in filtered.families["keep"].samples] == [1.0]


def test_a_later_declaration_can_claim_a_dropped_name() -> None:
    # a_sum goes nowhere while it groups under the unwanted a, then belongs to its own family.
    text = "# TYPE a summary\na_sum 1\na_sum 2\n# HELP a_sum Own.\na_sum 3\na_sum 4\n"

    family = parse(text, wanted={"a_sum"}).families["a_sum"]

    assert [s.value for s in family.samples] == [3.0, 4.0]
