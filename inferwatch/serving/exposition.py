"""The /metrics body, byte for byte what prometheus_client's encoders write, with each
series' line start (its name and labels) written once and remembered.

prometheus_client checks and escapes every label of every sample on every scrape: 9 µs a
sample on a sidecar's data-parallel page, a third of its whole ``GET /metrics``. A
component's series repeat from scrape to scrape, so the start of each one's line is made
once and kept (bounded, :func:`remember`); each scrape then writes only values.

Only what the components write takes this path: the default escaping (underscores), names
of the legacy character set without colons (which every prometheus_client version from 0.20
writes unchanged), no timestamps, exemplars or native histograms. Anything else is written
by the library's own encoder, whole; a property test holds the two byte-identical.
"""

from __future__ import annotations

import functools
import re
from collections.abc import Callable, Sequence

from prometheus_client.core import Metric
from prometheus_client.exposition import generate_latest as text_latest
from prometheus_client.openmetrics.exposition import generate_latest as openmetrics_latest

from inferwatch.serving.fastpath import OutputSample, format_boundary, remember

__all__ = ["fast_encoder"]

#: the names written unchanged by every encoder and version: metric names with colons are
#: rewritten by OpenMetrics encoders of prometheus_client 0.22 and later, so they are left out
_PLAIN_NAME = re.compile(r"[a-zA-Z_][a-zA-Z0-9_]*\Z")
_MEMO_LIMIT = 1 << 16

#: the text format's family names and types for OpenMetrics' (a counter's name is its
#: samples' stem; info and stateset families are gauges there)
_TEXT_SUFFIX = {"counter": "_total", "info": "_info"}
_TEXT_TYPE = {"info": "gauge", "stateset": "gauge", "gaugehistogram": "histogram",
              "unknown": "untyped"}  # fmt: skip
#: OpenMetrics-only samples the text format lists after the family, as gauges of their own
_LATE_SUFFIXES = ("_created", "_gsum", "_gcount")

_text_starts: dict[tuple[str, tuple[tuple[str, str], ...]], str] = {}
_openmetrics_starts: dict[tuple[str, tuple[tuple[str, str], ...]], str] = {}
_plain_names: dict[str, bool] = {}


class _Unwritten(Exception):
    """A family or sample this writer leaves to the library's encoder."""


def fast_encoder(
    encoder: Callable[..., bytes],
) -> Callable[[Sequence[Metric]], bytes | None] | None:
    """This module's writer for what ``choose_encoder`` chose (None: the library's alone);
    it returns None for families it leaves to the library."""
    func, keywords = (
        (encoder.func, encoder.keywords)
        if isinstance(encoder, functools.partial)
        else (encoder, {})
    )
    if keywords.get("escaping", "underscores") != "underscores":
        return None
    if func is text_latest:
        return _whole(_text)
    if func is openmetrics_latest:
        return _whole(_openmetrics)
    return None


def _whole(write: Callable[[Sequence[Metric]], str]) -> Callable[[Sequence[Metric]], bytes | None]:
    def encode(families: Sequence[Metric]) -> bytes | None:
        try:
            return write(families).encode("utf-8")
        except _Unwritten:
            return None

    return encode


def _plain(name: str) -> bool:
    known = _plain_names.get(name)
    if known is None:
        known = remember(_plain_names, name, _PLAIN_NAME.match(name) is not None, _MEMO_LIMIT)
    return known


def _label_value(value: str) -> str:
    return value.replace("\\", r"\\").replace("\n", r"\n").replace('"', r"\"")


def _start(sample: OutputSample) -> str:
    """``name{label="value",...} `` with the labels sorted, as both encoders write them."""
    if not _plain(sample.name) or not all(_plain(name) for name in sample.labels):
        raise _Unwritten
    if not sample.labels:
        return f"{sample.name} "
    labels = ",".join(f'{k}="{_label_value(v)}"' for k, v in sorted(sample.labels.items()))
    return f"{sample.name}{{{labels}}} "


def _line(sample: OutputSample, starts: dict[tuple[str, tuple[tuple[str, str], ...]], str]) -> str:
    if (
        sample.value is None
        or sample.timestamp is not None
        or getattr(sample, "native_histogram", None) is not None
    ):
        raise _Unwritten
    key = (sample.name, tuple(sample.labels.items()))
    start = starts.get(key)
    if start is None:
        start = remember(starts, key, _start(sample), _MEMO_LIMIT)
    return f"{start}{format_boundary(sample.value)}\n"


def _text(families: Sequence[Metric]) -> str:
    """The text format 0.0.4, as ``prometheus_client.generate_latest`` writes it."""
    out: list[str] = []
    for family in families:
        name = family.name + _TEXT_SUFFIX.get(family.type, "")
        if not _plain(name):
            raise _Unwritten
        help_text = family.documentation.replace("\\", r"\\").replace("\n", r"\n")
        out.append(f"# HELP {name} {help_text}\n")
        out.append(f"# TYPE {name} {_TEXT_TYPE.get(family.type, family.type)}\n")
        late: dict[str, list[str]] = {}
        for sample in family.samples:
            suffix = _late_suffix(family.name, sample.name)
            if suffix:
                late.setdefault(suffix, []).append(_line(sample, _text_starts))
            else:
                out.append(_line(sample, _text_starts))
        for suffix, lines in sorted(late.items()):
            out.append(f"# HELP {family.name}{suffix} {help_text}\n")
            out.append(f"# TYPE {family.name}{suffix} gauge\n")
            out.extend(lines)
    return "".join(out)


def _late_suffix(family: str, sample: str) -> str:
    if len(sample) > len(family) and sample.startswith(family):
        suffix = sample[len(family) :]
        if suffix in _LATE_SUFFIXES:
            return suffix
    return ""


def _openmetrics(families: Sequence[Metric]) -> str:
    """OpenMetrics 1.0.0, as ``prometheus_client.openmetrics.exposition.generate_latest``
    writes it."""
    out: list[str] = []
    for family in families:
        if not _plain(family.name):
            raise _Unwritten
        out.append(f"# HELP {family.name} {_label_value(family.documentation)}\n")
        out.append(f"# TYPE {family.name} {family.type}\n")
        if family.unit:
            out.append(f"# UNIT {family.name} {family.unit}\n")
        for sample in family.samples:
            if sample.exemplar is not None:
                raise _Unwritten
            out.append(_line(sample, _openmetrics_starts))
    out.append("# EOF\n")
    return "".join(out)
