"""Routing over real HTTP: no unmetered path, one spelling per route, tenant data private."""

from __future__ import annotations

import json
import socket
from collections.abc import Callable
from typing import Any

import httpx
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from inferwatch.proxy import config as proxy_config
from inferwatch.proxy import routes
from inferwatch.proxy.tenants import hash_key
from support.proxy_stack import CHAT, KEYS, Engine, Stack, auth, samples

pytestmark = pytest.mark.unit

MakeStack = Callable[..., Stack]
BODY = {"model": "m", "messages": [{"role": "user", "content": "hi"}], "max_tokens": 3}


def raw_request(url: str, head: bytes, body: bytes = b"") -> tuple[int, bytes]:
    """Send bytes exactly as written (httpx would normalise the target); status and the rest
    of the reply, read to the end (the request asks the server to close)."""
    host, port = url.removeprefix("http://").split(":")
    with socket.create_connection((host, int(port)), timeout=10) as sock:
        sock.sendall(head + body)
        data = b""
        while piece := sock.recv(65536):
            data += piece
    head_bytes = data.partition(b"\r\n\r\n")[0]
    status = int(head_bytes.split(b" ")[1]) if head_bytes else 0
    return status, data


def post_raw(proxy: Stack, target: str, method: str = "POST") -> tuple[int, bytes]:
    body = json.dumps(BODY).encode()
    head = (
        f"{method} {target} HTTP/1.1\r\nhost: x\r\nauthorization: Bearer {KEYS['acme']}\r\n"
        f"content-type: application/json\r\ncontent-length: {len(body)}\r\n"
        "connection: close\r\n\r\n"
    ).encode()
    return raw_request(proxy.url, head, body)


# ---------------------------------------------------------------- generating routes
GENERATING_ROUTES = [
    "/v1/responses",
    "/v1/responses/resp_1/cancel",
    "/v1/messages",
    "/pooling",
    "/classify",
    "/score",
    "/v1/score",
    "/rerank",
    "/v1/rerank",
    "/v2/rerank",
    "/v1/audio/transcriptions",
    "/v1/audio/translations",
    "/invocations",
    "/inference/v1/generate",
    "/generate",
    "/generate_stream",
    "/encode",
    "/embed",
    "/predict",
    "/",
]


@pytest.mark.parametrize("path", GENERATING_ROUTES)
def test_routes_that_generate_unmetered_are_refused_with_a_reason(
    proxy: Stack, engine: Engine, path: str
) -> None:
    seen = len(engine.engine.targets_seen)
    reply = proxy.client.post(path, json=BODY, headers=auth("acme"))
    assert reply.status_code == 403
    error = reply.json()["error"]
    assert error["code"] == "rejected_route"
    assert "does not meter" in error["message"]
    assert len(engine.engine.targets_seen) == seen, "the engine must never see it"


def test_other_routes_pass_only_when_allow_listed(stack: MakeStack, engine: Engine) -> None:
    default = stack()
    assert default.client.get("/v1/models", headers=auth("acme")).status_code == 200
    refused = default.client.post("/tokenize", json={"prompt": "x"}, headers=auth("acme"))
    assert refused.status_code == 404
    assert "routes.passthrough" in refused.json()["error"]["message"]
    assert default.client.delete("/v1/models", headers=auth("acme")).status_code == 404
    opened = stack(routes={"passthrough": ["GET /v1/models", "POST /tokenize"]})
    seen = len(engine.engine.targets_seen)
    assert opened.client.post("/tokenize", json={"x": 1}, headers=auth("acme")).status_code == 200
    assert engine.engine.targets_seen[seen:] == ["/tokenize"]


@pytest.mark.parametrize(
    "entry", ["POST /generate", "POST /v1/chat/completions/", "GET /v1/audio/x"]
)
def test_a_generating_route_cannot_be_allow_listed(entry: str) -> None:
    with pytest.raises(
        proxy_config.ConfigError, match=r"routes\.passthrough: .*cannot pass unmetered"
    ):
        proxy_config.parse({"routes": {"passthrough": [entry]}}, "p.yaml")


# ---------------------------------------------------------------- spellings
def _segment_spelling(draw: Any, segment: str) -> list[str]:
    out = []
    for _ in range(draw(st.integers(0, 2))):
        out.append(draw(st.sampled_from(["", ".", "junk/.."])))
    chars = []
    for ch in segment:
        chars.append(
            f"%{ord(ch):02{draw(st.sampled_from(['x', 'X']))}}" if draw(st.booleans()) else ch
        )
    out.append("".join(chars))
    return out


@st.composite
def spellings(draw: Any, path: str) -> str:
    parts: list[str] = []
    for segment in path.strip("/").split("/"):
        parts.extend(_segment_spelling(draw, segment))
    trailing = draw(st.sampled_from(["", "/", "//", "/."]))
    spelled = parts[0]
    for part in parts[1:]:  # engines decode an escaped slash before they route
        spelled += draw(st.sampled_from(["/", "/", "%2F", "%2f"])) + part
    return "/" + spelled + trailing


@settings(
    max_examples=40,
    deadline=None,
    suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.too_slow],
)
@given(target=spellings("/v1/chat/completions"))
def test_any_spelling_of_chat_is_metered_as_chat(proxy: Stack, engine: Engine, target: str) -> None:
    """Doubled or trailing slashes, dot segments and percent-escapes reach the engine only as
    the one metered route, and the request is charged."""
    before = samples(proxy.metrics(), "inferwatch_tenancy_accounted_requests_total")
    seen = len(engine.engine.targets_seen)
    status, body = post_raw(proxy, target)
    assert status == 200, (target, body)
    assert engine.engine.targets_seen[seen:] == ["/v1/chat/completions"]
    deadline = 50
    while samples(proxy.metrics(), "inferwatch_tenancy_accounted_requests_total") == before:
        deadline -= 1
        assert deadline, "the request was not charged"


@settings(
    max_examples=40,
    deadline=None,
    suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.too_slow],
)
@given(path=st.sampled_from(GENERATING_ROUTES[:-1]), data=st.data())
def test_no_spelling_of_a_generating_route_reaches_the_engine(
    proxy: Stack, engine: Engine, path: str, data: st.DataObject
) -> None:
    target = data.draw(spellings(path))
    method = data.draw(st.sampled_from(["POST", "GET", "PUT"]))
    seen = len(engine.engine.targets_seen)
    status, _ = post_raw(proxy, target, method)
    assert status in (400, 403, 404), target
    assert len(engine.engine.targets_seen) == seen


def test_the_router_normalises_before_it_decides() -> None:
    router = routes.Router()
    chat = router.route("post", b"/v1//chat/./x/../completions/", b"stream=1")
    assert (chat.kind, chat.path, chat.target) == (
        "metered",
        "/v1/chat/completions",
        b"/v1/chat/completions?stream=1",
    )
    assert router.route("GET", b"/v1/chat/completions", b"").kind == "unmetered"
    assert router.route("GET", b"/../../health", b"").kind == "passthrough"
    assert router.route("POST", b"/health", b"").kind == "refused"
    with pytest.raises(routes.BadTarget):
        router.route("GET", b"/health%00", b"")
    with pytest.raises(routes.BadTarget):
        router.route("GET", b"/%ff", b"")


def test_bad_targets_are_a_clear_400(proxy: Stack, engine: Engine) -> None:
    seen = len(engine.engine.targets_seen)
    for target in ("/v1/chat%0Acompletions", "/v1/%ff"):
        status, body = post_raw(proxy, target)
        assert status == 400, (target, body)
        assert b"rejected_bad_request" in body
    assert len(engine.engine.targets_seen) == seen


# ---------------------------------------------------------------- tenant data is private
def test_tenant_metrics_are_served_only_on_the_metrics_listener(proxy: Stack) -> None:
    assert proxy.client.post(CHAT, json=BODY, headers=auth("acme")).status_code == 200
    private = proxy.metrics()
    assert samples(private, "inferwatch_tenancy_tokens_total", tenant="acme") > 0
    public = proxy.client.get("/metrics", headers=auth("globex"))
    # the client port passes GET /metrics to the engine, whose page knows no tenants
    assert public.status_code == 200
    assert "inferwatch_tenancy" not in public.text and "acme" not in public.text
    assert "vllm:prompt_tokens_total" in public.text
    assert httpx.get(proxy.server.metrics_url + "/v1/models").status_code == 404


@pytest.mark.parametrize("claimed", ["unknown", "other", "_probe"])
def test_reserved_tenants_cannot_be_claimed_through_the_tenant_header(
    stack: MakeStack, claimed: str
) -> None:
    gateway = stack(
        identity={"trusted_sources": ["127.0.0.1/32"], "unknown": "attribute"},
        tenants={
            "acme": {"key_sha256": [hash_key(KEYS["acme"])]},
            "_probe": {"key_sha256": [hash_key("sk-probe")]},
        },
    )
    header = {"x-inferwatch-tenant": claimed}
    refused = gateway.client.post(CHAT, json=BODY, headers=header)
    assert refused.status_code == 401
    assert "reserved tenant" in refused.json()["error"]["message"]
    # with a key the key decides, never the reserved name
    keyed = gateway.client.post(CHAT, json=BODY, headers={**header, **auth("acme")})
    assert keyed.status_code == 200
    page = gateway.metrics()
    assert samples(page, "inferwatch_tenancy_requests_total", tenant="acme", outcome="ok") == 1
    assert samples(page, "inferwatch_tenancy_tokens_total", tenant=claimed) == 0
    assert (
        gateway.client.post(CHAT, json=BODY, headers={"x-inferwatch-tenant": "team-a"}).status_code
        == 200
    )
