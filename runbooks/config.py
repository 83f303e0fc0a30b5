"""The receiver's mapping config: which alerts start which action, and the guards around them.

Checked in full when loaded; every mistake is one line, ``<file>: <field path>: <reason>``.
A rule matches an alert by name and by Alertmanager-style label matchers (``=``, ``!=``,
``=~``, ``!~``; regular expressions are anchored, as in Alertmanager) and names an action
from the registry with its parameters. Durations are Prometheus durations (``30s``, ``1h30m``).
"""

from __future__ import annotations

import re
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from inferwatch import config as layer
from inferwatch.config import Fields
from inferwatch.runbooks import inventory, registry

_MATCHER = re.compile(r'^\s*([A-Za-z_][A-Za-z0-9_]*)\s*(=~|!~|!=|=)\s*"(.*)"\s*$')
#: the namespace an alert without a ``namespace`` label is in, for the allow-list
NO_NAMESPACE = ""


class ConfigError(layer.ConfigError):
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
    """At most ``max_fraction`` of a population's units out within ``window`` (the population
    and its size are the inventory's)."""

    max_fraction: float
    window: float


@dataclass(frozen=True)
class Config:
    rules: tuple[Rule, ...]
    namespaces: frozenset[str]
    breaker: Breaker
    execute: bool = False
    #: per action name, the keyword arguments its class is built with (token files, timeouts)
    action_settings: Mapping[str, Mapping[str, Any]] = field(default_factory=dict)
    #: per inventory kind, its one source and that source's settings (see ``inventory``)
    inventory: Mapping[str, Mapping[str, Any]] = field(default_factory=dict)
    #: seconds between read-backs of every active episode's targets (re-asserted if lost);
    #: None: only a redelivered alert reads its targets back
    reassert_every: float | None = None

    def rules_for(self, labels: Mapping[str, str]) -> list[Rule]:
        return [rule for rule in self.rules if rule.matches(labels)]

    def namespace_allowed(self, labels: Mapping[str, str]) -> bool:
        return "*" in self.namespaces or labels.get("namespace", NO_NAMESPACE) in self.namespaces


def _seconds(fields: Fields, key: str, default: str | None) -> float | None:
    """A duration field in seconds; None when it is absent and has no default."""
    value = fields.raw.get(key, default)
    return None if value is None else fields.duration(key, value).seconds


def _matchers(reader: Fields) -> tuple[Matcher, ...]:
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


def _rule(reader: Fields) -> Rule:
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
    cooldown = _seconds(reader, "cooldown", "30m")
    assert cooldown is not None
    return Rule(
        name=reader.text("name"),
        alertname=reader.text("alertname"),
        matchers=_matchers(reader),
        action=action,
        params=params,
        cooldown=cooldown,
        rollback_after=_seconds(reader, "rollback_after", None),
    )


def _breaker(reader: Fields) -> Breaker:
    reader.check_keys({"max_fraction", "window"}, {"max_fraction"})
    fraction = reader.raw["max_fraction"]
    if (
        not isinstance(fraction, (int, float))
        or isinstance(fraction, bool)
        or not 0 < fraction <= 1
    ):
        raise reader.error("max_fraction", "expected a number in (0, 1]")
    window = _seconds(reader, "window", "1h")
    assert window is not None
    return Breaker(float(fraction), window)


#: per source, its settings: (known, required)
_SOURCES: Mapping[str, tuple[set[str], set[str]]] = {
    "kubernetes": ({"selector", "host", "kubeconfig"}, {"selector"}),
    "haproxy": ({"runtime"}, {"runtime"}),
}
#: per kind listed from Kubernetes, the settings only it takes: (known, required)
_KUBERNETES_KINDS: Mapping[str, tuple[set[str], set[str]]] = {
    "replicas": ({"namespace", "port", "model_label", "population_label"}, {"namespace", "port"}),
    "nodes": ({"pool_label"}, set()),
}


def _inventory(reader: Fields) -> dict[str, dict[str, Any]]:
    reader.check_keys(set(inventory.KINDS), set())
    out: dict[str, dict[str, Any]] = {}
    for kind in inventory.KINDS:
        if kind not in reader.raw:
            continue
        section = reader.child(kind)
        if len(section.raw) != 1:
            raise reader.error(kind, "expected one source: static, kubernetes or haproxy")
        source, settings = next(iter(section.raw.items()))
        if source == "static":
            if not isinstance(settings, list) or len(settings) > inventory.MAX_ENTRIES:
                raise section.error(
                    "static", f"expected a list of at most {inventory.MAX_ENTRIES} label maps"
                )
            for i, labels in enumerate(settings):
                if not isinstance(labels, dict) or not all(
                    isinstance(k, str) and isinstance(v, str) for k, v in labels.items()
                ):
                    raise section.error(f"static[{i}]", "expected a map of label to string")
            out[kind] = {"static": [dict(labels) for labels in settings]}
            continue
        allowed = {"replicas": {"kubernetes"}, "nodes": {"kubernetes"}, "gateway": {"haproxy"}}
        if source not in allowed[kind]:
            raise section.error(
                str(source),
                f"a {kind} inventory comes from static or {', '.join(sorted(allowed[kind]))}",
            )
        fields = section.child(source)
        known, required = _SOURCES[source]
        if source == "kubernetes":
            own, needed = _KUBERNETES_KINDS[kind]
            known, required = known | own, required | needed
        fields.check_keys(known, required)
        if kind == "replicas" and not isinstance(fields.raw["port"], int):
            raise fields.error("port", "expected the sidecars' port number")
        out[kind] = {source: dict(fields.raw)}
    return out


def parse(document: Any, source: str = "<config>") -> Config:
    top = Fields(source, document, "", ConfigError)
    top.check_keys(
        {"execute", "namespaces", "breaker", "rules", "actions", "inventory", "reassert_every"},
        {"namespaces", "breaker"},
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
    rules = tuple(
        _rule(Fields(source, raw, f"rules[{i}]", ConfigError)) for i, raw in enumerate(rules_raw)
    )
    names = [rule.name for rule in rules]
    duplicates = sorted({name for name in names if names.count(name) > 1})
    if duplicates:
        raise top.error("rules", f"duplicate rule names {duplicates}")
    settings = top.child("actions").raw
    for name, values in settings.items():
        if name not in registry.ACTIONS or not isinstance(values, dict):
            raise top.error(f"actions.{name}", "expected a registered action name and a mapping")
    reassert = _seconds(top, "reassert_every", None)
    return Config(
        rules,
        frozenset(namespaces),
        _breaker(top.child("breaker")),
        execute,
        dict(settings),
        _inventory(top.child("inventory")),
        reassert,
    )


def load(path: str | Path) -> Config:
    try:
        document = layer.load(path)
    except layer.ConfigError as exc:
        raise ConfigError(str(exc)) from None
    return parse(document, str(path))
