"""The alert configuration: shipped defaults, a user's file on top, validated at load.

The shipped ``config.yaml`` is both the defaults and the schema: a user's file may only name
keys the defaults have, with values of the same kind. The few open mappings (per-model
latency thresholds and cost baselines, per-alert extra labels and annotations) are checked
entry by entry. Every error names the file, the field and the reason on one line.
"""

from __future__ import annotations

import functools
import math
import re
from collections.abc import Mapping
from dataclasses import dataclass
from importlib import resources
from pathlib import Path
from typing import Any

from inferwatch import config as layer
from inferwatch.config import Duration
from inferwatch.config.schema import kind as _kind
from inferwatch.mixin import routing

__all__ = [
    "ALERT_EXTRAS",
    "DURATION_KEYS",
    "SEVERITIES",
    "AlertSettings",
    "BurnWindow",
    "Config",
    "ConfigError",
    "defaults",
    "load",
]

SEVERITIES = ("critical", "warning", "info")
#: keys whose values are Prometheus durations
DURATION_KEYS = frozenset(
    {"for", "window", "lookback", "horizon", "baseline_window", "rate_window", "long", "short"}
)
#: keys every ``alerts.<name>`` entry accepts besides its own defaults
ALERT_EXTRAS = frozenset({"disabled", "labels", "annotations"})
_LABEL_NAME = re.compile(r"^[a-zA-Z_][a-zA-Z0-9_]*$")
_MATCHER = r'\s*[a-zA-Z_][a-zA-Z0-9_]*\s*(?:=~|!~|!=|=)\s*"(?:[^"\\]|\\.)*"\s*'
_MATCHERS = re.compile(rf"^{_MATCHER}(?:,{_MATCHER})*,?$")


class ConfigError(layer.ConfigError):
    """A user's alert config is wrong; the message is one line: file: field: reason."""


@functools.cache
def _defaults_text() -> str:
    return resources.files(__package__).joinpath("config.yaml").read_text(encoding="utf-8")


def defaults() -> dict[str, Any]:
    document = layer.parse(_defaults_text(), "inferwatch/mixin/config.yaml")
    assert isinstance(document, dict)
    return document


class _Checker:
    """Merges a user document onto the defaults, failing on the first wrong field."""

    def __init__(self, source: str) -> None:
        self.source = source

    def fail(self, path: str, reason: str) -> ConfigError:
        return ConfigError(f"{self.source}: {path or 'top level'}: {reason}")

    def merge(self, base: Any, given: Any, path: str) -> Any:
        if isinstance(base, dict):
            if not isinstance(given, dict):
                raise self.fail(path, f"expected a mapping, got {_kind(given)}")
            merged = dict(base)
            for key, value in given.items():
                where = f"{path}.{key}" if path else str(key)
                if not isinstance(key, str):
                    raise self.fail(where, "keys are strings")
                merged[key] = self.entry(base, key, value, path)
            return merged
        return self.scalar(base, given, path)

    def entry(self, base: dict[str, Any], key: str, value: Any, parent: str) -> Any:
        where = f"{parent}.{key}" if parent else key
        if parent == "alerts":
            if key not in base:
                raise self.fail(where, f"no alert of that name (known: {_short(base)})")
            return self.alert(base[key], value, where)
        if parent == "latency.models":
            thresholds = defaults()["latency"]["thresholds"]
            return self.partial(thresholds, value, where)
        if parent.endswith(".baselines"):
            return self.number(value, where)
        if key not in base:
            raise self.fail(where, f"unknown field (known: {_short(base)})")
        if where == "slo.windows":
            return self.windows(value, where)
        return self.merge(base[key], value, where)

    def alert(self, base: dict[str, Any], given: Any, path: str) -> dict[str, Any]:
        if not isinstance(given, dict):
            raise self.fail(path, f"expected a mapping, got {_kind(given)}")
        merged = dict(base)
        for key, value in given.items():
            where = f"{path}.{key}"
            if key == "disabled":
                if not isinstance(value, bool):
                    raise self.fail(where, f"expected true or false, got {_kind(value)}")
                merged[key] = value
            elif key in ("labels", "annotations"):
                merged[key] = self.strings(value, where)
            elif key == "for" or key in base:
                template = base.get(key, "0s")
                merged[key] = self.merge(template, value, where)
            else:
                known = sorted({*base, "for", *ALERT_EXTRAS})
                raise self.fail(where, f"unknown field (known: {', '.join(known)})")
        return merged

    def partial(self, base: dict[str, Any], given: Any, path: str) -> dict[str, Any]:
        """A mapping with any subset of ``base``'s keys, merged onto nothing."""
        if not isinstance(given, dict):
            raise self.fail(path, f"expected a mapping, got {_kind(given)}")
        result: dict[str, Any] = {}
        for key, value in given.items():
            where = f"{path}.{key}"
            if key not in base:
                raise self.fail(where, f"unknown field (known: {_short(base)})")
            result[key] = (
                self.partial(base[key], value, where)
                if isinstance(base[key], dict)
                else self.scalar(base[key], value, where)
            )
        return result

    def windows(self, given: Any, path: str) -> list[dict[str, Any]]:
        if not isinstance(given, list) or not given:
            raise self.fail(path, "expected a non-empty list of burn-rate windows")
        template = defaults()["slo"]["windows"][0]
        result = []
        for index, window in enumerate(given):
            where = f"{path}[{index}]"
            if not isinstance(window, dict) or set(window) != set(template):
                raise self.fail(where, f"expected a mapping with exactly {_short(template)}")
            result.append({k: self.scalar(template[k], window[k], f"{where}.{k}") for k in window})
        return result

    def scalar(self, base: Any, given: Any, path: str) -> Any:
        key = path.rsplit(".", 1)[-1]
        if isinstance(base, bool):
            if not isinstance(given, bool):
                raise self.fail(path, f"expected true or false, got {_kind(given)}")
            return given
        if isinstance(base, (int, float)):
            return self.number(given, path)
        if isinstance(base, list):
            if not isinstance(given, list):
                raise self.fail(path, f"expected a list, got {_kind(given)}")
            item = base[0] if base else ""
            return [self.scalar(item, v, f"{path}[{i}]") for i, v in enumerate(given)]
        if isinstance(base, dict):
            return self.merge(base, given, path)
        if not isinstance(given, str):
            raise self.fail(path, f"expected a string, got {_kind(given)}")
        if key in DURATION_KEYS:
            try:
                Duration.parse(given)
            except ValueError as exc:
                raise self.fail(path, str(exc)) from None
        return given

    def number(self, given: Any, path: str) -> float:
        if isinstance(given, bool) or not isinstance(given, (int, float)):
            raise self.fail(path, f"expected a number, got {_kind(given)}")
        if not math.isfinite(given):
            raise self.fail(path, f"expected a finite number, got {given}")
        return float(given)

    def strings(self, given: Any, path: str) -> dict[str, str]:
        if not isinstance(given, dict):
            raise self.fail(path, f"expected a mapping of names to strings, got {_kind(given)}")
        for key, value in given.items():
            if not isinstance(key, str) or not _LABEL_NAME.match(key):
                raise self.fail(f"{path}.{key}", "not a valid label or annotation name")
            if not isinstance(value, str):
                raise self.fail(f"{path}.{key}", f"expected a string, got {_kind(value)}")
        return dict(given)


def _short(mapping: Mapping[str, Any]) -> str:
    names = sorted(mapping)
    return ", ".join(names) if len(names) <= 8 else ", ".join(names[:8]) + ", ..."


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
        self.routing = routing.settings(document["alertmanager"], source, ConfigError)
        self.rate_window: str = document["rate_window"]
        self.quantiles: list[float] = [float(q) for q in document["quantiles"]]
        self.latency: Mapping[str, Any] = document["latency"]
        self.slo: Mapping[str, Any] = document["slo"]
        self.autoscaling: Mapping[str, Any] = document["autoscaling"]
        self.burn_windows = [
            BurnWindow(w["severity"], w["long"], w["short"], float(w["factor"]), w["for"])
            for w in document["slo"]["windows"]
        ]
        self._alerts: Mapping[str, Any] = document["alerts"]

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
        if selector and not _MATCHERS.match(selector):
            fail(f"selectors.{name}", 'expected label matchers without braces, e.g. job="x"')
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
    for slo in ("ttft", "availability"):
        objective = float(config.slo[slo]["objective"])
        if not 0 < objective < 1:
            fail(f"slo.{slo}.objective", f"must be between 0 and 1 (exclusive), got {objective}")
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


def load(path: Path | None = None) -> Config:
    """The defaults, with ``path`` (if given) on top; raises ConfigError on any bad field."""
    source = "inferwatch/mixin/config.yaml" if path is None else str(path)
    checker = _Checker(source)
    given = {} if path is None else _read(path, source)
    config = Config(checker.merge(defaults(), given, ""), source)

    def fail(where: str, reason: str) -> None:
        raise checker.fail(where, reason)

    _check_meaning(config, fail)
    return config


def _read(path: Path, source: str) -> Any:
    try:
        given = layer.load(path, source)
    except layer.ConfigError as exc:
        raise ConfigError(str(exc)) from None
    return {} if given is None else given
