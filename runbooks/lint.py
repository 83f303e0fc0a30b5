"""``runbooks check-config``'s warnings: mapping rules that parse but can never act.

A rule is dead when the receiver would refuse or never see every alert it names: the
namespace allow-list is empty; the alert is not one the shipped rules fire; the action's
breaker group has no population (or one too small for ``max_fraction`` to let one unit out);
or the rule needs a label (for a matcher, a ``{label}`` in its parameters, the namespace guard
or the action itself) that the alert's expression aggregates away. The labels an expression
keeps are read from its syntax tree (``promql-parser``): an aggregation keeps its ``by``
labels (or drops its ``without`` ones), a one-to-one binary operation with ``on``/``ignoring``
keeps the left side's matched labels, ``group_right`` the right side's, ``histogram_quantile``
drops ``le``, a recording rule's series what its expression keeps, and everything else what its
(left) operand keeps.
"""

from __future__ import annotations

import math
import re
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import promql_parser

from inferwatch import config as layer
from inferwatch.runbooks.config import NO_NAMESPACE, Config, Rule

#: the ``{label}`` placeholders of a parameter template (runbooks/actions/params.py)
PLACEHOLDER = re.compile(r"\{([A-Za-z_][A-Za-z0-9_]*)\}")
#: what each action reads from an alert beyond its parameters: labels, and the breaker groups
#: it counts in by default (its ``group`` parameter replaces them; "traffic" is not counted)
NEEDS: Mapping[str, tuple[frozenset[str], tuple[str, ...]]] = {
    "isolate_replica": (frozenset(), ("{model}",)),
    "shift_traffic": (frozenset({"model"}), ()),
    "kubernetes_isolate_node": (frozenset({"node"}), ("nodes",)),
    "kubernetes_request_gpu_reset": (frozenset({"node", "gpu_uuid"}), ("gpus",)),
    "kubernetes_restart_pod": (frozenset({"namespace", "pod"}), ("model {model}",)),
    "kubernetes_httproute_shift": (frozenset(), ()),
    # a reset request or a node isolation, by the XID's class (the critical alert's classes)
    "kubernetes_xid_remediation": (frozenset({"node"}), ("gpus", "nodes")),
}
#: parameters whose default reads a label: (action, parameter) -> the default template
DEFAULTS: Mapping[tuple[str, str], str] = {
    ("isolate_replica", "admin_url"): "http://{instance}/admin/isolation",
    ("kubernetes_httproute_shift", "namespace"): "{namespace}",
}


@dataclass(frozen=True)
class Kept:
    """The labels an expression's result keeps: ``only`` these (None: every label of its
    series), less ``dropped``."""

    only: frozenset[str] | None = None
    dropped: frozenset[str] = frozenset()

    def has(self, label: str) -> bool:
        if label in self.dropped:
            return False
        return self.only is None or label in self.only

    def restrict(self, labels: Iterable[str]) -> Kept:
        chosen = frozenset(labels)
        return Kept(chosen if self.only is None else self.only & chosen, self.dropped)

    def without(self, labels: Iterable[str]) -> Kept:
        return Kept(self.only, self.dropped | frozenset(labels))


def kept(expression: Any, recorded: Mapping[str, Kept]) -> Kept:
    """What a parsed PromQL expression keeps of its series' labels (see the module text); a
    series a recording rule makes keeps what that rule's expression keeps (``recorded``)."""
    kind = type(expression).__name__
    if kind == "VectorSelector":
        return recorded.get(expression.name or "", Kept())
    if kind == "MatrixSelector":
        return kept(expression.vector_selector, recorded)
    if kind == "AggregateExpr":
        inner = kept(expression.expr, recorded)
        if str(expression.op) in ("topk", "bottomk", "limitk", "limit_ratio"):
            return inner
        modifier = expression.modifier
        if modifier is None:
            return Kept(frozenset())
        if str(modifier).startswith("without"):
            return inner.without(modifier.labels)
        return inner.restrict(modifier.labels)
    if kind == "BinaryExpr":
        left, right = kept(expression.lhs, recorded), kept(expression.rhs, recorded)
        scalar = type(expression.rhs).__name__ == "NumberLiteral"
        modifier = expression.modifier
        matching = modifier.matching if modifier is not None else None
        card = str(modifier.card) if modifier is not None else ""
        if type(expression.lhs).__name__ == "NumberLiteral":
            return right
        if scalar or matching is None or str(expression.op) in ("and", "or", "unless"):
            return left
        if card.endswith("OneToMany"):
            return right
        if card.endswith("OneToOne"):
            on = str(matching).startswith("on")
            return left.restrict(matching.labels) if on else left.without(matching.labels)
        return left
    for attribute in ("expr", "args"):  # ParenExpr, UnaryExpr, SubqueryExpr; Call
        child = getattr(expression, attribute, None)
        if isinstance(child, list):
            vectors = [kept(a, recorded) for a in child if type(a).__name__ not in _SCALARS]
            result = vectors[0] if vectors else Kept(frozenset())
            return result.without({"le"}) if expression.func.name in _QUANTILES else result
        if child is not None:
            return kept(child, recorded)
    return Kept()


_SCALARS = ("NumberLiteral", "StringLiteral")
_QUANTILES = ("histogram_quantile",)


@dataclass(frozen=True)
class ShippedAlert:
    """One alerting rule as shipped: what its result keeps, and the labels it adds."""

    name: str
    keeps: Kept
    #: the labels the rule itself sets (severity)
    labels: Mapping[str, str]

    def has(self, label: str) -> bool:
        return label in self.labels or label == "alertname" or self.keeps.has(label)


def shipped_alerts(folder: Path) -> dict[str, list[ShippedAlert]]:
    """Every alerting rule of the rule files in ``folder`` (the generated ones), by name."""
    rules = [
        rule
        for path in sorted(folder.glob("*.yaml"))
        for group in (layer.load(path) or {}).get("groups", [])
        for rule in group.get("rules", [])
    ]
    recorded: dict[str, Kept] = {}
    for rule in rules:  # recording rules read only raw series and the ones before them
        if "record" in rule:
            recorded[rule["record"]] = kept(promql_parser.parse(rule["expr"]), recorded)
    found: dict[str, list[ShippedAlert]] = {}
    for rule in rules:
        if "alert" in rule:
            alert = ShippedAlert(
                rule["alert"],
                kept(promql_parser.parse(rule["expr"]), recorded),
                {str(k): str(v) for k, v in (rule.get("labels") or {}).items()},
            )
            found.setdefault(alert.name, []).append(alert)
    return found


def warnings(config: Config, alerts: Mapping[str, list[ShippedAlert]]) -> list[str]:
    """One line per way a rule (or the whole mapping) can never act."""
    found: list[str] = []
    if not config.namespaces:
        found.append("namespaces: the allow-list is empty, so every alert is refused")
    for index, rule in enumerate(config.rules):
        where = f"rules[{index}] ({rule.name})"
        found += [f"{where}: {reason}" for reason in _rule_warnings(config, rule, alerts)]
    return found


def _rule_warnings(
    config: Config, rule: Rule, alerts: Mapping[str, list[ShippedAlert]]
) -> list[str]:
    fired = alerts.get(rule.alertname)
    if not fired:
        return [f"alert {rule.alertname} is not one the shipped rules fire"]
    # the shipped rules of that name whose own labels (severity) the matchers accept
    candidates = [
        alert for alert in fired
        if all(m.matches(alert.labels) for m in rule.matchers if m.label in alert.labels)
    ]  # fmt: skip
    if not candidates:
        return [f"no shipped rule of {rule.alertname} has labels its matchers accept"]
    reasons = []
    lost = sorted(
        label for label in _needed(config, rule)
        if not any(alert.has(label) for alert in candidates)
    )  # fmt: skip
    if lost:
        reasons.append(
            f"needs label(s) {', '.join(lost)}, which {rule.alertname}'s expression "
            "aggregates away"
        )
    reasons += _population_warnings(config, rule)
    return reasons


def _templates(rule: Rule) -> list[str]:
    """Every text the action fills from the alert's labels: its parameters and defaults."""
    texts = list(_strings(rule.params))
    for (action, parameter), default in DEFAULTS.items():
        if action == rule.action and parameter not in rule.params:
            texts.append(default)
    return texts


def _strings(value: Any) -> Iterable[str]:
    if isinstance(value, str):
        yield value
    elif isinstance(value, Mapping):
        for item in value.values():
            yield from _strings(item)
    elif isinstance(value, list):
        for item in value:
            yield from _strings(item)


def _needed(config: Config, rule: Rule) -> set[str]:
    labels, groups = NEEDS.get(rule.action, (frozenset(), ()))
    needed = set(labels)
    for text in [*_templates(rule), *(groups if "group" not in rule.params else ())]:
        needed.update(PLACEHOLDER.findall(text))
    needed.update(m.label for m in rule.matchers if not m.matches({}))
    if NO_NAMESPACE not in config.namespaces and "*" not in config.namespaces:
        needed.add("namespace")
    return needed


def _population_warnings(config: Config, rule: Rule) -> list[str]:
    _, defaults = NEEDS.get(rule.action, (frozenset(), ()))
    group = rule.params.get("group")
    groups = [group] if isinstance(group, str) else list(defaults)
    reasons = []
    populations = config.breaker.populations
    for template in groups:
        pattern = re.compile(
            "".join(".+" if part.startswith("{") else re.escape(part)
                    for part in re.split(r"(\{[A-Za-z_][A-Za-z0-9_]*\})", template) if part)
        )  # fmt: skip
        counts = [count for name, count in populations.items() if pattern.fullmatch(name)]
        if not counts:
            reasons.append(f"breaker.populations names no group {template!r} for {rule.action}")
        elif all(math.floor(config.breaker.max_fraction * count) < 1 for count in counts):
            reasons.append(
                f"breaker.max_fraction {config.breaker.max_fraction:g} of group {template!r}"
                f" ({max(counts)} at most) lets no unit out"
            )
    return reasons
