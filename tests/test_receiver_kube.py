"""The receiver in Kubernetes, on the in-package fake API: its inventory listed by label
selector, its state in a ConfigMap with conflicts retried, and a Lease so that one replica acts."""

from __future__ import annotations

import asyncio
import datetime
import json
import logging
import threading
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest
from kubernetes import client

from inferwatch.drill.kubefake import FakeKube
from inferwatch.runbooks import config as mapping
from inferwatch.runbooks.actions.base import Alert
from inferwatch.runbooks.actions.kubernetes_api import body, connect
from inferwatch.runbooks.actions.node_isolation import NodeIsolation
from inferwatch.runbooks.audit import AuditLog
from inferwatch.runbooks.dispatch import Dispatcher
from inferwatch.runbooks.inventory import Inventory, Refused
from inferwatch.runbooks.kube_inventory import Nodes, Pods
from inferwatch.runbooks.kube_state import ConfigMapStore, LeaseElector
from inferwatch.runbooks.server import Receiver
from inferwatch.runbooks.state import State

pytestmark = pytest.mark.unit

GPU = "nvidia.com/gpu.present=true"


@pytest.fixture
def fake() -> FakeKube:
    kube = FakeKube()
    kube.add_node("control-plane", labels={"node-role.kubernetes.io/control-plane": ""})
    for name in ("gpu-1", "gpu-2", "gpu-3"):
        kube.add_node(name, labels={"nvidia.com/gpu.present": "true", "pool": "h100"})
    return kube


@pytest.fixture
def host(fake: FakeKube) -> Iterator[str]:
    with fake.serve() as url:
        yield url


@pytest.fixture
def api(host: str) -> client.ApiClient:
    return connect(host)


def xid(node: str, fingerprint: str = "aa") -> Alert:
    labels = {"alertname": "InferwatchGPUXidErrors", "node": node, "severity": "critical"}
    return Alert("firing", labels, {}, "2026-12-01T09:00:00Z", "0001-01-01T00:00:00Z", fingerprint)


def test_the_fake_lists_by_label_selector_with_a_limit(fake: FakeKube, host: str) -> None:
    names = lambda reply: [i["metadata"]["name"] for i in reply.json()["items"]]  # noqa: E731
    reply = httpx.get(f"{host}/api/v1/nodes", params={"labelSelector": GPU}, timeout=5)
    assert names(reply) == ["gpu-1", "gpu-2", "gpu-3"]
    reply = httpx.get(f"{host}/api/v1/nodes", params={"labelSelector": f"!{GPU.split('=')[0]}"})
    assert names(reply) == ["control-plane"]
    reply = httpx.get(f"{host}/api/v1/nodes", params={"labelSelector": GPU, "limit": 2})
    assert names(reply) == ["gpu-1", "gpu-2"] and reply.json()["metadata"]["continue"]
    bad = httpx.get(f"{host}/api/v1/nodes", params={"labelSelector": "a in (b)"}, timeout=5)
    assert bad.status_code == 400


def test_a_node_outside_the_gpu_selector_is_never_cordoned(
    fake: FakeKube, api: client.ApiClient, tmp_path: Path
) -> None:
    """The alert's node label named the control-plane node: refused, audited, untouched."""
    config = mapping.parse(
        {
            "execute": True,
            "namespaces": [""],
            "breaker": {"max_fraction": 0.34, "window": "1h"},
            "rules": [{"name": "isolate", "alertname": "InferwatchGPUXidErrors",
                       "action": "kubernetes_isolate_node"}],
        }
    )  # fmt: skip
    nodes = Nodes(selector=GPU, pool_label="pool", api=api)
    dispatcher = Dispatcher(
        config,
        {"kubernetes_isolate_node": NodeIsolation(api)},
        AuditLog(tmp_path / "audit.jsonl"),
        execute=True,
        inventory=Inventory({"nodes": nodes}),
    )

    async def decide() -> None:
        for one in (xid("control-plane", "a1"), xid("gpu-1", "a2"), xid("gpu-2", "a3")):
            await dispatcher.handle_one(one, {})

    asyncio.run(decide())
    lines = [json.loads(line) for line in (tmp_path / "audit.jsonl").read_text().splitlines()]
    assert [r["outcome"] for r in lines] == ["inventory", "applied", "breaker"]
    assert lines[0]["reason"] == "no nodes inventory entry matches node='control-plane'"
    assert lines[2]["reason"].startswith("breaker tripped: 2 of 3 in node h100")  # the pool's
    plane = fake.get("nodes", "", "control-plane")
    assert plane is not None and not plane["spec"].get("unschedulable")
    assert fake.get("nodes", "", "gpu-1")["spec"]["unschedulable"] is True  # type: ignore[index]


def test_the_models_pods_are_replicas_at_their_ip(fake: FakeKube, api: client.ApiClient) -> None:
    fake.add_pod("inference", "llama-0", labels={"inferwatch.io/model": "llama"}, ip="10.0.0.5")
    fake.add_pod("inference", "llama-1", labels={"inferwatch.io/model": "llama"})  # no IP yet
    fake.add_pod("other", "llama-2", labels={"inferwatch.io/model": "llama"}, ip="10.0.0.6")
    fake.add_pod("inference", "db-0", labels={"app": "db"}, ip="10.0.0.7")
    pods = Pods(namespace="inference", selector="inferwatch.io/model", port=9400, api=api)
    inventory = Inventory({"replicas": pods})
    labels = {"alertname": "X", "pod": "llama-0", "instance": "10.0.0.5:9400"}
    found = asyncio.run(inventory.resolve("isolate_replica", labels))
    assert found is not None
    entry, size = found
    assert dict(entry.labels) == {"pod": "llama-0", "namespace": "inference", "model": "llama",
                                  "instance": "10.0.0.5:9400", "node": ""}  # fmt: skip
    assert (entry.population, size) == ("llama", 1)
    for spoofed in ({"instance": "10.0.0.7:9400"}, {"pod": "llama-2"}, {"instance": "evil:80"}):
        with pytest.raises(Refused):
            asyncio.run(inventory.resolve("isolate_replica", {"alertname": "X", **spoofed}))


@pytest.mark.parametrize(
    ("population_label", "populations"),
    [("inferwatch.io/model", {"a-0": ("llama", 2), "b-0": ("qwen", 2)}),
     ("", {"a-0": ("replicas", 4), "b-0": ("replicas", 4)})],
)  # fmt: skip
def test_each_models_pods_are_a_breaker_population_of_their_own(
    fake: FakeKube, api: client.ApiClient, population_label: str, populations: dict[str, Any]
) -> None:
    """Two models in one namespace, their served names in no label (``model_label: ""``, as
    the kit lists them): with ``population_label`` each model's share is of its own pods."""
    for i, (pod, model) in enumerate([("a-0", "llama"), ("a-1", "llama"), ("b-0", "qwen"),
                                      ("b-1", "qwen")]):  # fmt: skip
        labels = {"inferwatch.io/sidecar": "true", "inferwatch.io/model": model}
        fake.add_pod("inference", pod, labels=labels, ip=f"10.0.0.{i + 1}")
    pods = Pods(namespace="inference", selector="inferwatch.io/sidecar=true", port=9400,
                model_label="", population_label=population_label, api=api)  # fmt: skip
    inventory = Inventory({"replicas": pods})
    for pod, expected in populations.items():
        found = asyncio.run(inventory.resolve("isolate_replica", {"alertname": "X", "pod": pod}))
        assert found is not None
        entry, size = found
        assert "model" not in entry.labels
        assert (entry.population, size) == expected


def test_a_setting_of_another_kind_is_refused_in_one_line() -> None:
    """``population_label`` lists replicas only: on the nodes it is a config error, not a
    crash when the inventory is built."""
    document = {
        "namespaces": [""],
        "breaker": {"max_fraction": 0.5},
        "inventory": {"nodes": {"kubernetes": {"selector": GPU, "population_label": "x"}}},
    }
    with pytest.raises(mapping.ConfigError, match=r"population_label: unknown field"):
        mapping.parse(document, "actions.yaml")


def test_configmap_writes_that_conflict_are_retried_and_none_is_lost(
    fake: FakeKube, api: client.ApiClient
) -> None:
    first, second = (ConfigMapStore(api, "inferwatch", "receiver-state") for _ in range(2))
    asyncio.run(first.transact(lambda s: s.remember(s.seen, "k0", 0.0)))  # creates it
    fake.line_up_reads(2)  # both replicas read the same resourceVersion

    def add(store: ConfigMapStore, key: str) -> None:
        asyncio.run(store.transact(lambda s: s.remember(s.seen, key, 1.0)))

    workers = [
        threading.Thread(target=add, args=(s, k)) for s, k in ((first, "k1"), (second, "k2"))
    ]
    for worker in workers:
        worker.start()
    for worker in workers:
        worker.join(30)
    state: State = asyncio.run(first.transact(lambda s: s))
    assert set(state.seen) == {"k0", "k1", "k2"}
    assert fake.count("PUT", 409) == 1  # the loser read again and wrote on top


def test_one_replica_holds_the_lease_and_another_takes_over_only_once_it_lapsed(
    fake: FakeKube, api: client.ApiClient
) -> None:
    """As client-go judges it: a lease lapses once this replica has seen it unchanged for a
    whole duration on its own clock, whatever the record's times say."""
    now = [1000.0]
    one, two = (LeaseElector(api, "inferwatch", "receiver", name, 15, lambda: now[0])
                for name in ("receiver-a", "receiver-b"))  # fmt: skip
    assert one.try_once() and one.leading()
    now[0] += 5
    assert not two.try_once() and not two.leading()  # first sight of the record
    assert one.try_once()  # renewed
    now[0] += 14
    assert not two.try_once()  # a renewal seen now: held
    now[0] += 14
    assert not two.try_once()  # unchanged for 14 s: still held
    now[0] += 2  # one stopped renewing 30 s ago, and two has seen nothing new for 16 s
    assert not one.leading()  # it gave up its belief before anyone could take over
    assert two.try_once() and two.leading()
    lease = fake.get("leases", "inferwatch", "receiver")
    assert lease is not None
    assert lease["spec"]["holderIdentity"] == "receiver-b"
    assert lease["spec"]["leaseTransitions"] == 1
    assert not one.try_once()


def plant_lease(api: client.ApiClient, holder: str, renewed: datetime.datetime,
                duration: Any = 15) -> None:  # fmt: skip
    """A Lease as another replica left it: its own clock's renewTime, its own duration."""
    stamp = renewed.strftime("%Y-%m-%dT%H:%M:%S.%fZ")
    spec = {"holderIdentity": holder, "leaseDurationSeconds": duration,
            "acquireTime": stamp, "renewTime": stamp, "leaseTransitions": 3}  # fmt: skip
    client.CoordinationV1Api(api).create_namespaced_lease(
        "inferwatch", {"metadata": {"name": "receiver"}, "spec": spec},  # type: ignore[arg-type]
        _preload_content=False,
    )  # fmt: skip


def test_a_dead_holder_whose_clock_ran_ahead_loses_the_lease_after_one_duration(
    fake: FakeKube, api: client.ApiClient
) -> None:
    """Its renewTime is a year ahead of ours: a receiver that trusted it would wait a year."""
    ahead = datetime.datetime.now(datetime.UTC) + datetime.timedelta(days=365)
    plant_lease(api, "receiver-dead", ahead)
    now = [1000.0]
    elector = LeaseElector(api, "inferwatch", "receiver", "receiver-a", 15, lambda: now[0])
    assert not elector.try_once()
    now[0] += 14
    assert not elector.try_once()
    now[0] += 2
    assert elector.try_once() and elector.leading()
    lease = fake.get("leases", "inferwatch", "receiver")
    assert lease is not None
    assert (lease["spec"]["holderIdentity"], lease["spec"]["leaseTransitions"]) == ("receiver-a", 4)


@pytest.mark.parametrize("duration", [10**9, 0, -5, None])
def test_a_lease_duration_out_of_bounds_is_refused_in_one_line(
    api: client.ApiClient, duration: Any, caplog: pytest.LogCaptureFixture
) -> None:
    """A holder claiming 31 years (or nothing, or less than a second) is held to this receiver's own
    duration: it neither blocks the election for ever nor loses the lease at first sight."""
    plant_lease(api, "receiver-x", datetime.datetime.now(datetime.UTC), duration)
    now = [1000.0]
    elector = LeaseElector(api, "inferwatch", "receiver", "receiver-a", 15, lambda: now[0])
    with caplog.at_level(logging.WARNING, "inferwatch.runbooks"):
        assert not elector.try_once()
        now[0] += 14
        assert not elector.try_once()
        now[0] += 2
        assert elector.try_once()
    refused = [r for r in caplog.records if r.getMessage() == "lease duration out of bounds"]
    assert len(refused) == 1, caplog.text  # once for the record, not once per attempt
    assert refused[0].__dict__["inferwatch_fields"]["holder"] == "receiver-x"


def test_a_standby_replica_refuses_webhooks_and_fails_readiness(
    api: client.ApiClient, tmp_path: Path
) -> None:
    config = mapping.parse({"namespaces": [""], "breaker": {"max_fraction": 0.5}})
    leading = LeaseElector(api, "inferwatch", "receiver", "receiver-a")
    standby = LeaseElector(api, "inferwatch", "receiver", "receiver-b")
    assert leading.try_once() and not standby.try_once()
    dispatcher = Dispatcher(
        config,
        {},
        AuditLog(tmp_path / "audit.jsonl"),
        execute=True,
        store=ConfigMapStore(api, "inferwatch", "receiver"),
        leader=standby,
    )
    app = Receiver(dispatcher, "receiver-token-0123456789").app()

    async def ask() -> tuple[httpx.Response, httpx.Response]:
        transport = httpx.ASGITransport(app=app)
        async with httpx.AsyncClient(transport=transport, base_url="http://receiver") as http:
            headers = {"authorization": "Bearer receiver-token-0123456789"}
            hook = await http.post("/webhook", content=b"{}", headers=headers)
            return hook, await http.get("/readyz")

    hook, ready = asyncio.run(ask())
    assert hook.status_code == 503 and hook.headers["retry-after"] == "5"
    assert ready.status_code == 503 and "another receiver leads" in ready.text


def test_an_api_answer_is_read_with_a_bound() -> None:
    class Endless:
        def read(self, amount: int) -> bytes:
            return b" " * amount

    with pytest.raises(ValueError, match="larger than 1024 bytes"):
        body(Endless(), 1024)
