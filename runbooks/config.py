"""The receiver's mapping config: which alerts start which action, and the guards around them.

Checked in full when loaded; every mistake is one line, ``<file>: <field path>: <reason>``.
A rule matches an alert by name and by Alertmanager-style label matchers (``=``, ``!=``,
``=~``, ``!~``; regular expressions are anchored, as in Alertmanager) and names an action
from the registry with its parameters. Durations are written ``30s``, ``10m``, ``1h``.
"""

from __future__ import annotations

import re
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from inferwatch import yamlfile
from inferwatch.runbooks import registry

_DURATION = re.compile(r"^(\d+(?:\.\d+)?)(ms|s|m|h|d)$")
_UNITS = {"ms": 0.001, "s": 1.0, "m": 60.0, "h": 3600.0, "d": 86400.0}
_MATCHER = re.compile(r'^\s*([A-Za-z_][A-Za-z0-9_]*)\s*(=~|!~|!=|=)\s*"(.*)"\s*$')
#: the namespace an alert without a ``namespace`` label is in, for the allow-list
NO_NAMESPACE = ""


class ConfigError(ValueError):
    """A mapping config that cannot be used; the message names file, field and reason."""


@dataclass(frozen=True)
class Matcher:
    label: str
    op: str
    value: str

    def matches(self, labels: Mapping[str, str]) -> bool:
        actual = labels.get(self.label, "")
        if self.op in ("=", "!="):
            return (actual == self.value) == (self.op == "=")
        return (re.fullmatch(self.value, actual) is not None) == (self.op == "=~")


@dataclass(frozen=True)
class Rule:
    name: str
    alertname: str
    matchers: tuple[Matcher, ...]
    action: str
    params: Mapping[str, Any]
    cooldown: float
    #: seconds after the alert resolves before the action is reverted; None: never
    rollback_after: float | None

    def matches(self, labels: Mapping[str, str]) -> bool:
        return labels.get("alertname") == self.alertname and all(
            m.matches(labels) for m in self.matchers
        )


@dataclass(frozen=True)
class Breaker:
    """At most ``max_fraction`` of a group's ``populations[group]`` units out within ``window``."""

    max_fraction: float
    window: float
    populations: Mapping[str, int] = field(default_factory=dict)


@dataclass(frozen=True)
class Config:
    rules: tuple[Rule, ...]
    namespaces: frozenset[str]
    breaker: Breaker
    execute: bool = False
    #: per action name, the keyword arguments its class is built with (token files, timeouts)
    action_settings: Mapping[str, Mapping[str, Any]] = field(default_factory=dict)

    def rules_for(self, labels: Mapping[str, str]) -> list[Rule]:
        return [rule for rule in self.rules if rule.matches(labels)]

    def namespace_allowed(self, labels: Mapping[str, str]) -> bool:
        return "*" in self.namespaces or labels.get("namespace", NO_NAMESPACE) in self.namespaces


def duration(value: Any) -> float | None:
    """Seconds in ``30s``/``10m``/``1h``; None when it is not such a duration."""
    match = _DURATION.match(str(value))
    return float(match.group(1)) * _UNITS[match.group(2)] if match else None


class _Reader:
    def __init__(self, source: str, raw: Any, path: str) -> None:
        if not isinstance(raw, dict):
            raise ConfigError(f"{source}: {path or 'top level'}: expected a mapping")
        self.source, self.raw, self.path = source, raw, path

    def error(self, key: str, reason: str) -> ConfigError:
        where = f"{self.path}.{key}" if self.path else key
        return ConfigError(f"{self.source}: {where}: {reason}")

    def check_keys(self, allowed: set[str], required: set[str] | None = None) -> None:
        for key in self.raw:
            if key not in allowed:
                raise self.error(str(key), f"unknown field (expected one of {sorted(allowed)})")
        for key in sorted((required or set()) - set(self.raw)):
            raise self.error(key, "is required")

    def child(self, key: str) -> _Reader:
        return _Reader(self.source, self.raw.get(key) or {}, f"{self.path}.{key}".lstrip("."))

    def text(self, key: str) -> str:
        value = self.raw.get(key)
        if not isinstance(value, str) or not value:
            raise self.error(key, "expected a non-empty string")
        return value

    def duration(self, key: str, default: str | None) -> float | None:
        value = self.raw.get(key, default)
        if value is None:
            return None
        seconds = duration(value)
        if seconds is None:
            raise self.error(key, f"{value!r} is not a duration such as 30s, 10m or 1h")
        return seconds


def _matchers(reader: _Reader) -> tuple[Matcher, ...]:
    raw = reader.raw.get("matchers", [])
    if not isinstance(raw, list):
        raise reader.error("matchers", 'expected a list such as [severity="critical"]')
    out = []
    for i, text in enumerate(raw):
        match = _MATCHER.match(text) if isinstance(text, str) else None
        if not match:
            raise reader.error(f"matchers[{i}]", f'{text!r} is not label="value" (=, !=, =~, !~)')
        label, op, value = match.groups()
        if op in ("=~", "!~"):
            try:
                re.compile(value)
            except re.error as exc:
                raise reader.error(f"matchers[{i}]", f"bad regular expression: {exc}") from None
        out.append(Matcher(label, op, value))
    return tuple(out)


def _rule(reader: _Reader) -> Rule:
    reader.check_keys(
        {"name", "alertname", "matchers", "action", "params", "cooldown", "rollback_after"},
        {"name", "alertname", "action"},
    )
    action = reader.text("action")
    if action not in registry.ACTIONS:
        raise reader.error("action", f"{action!r} is not one of {sorted(registry.ACTIONS)}")
    params = reader.raw.get("params") or {}
    if not isinstance(params, dict):
        raise reader.error("params", "expected a mapping")
    cooldown = reader.duration("cooldown", "30m")
    assert cooldown is not None
    return Rule(
        name=reader.text("name"),
        alertname=reader.text("alertname"),
        matchers=_matchers(reader),
        action=action,
        params=params,
        cooldown=cooldown,
        rollback_after=reader.duration("rollback_after", None),
    )


def _breaker(reader: _Reader) -> Breaker:
    reader.check_keys({"max_fraction", "window", "populations"}, {"max_fraction", "populations"})
    fraction = reader.raw["max_fraction"]
    if (
        not isinstance(fraction, (int, float))
        or isinstance(fraction, bool)
        or not 0 < fraction <= 1
    ):
        raise reader.error("max_fraction", "expected a number in (0, 1]")
    populations = reader.raw["populations"]
    if not isinstance(populations, dict):
        raise reader.error("populations", "expected a mapping of group to unit count")
    for group, count in populations.items():
        if not isinstance(count, int) or isinstance(count, bool) or count < 1:
            raise reader.error(f"populations.{group}", "expected a positive integer")
    window = reader.duration("window", "1h")
    assert window is not None
    return Breaker(float(fraction), window, {str(k): v for k, v in populations.items()})


def parse(document: Any, source: str = "<config>") -> Config:
    top = _Reader(source, document, "")
    top.check_keys(
        {"execute", "namespaces", "breaker", "rules", "actions"}, {"namespaces", "breaker"}
    )
    namespaces = top.raw["namespaces"]
    if not isinstance(namespaces, list) or not all(isinstance(n, str) for n in namespaces):
        raise top.error("namespaces", 'expected a list of namespaces ("*": any, "": none set)')
    execute = top.raw.get("execute", False)
    if not isinstance(execute, bool):
        raise top.error("execute", "expected true or false")
    rules_raw = top.raw.get("rules") or []
    if not isinstance(rules_raw, list):
        raise top.error("rules", "expected a list")
    rules = tuple(_rule(_Reader(source, raw, f"rules[{i}]")) for i, raw in enumerate(rules_raw))
    names = [rule.name for rule in rules]
    duplicates = sorted({name for name in names if names.count(name) > 1})
    if duplicates:
        raise top.error("rules", f"duplicate rule names {duplicates}")
    settings = top.child("actions").raw
    for name, values in settings.items():
        if name not in registry.ACTIONS or not isinstance(values, dict):
            raise top.error(f"actions.{name}", "expected a registered action name and a mapping")
    return Config(
        rules, frozenset(namespaces), _breaker(top.child("breaker")), execute, dict(settings)
    )


def load(path: str | Path) -> Config:
    return parse(yamlfile.load(path, ConfigError), str(path))
