"""``runbooks check-config``'s warnings: mapping rules that parse but can never act.

A rule is dead when the receiver would refuse or never see every alert it names: the
namespace allow-list is empty; the alert is not one the shipped rules fire; the action's
inventory kind is not configured; its inventory is a static list whose every population is
too small for ``breaker.max_fraction`` to let one target out (the size of a Kubernetes or
HAProxy listing is known only when the receiver asks); or the rule needs a label that the
alert's expression aggregates away: one that names the inventory entry, a matcher's, a
``{label}`` in its parameters the entry does not supply, the action's own, or the namespace
for an action without an inventory (the guard then reads the alert's). The labels an expression
keeps are read from its syntax tree (``promql-parser``): an aggregation keeps its ``by``
labels (or drops its ``without`` ones), a one-to-one binary operation with ``on``/``ignoring``
keeps the left side's matched labels, ``group_right`` the right side's, ``histogram_quantile``
drops ``le``, a recording rule's series what its expression keeps, and everything else what its
(left) operand keeps.
"""

from __future__ import annotations

import math
import re
from collections import Counter
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import promql_parser

from inferwatch import config as layer
from inferwatch.runbooks import inventory
from inferwatch.runbooks.config import NO_NAMESPACE, Config, Rule

#: the ``{label}`` placeholders of a parameter template (runbooks/actions/params.py)
PLACEHOLDER = re.compile(r"\{([A-Za-z_][A-Za-z0-9_]*)\}")
#: what each action reads from the alert itself beyond its parameters and inventory entry
NEEDS: Mapping[str, frozenset[str]] = {
    "kubernetes_request_gpu_reset": frozenset({"gpu_uuid"}),
}
#: the labels an entry of each inventory kind supplies in place of the alert's
#: (runbooks/inventory.py, runbooks/kube_inventory.py)
SUPPLIED: Mapping[str, frozenset[str]] = {
    "replicas": frozenset({"instance", "pod", "replica", "namespace", "model", "node"}),
    "nodes": frozenset({"node", "pool"}),
    "gateway": frozenset({"model", "backend"}),
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
    kind = inventory.KIND_OF_ACTION.get(rule.action)
    if kind is not None and kind not in config.inventory:
        return [f"inventory.{kind} is not configured, so {rule.action} has no valid target"]
    reasons = []
    lost = sorted(
        label for label in _needed(config, rule, kind)
        if not any(alert.has(label) for alert in candidates)
    )  # fmt: skip
    if lost:
        reasons.append(
            f"needs label(s) {', '.join(lost)}, which {rule.alertname}'s expression aggregates away"
        )
    if kind is not None:
        identifying = inventory.RULES[kind][0]
        if not any(alert.has(label) for alert in candidates for label in identifying):
            reasons.append(
                f"needs one of label(s) {', '.join(identifying)} to name its {kind} entry, "
                f"which {rule.alertname}'s expression aggregates away"
            )
        reasons += _population_warnings(config, kind)
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


def _needed(config: Config, rule: Rule, kind: inventory.Kind | None) -> set[str]:
    needed = set(NEEDS.get(rule.action, ()))
    for text in _templates(rule):
        needed.update(PLACEHOLDER.findall(text))
    if kind is not None:
        needed -= SUPPLIED[kind]  # the entry's labels replace the alert's
    needed.update(m.label for m in rule.matchers if not m.matches({}))
    # an inventory's entry carries the namespace the guard checks
    guarded = NO_NAMESPACE not in config.namespaces and "*" not in config.namespaces
    if guarded and kind is None:
        needed.add("namespace")
    return needed


def _population_warnings(config: Config, kind: inventory.Kind) -> list[str]:
    """A static inventory whose every population is too small to let one target out."""
    listed = config.inventory[kind].get("static")
    if listed is None:
        return []
    sizes = Counter(inventory.entry(kind, labels).population for labels in listed)
    fraction = config.breaker.max_fraction
    if any(math.floor(fraction * size) >= 1 for size in sizes.values()):
        return []
    largest = max(sizes.values(), default=0)
    return [
        f"breaker.max_fraction {fraction:g} of the static {kind} inventory's populations "
        f"({largest} at most) lets no target out"
    ]
