"""Tenant label cardinality stays bounded under a flood, and no token is lost by folding."""

from __future__ import annotations

import random
import string

import pytest
from hypothesis import given
from hypothesis import strategies as st
from prometheus_client import generate_latest

from inferwatch.identity import UNKNOWN
from inferwatch.proxy import config as proxy_config
from inferwatch.proxy.app import ProxyApp
from inferwatch.proxy.assembly import build
from inferwatch.proxy.labels import OTHER, BoundedLabels, split_label
from inferwatch.proxy.metrics import ProxyMetrics
from inferwatch.proxy.tenants import TenantResolver, hash_key
from inferwatch.proxy.usage import Usage
from inferwatch.wire import SPLITS

pytestmark = pytest.mark.unit


class Clock:
    def __init__(self) -> None:
        self.now = 0.0

    def __call__(self) -> float:
        return self.now


def test_100k_distinct_tenants_from_a_trusted_header_keep_the_bound() -> None:
    config = proxy_config.parse(
        {
            "identity": {"trusted_sources": ["10.0.0.0/8"]},
            "tenants": {"acme": {"key_sha256": [hash_key("sk-acme")]}},
            "labels": {"max_tenants": 50},
        }
    )
    app = ProxyApp(build(config, access_log=False))
    resolver = TenantResolver(config)
    rng = random.Random(7)
    charged = 0
    for index in range(100_000):
        tenant_id = "".join(rng.choices(string.ascii_lowercase, k=12)) + str(index)
        resolution = resolver.resolve([(b"x-inferwatch-tenant", tenant_id.encode())], "10.1.2.3")
        assert resolution.tenant == tenant_id
        identity = (app.parts.tenant_labels.label(tenant_id), "m", "", "", "", "")
        app.parts.metrics.charge(
            identity, Usage(prompt=3, completion=2), "reported", "complete", 0.0
        )
        charged += 5
    app.parts.metrics.charge(
        ("acme", "m", "", "", "", ""), Usage(prompt=1), "reported", "complete", 0.0
    )
    tenants = {identity[0] for identity, *_ in app.parts.metrics.tokens}
    assert len(tenants) == 50 + 2  # the 50 slots, the allow-listed tenant, and `other`
    assert {"acme", OTHER} <= tenants
    assert app.parts.tenant_labels.folded == 100_000 - 50
    assert app.parts.metrics.charged.total == charged + 1
    assert sum(app.parts.metrics.tokens.values()) == charged + 1
    page = generate_latest(app.registry()).decode()
    series = [line for line in page.splitlines() if line.startswith("inferwatch_tenancy_tokens")]
    assert len(series) == 2 * 51 + 1  # prompt and completion per label, prompt for acme
    assert "inferwatch_tenancy_tenant_label_folds_total 99950.0" in page


def test_idle_tenants_are_evicted_into_other_without_losing_tokens() -> None:
    clock = Clock()
    labels = BoundedLabels(capacity=2, allow=["vip"], idle_seconds=60, clock=clock)
    metrics = ProxyMetrics()

    def charge(tenant: str, tokens: int) -> None:
        identity = (labels.label(tenant), "m", "v1", "e1", "p1", "weight")
        metrics.charge(identity, Usage(prompt=tokens), "reported", "complete", tokens / 10)
        metrics.request(identity, "ok")
        metrics.timing(identity, 0.1, 0.5)

    charge("a", 10)
    charge("b", 20)
    charge("c", 40)  # no slot left
    charge("vip", 1)
    assert labels.label("c") == OTHER
    clock.now = 30
    charge("b", 5)  # b stays active
    clock.now = 70
    released = labels.evict_idle()
    assert released == ["a"]
    metrics.fold("tenant", released)
    by_tenant: dict[str, int] = {}
    for (identity, _, _), value in metrics.tokens.items():
        by_tenant[identity[0]] = by_tenant.get(identity[0], 0) + value
    assert by_tenant == {"b": 25, OTHER: 50, "vip": 1}
    assert metrics.requests[(("other", "m", "v1", "e1", "p1", "weight"), "ok")] == 2
    assert metrics.duration[(("other", "m", "v1", "e1", "p1", "weight"),)].counts[6] == 2
    assert sum(metrics.cost.values()) == 7.6
    charge("d", 1)  # the freed slot is usable again
    assert labels.label("d") == "d"


@given(st.lists(st.tuples(st.binary(max_size=40), st.binary(max_size=200)), max_size=8))
def test_any_headers_give_one_of_the_few_split_values(headers: list[tuple[bytes, bytes]]) -> None:
    assert split_label(headers) in {*SPLITS, OTHER, UNKNOWN}


def test_the_split_label_reads_the_gateways_header() -> None:
    assert split_label([(b"x-inferwatch-split", b"header")]) == "header"
    assert split_label([(b"x-inferwatch-split", b" User ")]) == "user"
    assert split_label([(b"x-inferwatch-split", b"canary-9")]) == OTHER
    assert split_label([(b"x-other", b"weight")]) == UNKNOWN
