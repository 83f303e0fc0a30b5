"""Invariants of the metric catalogue (inferwatch/catalog.yaml)."""

from __future__ import annotations

import re
from pathlib import Path

import pynvml
import pytest

from inferwatch import catalog
from inferwatch.catalog import UNITS, CatalogError
from inferwatch.exporters.gpu import nvml

pytestmark = pytest.mark.unit

CAT = catalog.load()
SPECS = list(CAT.values())
IDS = [spec.key for spec in SPECS]


@pytest.mark.parametrize("spec", SPECS, ids=IDS)
def test_names_are_namespaced_snake_case(spec: catalog.MetricSpec) -> None:
    assert catalog.NAME_PATTERN.match(spec.name), spec.name
    assert catalog.KEY_PATTERN.match(spec.key), spec.key


@pytest.mark.parametrize("spec", SPECS, ids=IDS)
def test_counters_and_only_counters_end_in_total(spec: catalog.MetricSpec) -> None:
    assert spec.name.endswith("_total") == (spec.type == "counter"), spec.name


@pytest.mark.parametrize("spec", SPECS, ids=IDS)
def test_unit_is_a_base_unit_and_the_name_suffix(spec: catalog.MetricSpec) -> None:
    assert spec.unit in UNITS, f"{spec.key}: unit {spec.unit!r} is not a base unit"
    stem = spec.name.removesuffix("_total")
    if spec.unit:
        assert stem.endswith("_" + spec.unit), f"{spec.name} should end in _{spec.unit}"
    for unit in UNITS - {""}:
        if stem.endswith("_" + unit):
            assert spec.unit == unit, f"{spec.name} looks like {unit} but declares {spec.unit!r}"
    assert not re.search(r"_(milliseconds|microseconds|percent|kilobytes|megabytes)$", stem)


@pytest.mark.parametrize("spec", SPECS, ids=IDS)
def test_labels_are_unique_and_not_reserved(spec: catalog.MetricSpec) -> None:
    assert len(set(spec.label_names)) == len(spec.label_names), spec.label_names
    assert "le" not in spec.label_names and "quantile" not in spec.label_names


def test_names_are_unique() -> None:
    names = [spec.name for spec in SPECS]
    assert len(set(names)) == len(names)


def _spelling(metric: str) -> str:
    """The form an alias takes once `:`/`_` and `_total` variants are folded together."""
    return metric.replace(":", "_").removesuffix("_total")


def test_each_source_spelling_feeds_one_signal_only() -> None:
    seen: dict[tuple[object, ...], str] = {}
    for spec in SPECS:
        for source, aliases in spec.sources.items():
            for alias in aliases:
                # one NVML call reads several signals; its arguments and part tell them apart
                where = (
                    source,
                    _spelling(alias.metric),
                    tuple(sorted(alias.match.items())),
                    alias.args,
                    alias.part,
                )
                assert where not in seen, f"{where} feeds both {seen[where]} and {spec.key}"
                seen[where] = spec.key


def test_alias_labels_are_declared() -> None:
    for spec in SPECS:
        for aliases in spec.sources.values():
            for alias in aliases:
                assert set(alias.labels) <= set(spec.labels), (spec.key, alias.labels)


def test_bad_entries_are_reported_with_entry_and_field() -> None:
    with pytest.raises(CatalogError, match=r"metrics\[0\] \(x\): 'help' is required"):
        catalog.parse("metrics:\n  - {key: x, name: inferwatch_x, type: gauge, collector: c}\n")
    with pytest.raises(CatalogError, match="type 'summary'"):
        catalog.parse(
            "metrics:\n  - {key: x, name: inferwatch_x, type: summary, help: h, collector: c}\n"
        )
    with pytest.raises(CatalogError, match="duplicate keys"):
        catalog.parse(
            "metrics:\n"
            "  - {key: x, name: inferwatch_x, type: gauge, help: h, collector: c}\n"
            "  - {key: x, name: inferwatch_y, type: gauge, help: h, collector: c}\n"
        )


def test_family_has_catalogue_name_help_and_labels() -> None:
    family = CAT.family("engine_up")
    assert family.name == "inferwatch_engine_up"
    assert family.type == "gauge"
    assert family.documentation == CAT["engine_up"].help


REPO = Path(__file__).resolve().parent.parent
CODE = "\n".join(
    path.read_text(encoding="utf-8")
    for folder in ("inferwatch", "exporters", "probes", "runbooks")
    for path in (REPO / folder).rglob("*.py")
)
GOLDENS = "\n".join(
    path.read_text(encoding="utf-8") for path in (REPO / "tests" / "golden").rglob("*.prom")
)


#: Entries the NVML collector reads from their catalogue sources alone (read in
#: test_gpu_nvml.py: the golden, or test_a_gpu_field_is_read_from_its_catalogue_entry_alone).
NVML_DRIVEN = {
    key for calls in nvml.call_table(pynvml).values() for call in calls for key, _ in call.fields
}


@pytest.mark.parametrize("spec", SPECS, ids=IDS)
def test_every_entry_is_emitted_by_some_collector(spec: catalog.MetricSpec) -> None:
    """Named by key in a collector's code, or fed through its sources and seen in a golden
    exposition that a collector produced from a real capture."""
    if f'"{spec.key}"' in CODE or spec.key in NVML_DRIVEN:
        return
    assert spec.sources, f"{spec.key}: no code names it and it has no sources"
    assert re.search(rf"^{spec.name}(_bucket)?[{{ ]", GOLDENS, re.MULTILINE), (
        f"{spec.key}: fed by {sorted(spec.sources)} but absent from every golden exposition"
    )
