"""The demo's gateway: HAProxy with the generated config, and where it sends each model now.

HAProxy runs with the config ``inferwatch generate gateway`` writes for the demo fleet
(:func:`fleet_topology`): health checks on each sidecar's ``/readyz``, weighted
versions, the fallback model's replicas at weight 0, and the Runtime API on a unix socket in
the work directory, which the runbook receiver's ``shift_traffic`` action drives. A spare
replica's server is in maintenance until the demo starts the replica (:func:`enable`). What the
view shows as routing is read back from HAProxy itself, never from a model of it.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Mapping, Sequence
from pathlib import Path

from inferwatch import wire
from inferwatch.demo import processes, topology
from inferwatch.demo.processes import Component, StartError
from inferwatch.demo.topology import Ports, Replica, Role
from inferwatch.gateway import haproxy as gateway
from inferwatch.runbooks.haproxy_runtime import RuntimeApi, RuntimeApiError, ServerState

CONFIG = "haproxy.cfg"
#: the port a spare's server has in the config until its processes bind theirs (:func:`enable`
#: sets them); a server in maintenance is neither checked nor sent traffic
UNBOUND = 1
RUNTIME = "haproxy.sock"


def binary() -> str:
    """The haproxy binary; a one-line error when it is not installed."""
    return processes.installed("haproxy", "the gateway the load goes through", "haproxy")


def layout(
    ports: Ports, workdir: Path, fleet: Sequence[Replica] = topology.REPLICAS
) -> gateway.Topology:
    return fleet_topology(
        ports,
        f"127.0.0.1:{ports.gateway}",
        str(workdir / RUNTIME),
        f"127.0.0.1:{ports.gateway_metrics}",
        fleet,
    )


def fleet_topology(
    ports: Ports,
    listen: str,
    runtime: str,
    metrics: str | None = None,
    fleet: Sequence[Replica] = topology.REPLICAS,
) -> gateway.Topology:
    """The demo fleet's topology (``fleet``: its replicas, by default those running at t=0)
    behind one gateway.

    Clients call each replica's tenancy proxies, one server each (named after the proxy, at
    the replica's weight, so that the versions' shares stay those of their replicas); HAProxy
    checks each replica's sidecar. A spare replica's server starts in maintenance, until the
    demo starts the replica.
    """
    chosen = tuple(fleet)
    models: list[gateway.Model] = []
    by_model: dict[str, list[Replica]] = {}
    for replica in chosen:
        by_model.setdefault(replica.model, []).append(replica)
    for name, replicas in by_model.items():
        role = replicas[0].role
        fallback = next((r.model for r in chosen if r.role != role), None)
        servers = tuple(
            gateway.Server(
                replica=proxy,
                version=r.version,
                address=f"127.0.0.1:{ports.proxy[proxy] or UNBOUND}",
                check_port=ports.sidecar[r.name] or UNBOUND,
                weight=round(r.weight * 100),
                disabled=r.spare,
            )
            for r in replicas
            for proxy in topology.proxy_names(r)
        )
        models.append(gateway.Model(name, servers, fallback))
    routed = gateway.Topology(
        gateway.checked_address(listen, "listen"),
        gateway.checked_runtime(runtime),
        tuple(models),
        metrics,
    )
    gateway.check(routed)
    return routed


def demo_example() -> str:
    """The committed example (deploy/haproxy/demo.cfg): the demo fleet at ``--base-port 18000``."""
    ports = Ports.assign(18000)
    return gateway.render(
        fleet_topology(ports, "127.0.0.1:8080", "/run/inferwatch/haproxy.sock", "127.0.0.1:8404")
    )


def component(
    binary: str, ports: Ports, workdir: Path, fleet: Sequence[Replica] = topology.REPLICAS
) -> Component:
    """HAProxy in the foreground (``-db``) with the generated config; ready once its
    metrics page answers."""
    config = workdir / CONFIG
    config.write_text(gateway.render(layout(ports, workdir, fleet)), encoding="utf-8")
    url = topology.url(ports.gateway_metrics)
    return Component("haproxy", "", url, "/metrics", [binary, "-db", "-f", str(config)])


def runtime(workdir: Path) -> RuntimeApi:
    return RuntimeApi(str(workdir / RUNTIME), timeout_s=2.0)


async def backends(
    api: RuntimeApi, replicas: Sequence[Replica] = topology.REPLICAS
) -> dict[str, list[ServerState]]:
    """Every model's backend as HAProxy reports it, by model name."""
    models = {r.model for r in replicas}
    return {model: await api.servers(wire.backend_name(model)) for model in sorted(models)}


def serving(states: Mapping[str, list[ServerState]], model: str) -> dict[str, int]:
    """Replica -> weight of the servers that take ``model``'s new requests now.

    A server takes traffic when it is up with a weight above 0; when none of the model's own
    backend does, the frontend sends the model to its fallback's backend (``nbsrv lt 1``), and
    when that has none either, to the model's fail-open backend (:func:`fails_open`), which
    this leaves empty.
    """
    own = _usable(states[model])
    if own:
        return own
    for other, servers in states.items():
        if other != model:
            return _usable(servers)
    return {}


def fails_open(states: Mapping[str, list[ServerState]]) -> bool:
    """Whether no server of any backend is usable, so every model is served fail-open."""
    return not any(_usable(servers) for servers in states.values())


def _usable(servers: list[ServerState]) -> dict[str, int]:
    usable: dict[str, int] = {}
    for server in servers:
        if server.up and server.weight > 0:
            replica = topology.owner(wire.parse_server_name(server.name)[1])
            usable[replica] = usable.get(replica, 0) + server.weight
    return usable


def describe(weights: Mapping[str, int]) -> str:
    """``primary-v1 67%, primary-v2 33%``; ``nothing`` when no server takes traffic."""
    total = sum(weights.values())
    if not total:
        return "nothing (503)"
    return ", ".join(f"{name} {weight / total:.0%}" for name, weight in sorted(weights.items()))


async def routes(
    api: RuntimeApi, replicas: Sequence[Replica] = topology.REPLICAS
) -> dict[Role, str]:
    """Where each role's model traffic goes now, as the view prints it."""
    states = await backends(api, replicas)
    by_role = {r.role: r.model for r in replicas}
    if fails_open(states):
        return {role: "its replicas, unready (fail-open)" for role in by_role}
    return {role: describe(serving(states, model)) for role, model in by_role.items()}


async def wait_all_up(
    api: RuntimeApi, timeout_s: float, replicas: Sequence[Replica] = topology.REPLICAS
) -> None:
    """Return once HAProxy's checks find the servers of ``replicas`` (those running) up;
    raise StartError after ``timeout_s``."""
    deadline = time.monotonic() + timeout_s
    names = {r.name for r in replicas}
    down: list[str] = []
    while time.monotonic() < deadline:
        try:
            states = await backends(api, replicas)
            down = [
                s.name
                for servers in states.values()
                for s in servers
                if not s.up and topology.owner(wire.parse_server_name(s.name)[1]) in names
            ]
            if not down:
                return
        except RuntimeApiError as exc:
            down = [str(exc)]
        await asyncio.sleep(0.2)
    raise StartError(f"haproxy: servers not up within {timeout_s:g} s: {', '.join(down)}")


async def enable(api: RuntimeApi, replica: Replica, ports: Ports, timeout_s: float) -> None:
    """Point a started spare replica's server at the ports its proxy and sidecar bound, and
    take it out of maintenance.

    HAProxy counts a server that leaves maintenance as up until its first check, and setting
    its health down while in maintenance does not stick. So it leaves maintenance for drain
    (checked, sent no new request), its health is set down there, and it turns ready only
    once a check has found it down: at no step between is it a server HAProxy would send a
    request to. From then on it takes traffic only once its sidecar's ``/readyz`` passes, as
    a new pod's endpoint joins a Service only once its readiness probe passes. Raises
    StartError.
    """
    backend = wire.backend_name(replica.model)
    server = f"{backend}/{replica.version}:{replica.name}"
    deadline = time.monotonic() + timeout_s
    try:
        await api.command(f"set server {server} addr 127.0.0.1 port {ports.proxy[replica.name]}")
        await api.command(f"set server {server} check-port {ports.sidecar[replica.name]}")
        await api.command(f"set server {server} state drain")
        await api.command(f"set server {server} health down")
        name = server.split("/", 1)[1]
        while time.monotonic() < deadline:
            if not any(s.up for s in await api.servers(backend) if s.name == name):
                await api.command(f"set server {server} state ready")
                return
            await asyncio.sleep(0.1)
    except RuntimeApiError as exc:
        raise StartError(f"haproxy: cannot take {server} into service: {exc}") from None
    raise StartError(f"haproxy: {server} not checked within {timeout_s:g} s")
