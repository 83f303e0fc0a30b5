"""The metric catalogue: the single list of every metric inferwatch exposes.

Collectors never spell a metric name or help text. They ask the catalogue for a typed,
empty family (``CATALOG.family(key)``) and fill it. Engine adapters read each entry's
``sources`` to learn how every engine, and every version of it, spells the same signal.
Dashboards, alert rules and the metric table in docs/metrics.md are derived from the same file.
"""

from __future__ import annotations

import functools
import re
from collections.abc import Iterator, Mapping, Sequence
from dataclasses import dataclass, field
from importlib import resources
from typing import Any, Literal

from prometheus_client.core import (
    CounterMetricFamily,
    GaugeMetricFamily,
    HistogramMetricFamily,
    Metric,
)

from inferwatch import config as layer

__all__ = [
    "KEY_PATTERN",
    "NAME_PATTERN",
    "UNITS",
    "Aggregation",
    "Alias",
    "Cadence",
    "Catalog",
    "CatalogError",
    "Conversion",
    "MetricSpec",
    "MetricType",
    "load",
    "parse",
]

MetricType = Literal["counter", "gauge", "histogram"]
Aggregation = Literal["sum", "max"]
Conversion = Literal["value", "flag", "count", "enabled", "field_value"]
Cadence = Literal["once", "scrape", "slow"]
_CONVERSIONS = ("value", "flag", "count", "enabled", "field_value")
_CADENCES = ("once", "scrape", "slow")

NAME_PATTERN = re.compile(r"^inferwatch_[a-z0-9_]+$")
KEY_PATTERN = re.compile(r"^[a-z][a-z0-9_]*$")
# Units are base units (Prometheus naming guide) or the countable things LLM serving deals in.
UNITS = frozenset(
    {"", "seconds", "bytes", "ratio", "joules", "watts", "celsius", "hertz", "tokens", "blocks"}
)


class CatalogError(layer.ConfigError):
    """The catalogue file breaks one of its own rules; the message names the entry and field."""


@dataclass(frozen=True)
class Alias:
    """One way a source spells a catalogue signal.

    ``metric`` is the source's family name as written in its documentation; the ``:``/``_``
    and ``_total`` variants are matched by the engine adapters, not listed here. ``match``
    selects samples by label value, ``scale`` converts to base units (0.001 for ms), and
    ``labels`` maps our label names to the source's (``reason: finished_reason``). ``set``
    gives the fixed label values the source series stands for (``DCGM_FI_DEV_SM_CLOCK`` is
    ``clock: sm``).

    For NVML, ``metric`` is the pynvml call and the rest says how to make it and read its
    answer: ``args`` (pynvml constant names or numbers), ``part`` (the attribute, or the
    index, of the result to read; empty for the result itself), ``convert`` (``value``,
    ``flag`` for 1 when true, ``count`` for a list's length, ``enabled`` for 1 when it equals
    ``NVML_FEATURE_ENABLED``, ``field_value`` for an ``nvmlDeviceGetFieldValues`` answer),
    ``omit`` (an answer meaning "unknown", left out) and ``cadence`` (``once`` at discovery,
    ``scrape``, or ``slow`` for calls too costly for every scrape).
    """

    metric: str
    match: Mapping[str, str] = field(default_factory=dict)
    scale: float = 1.0
    labels: Mapping[str, str] = field(default_factory=dict)
    set: Mapping[str, str] = field(default_factory=dict)
    args: tuple[Any, ...] = ()
    part: str = ""
    convert: Conversion = "value"
    omit: float | None = None
    cadence: Cadence = "scrape"


@dataclass(frozen=True)
class MetricSpec:
    """A catalogue entry."""

    key: str
    name: str
    type: MetricType
    unit: str
    help: str
    collector: str
    identity: tuple[str, ...]
    labels: tuple[str, ...]
    sources: Mapping[str, tuple[Alias, ...]]
    aggregate: Aggregation
    semconv: str | None

    @property
    def label_names(self) -> tuple[str, ...]:
        """Identity labels first, then the signal's own labels, in catalogue order."""
        return self.identity + self.labels

    def new_family(self) -> Metric:
        """An empty prometheus_client family with this entry's name, help, type and labels."""
        labels = list(self.label_names)
        if self.type == "counter":
            return CounterMetricFamily(self.name, self.help, labels=labels)
        if self.type == "histogram":
            return HistogramMetricFamily(self.name, self.help, labels=labels)
        return GaugeMetricFamily(self.name, self.help, labels=labels)


class Catalog(Mapping[str, MetricSpec]):
    """Catalogue entries by key, in file order."""

    def __init__(self, specs: Sequence[MetricSpec], identities: Mapping[str, tuple[str, ...]]):
        self._specs = {spec.key: spec for spec in specs}
        self.identities = dict(identities)

    def __getitem__(self, key: str) -> MetricSpec:
        try:
            return self._specs[key]
        except KeyError:
            raise KeyError(f"{key!r} is not in the metric catalogue") from None

    def __iter__(self) -> Iterator[str]:
        return iter(self._specs)

    def __len__(self) -> int:
        return len(self._specs)

    def family(self, key: str) -> Any:
        """A fresh, empty family for ``key``.

        It is the prometheus_client ``CounterMetricFamily``, ``GaugeMetricFamily`` or
        ``HistogramMetricFamily`` the entry's type calls for; typed ``Any`` because their
        ``add_metric`` signatures differ and the caller knows which one it asked for.
        """
        return self[key].new_family()

    def by_collector(self, collector: str) -> list[MetricSpec]:
        return [spec for spec in self._specs.values() if spec.collector == collector]

    def with_source(self, source: str) -> list[MetricSpec]:
        """Entries that the given source (an engine name, ``dcgm``, ``nvml``) can feed."""
        return [spec for spec in self._specs.values() if source in spec.sources]

    def by_name(self, name: str) -> MetricSpec | None:
        for spec in self._specs.values():
            if spec.name == name:
                return spec
        return None


def _fail(where: str, reason: str) -> CatalogError:
    return CatalogError(f"catalog.yaml: {where}: {reason}")


def _parse_alias(raw: Any, where: str) -> Alias:
    if isinstance(raw, str):
        return Alias(metric=raw)
    if not isinstance(raw, dict) or "metric" not in raw:
        raise _fail(where, "an alias is a metric name or a mapping with 'metric'")
    unknown = set(raw) - _ALIAS_FIELDS
    if unknown:
        raise _fail(where, f"unknown alias fields {sorted(unknown)}")
    convert = raw.get("convert", "value")
    if convert not in _CONVERSIONS:
        raise _fail(where, f"convert {convert!r} is not one of {_CONVERSIONS}")
    cadence = raw.get("cadence", "scrape")
    if cadence not in _CADENCES:
        raise _fail(where, f"cadence {cadence!r} is not one of {_CADENCES}")
    args = raw.get("args") or ()
    return Alias(
        metric=str(raw["metric"]),
        match={str(k): str(v) for k, v in (raw.get("match") or {}).items()},
        scale=float(raw.get("scale", 1.0)),
        labels={str(k): str(v) for k, v in (raw.get("labels") or {}).items()},
        set={str(k): str(v) for k, v in (raw.get("set") or {}).items()},
        args=tuple(tuple(a) if isinstance(a, list) else a for a in args),
        part=str(raw.get("part", "")),
        convert=convert,
        omit=float(raw["omit"]) if raw.get("omit") is not None else None,
        cadence=cadence,
    )


_ALIAS_FIELDS = {
    "metric",
    "match",
    "scale",
    "labels",
    "set",
    "args",
    "part",
    "convert",
    "omit",
    "cadence",
}


_ENTRY_FIELDS = {
    "key",
    "name",
    "type",
    "unit",
    "help",
    "collector",
    "identity",
    "labels",
    "sources",
    "aggregate",
    "semconv",
}


def _parse_entry(raw: Any, index: int, identities: Mapping[str, tuple[str, ...]]) -> MetricSpec:
    where = f"metrics[{index}]"
    if not isinstance(raw, dict):
        raise _fail(where, "each entry is a mapping")
    key = raw.get("key")
    where = f"metrics[{index}] ({key})"
    unknown = set(raw) - _ENTRY_FIELDS
    if unknown:
        raise _fail(where, f"unknown fields {sorted(unknown)}")
    for required in ("key", "name", "type", "help", "collector"):
        if not raw.get(required):
            raise _fail(where, f"'{required}' is required")
    identity_name = raw.get("identity")
    if identity_name is not None and identity_name not in identities:
        raise _fail(where, f"identity {identity_name!r} is not one of {sorted(identities)}")
    sources: dict[str, tuple[Alias, ...]] = {}
    for source, aliases in (raw.get("sources") or {}).items():
        if isinstance(aliases, (str, dict)):
            aliases = [aliases]
        sources[str(source)] = tuple(
            _parse_alias(alias, f"{where} sources.{source}") for alias in aliases
        )
    own_labels = tuple(str(label) for label in raw.get("labels") or ())
    for source, aliases in sources.items():
        for alias in aliases:
            fixed = set(alias.set) - set(own_labels)
            if fixed:
                raise _fail(where, f"sources.{source} sets labels {sorted(fixed)} it lacks")
    metric_type = raw["type"]
    if metric_type not in ("counter", "gauge", "histogram"):
        raise _fail(where, f"type {metric_type!r} is not counter, gauge or histogram")
    aggregate = raw.get("aggregate", "sum")
    if aggregate not in ("sum", "max"):
        raise _fail(where, f"aggregate {aggregate!r} is not sum or max")
    return MetricSpec(
        key=str(key),
        name=str(raw["name"]),
        type=metric_type,
        unit=str(raw.get("unit", "")),
        help=" ".join(str(raw["help"]).split()),
        collector=str(raw["collector"]),
        identity=identities[identity_name] if identity_name else (),
        labels=own_labels,
        sources=sources,
        aggregate=aggregate,
        semconv=raw.get("semconv"),
    )


def parse(text: str) -> Catalog:
    """Build a catalogue from YAML text, failing with the entry and field on bad input."""
    document = layer.parse(text, "catalog.yaml", CatalogError)
    if not isinstance(document, dict) or not isinstance(document.get("metrics"), list):
        raise _fail("top level", "expected a mapping with a 'metrics' list")
    identities = {
        str(name): tuple(str(label) for label in labels)
        for name, labels in (document.get("identity") or {}).items()
    }
    specs = [_parse_entry(raw, i, identities) for i, raw in enumerate(document["metrics"])]
    keys = [spec.key for spec in specs]
    duplicates = sorted({key for key in keys if keys.count(key) > 1})
    if duplicates:
        raise _fail("metrics", f"duplicate keys {duplicates}")
    return Catalog(specs, identities)


@functools.cache
def load() -> Catalog:
    """The catalogue shipped with inferwatch (read once per process)."""
    text = resources.files("inferwatch").joinpath("catalog.yaml").read_text(encoding="utf-8")
    return parse(text)
