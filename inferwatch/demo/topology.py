"""The demo fleet: which replicas, tenants and prices exist, and the config files they need.

The fleet is fixed so that scenarios can name its parts: the primary model served at two
versions (``primary-v1`` on bf16 weights and the fp8 rollout ``primary-v2``, a canary taking a
third of the primary traffic) and a smaller fallback model (``fallback``) that a batch tenant
uses and that takes the primary traffic when no primary replica is ready. Every replica has
its own sidecar and a tenancy proxy in front of it, as in a pod; a primary replica running at
t=0 has two proxies (:func:`proxy_names`), as a fleet runs several proxy replicas per model.
Every proxy keeps the tenants' budgets in one Redis (``shared_state``), so a budget holds
across all of them. HAProxy in front of the proxies is the gateway clients call.

A spare replica (``primary-v1b``, a second replica of ``primary-v1``'s model and version) is
not running at t=0: a scenario's ``start`` step starts it, as an autoscaler scaling out would.
Only a scenario that starts it has it in its fleet (ports, gateway server, scrape files).

With ``--engine-url``, engines the user runs take the simulated replicas' place
(``inferwatch.demo.engines`` makes their replicas): each gets its sidecar and proxy, and no
simulator runs.
"""

from __future__ import annotations

import json
import re
from collections.abc import Collection, Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Literal

import yaml

from inferwatch.proxy.tenants import hash_key

Role = Literal["primary", "fallback"]
#: where the demo's series are stored and its rules evaluated (``inferwatch demo --tsdb``)
Tsdb = Literal["prometheus", "victoriametrics"]
TSDBS: tuple[Tsdb, ...] = ("prometheus", "victoriametrics")

PRIMARY_MODEL = "meta-llama/Llama-3.1-8B-Instruct"
FALLBACK_MODEL = "Qwen/Qwen2.5-7B-Instruct"
#: price per million tokens (uncached prompt, cached prompt, completion), by the model's role
PRICES: Mapping[Role, Mapping[str, float]] = {
    "primary": {"prompt": 0.20, "cached_prompt": 0.05, "completion": 0.60},
    "fallback": {"prompt": 0.10, "cached_prompt": 0.025, "completion": 0.30},
}


@dataclass(frozen=True)
class Replica:
    name: str
    role: Role
    model: str
    version: str
    gpu: str
    node: str
    #: share of its model's traffic while every replica of the role is ready
    weight: float
    sim_flags: tuple[str, ...] = ()
    #: not running at t=0; a scenario's ``start`` step starts it (a scale-out)
    spare: bool = False
    #: GB/s at which its engine reads its weights at start: a cold start of seconds from
    #: the node's local disk
    storage_bandwidth: float = 4.0
    #: the base URL of an engine the user runs, which serves this replica; empty: simulated
    engine_url: str = ""


@dataclass(frozen=True)
class Tenant:
    name: str
    key: str
    role: Role  # the model the tenant asks for
    share: float  # share of the demo's requests (0: none, only what a user sends)
    prompt_words: tuple[int, int]
    max_tokens: tuple[int, int]
    priority: str = "normal"
    #: tokens per budget window, for the whole fleet (every proxy keeps it in the one Redis)
    budget_tokens: int | None = None
    budget_window: str = "1h"


# Small KV caches (``--num-gpu-blocks``) keep cache usage visible at demo load; primary-v1
# speculates (3 draft tokens), so the replica board's spec-decode panels draw.
REPLICAS: tuple[Replica, ...] = (
    Replica("primary-v1", "primary", PRIMARY_MODEL, "v1", "H100", "node-a", 2 / 3,
            ("--num-gpu-blocks", "2048", "--num-speculative-tokens", "3")),
    Replica("primary-v2", "primary", PRIMARY_MODEL, "v2-fp8", "H100", "node-b", 1 / 3,
            ("--num-gpu-blocks", "2048", "--weight-dtype", "fp8", "--kv-cache-dtype", "fp8")),
    Replica("fallback", "fallback", FALLBACK_MODEL, "v1", "L40S", "node-c", 1.0,
            ("--num-gpu-blocks", "1024")),
)  # fmt: skip

TENANTS: tuple[Tenant, ...] = (
    Tenant("acme", "sk-demo-acme", "primary", 0.5, (20, 120), (32, 160), priority="high"),
    Tenant("globex", "sk-demo-globex", "primary", 0.3, (400, 900), (16, 64)),
    Tenant("initech", "sk-demo-initech", "fallback", 0.2, (200, 500), (128, 384),
           priority="low", budget_tokens=30_000, budget_window="1m"),
    # no share of the demo's load (so no scenario's load meets its budget): its traffic is
    # the user's own, through the gateway, to watch one budget hold over the four proxies
    Tenant("hooli", "sk-demo-hooli", "primary", 0.0, (400, 900), (16, 64),
           budget_tokens=20_000, budget_window="1m"),
)  # fmt: skip


#: replicas a scenario may start later: the same deployment as the one it copies
#: ``primary-v1b`` lands on a new node, which has no copy of the weights yet: they come over
#: the network (0.5 GB/s, about 32 s for the 8B model's 16 GB)
SPARES: tuple[Replica, ...] = (
    Replica("primary-v1b", "primary", PRIMARY_MODEL, "v1", "H100", "node-d", 2 / 3,
            ("--num-gpu-blocks", "2048"), spare=True, storage_bandwidth=0.5),
)  # fmt: skip


def replica(name: str) -> Replica:
    for candidate in (*REPLICAS, *SPARES):
        if candidate.name == name:
            return candidate
    raise KeyError(name)


def fleet(
    spares: Iterable[str] = (), replicas: Sequence[Replica] = REPLICAS
) -> tuple[Replica, ...]:
    """The replicas running at t=0 and the named spares, which a scenario starts later."""
    wanted = set(spares)
    return (*replicas, *(r for r in SPARES if r.name in wanted))


#: what a replica's second proxy is called after it: ``primary-v1.b``
TWIN = ".b"


def proxy_names(replica: Replica) -> tuple[str, ...]:
    """The proxies in front of a replica: two for a primary replica running at t=0 (their
    budgets held in the one Redis), one for any other."""
    if replica.role == "primary" and not replica.spare:
        return (replica.name, replica.name + TWIN)
    return (replica.name,)


def owner(proxy: str) -> str:
    """The replica a proxy (named by :func:`proxy_names`) is in front of."""
    return proxy.removesuffix(TWIN)


def models(replicas: Sequence[Replica]) -> dict[Role, str]:
    """The model of each role the fleet serves; a fleet without a fallback model sends the
    fallback's tenants to the primary model."""
    by_role: dict[Role, str] = {}
    for replica in replicas:
        by_role.setdefault(replica.role, replica.model)
    by_role.setdefault("fallback", by_role["primary"])
    return by_role


@dataclass
class Ports:
    """Loopback ports of every component; 0 for one not bound yet, which then binds a port
    the OS gives it and the demo records here the port it announces (so that no port is
    picked first and bound later by another process, which may have taken it meanwhile)."""

    sim: dict[str, int]  # the simulated replicas' engines
    sidecar: dict[str, int]
    proxy: dict[str, int]  # by proxy name (:func:`proxy_names`)
    #: each proxy's own metrics listener (tenant series), apart from the client port
    proxy_metrics: dict[str, int]
    redis: int  # the proxies' shared state
    #: the query API: Prometheus, or the single-node VictoriaMetrics (``--tsdb
    #: victoriametrics``), whose Prometheus-compatible API the same tools read
    prometheus: int
    alertmanager: int
    runbooks: int  # the runbook receiver (inferwatch runbooks serve)
    gateway: int  # HAProxy's client port: the load goes through it
    gateway_metrics: int  # HAProxy's own Prometheus page
    advisor: int  # the tuning advice (inferwatch advisor), read from the query API
    #: every port was given (``--base-port``): none may be replaced by another
    fixed: bool = False
    #: each cluster's vmagent, by cluster, and the vmalert evaluating the rules (``--tsdb
    #: victoriametrics``; else none)
    vmagent: dict[str, int] = field(default_factory=dict)
    vmalert: int = 0

    @classmethod
    def count(cls, replicas: Sequence[Replica] = REPLICAS, clusters: Collection[str] = ()) -> int:
        """How many ports the fleet uses: a replica served by the user's engine has none;
        ``clusters`` (``--tsdb victoriametrics``): one vmagent each, and vmalert."""
        proxies = sum(len(proxy_names(r)) for r in replicas)
        scale_out = len(clusters) + 1 if clusters else 0
        return len(replicas) + 2 * proxies + len(_simulated(replicas)) + 7 + scale_out

    @classmethod
    def assign(
        cls, base: int | None, replicas: Sequence[Replica] = REPLICAS,
        clusters: Collection[str] = (),
    ) -> Ports:  # fmt: skip
        """Consecutive ports from ``base``, or all 0: each bound when its component starts."""
        count = cls.count(replicas, clusters)
        ports = iter(range(base, base + count) if base else [0] * count)
        names = [r.name for r in replicas]
        proxies = [name for r in replicas for name in proxy_names(r)]
        return cls(
            sim={name: next(ports) for name in _simulated(replicas)},
            sidecar={name: next(ports) for name in names},
            proxy={name: next(ports) for name in proxies},
            proxy_metrics={name: next(ports) for name in proxies},
            redis=next(ports),
            prometheus=next(ports),
            alertmanager=next(ports),
            runbooks=next(ports),
            gateway=next(ports),
            gateway_metrics=next(ports),
            advisor=next(ports),
            fixed=bool(base),
            vmagent={cluster: next(ports) for cluster in clusters},
            vmalert=next(ports) if clusters else 0,
        )


def _simulated(replicas: Sequence[Replica]) -> list[str]:
    return [r.name for r in replicas if not r.engine_url]


def served_names(replica: Replica, replicas: Sequence[Replica] = REPLICAS) -> list[str]:
    """The model names a replica's engine answers to: its own first (replies carry it), then
    every other model of the fleet, whose traffic the gateway sends it as their fallback."""
    others = sorted({r.model for r in replicas} - {replica.model})
    return [replica.model, *others]


#: every proxy's max_input_tokens: no reservation is larger than it plus the completion cap
MAX_INPUT_TOKENS = 8192


def url(port: int) -> str:
    return f"http://127.0.0.1:{port}"


def proxy_config(
    replica: Replica,
    upstream: str,
    sidecar: str,
    tenants: Sequence[Tenant] = TENANTS,
    replicas: Sequence[Replica] = REPLICAS,
    shared_state: Mapping[str, Any] | None = None,
    usage_log: str = "",
) -> str:
    """The tenancy proxy's YAML for a proxy in front of one replica; ``shared_state``: its
    section (the fleet's Redis, where every proxy keeps the budgets); ``usage_log``: the
    directory every proxy appends its settled requests to ("": none).

    The replica's sidecar probes the engine directly; the proxy reads its probe token counters
    so that they reconcile with the engine's. A proxy that shares its engine with another
    (:func:`proxy_names`) does not reconcile: the engine's counters hold both proxies' traffic.
    """
    shares_engine = len(proxy_names(replica)) > 1
    tenant_entries: dict[str, Any] = {}
    for tenant in tenants:
        entry: dict[str, Any] = {"key_sha256": [hash_key(tenant.key)], "priority": tenant.priority}
        if tenant.budget_tokens:
            entry["budget"] = {"tokens": tenant.budget_tokens, "window": tenant.budget_window}
        tenant_entries[tenant.name] = entry
    document = {
        "upstream": {
            "url": upstream,
            "reconcile_interval": 0 if shares_engine else 5,
            "probe_metrics": [sidecar + "/metrics"],
        },
        "tenants": tenant_entries,
        "versions": {"model_version": replica.version},
        "prices": {"models": {r.model: dict(PRICES[r.role]) for r in replicas}},
        "limits": {"max_input_tokens": MAX_INPUT_TOKENS},
        # demo traffic is light: screen half of it so injected degeneracy shows in seconds
        "quality_sampling": {"rate": 1.0},
    }
    if shared_state is not None:
        document["shared_state"] = dict(shared_state)
    if usage_log:
        document["usage_log"] = {"dir": usage_log}
    return yaml.safe_dump(document, sort_keys=False)


#: the demo's scrape and rule evaluation interval: short, so that alerts fire within seconds
INTERVAL = "2s"
CLUSTER = "demo"
#: ``--tsdb victoriametrics`` simulates two clusters, each scraped by its own vmagent: the
#: primary model's replicas (with the gateway and the runbook receiver, which serve the
#: whole fleet) in one, the fallback model's in the other
CLUSTERS: Mapping[Role, str] = {"primary": "east", "fallback": "west"}
#: the namespace every sidecar reports its replica in
NAMESPACE = "demo"


def prometheus_config(
    ports: Ports,
    rule_files: Sequence[Path] = (),
    alertmanager: bool = False,
    replicas: Sequence[Replica] = REPLICAS,
    discovery: Path | None = None,
    advisor: Path | None = None,
) -> str:
    """Prometheus scraping the fleet (:func:`scrape_configs`); with ``alertmanager``, alerts
    go to the demo's Alertmanager and the runbook receiver it feeds is scraped too (its
    webhooks, actions and breakers)."""
    jobs = scrape_configs(ports, replicas, discovery, runbooks=alertmanager, advisor=advisor)
    document: dict[str, Any] = {
        "global": {"scrape_interval": INTERVAL, "evaluation_interval": INTERVAL},
        "scrape_configs": jobs,
    }
    if rule_files:
        document["rule_files"] = [str(path) for path in rule_files]
    if alertmanager:
        document["alerting"] = {
            "alertmanagers": [
                {"static_configs": [{"targets": [f"127.0.0.1:{ports.alertmanager}"]}]}
            ]
        }
    return yaml.safe_dump(document, sort_keys=False)


#: the first line of the vmagent scrape config
VMAGENT_MARKER = "# generated by inferwatch (inferwatch generate vmagent), do not edit\n"


def vmagent_config(
    ports: Ports,
    cluster: str = CLUSTER,
    replicas: Sequence[Replica] = REPLICAS,
    discovery: Path | None = None,
    gateway: bool = True,
    runbooks: bool = False,
    advisor: Path | None = None,
) -> str:
    """vmagent's ``-promscrape.config``: the same jobs as Prometheus's (:func:`scrape_configs`),
    with ``cluster`` as the external label of everything it remote-writes. Every vmagent of a
    cluster reads this same file; ``-promscrape.cluster.*`` flags share its targets out."""
    jobs = scrape_configs(ports, replicas, discovery, cluster, gateway, runbooks, advisor)
    for job in jobs:  # vmagent (1.79) refuses the field: -promscrape.fileSDCheckInterval sets it
        for files in job.get("file_sd_configs", ()):
            del files["refresh_interval"]
    document: dict[str, Any] = {
        "global": {"scrape_interval": INTERVAL, "external_labels": {"cluster": cluster}},
        "scrape_configs": jobs,
    }
    return VMAGENT_MARKER + yaml.safe_dump(document, sort_keys=False)


def scrape_configs(
    ports: Ports,
    replicas: Sequence[Replica] = REPLICAS,
    discovery: Path | None = None,
    cluster: str = CLUSTER,
    gateway: bool = True,
    runbooks: bool = False,
    advisor: Path | None = None,
) -> list[dict[str, Any]]:
    """The scrape jobs of every sidecar and proxy, each target labelled with its replica and
    the cluster, and HAProxy's built-in exporter (the gateway board's series, labelled with
    the cluster only: it serves every replica): one list, which Prometheus and vmagent read.
    With ``runbooks`` the runbook receiver Alertmanager feeds is scraped too (its webhooks,
    actions and breakers); without ``gateway`` HAProxy is not (another cluster's scraper
    has it: what serves the whole fleet is scraped once), nor the advisor. The advisor reads
    the query API, so it starts after it: at its port when ports are given, else at the one
    the file ``advisor`` lists once it is bound (:func:`write_advisor`).

    A spare's targets are not listed: with ``discovery`` (a folder), each job also reads its
    targets from a file there (file-based service discovery), which :func:`write_discovered`
    rewrites when a spare starts, as Kubernetes service discovery adds a new pod. A replica
    that is not started is then no target at all, rather than a down one.
    """
    running = [r.name for r in replicas if not r.spare]
    jobs = []
    for job, by_replica in scrape_jobs(ports).items():
        config: dict[str, Any] = {
            "job_name": job,
            "static_configs": target_groups(by_replica, running, cluster),
        }
        if discovery is not None:
            files = [str(discovery / f"{job}.json")]
            config["file_sd_configs"] = [{"files": files, "refresh_interval": INTERVAL}]
        if job == SIDECAR_JOB:
            config["metric_relabel_configs"] = gpu_nodes(replicas)
        jobs.append(config)
    fleet_wide = [(GATEWAY_JOB, ports.gateway_metrics)] if gateway else []
    if runbooks:
        fleet_wide.append((RUNBOOKS_JOB, ports.runbooks))
    if gateway and ports.fixed and ports.advisor:
        fleet_wide.append((ADVISOR_JOB, ports.advisor))
    for job, port in fleet_wide:
        group = {"targets": [f"127.0.0.1:{port}"], "labels": {"cluster": cluster}}
        jobs.append({"job_name": job, "static_configs": [group]})
    if gateway and not ports.fixed and advisor is not None:
        discovered = {"files": [str(advisor)], "refresh_interval": INTERVAL}
        jobs.append({"job_name": ADVISOR_JOB, "file_sd_configs": [discovered]})
    return jobs


def write_advisor(path: Path, port: int, cluster: str = CLUSTER) -> None:
    """The advisor's target, for the scrapers that discover it (:func:`scrape_configs`);
    written aside, then renamed, so that no scraper reads half a file."""
    aside = path.with_name(f".{path.name}")
    group = {"targets": [f"127.0.0.1:{port}"], "labels": {"cluster": cluster}}
    aside.write_text(json.dumps([group]), encoding="utf-8")
    aside.replace(path)


SIDECAR_JOB = "inferwatch-sidecar"
GATEWAY_JOB = "haproxy"
RUNBOOKS_JOB = "inferwatch-runbooks"
ADVISOR_JOB = "inferwatch-advisor"


def scrape_jobs(ports: Ports) -> dict[str, Mapping[str, int]]:
    """Each scrape job's port by replica: the sidecars, and the proxies' tenant listeners."""
    return {SIDECAR_JOB: ports.sidecar, "inferwatch-proxy": ports.proxy_metrics}


def target_groups(
    by_replica: Mapping[str, int], names: Collection[str], cluster: str = CLUSTER
) -> list[dict[str, Any]]:
    """One target group per sidecar or proxy of the named replicas, labelled with its replica
    (both proxies of a replica carry its name) and the cluster, as static configs and
    discovery files list them."""
    return [
        {"targets": [f"127.0.0.1:{port}"], "labels": {"cluster": cluster, "replica": owner(name)}}
        for name, port in by_replica.items()
        if owner(name) in names
    ]


def write_discovered(
    folder: Path, ports: Ports, names: Collection[str], cluster: str = CLUSTER
) -> None:
    """The discovery file of each job, listing the named replicas' targets in ``cluster``;
    each is replaced whole (written aside, then renamed), so no scraper reads half a file."""
    folder.mkdir(parents=True, exist_ok=True)
    for job, by_replica in scrape_jobs(ports).items():
        aside = folder / f".{job}.json"
        groups = target_groups(by_replica, names, cluster)
        aside.write_text(json.dumps(groups), encoding="utf-8")
        aside.replace(folder / f"{job}.json")


def clusters(replicas: Sequence[Replica], split: bool) -> dict[str, tuple[Replica, ...]]:
    """The fleet's replicas by cluster: one cluster (:data:`CLUSTER`), or with ``split``
    (``--tsdb victoriametrics``) each role's in its own (:data:`CLUSTERS`), the primary
    model's first: the cluster whose scraper also scrapes the gateway and the receiver."""
    if not split:
        return {CLUSTER: tuple(replicas)}
    by_cluster: dict[str, tuple[Replica, ...]] = {}
    for role, cluster in CLUSTERS.items():
        members = tuple(r for r in replicas if r.role == role)
        if members:
            by_cluster[cluster] = members
    return by_cluster


def gpu_nodes(replicas: Sequence[Replica] = REPLICAS) -> list[dict[str, Any]]:
    """Relabelling that gives each replica's GPU series its ``node``, as Kubernetes service
    discovery does from the pod's node (the sidecar puts it on its engine series only), so
    that a GPU alert names the node a reset request or a cordon is for."""
    return [
        {
            "source_labels": ["replica", "__name__"],
            "regex": f"{re.escape(r.name)};inferwatch_gpu_.*",
            "target_label": "node",
            "replacement": r.node,
        }
        for r in replicas
    ]


def alertmanager_argv(binary: str, config: Path, storage: Path, port: int) -> list[str]:
    """A single Alertmanager on loopback: no cluster gossip port, its own storage."""
    return [
        binary,
        f"--config.file={config}",
        f"--storage.path={storage}",
        f"--web.listen-address=127.0.0.1:{port}",
        "--cluster.listen-address=",  # empty: no HA peer port (9094) to collide on
        "--log.level=warn",
    ]


def generated_rule_files() -> list[Path]:
    """The committed rule files (default alert config), whose recording rules the generated
    dashboards read; the demo's own Prometheus loads those of its alert config instead."""
    from inferwatch import alerts

    return sorted((Path(alerts.__file__).parent / "generated").glob("*.yaml"))
