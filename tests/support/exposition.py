"""A Prometheus text page as the sidecar tests read it: every sample, or the one a test names."""

from __future__ import annotations

from prometheus_client.parser import text_string_to_metric_families

#: (sample name, its labels) -> value
Samples = dict[tuple[str, frozenset[tuple[str, str]]], float]


def samples(text: str) -> Samples:
    """Every sample of the page, by name and labels."""
    return {
        (s.name, frozenset(s.labels.items())): s.value
        for family in text_string_to_metric_families(text)
        for s in family.samples
    }


def value(text: str, name: str, **labels: str) -> float | None:
    """The one sample called ``name`` whose labels include ``labels`` (None when there is none;
    more than one fails the test, since the labels given do not pick one)."""
    found = [
        v
        for (sample_name, sample_labels), v in samples(text).items()
        if sample_name == name and set(labels.items()) <= sample_labels
    ]
    assert len(found) <= 1, f"{name}{labels} is ambiguous"
    return found[0] if found else None
