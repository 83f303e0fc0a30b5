"""Which targets an action may touch: an inventory the receiver trusts, never a label alone.

An alert's labels only *select*: they must match exactly one entry of the action's inventory,
or the action is refused (and audited). The entry's own labels then replace the alert's
(``instance``, ``pod``, ``namespace``, ``node``, ``model``), so a URL, a node name or the sidecar
token can only ever go to a listed target, and the breaker counts the entry's population with
the size the inventory gives it. Three kinds, one per family of actions
(:data:`KIND_OF_ACTION`):

- ``replicas`` (sidecars and pods): identified by ``instance``, ``pod`` or ``replica``, qualified
  by ``namespace`` and ``model``; population: the entry's ``model``.
- ``nodes`` (GPU nodes): identified by ``node``; population: the entry's ``pool`` (``nodes``).
- ``gateway`` (HAProxy backends): identified by ``model``, whose backend HAProxy must list.

Sources: ``static`` (a list in the config: the demo's and the drill's topology),
``kubernetes`` (pods or nodes listed by label selector) and ``haproxy`` (the Runtime API's
``show servers state``). Every listing is bounded: a source over :data:`MAX_ENTRIES` fails.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any, Literal, Protocol

from inferwatch.runbooks.haproxy_runtime import RuntimeApi, RuntimeApiError
from inferwatch.runbooks.registry import MissingExtra
from inferwatch.wire import backend_name

Kind = Literal["replicas", "nodes", "gateway"]
KINDS: tuple[Kind, ...] = ("replicas", "nodes", "gateway")
#: the inventory each action's targets come from (actions not listed name theirs in the rule)
KIND_OF_ACTION: Mapping[str, Kind] = {
    "isolate_replica": "replicas",
    "kubernetes_restart_pod": "replicas",
    "kubernetes_isolate_node": "nodes",
    "kubernetes_xid_remediation": "nodes",
    "kubernetes_request_gpu_reset": "nodes",
    "shift_traffic": "gateway",
}
#: per kind: labels that identify an entry, and labels that must agree when both carry them
RULES: Mapping[Kind, tuple[tuple[str, ...], tuple[str, ...]]] = {
    "replicas": (("instance", "pod", "replica"), ("namespace", "model")),
    "nodes": (("node",), ()),
    "gateway": (("model",), ()),
}
#: the label of an entry that names its population, and the population when it has none
POPULATION: Mapping[Kind, tuple[str, str]] = {
    "replicas": ("model", "replicas"),
    "nodes": ("pool", "nodes"),
    "gateway": ("model", "gateway"),
}
MAX_ENTRIES = 5000


class Refused(Exception):
    """No entry, or more than one, matches the alert: the action is refused."""


@dataclass(frozen=True)
class Entry:
    labels: Mapping[str, str]
    population: str


def entry(kind: Kind, labels: Mapping[str, str]) -> Entry:
    label, default = POPULATION[kind]
    return Entry(dict(labels), labels.get(label) or default)


def match(kind: Kind, entries: Sequence[Entry], labels: Mapping[str, str]) -> Entry:
    """The one entry the alert's labels name (see the module docstring), else :class:`Refused`."""
    identifying, qualifiers = RULES[kind]
    named = {k: labels[k] for k in identifying if labels.get(k)}
    if not named:
        raise Refused(f"the alert names no {kind} entry (no {', '.join(identifying)} label)")
    found = [
        e
        for e in entries
        if any(e.labels.get(k) == v for k, v in named.items())
        and all(e.labels.get(k, v) == v for k, v in named.items())
        and all(e.labels.get(k, labels[k]) == labels[k] for k in qualifiers if labels.get(k))
    ]
    shown = ", ".join(f"{k}={v[:64]!r}" for k, v in sorted(named.items()))
    if not found:
        raise Refused(f"no {kind} inventory entry matches {shown}")
    if len(found) > 1:
        raise Refused(f"{len(found)} {kind} inventory entries match {shown}; expected one")
    return found[0]


class Source(Protocol):
    kind: Kind

    async def entries(self) -> Sequence[Entry]:
        """What the source lists now; raises :class:`Refused` when it cannot say."""
        ...


class Static:
    """A list fixed in the config (the demo's and the drill's topology)."""

    def __init__(self, kind: Kind, listed: Sequence[Mapping[str, str]]) -> None:
        self.kind = kind
        self._entries = [entry(kind, labels) for labels in listed]

    async def entries(self) -> Sequence[Entry]:
        return self._entries


class HAProxyBackends:
    """The gateway's backends as HAProxy's Runtime API lists them (``show servers state``)."""

    kind: Kind = "gateway"

    def __init__(self, runtime: str) -> None:
        self.api = RuntimeApi(runtime)

    async def entries(self) -> Sequence[Entry]:
        try:
            answer = await self.api.command("show servers state")
        except RuntimeApiError as exc:
            raise Refused(f"gateway inventory: {exc}") from None
        backends = sorted(
            {row.split()[1] for row in answer.splitlines() if len(row.split()) > 3} - {"be_name"}
        )
        return [Entry({"backend": name}, name) for name in backends[:MAX_ENTRIES]]

    async def match(self, labels: Mapping[str, str]) -> Entry:
        model = labels.get("model", "")
        if not model:
            raise Refused("the alert names no gateway entry (no model label)")
        backend = backend_name(model)
        found = [e for e in await self.entries() if e.labels["backend"] == backend]
        if not found:
            raise Refused(f"haproxy lists no backend {backend!r} for model {model[:64]!r}")
        return Entry({"model": model, "backend": backend}, model)


class Inventory:
    """Every configured source, by kind; the receiver's one way to name a target."""

    def __init__(self, sources: Mapping[Kind, Source]) -> None:
        self.sources = dict(sources)

    async def resolve(self, action: str, labels: Mapping[str, str]) -> tuple[Entry, int] | None:
        """The entry ``labels`` name for ``action``, and the size of its population;
        ``None`` for an action whose targets the rule itself names. Raises :class:`Refused`."""
        kind = KIND_OF_ACTION.get(action)
        if kind is None:
            return None
        source = self.sources.get(kind)
        if source is None:
            raise Refused(f"no {kind} inventory is configured, so {action} has no valid target")
        listed = await source.entries()
        if isinstance(source, HAProxyBackends):
            found = await source.match(labels)
        else:
            found = match(kind, listed, labels)
        size = sum(1 for e in listed if e.population == found.population)
        return found, max(size, 1)


def kubernetes_source(kind: Kind, settings: Mapping[str, Any]) -> Source:
    """Pods (``replicas``) or nodes (``nodes``) listed by label selector (kubernetes extra)."""
    try:
        from inferwatch.runbooks.kube_inventory import Nodes, Pods
    except ImportError as exc:
        raise MissingExtra(
            f"inventory.{kind}: needs {exc.name or exc}; install inferwatch[kubernetes]"
        ) from None

    if kind == "replicas":
        return Pods(**settings)
    if kind == "nodes":
        return Nodes(**settings)
    raise ValueError(f"inventory.{kind}: kubernetes lists only replicas and nodes")


def build(spec: Mapping[str, Mapping[str, Any]]) -> Inventory:
    """The inventory of a config's ``inventory`` section (checked by the config loader)."""
    sources: dict[Kind, Source] = {}
    for kind in KINDS:
        section = spec.get(kind)
        if not section:
            continue
        if "static" in section:
            sources[kind] = Static(kind, section["static"])
        elif "haproxy" in section:
            sources[kind] = HAProxyBackends(str(section["haproxy"]["runtime"]))
        else:
            sources[kind] = kubernetes_source(kind, section["kubernetes"])
    return Inventory(sources)
