"""Prometheus text / OpenMetrics exposition parser (interim implementation).

The data model below is the stable interface that engine adapters use. The parse function is
a placeholder built on prometheus_client and is being replaced by the fast, tolerant parser.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from prometheus_client.parser import text_string_to_metric_families


@dataclass(slots=True)
class Sample:
    name: str
    labels: dict[str, str]
    value: float
    timestamp: float | None = None


@dataclass(slots=True)
class Family:
    """Samples under one ``# TYPE`` declaration (or one bare sample name when untyped)."""

    name: str
    type: str
    help: str = ""
    unit: str = ""
    samples: list[Sample] = field(default_factory=list)


@dataclass(slots=True)
class Exposition:
    families: dict[str, Family]
    malformed_lines: int = 0


def parse(text: str | bytes) -> Exposition:
    if isinstance(text, bytes):
        text = text.decode("utf-8", errors="replace")
    families: dict[str, Family] = {}
    for metric in text_string_to_metric_families(text):
        family = families.setdefault(
            metric.name, Family(metric.name, metric.type, metric.documentation, metric.unit)
        )
        for s in metric.samples:
            family.samples.append(Sample(s.name, dict(s.labels), s.value, None))
    return Exposition(families)
