"""The proxy exports each configured tenant's weight, the fair-share panel's denominator."""

from __future__ import annotations

import pytest

from inferwatch.proxy import config as proxy_config
from inferwatch.proxy.app import ProxyApp
from inferwatch.proxy.assembly import build
from inferwatch.proxy.tenants import hash_key

pytestmark = pytest.mark.unit


def test_every_configured_tenant_has_its_weight_as_a_gauge() -> None:
    document = {
        "upstream": {"url": "http://127.0.0.1:9", "reconcile_interval": 0},
        "tenants": {
            "paying": {"priority": "high", "weight": 4, "key_sha256": [hash_key("sk-p")]},
            "free": {"priority": "low", "key_sha256": [hash_key("sk-f")]},
        },
    }
    app = ProxyApp(build(proxy_config.parse(document, "test.yaml")))
    (family,) = [f for f in app.families() if f.name == "inferwatch_tenancy_weight"]
    assert family.type == "gauge"
    assert {s.labels["tenant"]: s.value for s in family.samples} == {"paying": 4, "free": 1}
