"""The alert configuration: shipped defaults, a user's file on top, validated at load.

The defaults are the schema: a field is declared by writing its default, and its type is the
default's. The shipped ``config.yaml`` holds what components share (selectors, links, the
recording rules' windows, latency thresholds, SLO objectives), which users read as the
commented list of what they can set; a component declares its own sections beside the code
that reads them (a :class:`Part`: the alerts component's per-alert settings and Alertmanager
routing), and loading with it merges a user's file over both. Written as code, the
declaration would be ``fields.number("usage", 0.9)`` for every field, repeating each default
the defaults already hold; so the merge below walks the defaults and reads each field of a
user's file with the
:class:`~inferwatch.config.schema.Fields` read of its default's type (a duration where the
key names one). Unknown keys and wrong types therefore read as in every other config. The
few open mappings (per-model latency thresholds, SLO objectives and cost baselines,
per-alert labels and annotations) and the burn-rate windows are read entry by entry, and
rules between fields are checked once the document is merged.
"""

from __future__ import annotations

import functools
import math
import re
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from importlib import resources
from pathlib import Path
from typing import Any

from inferwatch import config as layer
from inferwatch.config import Duration
from inferwatch.config.schema import Fail, Fields, number_of, text_of
from inferwatch.mixin import gotemplate, validate

__all__ = [
    "ALERT_EXTRAS",
    "DURATION_KEYS",
    "SEVERITIES",
    "AlertSettings",
    "BurnWindow",
    "Config",
    "ConfigError",
    "Part",
    "defaults",
    "load",
]

SEVERITIES = ("critical", "warning", "info")
#: keys whose values are Prometheus durations
DURATION_KEYS = frozenset(
    {
        "for",
        "window",
        "lookback",
        "horizon",
        "baseline_window",
        "rate_window",
        "long",
        "short",
        "period",
    }
)
#: keys every ``alerts.<name>`` entry accepts besides its own defaults
ALERT_EXTRAS = frozenset({"disabled", "labels", "annotations"})
_LABEL_NAME = re.compile(r"^[a-zA-Z_][a-zA-Z0-9_]*$")
_MATCHER = r'\s*[a-zA-Z_][a-zA-Z0-9_]*\s*(?:=~|!~|!=|=)\s*"(?:[^"\\\n]|\\.)*"\s*'
_MATCHERS = re.compile(rf"{_MATCHER}(?:,{_MATCHER})*,?")


class ConfigError(layer.ConfigError):
    """A user's alert config is wrong; the message is one line: file: field: reason."""


@dataclass(frozen=True)
class Part:
    """A component's own top-level sections: their defaults, and the check of what the
    merge cannot see (raising ConfigError), so that they live beside the code reading them."""

    defaults: Mapping[str, Any]
    check: Callable[[Config], object]


@functools.cache
def _defaults_text() -> str:
    return resources.files(__package__).joinpath("config.yaml").read_text(encoding="utf-8")


def defaults(part: Part | None = None) -> dict[str, Any]:
    """The shipped defaults, with ``part``'s own sections: what a user's file may set."""
    document = layer.parse(_defaults_text(), "inferwatch/mixin/config.yaml")
    assert isinstance(document, dict)
    return {**document, **(part.defaults if part else {})}


def _merge(base: Mapping[str, Any], given: Fields) -> dict[str, Any]:
    """``given`` on top of the section ``base``, each field read as its default's type."""
    given.check_keys(set(base))
    merged = dict(base)
    for key in given.raw:
        if given.where(key) == "alerts":
            merged[key] = _alerts(base[key], given.child(key))
        elif given.where(key) == "latency.models":
            merged[key] = {
                _model_name(model, thresholds.error_at("")): _partial(
                    base["thresholds"], thresholds
                )
                for model, thresholds in given.child(key).entries()
            }
        elif given.where(key) in ("slo.ttft.models", "slo.availability.models"):
            objectives = given.child(key)
            merged[key] = {
                str(model): number_of(value, objectives.error_at(str(model)))
                for model, value in objectives.raw.items()
            }
        elif given.where(key) == "slo.tenant_classes":
            merged[key] = _tenant_classes(given.child(key))
        elif given.where(key) == "slo.windows":
            merged[key] = _windows(base[key][0], given)
        elif given.where(key) in KUBE_LABELS:
            merged[key] = {**base[key], **_kube_labels(given.child(key))}
        else:
            merged[key] = _field(base[key], given, key)
    return merged


def _field(default: Any, given: Fields, key: str) -> Any:
    """The field ``key`` of ``given``, read as the type of its ``default``."""
    if isinstance(default, dict):
        return _merge(default, given.child(key))
    if isinstance(default, bool):
        return given.flag(key, default)
    if isinstance(default, (int, float)):
        return given.number(key, default, minimum=-math.inf)
    if isinstance(default, list):
        numbers = bool(default) and not isinstance(default[0], str)
        return given.each(key, number_of if numbers else _string)
    if key in DURATION_KEYS:
        given.duration(key, default)  # checked; kept as the user wrote it
        return str(given.raw.get(key, default))
    return given.text(key, default, numbers=False)


def _string(value: Any, fail: Fail) -> str:
    return text_of(value, fail, numbers=False)


def _alerts(base: Mapping[str, Any], given: Fields) -> dict[str, Any]:
    """Each alert's entry: ``for``, ``disabled``, labels, annotations and its own parameters."""
    given.check_keys(set(base))
    merged = dict(base)
    for name, entry in given.entries():
        own = base[name]
        entry.check_keys({*own, "for", *ALERT_EXTRAS})
        settings = dict(own)
        for key in entry.raw:
            if key == "disabled":
                settings[key] = entry.flag(key, False)
            elif key in ("labels", "annotations"):
                settings[key] = _strings(entry.child(key))
            elif key == "baselines":  # per model, in currency per 1k tokens
                baselines = entry.child(key)
                settings[key] = {
                    _model_name(str(model), baselines.error_at(str(model))): number_of(
                        value, baselines.error_at(str(model))
                    )
                    for model, value in baselines.raw.items()
                }
            else:
                settings[key] = _field(own.get(key, "0s"), entry, key)
        merged[name] = settings
    return merged


def _partial(base: Mapping[str, Any], given: Fields) -> dict[str, Any]:
    """A mapping with any subset of ``base``'s keys (a model's own latency thresholds)."""
    given.check_keys(set(base))
    return {
        key: _partial(base[key], given.child(key))
        if isinstance(base[key], dict)
        else _field(base[key], given, key)
        for key in given.raw
    }


_CLASS_NAME = re.compile(r"^[a-z0-9]([a-z0-9-]*[a-z0-9])?$")


def _tenant_classes(given: Fields) -> dict[str, dict[str, Any]]:
    """Each class: its ``tenants`` (non-empty) and an objective per SLO it names."""
    classes = {}
    for name, entry in given.entries():
        if not _CLASS_NAME.match(name):
            raise given.error(name, "a class name is lowercase letters, digits and dashes")
        entry.check_keys({"tenants", "ttft", "availability"}, required={"tenants"})
        tenants = entry.each("tenants", _string, max_items=1000)
        if not tenants:
            raise entry.error("tenants", "expected at least one tenant")
        objectives = {
            slo: entry.number(slo, 0.0, minimum=-math.inf)
            for slo in ("ttft", "availability")
            if slo in entry.raw
        }
        if not objectives:
            raise given.error(name, "expected an objective: ttft, availability or both")
        classes[name] = {"tenants": tenants, **objectives}
    return classes


def _windows(template: Mapping[str, Any], slo: Fields) -> list[dict[str, Any]]:
    """The burn-rate windows: a non-empty list, each with every key of the shipped ones."""
    windows = slo.records("windows")
    if not windows:
        raise slo.error("windows", "expected a non-empty list of burn-rate windows")
    result = []
    for window in windows:
        window.check_keys(set(template), required=set(template))
        result.append({key: _field(template[key], window, key) for key in template})
    return result


def _strings(given: Fields) -> dict[str, str]:
    """Extra labels or annotations: label names to strings, each a template that Prometheus
    can parse (it expands both)."""
    result = {}
    for key, value in given.raw.items():
        if not isinstance(key, str) or not _LABEL_NAME.fullmatch(key):
            raise given.error(str(key), "not a valid label or annotation name")
        text = text_of(value, given.error_at(key), numbers=False)
        reason = gotemplate.error(text)
        if reason is not None:
            raise given.error(key, f"not a template Prometheus can parse: {reason}")
        result[key] = text
    return result


def _model_name(name: str, fail: Fail) -> str:
    """A model name, which lands in PromQL strings and YAML keys: printable, one line."""
    if not name or not name.isprintable():
        raise fail(f"a model name is printable text on one line, got {name!r}")
    return name


#: the open mappings of Kubernetes labels (kubernetes.* in config.yaml)
KUBE_LABELS = ("kubernetes.prometheus_rule_labels", "kubernetes.dashboard_labels")
#: a Kubernetes label key (an optional DNS-subdomain prefix and a name) and value
_KUBE_LABEL_KEY = re.compile(
    r"([a-z0-9]([-a-z0-9.]{0,251}[a-z0-9])?/)?[A-Za-z0-9]([-A-Za-z0-9_.]{0,61}[A-Za-z0-9])?"
)
_KUBE_LABEL_VALUE = re.compile(r"([A-Za-z0-9]([-A-Za-z0-9_.]{0,61}[A-Za-z0-9])?)?")


def _kube_labels(given: Fields) -> dict[str, str]:
    """Labels for a Kubernetes resource's metadata: keys and values as the API accepts them."""
    result = {}
    for key, value in given.raw.items():
        if not isinstance(key, str) or not _KUBE_LABEL_KEY.fullmatch(key):
            raise given.error(str(key), "not a Kubernetes label key")
        text = text_of(value, given.error_at(key), numbers=False)
        if not _KUBE_LABEL_VALUE.fullmatch(text):
            raise given.error(key, f"{text[:64]!r} is not a Kubernetes label value")
        result[key] = text
    return result


@dataclass(frozen=True)
class AlertSettings:
    """One alert's entry: ``for``, its own parameters, and the user's overrides."""

    name: str
    for_: str
    disabled: bool
    labels: Mapping[str, str]
    annotations: Mapping[str, str]
    params: Mapping[str, Any]

    def number(self, key: str) -> float:
        return float(self.params[key])

    def text(self, key: str) -> str:
        return str(self.params[key])

    def names(self, key: str) -> list[str]:
        return [str(item) for item in self.params[key]]


@dataclass(frozen=True)
class BurnWindow:
    severity: str
    long: str
    short: str
    factor: float
    for_: str


class Config:
    """The merged, validated configuration, with typed accessors for the builders."""

    def __init__(self, document: Mapping[str, Any], source: str) -> None:
        self.source = source
        self.cluster_label: str = document["cluster_label"]
        self.selectors: Mapping[str, str] = document["selectors"]
        self.links: Mapping[str, str] = document["links"]
        #: extra metadata labels: prometheus_rule_labels, dashboard_labels
        self.kubernetes: Mapping[str, Mapping[str, str]] = document["kubernetes"]
        self.rate_window: str = document["rate_window"]
        self.quantiles: list[float] = [float(q) for q in document["quantiles"]]
        self.latency: Mapping[str, Any] = document["latency"]
        self.slo: Mapping[str, Any] = document["slo"]
        self.autoscaling: Mapping[str, Any] = document["autoscaling"]
        self.burn_windows = [
            BurnWindow(w["severity"], w["long"], w["short"], float(w["factor"]), w["for"])
            for w in document["slo"]["windows"]
        ]
        #: absent unless a component's part declared alerts (a shared-only load)
        self._alerts: Mapping[str, Any] = document.get("alerts", {})
        self._document = document

    def section(self, key: str) -> Mapping[str, Any]:
        """A component's own section as merged, for the component to read (its part declared
        it)."""
        section: Mapping[str, Any] = self._document[key]
        return section

    @property
    def alert_names(self) -> list[str]:
        return list(self._alerts)

    def alert(self, name: str) -> AlertSettings:
        entry = dict(self._alerts[name])
        return AlertSettings(
            name=name,
            for_=str(entry.pop("for", "0s")),
            disabled=bool(entry.pop("disabled", False)),
            labels=entry.pop("labels", {}),
            annotations=entry.pop("annotations", {}),
            params=entry,
        )

    def latency_threshold(self, signal: str, severity: str, model: str | None = None) -> float:
        """The threshold for ``model`` (its own where configured), else the default."""
        if model is not None:
            own = self.latency["models"].get(model, {}).get(signal, {})
            if severity in own:
                return float(own[severity])
        return float(self.latency["thresholds"][signal][severity])

    def slo_objective(self, slo: str, model: str | None = None) -> float:
        """The objective of ``slo`` for ``model`` (its own where configured), else the default."""
        own = self.slo[slo]["models"]
        return float(own[model] if model in own else self.slo[slo]["objective"])

    @property
    def slo_windows(self) -> list[str]:
        """Every window a burn-rate alert reads, shortest first (deduplicated)."""
        names = {w for pair in self.burn_windows for w in (pair.long, pair.short)}
        return sorted(names, key=Duration.parse)


def _check_meaning(config: Config, fail: Any) -> None:
    """Rules between fields that the defaults-as-schema merge cannot see."""
    if not _LABEL_NAME.match(config.cluster_label):
        fail("cluster_label", f"{config.cluster_label!r} is not a label name")
    for name, selector in config.selectors.items():
        if selector and not _MATCHERS.fullmatch(selector):
            fail(f"selectors.{name}", 'expected label matchers without braces, e.g. job="x"')
        reason = validate.promql_error(f"up{{{selector}}}")
        if reason is not None:
            fail(f"selectors.{name}", reason)
    for link, fields in (("runbook_url", {"alertname"}), ("dashboard_url", {"uid", "panel"})):
        try:
            config.links[link].format(**{field: "x" for field in fields})
        except (KeyError, IndexError, ValueError):
            fail(f"links.{link}", f"may only use {sorted(fields)} in braces")
    if "{alertname}" not in config.links["runbook_url"]:
        fail("links.runbook_url", "must contain {alertname}")
    if config.rate_window and Duration.parse(config.rate_window).milliseconds <= 0:
        fail("rate_window", "must be longer than 0s")
    if not config.quantiles or not all(0 < q < 1 for q in config.quantiles):
        fail("quantiles", "each quantile is between 0 and 1 (exclusive)")
    if float(config.latency["quantile"]) not in config.quantiles:
        fail("latency.quantile", f"must be one of quantiles {config.quantiles}")
    for signal, levels in config.latency["thresholds"].items():
        if float(levels["warning"]) >= float(levels["critical"]):
            fail(f"latency.thresholds.{signal}", "warning must be below critical")
    for model in config.latency["models"]:
        for signal in config.latency["thresholds"]:
            warning = config.latency_threshold(signal, "warning", model)
            critical = config.latency_threshold(signal, "critical", model)
            if warning >= critical:
                fail(f"latency.models.{model}.{signal}", "warning must be below critical")
    if Duration.parse(config.slo["period"]) < Duration.parse(config.slo_windows[-1]):
        fail(
            "slo.period", f"must be at least the longest burn-rate window {config.slo_windows[-1]}"
        )
    for slo in ("ttft", "availability"):
        objectives = {"objective": config.slo[slo]["objective"]}
        objectives.update({f"models.{m}": v for m, v in config.slo[slo]["models"].items()})
        objectives.update(
            {
                f"tenant_classes.{name}.{slo}": entry[slo]
                for name, entry in config.slo["tenant_classes"].items()
                if slo in entry
            }
        )
        for where, value in objectives.items():
            if not 0 < float(value) < 1:
                where = where if where.startswith("tenant_classes") else f"{slo}.{where}"
                fail(f"slo.{where}", f"must be between 0 and 1 (exclusive), got {value}")
    buckets = config.slo["ttft"]["buckets"]
    if not buckets or sorted(set(buckets)) != list(buckets) or min(buckets) <= 0:
        fail("slo.ttft.buckets", "expected positive bucket bounds in increasing order")
    if float(config.slo["ttft"]["threshold"]) < min(buckets):
        fail("slo.ttft.threshold", f"below the smallest bucket bound {min(buckets)}")
    if not 0 < float(config.autoscaling["queue_wait_quantile"]) < 1:
        fail("autoscaling.queue_wait_quantile", "must be between 0 and 1 (exclusive)")
    for signal, target in config.autoscaling["targets"].items():
        if float(target) <= 0:
            fail(f"autoscaling.targets.{signal}", "must be above 0")
    if float(config.autoscaling["targets"]["kv_cache_usage"]) > 1:
        fail("autoscaling.targets.kv_cache_usage", "is a share of the KV cache, at most 1")
    for index, window in enumerate(config.burn_windows):
        where = f"slo.windows[{index}]"
        if window.severity not in ("critical", "warning"):
            fail(f"{where}.severity", "is critical (page) or warning (ticket)")
        if Duration.parse(window.short) >= Duration.parse(window.long):
            fail(f"{where}.short", "must be shorter than long")
        if window.factor <= 0:
            fail(f"{where}.factor", "must be above 0")
    for name in config.alert_names:
        settings = config.alert(name)
        for key, value in settings.params.items():
            if isinstance(value, float) and value < 0:
                fail(f"alerts.{name}.{key}", "must not be negative")
        if "severity" in settings.labels:
            fail(
                f"alerts.{name}.labels.severity", "severity is set by the rule; disable it instead"
            )


def load(path: Path | None = None, part: Part | None = None) -> Config:
    """The shared defaults and ``part``'s, with ``path`` (if given) on top; raises
    ConfigError on any bad field. Without a part, a file may set only shared sections."""
    source = "inferwatch/mixin/config.yaml" if path is None else str(path)
    given = Fields(source, None if path is None else _read(path, source), error=ConfigError)
    config = Config(_merge(defaults(part), given), source)

    def fail(where: str, reason: str) -> None:
        raise given.error(where, reason)

    _check_meaning(config, fail)
    if part is not None:
        part.check(config)
    return config


def _read(path: Path, source: str) -> Any:
    try:
        return layer.load(path, source)
    except layer.ConfigError as exc:
        raise ConfigError(str(exc)) from None
