"""Canary splits through a real haproxy: by weight, by header and by user, each request
carrying the split it came through to the proxy, whatever the client sent.

Replicas are loopback HTTP servers that answer with their name and the split header they
received; sidecars answer ``/readyz`` as the test sets them.
"""

from __future__ import annotations

import collections
import json
import threading
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest

from inferwatch import wire
from inferwatch.gateway import haproxy as gateway
from support.gateway_stubs import Stub
from support.ports import launch
from support.wait import wait_for

pytestmark = pytest.mark.proc

MODEL = "org/big"
DEADLINE = 20.0
#: what a request to a gateway still starting or still switching raises
NOT_YET = (httpx.HTTPError, ValueError, KeyError)


@pytest.fixture
def fleet(haproxy_bin: str, tmp_path: Path) -> Iterator[tuple[str, dict[str, Stub]]]:
    """A stable v1 (weight 90) and a canary v2 (weight 10) for alice and the header."""
    stubs, sidecars, replicas = [], {}, []
    for name, version, weight in (("stable-1", "v1", 90), ("canary-1", "v2", 10)):
        stubs.append(Stub(0, name, "replica"))
        sidecars[name] = Stub(0, name, "sidecar")
        stubs.append(sidecars[name])
        replicas.append({"name": name, "version": version,
                         "address": f"127.0.0.1:{stubs[-2].server_address[1]}",
                         "check_port": sidecars[name].server_address[1],
                         "weight": weight})  # fmt: skip
    for stub in stubs:
        threading.Thread(target=stub.serve_forever, args=(0.05,), daemon=True).start()
    config = tmp_path / "haproxy.cfg"

    def argv(listen: int) -> list[str]:
        topology = gateway.parse(
            {
                "listen": f"127.0.0.1:{listen}",
                "runtime": str(tmp_path / "admin.sock"),
                "models": {
                    MODEL: {"replicas": replicas, "canary": {"version": "v2", "users": ["alice"]}}
                },
            }
        )
        config.write_text(gateway.render(topology))
        return [haproxy_bin, "-db", "-f", str(config)]

    process, url = launch(argv, tmp_path / "haproxy.log", "/healthz", "haproxy")
    try:
        wait_for(
            lambda: _ask(url, 1) == _ask(url, 1), "haproxy answering", DEADLINE, ignore=NOT_YET
        )
        yield url, sidecars
    finally:
        process.terminate()
        process.wait(10)
        for stub in stubs:
            stub.shutdown()
            stub.server_close()


def _ask(url: str, count: int, **headers: str) -> collections.Counter[tuple[str, str]]:
    """(replica, split header it received) of ``count`` requests, by count."""
    seen: collections.Counter[tuple[str, str]] = collections.Counter()
    with httpx.Client(timeout=10) as client:
        for _ in range(count):
            reply = client.post(
                f"{url}/v1/chat/completions", json={"model": MODEL, "messages": []}, headers=headers
            ).json()
            seen[(reply["replica"], ",".join(reply["splits"]))] += 1
    return seen


def test_weighted_traffic_is_marked_weight_on_both_versions(fleet: Any) -> None:
    url, _ = fleet
    seen = _ask(url, 200)
    assert set(seen) == {("stable-1", "weight"), ("canary-1", "weight")}, seen
    assert 0.03 <= seen[("canary-1", "weight")] / 200 <= 0.2, seen


def test_the_canary_header_and_a_listed_user_reach_the_canary_only(fleet: Any) -> None:
    url, _ = fleet
    assert _ask(url, 20, **{wire.CANARY_HEADER: "true"}) == {("canary-1", "header"): 20}
    assert _ask(url, 20, **{wire.USER_HEADER: "alice"}) == {("canary-1", "user"): 20}
    assert {split for _, split in _ask(url, 40, **{wire.USER_HEADER: "mallory"})} == {"weight"}


def test_a_client_cannot_claim_a_split(fleet: Any) -> None:
    url, _ = fleet
    seen = _ask(url, 40, **{wire.SPLIT_HEADER: "header"})
    assert {split for _, split in seen} == {"weight"}, seen
    assert seen[("stable-1", "weight")] > 0  # and it is not routed as a header split either


def test_an_unready_canary_sends_its_header_traffic_to_the_stable_version(fleet: Any) -> None:
    url, sidecars = fleet
    header = {wire.CANARY_HEADER: "true"}
    sidecars["canary-1"].ready = False
    wait_for(lambda: set(_ask(url, 5, **header)) == {("stable-1", "weight")},
             "the header split to fall back", DEADLINE, ignore=NOT_YET)  # fmt: skip
    # while the canary stays unready, every header request keeps going to the stable version
    assert set(_ask(url, 10, **header)) == {("stable-1", "weight")}
    sidecars["canary-1"].ready = True
    wait_for(lambda: set(_ask(url, 5, **header)) == {("canary-1", "header")},
             "the header split to return", DEADLINE, ignore=NOT_YET)  # fmt: skip
    assert set(_ask(url, 10, **header)) == {("canary-1", "header")}


@pytest.mark.parametrize(
    ("canary", "reason"),
    [
        ({"version": "v9"}, r"canary\.version: 'v9' has no replica"),
        ({"version": "v1", "users": ["a b"]}, r"canary\.users\[0\]: expected a name of"),
        ({"version": "v1", "header": "yes"}, r"canary\.header: expected true or false"),
        ({"version": "v1", "weight": 5}, r"canary\.weight: unknown field"),
        ("v1", "canary: expected a mapping"),
    ],
)
def test_bad_canary_specs_are_refused(canary: Any, reason: str) -> None:
    replica = {"name": "r1", "version": "v1", "address": "127.0.0.1:1", "check_port": 2}
    with pytest.raises(gateway.TopologyError, match=reason):
        gateway.parse({"listen": "127.0.0.1:3", "runtime": "/tmp/s", "models": {
            MODEL: {"replicas": [replica], "canary": canary}}})  # fmt: skip


@pytest.mark.parametrize(
    "users",
    ["release-qa", ["a b"], [""], [7], ["u"] * 65, ["x" * 64]],
)
def test_bad_canary_users_of_a_site_are_refused(users: Any, tmp_path: Path) -> None:
    from inferwatch.k8s.site import SiteError, load_site

    site = tmp_path / "site.yaml"
    site.write_text(json.dumps({"gateway": {"canary_users": users}}))
    with pytest.raises(SiteError, match=r"gateway\.canary_users"):
        load_site(site)
