"""Rate limits per tenant and per tenant and model: buckets, their headers as the openai SDK
sees them, and the config's mistakes (one proxy; the fleet's shared buckets are in
test_fleet_budget)."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import openai
import pytest

from inferwatch.proxy import config as proxy_config
from inferwatch.proxy.config import Limit, RateLimits
from inferwatch.proxy.ratelimit import Bucket, LocalBuckets, _duration, buckets, headers
from inferwatch.proxy.tenants import hash_key
from support.proxy_stack import KEYS, Stack, samples

pytestmark = pytest.mark.unit

MakeStack = Callable[..., Stack]


def limited(**limits: Any) -> dict[str, Any]:
    return {"acme": {"key_sha256": [hash_key(KEYS["acme"])], "rate_limits": limits}}


def client(stack: Stack) -> openai.OpenAI:
    """The tenant's OpenAI client: use it in a ``with`` block, which closes its connections."""
    return openai.OpenAI(base_url=stack.url + "/v1", api_key=KEYS["acme"], max_retries=0)


def chat(api: openai.OpenAI, model: str = "m", max_tokens: int = 4) -> Any:
    return api.chat.completions.with_raw_response.create(
        model=model, messages=[{"role": "user", "content": "hi"}], max_tokens=max_tokens
    )


def test_the_openai_client_sees_the_429_and_the_ratelimit_headers(stack: MakeStack) -> None:
    proxy = stack(tenants=limited(requests_per_minute=3, tokens_per_minute=100_000))
    with client(proxy) as api:
        first = chat(api)
        assert first.headers["x-ratelimit-limit-requests"] == "3"
        assert first.headers["x-ratelimit-remaining-requests"] == "2"
        assert first.headers["x-ratelimit-limit-tokens"] == "100000"
        assert first.headers["x-ratelimit-reset-requests"].endswith("s")
        chat(api), chat(api)
        with pytest.raises(openai.RateLimitError) as refused:
            chat(api)
        response = refused.value.response
        assert response.status_code == 429
        assert int(response.headers["retry-after"]) >= 1
        assert response.headers["x-ratelimit-remaining-requests"] == "0"
        assert refused.value.code == "rejected_rate_limit"
        outcome = samples(proxy.metrics(), "inferwatch_tenancy_requests_total", tenant="acme",
                          outcome="rejected_rate_limit")  # fmt: skip
        assert outcome == 1


def test_tokens_per_minute_refuse_once_usage_has_drained_the_bucket(stack: MakeStack) -> None:
    proxy = stack(tenants=limited(tokens_per_minute=30))
    with client(proxy) as api:
        chat(api, max_tokens=40)  # lets in a bucket above zero; its usage puts it in debt
        with pytest.raises(openai.RateLimitError) as refused:
            chat(api)
        assert refused.value.response.headers["x-ratelimit-remaining-tokens"] == "0"


def test_a_models_own_limit_applies_on_top_of_the_tenants(stack: MakeStack) -> None:
    proxy = stack(
        tenants=limited(requests_per_minute=100, models={"big": {"requests_per_minute": 1}})
    )
    with client(proxy) as api:
        chat(api, model="big")
        with pytest.raises(openai.RateLimitError):
            chat(api, model="big")
        assert chat(api, model="m").headers["x-ratelimit-remaining-requests"] == "98"


def test_a_bucket_refills_at_its_rate_and_never_over_capacity(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    now = [1000.0]
    monkeypatch.setattr("inferwatch.proxy.ratelimit.time.monotonic", lambda: now[0])
    local = LocalBuckets()
    found = [Bucket("", "requests", 60)]  # one a second
    for _ in range(60):
        assert local.take("t", found).admitted
    refused = local.take("t", found)
    assert not refused.admitted and refused.wait_s == pytest.approx(1.0)
    now[0] += 2.5
    assert local.take("t", found).levels == (pytest.approx(1.5),)
    now[0] += 3600
    assert local.take("t", found).levels == (pytest.approx(59.0),)  # full, less this one


def test_headers_name_the_tightest_bucket_of_each_kind() -> None:
    limits = RateLimits(Limit(100, 0), {"m": Limit(10, 1000)})
    found = buckets(limits, "m")
    taken = LocalBuckets().take("t", found)
    sent = dict(headers(found, taken))
    assert sent[b"x-ratelimit-limit-requests"] == b"10"
    assert sent[b"x-ratelimit-remaining-requests"] == b"9"
    assert sent[b"x-ratelimit-reset-requests"] == b"6s"
    assert sent[b"x-ratelimit-remaining-tokens"] == b"1000"
    assert [_duration(s) for s in (0.02, 1.5, 360)] == ["20ms", "1.5s", "6m0s"]
    assert buckets(limits, "m", divide=4)[1].capacity == 2  # a 1/N share while Redis is down


@pytest.mark.parametrize(
    "limits, field, reason",
    [
        ({}, "rate_limits", "give requests_per_minute"),
        ({"requests_per_minute": -1}, "requests_per_minute", "an integer from 0"),
        ({"models": {"m": {}}}, "rate_limits.models.m", "give requests_per_minute"),
        ({"per_hour": 5}, "per_hour", "unknown field"),
    ],
)
def test_a_bad_rate_limit_names_its_field(limits: Any, field: str, reason: str) -> None:
    with pytest.raises(proxy_config.ConfigError) as error:
        proxy_config.parse({"tenants": {"acme": {"rate_limits": limits}}}, "p.yaml")
    assert field in str(error.value) and reason in str(error.value)
