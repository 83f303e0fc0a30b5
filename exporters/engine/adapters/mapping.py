"""Reading catalogue signals off a parsed engine page: the mechanics every adapter shares.

A page is indexed once per scrape by *folded* family name (``:`` read as ``_``, a trailing
``_total`` dropped), so ``vllm:prompt_tokens_total``, ``vllm_prompt_tokens_total`` and a
TGI-style ``tgi_request_success`` without ``_total`` are all found under the spelling the
catalogue writes. Only the families an alias names are ever visited sample by sample.

Each source sample is mapped to the output label values it determines (the engine's model
label, the entry's own labels). Samples that map to the same values are combined, which is
how vLLM's data-parallel ``engine`` ranks and SGLang's rank labels are aggregated away:
counters, gauges and histogram buckets are summed, ``aggregate: max`` entries take the
largest value. Histograms keep the source's bucket boundaries, scaled to base units.

An entry's aliases are tried in catalogue order and the first one with data on the page
wins, so a release that still shows a deprecated name next to its replacement is not
counted twice. Signals an engine only yields through arithmetic are declared per engine as
a ``Derivation`` and computed here with the same readers.
"""

from __future__ import annotations

import math
import sys
from collections.abc import Callable, Collection, Iterable, Mapping
from dataclasses import dataclass, field
from typing import Protocol, cast

from prometheus_client.core import Metric

from inferwatch.catalog import Alias, Catalog, MetricSpec
from inferwatch.exporters.engine.adapters.adapter import (
    Adapter,
    Derivation,
    Host,
    LabelValue,
    Total,
)
from inferwatch.serving.fastpath import OutputSample, add_histogram, format_boundary, remember
from inferwatch.serving.textformat import Exposition, Family, PageSample

#: output label values a sample determines; None where the sample lacks the source label
Key = tuple[str | None, ...]

_UNTYPED = frozenset({"unknown", "untyped", ""})
_WITH_CREATED = frozenset({"counter", "histogram", "summary"})
_STRAY_SUFFIXES = ("_bucket", "_count", "_sum", "_created", "_total")


def fold(name: str) -> str:
    """The spelling under which aliases and page families meet."""
    try:
        return _FOLDED[name]
    except KeyError:
        pass
    folded = name.replace(":", "_")
    if folded.endswith("_total"):
        folded = folded[:-6]
    return remember(_FOLDED, name, folded, FOLDED_LIMIT)


_FOLDED: dict[str, str] = {}
#: names recur every scrape; a hostile page must not grow memory
FOLDED_LIMIT = 100_000


# --------------------------------------------------------------------------------------------
# The page index
# --------------------------------------------------------------------------------------------


class Page:
    """An exposition's families by folded name, built once per scrape.

    Series a parser filed as untyped families of their own although their stem has a typed
    family (prometheus_client's OpenMetrics writer declares ``# TYPE vllm:x counter`` but
    writes ``vllm_x_total``) are put back under that family; untyped ``_bucket`` series of
    a page without ``# TYPE`` lines become a histogram of their stem. The exposition's own
    families are never changed: a family that takes in strays is replaced by a new one.
    """

    __slots__ = ("entries",)

    def __init__(self, exposition: Exposition):
        entries: dict[str, Family] = {}
        strays = []
        for name, family in exposition.families.items():
            if family.type in _UNTYPED:
                strays.append(family)
            else:
                entries[fold(name)] = family
        if strays:
            strays.sort(key=lambda family: not family.name.endswith("_bucket"))
            for family in strays:
                stem = _stem(family.name) or ""
                home = entries.get(stem) if stem else None
                if home is not None and home.type in _UNTYPED:
                    home = None  # an untyped `x_created` next to an untyped `x_total`
                if home is None and stem and family.name.endswith("_bucket"):
                    home = Family(stem, "histogram")
                if home is None:
                    entries[fold(family.name)] = family
                else:
                    samples = home.samples + family.samples
                    entries[stem] = Family(stem, home.type, samples=samples)
        self.entries = entries

    def find(self, how: Reading) -> tuple[Family, str] | None:
        """The entry a reading names, and the series suffix it selects ('' for all).

        An alias ending in ``_sum`` or ``_count`` that names no family of its own reads that
        series of the histogram or summary it belongs to.
        """
        entry = self.entries.get(how.name)
        if entry is not None:
            return entry, ""
        if how.part:
            entry = self.entries.get(how.name[: -len(how.part)])
            if entry is not None and entry.type in ("histogram", "summary"):
                return entry, how.part
        return None


def _stem(name: str) -> str | None:
    """The folded family name a series name belongs to, if it has a series suffix."""
    name = name.replace(":", "_")
    for suffix in _STRAY_SUFFIXES:
        if name.endswith(suffix):
            return fold(name[: -len(suffix)])
    return None


# --------------------------------------------------------------------------------------------
# Readers
# --------------------------------------------------------------------------------------------


@dataclass(frozen=True)
class Reading:
    """One alias of one entry on one engine, prepared once per engine.

    ``name`` is the alias folded; ``part`` is ``_sum``/``_count`` when the alias may name
    that series of a histogram. ``targets`` are the output labels that vary per sample, and
    ``key`` reads their values off a sample's labels (the source labels behind them), None
    where the sample lacks one.
    """

    alias: Alias
    name: str
    part: str
    targets: tuple[str, ...]
    match: tuple[tuple[str, str], ...]
    key: Callable[[Mapping[str, str]], Key] = field(compare=False, repr=False)
    value_label: str | None = None


def reading(
    spec: MetricSpec,
    alias: Alias,
    identity_sources: Mapping[str, str],
    value_label: str | None = None,
) -> Reading:
    """How to read ``alias`` for ``spec`` on an engine whose identity labels come from
    ``identity_sources`` (our label -> the engine's, e.g. model -> model_name)."""
    sources: list[str] = []
    targets: list[str] = []
    for label in spec.label_names:
        if label in spec.labels:
            sources.append(alias.labels.get(label, label))
        elif label in identity_sources:
            sources.append(identity_sources[label])
        else:
            continue
        targets.append(label)
    name = fold(alias.metric)
    part = next((p for p in ("_sum", "_count") if name.endswith(p)), "")
    return Reading(
        alias,
        name,
        part,
        tuple(targets),
        tuple(alias.match.items()),
        _key_reader(tuple(sources)),
        value_label,
    )


def _key_reader(sources: tuple[str, ...]) -> Callable[[Mapping[str, str]], Key]:
    """``labels -> tuple(map(labels.get, sources))``, spelled out for the short source lists
    aliases have: it runs for every sample read, and the generic form is several times slower."""
    if not sources:
        return lambda labels: ()
    if len(sources) == 1:
        (only,) = sources
        return lambda labels: (labels.get(only),)
    if len(sources) == 2:
        first, second = sources
        return lambda labels: (labels.get(first), labels.get(second))
    return lambda labels: tuple(map(labels.get, sources))


def read_values(
    page: Page, how: Reading, aggregate: str, replica_labels: frozenset[str] = frozenset()
) -> dict[Key, float]:
    """Counter or gauge values by output key, in base units; empty when nothing matches.

    Series that differ only in ``replica_labels`` report the same work (every tensor-parallel
    rank of an SGLang scheduler sees the same batch): they collapse by max first.
    """
    found = page.find(how)
    if found is None:
        return {}
    entry, part = found
    if not part and entry.type in ("histogram", "summary"):
        return {}
    skip_created = not part and entry.type in _WITH_CREATED
    match = how.match
    key_of = how.key
    scale = how.alias.scale
    value_label = how.value_label
    take_max = aggregate == "max"
    values: dict[Key, float] = {}
    replicas: dict[tuple[Key, tuple[tuple[str, str], ...]], float] = {}
    for name, labels, value, _ in entry.samples:
        if part:
            if not name.endswith(part):
                continue
        elif skip_created and name.endswith("_created"):
            continue
        if match and any(labels.get(k) != v for k, v in match):
            continue
        if value_label is not None:
            label_value = _number(labels.get(value_label))
            if label_value is None:
                continue
            value = label_value
        if scale != 1.0:
            value = to_base_unit(value, scale)
        key = key_of(labels)
        if replica_labels and not replica_labels.isdisjoint(labels):
            work = (key, tuple(sorted(i for i in labels.items() if i[0] not in replica_labels)))
            seen = replicas.get(work)
            if seen is None or value > seen:
                replicas[work] = value
            continue
        _combine(values, key, value, take_max)
    for (key, _), value in replicas.items():
        _combine(values, key, value, take_max)
    return values


def _combine(values: dict[Key, float], key: Key, value: float, take_max: bool) -> None:
    seen = values.get(key)
    if seen is None:
        values[key] = value
    elif take_max:
        if value > seen:
            values[key] = value
    else:
        values[key] = seen + value


@dataclass(slots=True)
class _Histogram:
    """One output series being merged from one or more source series."""

    buckets: dict[str, float] = field(default_factory=dict)
    sum: float | None = None
    count: float = 0.0
    series: int = 0  # source series merged in (their _count samples)
    bucket_samples: int = 0
    common: frozenset[str] | None = None  # set only when the series' boundaries differ


def read_histograms(page: Page, how: Reading) -> dict[Key, _Histogram]:
    """Histogram series by output key, bucket counts summed over the labels the key drops."""
    found = page.find(how)
    if found is None or found[1] or found[0].type != "histogram":
        return {}
    family = found[0]
    samples = family.samples
    # The parser interns sample names, so a bucket is nearly always this very string.
    bucket = sys.intern(family.name + "_bucket")
    match = how.match
    key_of = how.key
    groups: dict[Key, _Histogram] = {}
    group, group_key, buckets = None, None, {}
    for name, labels, value, _ in samples:
        if match and any(labels.get(k) != v for k, v in match):
            continue
        key = key_of(labels)
        if group is None or key != group_key:  # a series is listed together: one lookup
            group, group_key = groups.get(key), key
            if group is None:
                group = groups[key] = _Histogram()
            buckets = group.buckets
        if name is bucket or name.endswith("_bucket"):
            le = labels.get("le")
            if le is not None:
                buckets[le] = buckets.get(le, 0.0) + value
                group.bucket_samples += 1
        elif name.endswith("_count"):
            group.count += value
            group.series += 1
        elif name.endswith("_sum"):
            group.sum = value if group.sum is None else group.sum + value
    for key, group in groups.items():
        if group.series > 1 and len(group.buckets) * group.series != group.bucket_samples:
            group.common = _common_boundaries(samples, how, key)
    return groups


def _common_boundaries(samples: list[PageSample], how: Reading, key: Key) -> frozenset[str]:
    """Boundaries every source series of ``key`` has (ranks with differing buckets)."""
    per_series: dict[tuple[tuple[str, str], ...], set[str]] = {}
    for sample in samples:
        labels = sample.labels
        if not sample.name.endswith("_bucket") or "le" not in labels:
            continue
        if any(labels.get(k) != v for k, v in how.match):
            continue
        if how.key(labels) != key:
            continue
        series = tuple(sorted(item for item in labels.items() if item[0] != "le"))
        per_series.setdefault(series, set()).add(labels["le"])
    return frozenset(set.intersection(*per_series.values())) if per_series else frozenset()


def histogram_buckets(
    group: _Histogram, scale: float = 1.0
) -> tuple[tuple[str, ...], list[float]] | None:
    """The output ``le`` values in base units, ascending and ending with ``+Inf``, and the
    cumulative count of each.

    Only boundaries that every merged series has are kept: ranks configured with different
    buckets cannot be merged exactly otherwise. None when the series cannot form a valid
    histogram (no ``_sum``, or neither a ``+Inf`` bucket nor a ``_count``).
    """
    if group.sum is None:
        return None
    buckets = group.buckets
    if group.common is not None:
        buckets = {le: n for le, n in buckets.items() if le in group.common}
    layout = _layout(tuple(buckets), scale)
    counts = list(buckets.values())
    if layout.order is None:
        return layout.les, counts
    if layout.infinite is not None:
        infinite = counts[layout.infinite]
    elif group.series:
        infinite = group.count
    else:
        return None
    return layout.les, [*map(counts.__getitem__, layout.order), infinite]


@dataclass(frozen=True, slots=True)
class _Layout:
    """Where the boundaries of a series, in the order the page lists them, go in the output."""

    les: tuple[str, ...]  # output ``le`` values in base units, ascending, ending with +Inf
    #: the listed position of each finite one; None when the list is already in output order,
    #: +Inf last and nothing left out (the usual case: no reordering needed)
    order: tuple[int, ...] | None
    infinite: int | None  # the listed position of +Inf, if listed


_LAYOUTS: dict[tuple[tuple[str, ...], float], _Layout] = {}
_LAYOUTS_LIMIT = 10_000


def _layout(boundaries: tuple[str, ...], scale: float) -> _Layout:
    """How ``boundaries`` (``le`` values as listed) become output buckets; values that are
    not numbers are left out. Cached: a page repeats the same few lists every scrape, so
    parsing, scaling and formatting each boundary and sorting them is done once."""
    layout = _LAYOUTS.get((boundaries, scale))
    if layout is not None:
        return layout
    finite: list[tuple[float, str, int]] = []
    infinite = None
    for position, le in enumerate(boundaries):
        number = _number(le)
        if number is None:
            continue
        number = to_base_unit(number, scale)
        if number == math.inf:
            infinite = position
        else:
            finite.append((number, format_boundary(number), position))
    finite.sort()
    les = (*(text for _, text, _ in finite), "+Inf")
    order: tuple[int, ...] | None = tuple(position for _, _, position in finite)
    if order == tuple(range(len(boundaries) - 1)) and infinite == len(boundaries) - 1:
        order = None
    layout = _Layout(les, order, infinite)
    return remember(_LAYOUTS, (boundaries, scale), layout, _LAYOUTS_LIMIT)


def _number(text: str | None) -> float | None:
    if text is None:
        return None
    try:
        value = float(text)
    except ValueError:
        return None
    return None if math.isnan(value) else value


def to_base_unit(value: float, scale: float) -> float:
    """``value * scale``, dividing where the scale is 1/n so that 300 ms is exactly 0.3 s."""
    if scale == 1.0:
        return value
    if scale < 1.0:
        inverse = round(1.0 / scale)
        if inverse * scale == 1.0:
            return value / inverse
    return value * scale


# --------------------------------------------------------------------------------------------
# Plans: what to read for each catalogue entry on one engine, built once per engine
# --------------------------------------------------------------------------------------------


class Step(Protocol):
    @property
    def spec(self) -> MetricSpec:
        """The catalogue entry the step fills."""
        ...

    @property
    def readings(self) -> tuple[Reading, ...]:
        """Every alias the step may read."""
        ...

    def emit(self, page: Page, output: Output) -> Metric | None:
        """The filled family, or None when the page has no data for it."""
        ...


class Output:
    """What one page's families are built from.

    Empty families are copied from ones the plan built once: ``MetricSpec.new_family``
    validates the name on every call, which costs more than filling a one-sample family.
    Label sets start from the caller's identity (missing labels ""), then the entry's own
    labels; every engine entry has the same identity labels, so their values are looked up
    once per page.
    """

    __slots__ = ("_bases", "_empty", "_identity")

    def __init__(self, identity: Mapping[str, str], empty: Mapping[str, Metric]):
        self._identity = identity
        self._empty = empty
        self._bases: dict[tuple[str, ...], dict[str, str]] = {}

    def family(self, spec: MetricSpec) -> Metric:
        """A new empty family for the entry, as ``spec.new_family()`` makes it."""
        empty = self._empty[spec.key]
        family = object.__new__(type(empty))
        family.__dict__.update(empty.__dict__)
        family.samples = []
        return family

    def base(self, spec: MetricSpec) -> dict[str, str]:
        """The entry's label set before any sample fills it in; callers copy it."""
        base = self._bases.get(spec.identity)
        if base is None:
            base = self._bases[spec.identity] = {
                label: self._identity.get(label, "") for label in spec.identity
            }
        return {**base, **dict.fromkeys(spec.labels, "")} if spec.labels else base


def _series_labels(base: dict[str, str], how: Reading, key: Key) -> dict[str, str]:
    """The label set of the output series ``key`` (a new dict)."""
    labels = base.copy()
    if None in key:  # a label the sample lacks keeps the identity's value
        pairs = zip(how.targets, key, strict=True)
        labels.update((label, value) for label, value in pairs if value is not None)
    else:
        labels.update(zip(how.targets, cast("tuple[str, ...]", key), strict=True))
    return labels


def _ordered(keys: Collection[Key]) -> Iterable[Key]:
    """Output keys in label-value order (None as ""), the order the series are written in."""
    return sorted(keys, key=_sort_key) if len(keys) > 1 else keys


def _sort_key(key: Key) -> tuple[str, ...]:
    return tuple("" if value is None else value for value in key)


def _scalar_family(
    spec: MetricSpec, output: Output, how: Reading, values: Mapping[Key, float]
) -> Metric:
    """The counter or gauge family of ``values``; its samples are built directly, as the
    family's ``add_metric`` would (a counter's sample is named ``<name>_total``)."""
    family = output.family(spec)
    name = family.name + "_total" if family.type == "counter" else family.name
    base = output.base(spec)
    family.samples = [
        OutputSample(name, _series_labels(base, how, key), values[key]) for key in _ordered(values)
    ]
    return family


@dataclass(frozen=True)
class AliasStep:
    """An entry read through its catalogue aliases, first alias with data wins."""

    spec: MetricSpec
    readings: tuple[Reading, ...]
    replica_labels: frozenset[str] = frozenset()

    def emit(self, page: Page, output: Output) -> Metric | None:
        if self.spec.type == "histogram":
            return self._histogram(page, output)
        for how in self.readings:
            values = read_values(page, how, self.spec.aggregate, self.replica_labels)
            if values:
                return _scalar_family(self.spec, output, how, values)
        return None

    def _histogram(self, page: Page, output: Output) -> Metric | None:
        for how in self.readings:
            groups = read_histograms(page, how)
            if not groups:
                continue
            family = output.family(self.spec)
            base = output.base(self.spec)
            scale = how.alias.scale
            for key in _ordered(groups):
                group = groups[key]
                buckets = histogram_buckets(group, scale)
                if buckets is not None and group.sum is not None:
                    labels = _series_labels(base, how, key)
                    add_histogram(family, labels, *buckets, to_base_unit(group.sum, scale))
            if family.samples:
                return family
        return None


@dataclass(frozen=True)
class TotalStep:
    spec: MetricSpec
    required: tuple[Reading, ...]
    optional: tuple[Reading, ...]
    replica_labels: frozenset[str] = frozenset()

    @property
    def readings(self) -> tuple[Reading, ...]:
        return self.required + self.optional

    def emit(self, page: Page, output: Output) -> Metric | None:
        aggregate = self.spec.aggregate
        values = read_values(page, self.required[0], aggregate, self.replica_labels)
        for how in self.required[1:]:
            more = read_values(page, how, aggregate, self.replica_labels)
            values = {key: value + more[key] for key, value in values.items() if key in more}
        for how in self.optional:
            more = read_values(page, how, aggregate, self.replica_labels)
            values = {key: value + more.get(key, 0.0) for key, value in values.items()}
        if not values:
            return None
        return _scalar_family(self.spec, output, self.required[0], values)


@dataclass(frozen=True)
class SumCountStep:
    spec: MetricSpec
    sums: tuple[Reading, ...]
    count: Reading

    @property
    def readings(self) -> tuple[Reading, ...]:
        return (*self.sums, self.count)

    def emit(self, page: Page, output: Output) -> Metric | None:
        counts = read_values(page, self.count, "sum")
        totals = dict.fromkeys(counts, 0.0)
        for how in self.sums:
            part = read_values(page, how, "sum")
            totals = {key: total + part[key] for key, total in totals.items() if key in part}
        if not totals:
            return None
        family = output.family(self.spec)
        base = output.base(self.spec)
        for key in _ordered(totals):
            labels = _series_labels(base, self.count, key)
            add_histogram(family, labels, ("+Inf",), (counts[key],), totals[key])
        return family


@dataclass(frozen=True)
class FirstStep:
    """Alternative derivations of one entry: the first that yields data wins."""

    steps: tuple[Step, ...]

    @property
    def spec(self) -> MetricSpec:
        return self.steps[0].spec

    @property
    def readings(self) -> tuple[Reading, ...]:
        return tuple(how for step in self.steps for how in step.readings)

    def emit(self, page: Page, output: Output) -> Metric | None:
        for step in self.steps:
            family = step.emit(page, output)
            if family is not None:
                return family
        return None


@dataclass(frozen=True)
class Plan:
    """Everything needed to map one engine's pages, built once per engine."""

    steps: tuple[Step, ...]
    served_model: tuple[str, str] | None  # (folded family, model label)
    empty_families: Mapping[str, Metric]  # by catalogue key, copied for each page

    def run(self, exposition: Exposition, identity: Mapping[str, str]) -> list[Metric]:
        """Catalogue families for the page, in catalogue order; signals it lacks are absent."""
        page = Page(exposition)
        model = self._served_model(page)
        if model is not None:
            identity = {**identity, "model": model}
        output = Output(identity, self.empty_families)
        families = []
        for step in self.steps:
            family = step.emit(page, output)
            if family is not None:
                families.append(family)
        return families

    def _served_model(self, page: Page) -> str | None:
        if self.served_model is None:
            return None
        family, label = self.served_model
        entry = page.entries.get(family)
        models = {s.labels.get(label) for s in entry.samples} if entry else set()
        models.discard(None)
        return models.pop() if len(models) == 1 else None

    def family_filter(self) -> Callable[[str], bool]:
        """A ``wanted`` predicate for the parser: True for family names the plan may read."""
        names = set()
        for step in self.steps:
            for how in step.readings:
                names.add(how.name[: -len(how.part)] if how.part else how.name)
                names.add(how.name)
        if self.served_model is not None:
            names.add(self.served_model[0])
        folded = frozenset(names)
        answers: dict[str, bool] = {}  # the same names come back on every scrape

        def wanted(name: str) -> bool:
            answer = answers.get(name)
            if answer is None:
                answer = fold(name) in folded or (
                    not name.endswith("_created") and _stem(name) in folded
                )
                if len(answers) < 100_000:
                    answers[name] = answer
            return answer

        return wanted


def _derived_step(
    spec: MetricSpec,
    derivation: Derivation,
    ids: Mapping[str, str],
    replicas: frozenset[str],
) -> Step:
    if isinstance(derivation, LabelValue):
        how = reading(spec, Alias(derivation.metric), ids, value_label=derivation.label)
        return AliasStep(spec, (how,), replicas)
    if isinstance(derivation, Total):
        return TotalStep(
            spec,
            tuple(reading(spec, alias, ids) for alias in derivation.required),
            tuple(reading(spec, alias, ids) for alias in derivation.optional),
            replicas,
        )
    sums = tuple(reading(spec, alias, ids) for alias in derivation.sum)
    return SumCountStep(spec, sums, reading(spec, derivation.count, ids))


def plan(catalog: Catalog, adapter: Adapter, host: Host | None = None) -> Plan:
    """What to read for every catalogue engine signal on this engine's pages, served by the
    engine itself or, with ``host``, by the server it runs inside (whose labels carry the
    identity)."""
    unknown = sorted(set(adapter.derived) - set(catalog))
    if unknown:
        raise KeyError(f"{adapter.name}: derived signals {unknown} are not in the catalogue")
    steps: list[Step] = []
    ids = adapter.identity_labels if host is None else host.identity_labels
    replicas = adapter.replica_labels
    for spec in catalog.by_collector("engine"):
        aliases = spec.sources.get(adapter.name, ())
        derivation = adapter.derived.get(spec.key)
        if aliases and derivation is not None:
            raise ValueError(
                f"{spec.key}: {adapter.name} has both catalogue aliases and a derivation"
            )
        if aliases:
            readings = tuple(reading(spec, alias, ids) for alias in aliases)
            steps.append(AliasStep(spec, readings, replicas))
        elif derivation is not None:
            tried = derivation if isinstance(derivation, tuple) else (derivation,)
            alternatives = tuple(_derived_step(spec, d, ids, replicas) for d in tried)
            steps.append(alternatives[0] if len(alternatives) == 1 else FirstStep(alternatives))
    served_model = None
    if adapter.served_model_family is not None and "model" in ids:
        served_model = (fold(adapter.served_model_family), ids["model"])
    empty_families = {step.spec.key: step.spec.new_family() for step in steps}
    return Plan(tuple(steps), served_model, empty_families)
