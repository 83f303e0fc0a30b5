"""Who is billed, at the proxy: nothing a client or an engine says is taken on trust.

A valid API key decides the tenant whatever headers come with it; the headers a gateway sets
count only from a trusted source; the engine's usage is charged within what was relayed and
what was reserved; every field a chat template renders counts against the input limit, and
every spelling of the completion cap is normalised or refused; only what the engine served
takes a label slot.
"""

from __future__ import annotations

from collections.abc import Callable

import pytest

from support.proxy_stack import CHAT, Stack, auth, samples

pytestmark = pytest.mark.unit

MakeStack = Callable[..., Stack]


def chat(**extra: object) -> dict[str, object]:
    return {"model": "m", "messages": [{"role": "user", "content": "hi"}], "max_tokens": 3, **extra}


# ---------------------------------------------------------------- tenant and gateway headers
def test_a_valid_key_wins_over_a_trusted_tenant_header(stack: MakeStack) -> None:
    gateway = stack(identity={"trusted_sources": ["127.0.0.1/32"]})
    headers = auth("acme", **{"x-inferwatch-tenant": "globex"})
    assert gateway.client.post(CHAT, json=chat(), headers=headers).status_code == 200
    page = gateway.metrics()
    assert samples(page, "inferwatch_tenancy_tokens_total", tenant="globex") == 0
    assert samples(page, "inferwatch_tenancy_requests_total", tenant="acme", outcome="ok") == 1
    # an unknown key leaves the decision to the gateway's header, as before
    unknown = {"authorization": "Bearer sk-nobody", "x-inferwatch-tenant": "team-blue"}
    assert gateway.client.post(CHAT, json=chat(), headers=unknown).status_code == 200
    assert samples(gateway.metrics(), "inferwatch_tenancy_requests_total", tenant="team-blue")


def test_split_and_version_headers_count_only_from_a_trusted_source(stack: MakeStack) -> None:
    elsewhere = stack(
        identity={"trusted_sources": ["10.0.0.0/8"]}, versions={"model_version": "v1"}
    )
    headers = auth("acme", **{"x-model-version": "cheap", "x-inferwatch-split": "header"})
    assert elsewhere.client.post(CHAT, json=chat(), headers=headers).status_code == 200
    page = elsewhere.metrics()
    assert samples(page, "inferwatch_tenancy_requests_total", model_version="cheap") == 0
    assert samples(page, "inferwatch_tenancy_requests_total", model_version="v1", split="unknown")
    gateway = stack(
        identity={"trusted_sources": ["127.0.0.1/32"]}, versions={"model_version": "v1"}
    )
    assert gateway.client.post(CHAT, json=chat(), headers=headers).status_code == 200
    page = gateway.metrics()
    assert samples(page, "inferwatch_tenancy_requests_total", model_version="cheap", split="header")
    for name in gateway.app.config.gateway_headers:  # none of them reaches the engine
        assert name not in gateway.engine.headers_seen[-1]
