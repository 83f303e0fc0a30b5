"""The proxy's YAML configuration, checked in full when it is loaded.

Every mistake is reported as ``<file>: <field path>: <reason>`` so that an operator can fix a
ConfigMap without reading code. API keys are never stored: tenants list the SHA-256 of their
keys (``printf %s "$KEY" | sha256sum``).

``quality_sampling: {rate: 0.01}`` screens that share of chat and completion responses with
the cheap degeneracy checks (empty output, repetition loops, wrong script) and counts what
fires per model and model version; 0 turns it off. The text of a sampled response is held in
memory only until it has been screened, and never written anywhere. Requests of the probe
runner's reserved tenant ``_probe`` are never sampled (the probes screen their own replies).

``upstream.probe_metrics: [http://127.0.0.1:9400/metrics]`` names the ``/metrics`` of probe
runners that send their probes straight to this engine (the sidecar with ``--probes``; its
warm-up requests too): their tokens are engine load that never passes the proxy, added to
what the proxy charged when it reconciles with the engine's counters (see ``reconcile``).
"""

from __future__ import annotations

import ipaddress
import re
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Literal

from inferwatch import config as layer
from inferwatch.config import schema as _schema
from inferwatch.proxy import routes, sharedconfig
from inferwatch.proxy.sharedconfig import FailurePolicy, SharedState
from inferwatch.wire import PROBE_TENANT, SPLIT_HEADER, TENANT_HEADER

UnknownPolicy = Literal["reject", "attribute"]
PRIORITIES = {"high": 0, "normal": 1, "low": 2}
# Tenant ids start with a letter or digit; the one exception is the probe runner's tenant.
TENANT_PATTERN = re.compile(rf"^(?:{PROBE_TENANT}|[A-Za-z0-9][A-Za-z0-9._:@/-]{{0,127}})$")
_SHA256 = re.compile(r"^[0-9a-f]{64}$")
HTTP_URL = re.compile(r"^https?://[^/\s]+(/\S*)?$")
RESERVED_TENANTS = ("unknown", "other")
#: names a client may never claim through the tenant header (the probe tenant needs a key)
HEADER_RESERVED_TENANTS = frozenset({*RESERVED_TENANTS, PROBE_TENANT})
OverBudget = Literal["clamp", "reject"]
#: the share of queued slots each waiting lower priority class is owed by default, and the
#: most it may be set to (two lower classes: 0.6 at most, the rest the best class's)
MIN_CLASS_SHARE = 0.1
MAX_CLASS_SHARE = 0.3


class ConfigError(layer.ConfigError):
    """A configuration file that cannot be used; the message names file, field and reason."""


@dataclass(frozen=True)
class Budget:
    tokens: int
    window_seconds: float
    #: tokens a window may be overspent by: room for prompt counts below the engine's own
    tolerance: int = 0


@dataclass(frozen=True)
class Limit:
    """Per-minute rates (0: no limit of that kind)."""

    requests_per_minute: int = 0
    tokens_per_minute: int = 0

    def per_minute(self, kind: str) -> int:
        return self.requests_per_minute if kind == "requests" else self.tokens_per_minute


@dataclass(frozen=True)
class RateLimits:
    tenant: Limit = field(default_factory=Limit)
    #: model name -> this tenant's limits for it, on top of the tenant's own
    models: Mapping[str, Limit] = field(default_factory=dict)


@dataclass(frozen=True)
class Tenant:
    name: str
    key_hashes: tuple[str, ...] = ()
    priority: int = PRIORITIES["normal"]
    max_concurrency: int = 0  # 0: no cap of its own
    #: its share of slots against the other tenants of its priority class when queued
    weight: int = 1
    budget: Budget | None = None
    #: what its budget does while the shared state is unreachable (None: the section's)
    failure_policy: FailurePolicy | None = None
    rate_limits: RateLimits | None = None


@dataclass(frozen=True)
class Price:
    """Currency units per million tokens of each disjoint kind."""

    prompt: float = 0.0
    cached_prompt: float = 0.0
    completion: float = 0.0

    def cost(self, prompt: int, cached_prompt: int, completion: int) -> float:
        uncached = max(prompt - cached_prompt, 0)
        return (
            uncached * self.prompt
            + min(cached_prompt, prompt) * self.cached_prompt
            + completion * self.completion
        ) / 1e6


@dataclass(frozen=True)
class Versions:
    """Defaults for the three versions, and the request headers that override them."""

    model_version: str = ""
    engine_version: str = ""
    prompt_version: str = ""
    model_version_header: str = "x-model-version"
    engine_version_header: str = "x-engine-version"
    prompt_version_header: str = "x-prompt-version"


@dataclass(frozen=True)
class Serving:
    """Where ``inferwatch proxy`` serves and how long it drains: its flags' defaults."""

    #: clients call this instead of the engine
    listen: str = "0.0.0.0:8080"
    #: the proxy's own /metrics, per-tenant series included: pod-internal
    metrics_listen: str = "127.0.0.1:9402"
    #: seconds SIGTERM lets in-flight requests finish
    drain_grace: float = 25.0


@dataclass(frozen=True)
class ProxyConfig:
    upstream_url: str = "http://127.0.0.1:8000"
    connect_timeout_s: float = 5.0
    read_timeout_s: float = 300.0
    #: ask the engine for cumulative usage on every chunk (vLLM ``continuous_usage_stats``)
    continuous_usage: bool = False
    upstream_health_path: str = "/health"
    upstream_metrics_path: str = "/metrics"
    reconcile_interval: float = 15.0
    #: /metrics of probe runners that probe the engine directly (their tokens bypass the proxy)
    probe_metrics_urls: tuple[str, ...] = ()
    tenants: Mapping[str, Tenant] = field(default_factory=dict)
    tenant_header: str = TENANT_HEADER.lower()
    trusted_sources: tuple[ipaddress.IPv4Network | ipaddress.IPv6Network, ...] = ()
    unknown_policy: UnknownPolicy = "reject"
    max_tenant_labels: int = 100
    tenant_idle_seconds: float = 600.0
    max_version_labels: int = 20
    #: model and version label values idle this long give their slot back
    value_idle_seconds: float = 600.0
    versions: Versions = field(default_factory=Versions)
    default_price: Price = field(default_factory=Price)
    prices: Mapping[str, Price] = field(default_factory=dict)
    max_input_tokens: int = 0  # 0: no limit
    #: tokenizer.json of the served model, for exact prompt counts ("" : a byte bound)
    tokenizer: str = ""
    #: completion cap reserved (and sent) for a budgeted request that sets none
    default_max_tokens: int = 4096
    over_budget: OverBudget = "clamp"
    #: longest wait for a request's headers, and for its whole body
    header_timeout_s: float = 10.0
    body_timeout_s: float = 30.0
    #: an idle keep-alive connection is closed after this long
    keep_alive_timeout_s: float = 5.0
    max_header_bytes: int = 64 << 10
    passthrough: tuple[str, ...] = routes.DEFAULT_PASSTHROUGH
    max_body_bytes: int = 8 << 20
    max_response_bytes: int = 64 << 20
    max_concurrency: int = 0  # 0: no global cap
    queue_timeout_s: float = 10.0
    #: requests waiting for a slot at most; past it the lowest priority is shed (0: no bound)
    max_queue: int = 0
    #: share of queued slots each waiting lower priority class is owed (0: strict priority)
    min_class_share: float = MIN_CLASS_SHARE
    #: share of chat/completion responses screened for degenerate output (0: none)
    quality_sample_rate: float = 0.01
    #: the fleet's Redis, where budgets are kept for every proxy replica (None: in this process)
    shared_state: SharedState | None = None
    #: the usage log's directory ("" : no usage log), file size to rotate at, files kept
    usage_log_dir: str = ""
    usage_log_rotate_bytes: int = 64 << 20
    usage_log_retain_files: int = 100
    #: lines the usage log's Redis stream keeps, about (0: no stream; see :mod:`.usagestream`)
    usage_log_stream_maxlen: int = 0

    def price(self, model: str) -> Price:
        return self.prices.get(model, self.default_price)

    @property
    def gateway_headers(self) -> tuple[str, ...]:
        """The request headers the proxy takes from a gateway (lower case): the tenant, the
        canary split and the three versions. The gateways we generate remove each of them
        from a client's request and set only those they derived themselves, so this one list
        is what the HAProxy config and the Kubernetes HTTPRoute are written from."""
        v = self.versions
        return (
            self.tenant_header,
            SPLIT_HEADER,
            v.model_version_header,
            v.engine_version_header,
            v.prompt_version_header,
        )

    @property
    def key_index(self) -> dict[str, str]:
        """SHA-256 hex of an API key -> tenant name."""
        return {digest: t.name for t in self.tenants.values() for digest in t.key_hashes}


#: a duration of the proxy's is above zero; a whole number of seconds is accepted too
_POSITIVE = layer.Duration(1)


def _seconds(fields: layer.Fields, key: str, default: float) -> float:
    """A positive duration, in seconds; a whole number of seconds is one too."""
    given = fields.raw.get(key, layer.Duration(round(default * 1000)))
    return _schema.duration_of(given, fields.error_at(key), _POSITIVE, True).seconds


def _price(reader: layer.Fields) -> Price:
    reader.check_keys({"prompt", "cached_prompt", "completion"})
    prompt = reader.number("prompt", Price.prompt)
    return Price(
        prompt=prompt,
        cached_prompt=reader.number("cached_prompt", prompt),
        completion=reader.number("completion", Price.completion),
    )


def _tenant(reader: layer.Fields, name: str) -> Tenant:
    if not TENANT_PATTERN.match(name) or name in RESERVED_TENANTS:
        raise reader.error(
            "", f"tenant name {name!r} is reserved or not [A-Za-z0-9._:@/-]{{1,128}}"
        )
    reader.check_keys(
        {
            "key_sha256",
            "priority",
            "weight",
            "max_concurrency",
            "budget",
            "failure_policy",
            "rate_limits",
        }
    )
    hashes = reader.raw.get("key_sha256", [])
    if isinstance(hashes, str):
        hashes = [hashes]
    if not isinstance(hashes, list) or not all(
        isinstance(h, str) and _SHA256.match(h) for h in hashes
    ):
        raise reader.error("key_sha256", "expected 64-char lowercase hex SHA-256 digests of keys")
    priority = reader.text("priority", "normal")
    if priority not in PRIORITIES:
        raise reader.error("priority", f"expected one of {sorted(PRIORITIES)}, got {priority!r}")
    budget = None
    if "budget" in reader.raw:
        budget_reader = reader.child("budget")
        budget_reader.check_keys({"tokens", "window", "tolerance"})
        if "tokens" not in budget_reader.raw:
            raise budget_reader.error("tokens", "required")
        budget = Budget(
            tokens=budget_reader.integer("tokens", 0, minimum=1),
            window_seconds=_seconds(budget_reader, "window", 3600.0),
            tolerance=budget_reader.integer("tolerance", Budget.tolerance),
        )
    policy: FailurePolicy | None = None
    if "failure_policy" in reader.raw:
        chosen = reader.choice("failure_policy", "fail_open", sharedconfig.FAILURE_POLICIES)
        policy = "fail_closed" if chosen == "fail_closed" else "fail_open"
    return Tenant(
        name=name,
        key_hashes=tuple(hashes),
        priority=PRIORITIES[priority],
        max_concurrency=reader.integer("max_concurrency", Tenant.max_concurrency),
        weight=reader.integer("weight", Tenant.weight, minimum=1, maximum=1000),
        budget=budget,
        failure_policy=policy,
        rate_limits=_rate_limits(reader.child("rate_limits"))
        if "rate_limits" in reader.raw
        else None,
    )


def _limit(reader: layer.Fields, more: frozenset[str] = frozenset()) -> Limit:
    reader.check_keys({"requests_per_minute", "tokens_per_minute", *more})
    return Limit(
        requests_per_minute=reader.integer("requests_per_minute", 0, maximum=10**9),
        tokens_per_minute=reader.integer("tokens_per_minute", 0, maximum=10**12),
    )


def _rate_limits(reader: layer.Fields) -> RateLimits:
    """``rate_limits: {requests_per_minute, tokens_per_minute, models: {name: {...}}}``."""
    limits = RateLimits(
        _limit(reader, frozenset({"models"})),
        {name: _limit(model) for name, model in reader.child("models").entries()},
    )
    for name, limit in [("", limits.tenant), *limits.models.items()]:
        if limit == Limit() and (name or not limits.models):
            where = f"models.{name}" if name else ""
            raise reader.error(where, "give requests_per_minute, tokens_per_minute or both")
    return limits


#: lines a usage stream keeps unless told (a few hundred bytes of Redis memory each)
USAGE_STREAM_MAXLEN = 1_000_000


def _usage_stream(reader: layer.Fields, shared: bool) -> int:
    """``usage_log.stream: {maxlen}``: the lines it keeps; 0 where there is no stream."""
    if "stream" not in reader.raw:
        return 0
    if not shared:
        raise reader.error("stream", "needs shared_state: the stream is kept in its Redis")
    for key in ("dir", "rotate_bytes", "retain_files"):
        if key in reader.raw:
            raise reader.error(
                key, "is for files: give dir or stream, not both (stream.maxlen is its retention)"
            )
    stream = reader.child("stream")
    stream.check_keys({"maxlen"})
    return stream.integer("maxlen", USAGE_STREAM_MAXLEN, minimum=1000, maximum=10**9)


#: Every default the parser falls back on is the dataclass's own.
_DEFAULT = ProxyConfig()


def parse(document: Any, source: str = "<config>") -> ProxyConfig:
    """Build a config from a parsed YAML document (absent fields take ``ProxyConfig``'s)."""
    top = layer.Fields(source, document, "", ConfigError)
    top.check_keys(
        {
            "upstream",
            "identity",
            "tenants",
            "labels",
            "versions",
            "prices",
            "limits",
            "routes",
            "quality_sampling",
            "shared_state",
            "usage_log",
        }
    )
    usage_log = top.child("usage_log")
    usage_log.check_keys({"dir", "rotate_bytes", "retain_files", "stream"})

    upstream = top.child("upstream")
    upstream.check_keys(
        {
            "url",
            "connect_timeout",
            "read_timeout",
            "continuous_usage",
            "health_path",
            "metrics_path",
            "reconcile_interval",
            "probe_metrics",
        }
    )
    url = upstream.text("url", _DEFAULT.upstream_url)
    if not re.match(r"^http://[^/\s]+(/\S*)?$", url):
        raise upstream.error("url", f"expected http://host[:port][/prefix], got {url!r}")
    probe_metrics = upstream.raw.get("probe_metrics", [])
    if isinstance(probe_metrics, str):
        probe_metrics = [probe_metrics]
    if not isinstance(probe_metrics, list) or not all(
        isinstance(u, str) and HTTP_URL.match(u) for u in probe_metrics
    ):
        raise upstream.error("probe_metrics", "expected a list of http(s)://host[:port]/path URLs")

    identity = top.child("identity")
    identity.check_keys({"tenant_header", "trusted_sources", "unknown"})
    trusted_raw = identity.raw.get("trusted_sources", [])
    if not isinstance(trusted_raw, list):
        raise identity.error("trusted_sources", "expected a list of addresses or CIDR networks")
    trusted = []
    for index, entry in enumerate(trusted_raw):
        try:
            trusted.append(ipaddress.ip_network(str(entry), strict=False))
        except ValueError:
            raise identity.error(
                f"trusted_sources[{index}]", f"{entry!r} is not an IP address or CIDR network"
            ) from None
    unknown = identity.text("unknown", _DEFAULT.unknown_policy)
    if unknown not in ("reject", "attribute"):
        raise identity.error("unknown", f"expected reject or attribute, got {unknown!r}")

    tenants_reader = top.child("tenants")
    tenants = {
        str(name): _tenant(tenants_reader.child(str(name)), str(name))
        for name in tenants_reader.raw
    }
    owners: dict[str, str] = {}
    for tenant in tenants.values():
        for digest in tenant.key_hashes:
            if digest in owners:
                raise tenants_reader.error(
                    f"{tenant.name}.key_sha256", f"key hash also belongs to {owners[digest]!r}"
                )
            owners[digest] = tenant.name

    labels = top.child("labels")
    labels.check_keys({"max_tenants", "tenant_idle", "max_version_values", "value_idle"})

    versions = top.child("versions")
    versions.check_keys(
        {
            "model_version",
            "engine_version",
            "prompt_version",
            "model_version_header",
            "engine_version_header",
            "prompt_version_header",
        }
    )

    prices = top.child("prices")
    prices.check_keys({"default", "models"})
    models = prices.child("models")

    limits = top.child("limits")
    limits.check_keys(
        {
            "max_input_tokens",
            "max_body_bytes",
            "max_response_bytes",
            "max_concurrency",
            "queue_timeout",
            "max_queue",
            "min_class_share",
            "tokenizer",
            "default_max_tokens",
            "over_budget",
            "header_timeout",
            "body_timeout",
            "keep_alive_timeout",
            "max_header_bytes",
        }
    )
    over_budget = limits.text("over_budget", _DEFAULT.over_budget)
    if over_budget not in ("clamp", "reject"):
        raise limits.error("over_budget", f"expected clamp or reject, got {over_budget!r}")
    route_reader = top.child("routes")
    route_reader.check_keys({"passthrough"})
    passthrough = route_reader.raw.get("passthrough", list(_DEFAULT.passthrough))
    if not isinstance(passthrough, list) or not all(isinstance(e, str) for e in passthrough):
        raise route_reader.error("passthrough", "expected a list of 'METHOD /path' strings")
    try:
        routes.Router(passthrough)
    except ValueError as exc:
        raise route_reader.error("passthrough", str(exc)) from None
    sampling = top.child("quality_sampling")
    sampling.check_keys({"rate"})
    return ProxyConfig(
        upstream_url=url.rstrip("/"),
        connect_timeout_s=_seconds(upstream, "connect_timeout", _DEFAULT.connect_timeout_s),
        read_timeout_s=_seconds(upstream, "read_timeout", _DEFAULT.read_timeout_s),
        continuous_usage=upstream.flag("continuous_usage", _DEFAULT.continuous_usage),
        upstream_health_path=upstream.text("health_path", _DEFAULT.upstream_health_path),
        upstream_metrics_path=upstream.text("metrics_path", _DEFAULT.upstream_metrics_path),
        reconcile_interval=upstream.number("reconcile_interval", _DEFAULT.reconcile_interval),
        probe_metrics_urls=tuple(probe_metrics),
        tenants=tenants,
        tenant_header=identity.text("tenant_header", _DEFAULT.tenant_header).lower(),
        trusted_sources=tuple(trusted),
        unknown_policy="attribute" if unknown == "attribute" else "reject",
        max_tenant_labels=labels.integer("max_tenants", _DEFAULT.max_tenant_labels),
        tenant_idle_seconds=_seconds(labels, "tenant_idle", _DEFAULT.tenant_idle_seconds),
        max_version_labels=labels.integer(
            "max_version_values", _DEFAULT.max_version_labels, minimum=1
        ),
        value_idle_seconds=_seconds(labels, "value_idle", _DEFAULT.value_idle_seconds),
        versions=Versions(
            **{
                name: versions.text(name, getattr(_DEFAULT.versions, name))
                for name in ("model_version", "engine_version", "prompt_version")
            },
            **{
                name: versions.text(name, getattr(_DEFAULT.versions, name)).lower()
                for name in (
                    "model_version_header",
                    "engine_version_header",
                    "prompt_version_header",
                )
            },
        ),
        default_price=_price(prices.child("default")),
        prices={str(model): _price(models.child(str(model))) for model in models.raw},
        max_input_tokens=limits.integer("max_input_tokens", _DEFAULT.max_input_tokens),
        max_body_bytes=limits.integer("max_body_bytes", _DEFAULT.max_body_bytes, minimum=1024),
        max_response_bytes=limits.integer(
            "max_response_bytes", _DEFAULT.max_response_bytes, minimum=1024
        ),
        max_concurrency=limits.integer("max_concurrency", _DEFAULT.max_concurrency),
        queue_timeout_s=_seconds(limits, "queue_timeout", _DEFAULT.queue_timeout_s),
        max_queue=limits.integer("max_queue", _DEFAULT.max_queue),
        # two lower classes each owed a third would leave the best class nothing for itself
        min_class_share=limits.number(
            "min_class_share", _DEFAULT.min_class_share, minimum=0.0, maximum=MAX_CLASS_SHARE
        ),
        tokenizer=limits.text("tokenizer", _DEFAULT.tokenizer),
        default_max_tokens=limits.integer(
            "default_max_tokens", _DEFAULT.default_max_tokens, minimum=1
        ),
        over_budget="reject" if over_budget == "reject" else "clamp",
        header_timeout_s=_seconds(limits, "header_timeout", _DEFAULT.header_timeout_s),
        body_timeout_s=_seconds(limits, "body_timeout", _DEFAULT.body_timeout_s),
        keep_alive_timeout_s=_seconds(limits, "keep_alive_timeout", _DEFAULT.keep_alive_timeout_s),
        max_header_bytes=limits.integer(
            "max_header_bytes", _DEFAULT.max_header_bytes, minimum=1024
        ),
        passthrough=tuple(passthrough),
        quality_sample_rate=sampling.number(
            "rate", _DEFAULT.quality_sample_rate, minimum=0.0, maximum=1.0
        ),
        shared_state=sharedconfig.parse(top.child("shared_state"))
        if "shared_state" in top.raw
        else None,
        usage_log_dir=usage_log.text("dir", _DEFAULT.usage_log_dir),
        usage_log_rotate_bytes=usage_log.integer(
            "rotate_bytes", _DEFAULT.usage_log_rotate_bytes, minimum=4096
        ),
        usage_log_retain_files=usage_log.integer(
            "retain_files", _DEFAULT.usage_log_retain_files, minimum=1
        ),
        usage_log_stream_maxlen=_usage_stream(usage_log, "shared_state" in top.raw),
    )


def load(path: str | Path) -> ProxyConfig:
    """Read and validate a config file."""
    try:
        document = layer.load(path)
    except layer.ConfigError as exc:
        raise ConfigError(str(exc)) from None
    return parse(document, str(path))
