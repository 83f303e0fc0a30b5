"""PromQL spelled once: selectors from catalogue keys, `le` matchers, numbers, groupings.

Builders never write a metric name: they ask for a catalogue key, so a rule cannot name a
metric the sidecar does not emit, and the source's label matchers from the config are added
to every selector in one place.
"""

from __future__ import annotations

import math
import re
from collections.abc import Sequence
from decimal import Decimal

from inferwatch import catalog
from inferwatch.config import Duration
from inferwatch.mixin.config import Config

__all__ = [
    "IDENTITY_KEY",
    "MODEL",
    "MODEL_VERSION",
    "SOURCE_OF_COLLECTOR",
    "by",
    "le_matcher",
    "le_regex",
    "metric",
    "number",
    "on",
    "one_of",
    "quoted",
    "seconds_text",
    "snap",
    "with_model",
]

#: catalogue collector -> the config's selector for the process that serves it
SOURCE_OF_COLLECTOR = {
    "sidecar": "sidecar",
    "engine": "sidecar",
    "gpu": "sidecar",
    "nvml": "sidecar",
    "dcgm": "sidecar",
    "tenancy": "proxy",
    "probes": "probes",
    "advise": "advisor",
}
_REGEX_SPECIAL = re.compile(r"[.^$*+?()\[\]{}|\\]")
#: label sets alerts group by
MODEL = ("model",)
MODEL_VERSION = ("model", "model_version")


def number(value: float) -> str:
    """A threshold as PromQL text: short, exact enough, the same on every run."""
    if math.isinf(value):
        return "+Inf" if value > 0 else "-Inf"
    return format(round(value, 12), ".12g")


def metric(config: Config, key: str, *matchers: str, suffix: str = "") -> str:
    """``inferwatch_x{matchers}`` for catalogue ``key`` (``suffix``: _bucket, _count, _sum)."""
    spec = catalog.load()[key]
    if suffix and spec.type != "histogram":
        raise ValueError(f"{key} is a {spec.type}, it has no {suffix} series")
    source = config.selectors[SOURCE_OF_COLLECTOR[spec.collector]]
    parts = [m for m in (source, *matchers) if m]
    return f"{spec.name}{suffix}{{{','.join(parts)}}}" if parts else f"{spec.name}{suffix}"


def by(config: Config, labels: Sequence[str]) -> str:
    """``by (cluster, ...)``: the cluster label first, then ``labels``."""
    return f"by ({', '.join((config.cluster_label, *labels))})"


def on(config: Config, labels: Sequence[str]) -> str:
    return f"on ({', '.join((config.cluster_label, *labels))})"


#: the series every replica's sidecar serves with the replica's full identity
IDENTITY_KEY = "engine_up"


def with_model(config: Config, gpu_series: str, identity_series: str) -> str:
    """``gpu_series`` labelled with the model and model_version of its replica: GPU series
    carry no model, so each is joined to the replica's identity (``identity_series``) on the
    scrape target both come from (the cost board's GPU cost, the usage report's idle cost)."""
    c = config.cluster_label
    identity = f"group by ({c}, instance, model, model_version) ({identity_series})"
    return f"({gpu_series} * on ({c}, instance) group_left (model, model_version) {identity})"


def one_of(values: Sequence[str]) -> str:
    """A regex alternative matching exactly these label values, for a double-quoted
    PromQL string (so a regex backslash is itself escaped there)."""
    return "|".join(_string(_REGEX_SPECIAL.sub(r"\\\g<0>", v)) for v in values)


def quoted(value: str) -> str:
    """A label value as a PromQL double-quoted string."""
    return f'"{_string(value)}"'


def _string(text: str) -> str:
    return text.replace("\\", "\\\\").replace('"', '\\"')


def snap(threshold: float, buckets: Sequence[float]) -> float:
    """The largest bucket bound at or below ``threshold``: the SLI can only count whole
    buckets, and snapping down never calls a slow request good."""
    below = [b for b in buckets if b <= threshold]
    if not below:
        raise ValueError(f"no bucket bound at or below {threshold}")
    return max(below)


def le_matcher(bound: float) -> str:
    """``le=~"..."`` matching every spelling of ``bound`` that exporters emit.

    Python's client writes ``0.5`` and ``1.0``, Go's ``0.5`` and ``1``, some engines pad
    (``0.50``) or use exponents (``5e-01``), and Prometheus 3 rewrites whole numbers as
    ``1.0``. An exact ``le="1.0"`` silently matches nothing on half of them.
    """
    return f'le=~"{le_regex(bound)}"'


def le_regex(bound: float) -> str:
    """The regex behind :func:`le_matcher`, written for a PromQL double-quoted string."""
    digits, exponent = _digits(bound)
    # decimal form: digits with the point in place, any zeros padded after the last digit
    point = len(digits) + exponent
    if point <= 0:
        integer, fraction = "0", "0" * -point + digits
    elif point >= len(digits):
        integer, fraction = digits + "0" * (point - len(digits)), ""
    else:
        integer, fraction = digits[:point], digits[point:]
    decimal = integer + (r"\\." + fraction + "0*" if fraction else r"(\\.0*)?")
    # scientific form: one digit before the point, then the rest, any exponent spelling
    lead, rest = digits[0], digits[1:]
    mantissa = lead + (r"\\." + rest + "0*" if rest else r"(\\.0*)?")
    power = len(digits) - 1 + exponent
    sign = "-" if power < 0 else r"\\+?"
    scientific = f"{mantissa}[eE]{sign}0*{abs(power)}"
    return f"{decimal}|{scientific}"


def _digits(bound: float) -> tuple[str, int]:
    """Significant digits and exponent of the shortest decimal spelling of ``bound``."""
    if bound <= 0 or math.isinf(bound) or math.isnan(bound):
        raise ValueError(f"a latency bucket bound is positive and finite, got {bound}")
    _, digit_tuple, exponent = Decimal(repr(bound)).normalize().as_tuple()
    assert isinstance(exponent, int)
    return "".join(str(d) for d in digit_tuple), exponent


def seconds_text(duration: str) -> str:
    """A Prometheus duration as a number of seconds (what ``predict_linear`` takes)."""
    return number(Duration.parse(duration).seconds)
