"""Who is billed, through a real haproxy: the generated gateway in front of a real proxy.

The proxy trusts the gateway's address for the tenant header (``identity.trusted_sources``),
so whatever the gateway passes on decides whose budget a request spends. A client's own
tenant, split and version headers must never get that far; the proxy reads the names from
its config, and so does the generator (``proxy_config`` in the topology).
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from pathlib import Path

import httpx
import pytest
import yaml

import support.k8s as k8s_support
from inferwatch.gateway import haproxy as gateway
from inferwatch.k8s.overlay import proxy_headers
from inferwatch.k8s.site import SiteError
from support.ports import launch
from support.proxy_stack import CHAT, Stack, auth, samples
from support.shared import tool

pytestmark = pytest.mark.proc

MODEL = "m"
#: the proxy config's own names for two of the headers it takes from a gateway
TENANT_HEADER, VERSION_HEADER = "x-billed-to", "x-weights"


def chat() -> dict[str, object]:
    return {"model": MODEL, "messages": [{"role": "user", "content": "hi"}], "max_tokens": 3}


@pytest.fixture(scope="module")
def fleet(
    stack: Callable[..., Stack], haproxy_bin: str, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[tuple[Stack, str, Path]]:
    """A proxy that trusts loopback (where haproxy connects from), haproxy in front of it."""
    identity = {"trusted_sources": ["127.0.0.1/32"], "tenant_header": TENANT_HEADER}
    versions = {"model_version": "v1", "model_version_header": VERSION_HEADER}
    proxy = stack(identity=identity, versions=versions)
    folder = tmp_path_factory.mktemp("gateway")
    (folder / "proxy.yaml").write_text(yaml.safe_dump({"identity": identity, "versions": versions}))
    port = int(proxy.url.rsplit(":", 1)[1])
    config = folder / "haproxy.cfg"

    def argv(listen: int) -> list[str]:
        topology_file = folder / "topology.yaml"
        topology_file.write_text(
            yaml.safe_dump(
                {
                    "listen": f"127.0.0.1:{listen}",
                    "runtime": str(folder / "admin.sock"),
                    "proxy_config": "proxy.yaml",  # found beside the topology
                    "models": {
                        MODEL: {
                            "replicas": [
                                {"name": "r1", "version": "v1", "address": f"127.0.0.1:{port}",
                                 "check_port": port}  # the proxy's own /readyz
                            ]
                        }
                    },
                }
            )
        )  # fmt: skip
        config.write_text(gateway.render(gateway.load(topology_file)))
        return [haproxy_bin, "-db", "-f", str(config)]

    process, url = launch(argv, folder / "haproxy.log", "/healthz", "haproxy")
    try:
        yield proxy, url, config
    finally:
        process.terminate()
        process.wait(10)


def test_the_gateway_removes_every_header_the_proxy_takes_from_it(
    fleet: tuple[Stack, str, Path],
) -> None:
    proxy, _, config = fleet
    lines = config.read_text().splitlines()
    removed = [line.split()[-1] for line in lines if "http-request del-header" in line]
    assert removed == list(proxy.app.config.gateway_headers)
    assert {TENANT_HEADER, VERSION_HEADER, "x-inferwatch-split"} <= set(removed)
    # and the one header the gateway derives itself is set after the removals
    split = lines.index("    http-request set-header x-inferwatch-split weight")
    assert split > max(i for i, line in enumerate(lines) if "del-header" in line)


def test_a_clients_own_tenant_header_does_not_pick_the_budget(
    fleet: tuple[Stack, str, Path],
) -> None:
    proxy, url, _ = fleet
    with httpx.Client(base_url=url, timeout=20) as client:
        # no key: the header was the gateway's to set, and it set none
        claimed = client.post(CHAT, json=chat(), headers={TENANT_HEADER: "globex"})
        assert claimed.status_code == 401, claimed.text
        # acme's key with globex's name: acme pays
        keyed = client.post(CHAT, json=chat(), headers=auth("acme", **{TENANT_HEADER: "globex"}))
        assert keyed.status_code == 200, keyed.text
    page = proxy.metrics()
    assert samples(page, "inferwatch_tenancy_tokens_total", tenant="globex") == 0
    assert samples(page, "inferwatch_tenancy_requests_total", tenant="acme", outcome="ok") == 1


def test_a_client_cannot_choose_the_version_or_split_it_is_charged_to(
    fleet: tuple[Stack, str, Path],
) -> None:
    proxy, url, _ = fleet
    headers = auth("acme", **{VERSION_HEADER: "cheap", "x-inferwatch-split": "header"})
    with httpx.Client(base_url=url, timeout=20) as client:
        assert client.post(CHAT, json=chat(), headers=headers).status_code == 200
    page = proxy.metrics()
    assert samples(page, "inferwatch_tenancy_requests_total", model_version="cheap") == 0
    assert samples(page, "inferwatch_tenancy_requests_total", split="header") == 0
    assert samples(page, "inferwatch_tenancy_requests_total", model_version="v1", split="weight")


@pytest.mark.parametrize("overlay", ["single-cluster", "multi-cluster-east"])
def test_every_route_rule_removes_or_sets_what_the_kits_proxy_takes(overlay: str) -> None:
    """The Gateway API has no wildcard: each rule names every header of the kit's proxy."""
    documents = k8s_support.render(tool("kubectl"), overlay)
    (route,) = [d for d in documents if d["kind"] == "HTTPRoute"]
    k8s_support.validate(route)  # `remove` is a field the CRD knows
    taken = set(proxy_headers(k8s_support.KIT))
    assert {"x-inferwatch-tenant", "x-inferwatch-split", "x-model-version"} <= taken
    rules = route["spec"]["rules"]
    assert len(rules) >= 2
    for rule in rules:
        (modifier,) = [f["requestHeaderModifier"] for f in rule["filters"]]
        handled = set(modifier.get("remove", [])) | {h["name"] for h in modifier.get("set", [])}
        assert handled == taken, rule
        assert {h["name"] for h in modifier["set"]} == {"x-inferwatch-split"}


def test_the_kit_reads_renamed_headers_from_its_proxy_config(tmp_path: Path) -> None:
    folder = tmp_path / "base" / "model"
    folder.mkdir(parents=True)
    proxy_yaml = "identity: {tenant_header: X-Billed-To}\nversions: {prompt_version_header: x-p}\n"
    (folder / "vllm.yaml").write_text(
        yaml.safe_dump({"kind": "ConfigMap", "data": {"proxy.yaml": proxy_yaml}})
    )
    assert proxy_headers(tmp_path) == (
        "x-billed-to", "x-inferwatch-split", "x-model-version", "x-engine-version", "x-p",
    )  # fmt: skip
    (folder / "vllm.yaml").write_text(
        yaml.safe_dump({"kind": "ConfigMap", "data": {"proxy.yaml": "identity: {bogus: 1}\n"}})
    )
    with pytest.raises(SiteError, match=r"proxy\.yaml\): identity\.bogus: unknown field"):
        proxy_headers(tmp_path)


@pytest.mark.parametrize(
    ("proxy_yaml", "reason"),
    [
        ("identity: {bogus: 1}\n", r"proxy_config: .*proxy\.yaml: identity\.bogus: unknown field"),
        ("identity: {tenant_header: 'x bad#'}\n", r"proxy_config: header name 'x bad#' is not"),
        (None, r"proxy_config: .*proxy\.yaml"),  # no such file
    ],
    ids=["bad-field", "bad-header-name", "missing"],
)
def test_a_topologys_proxy_config_that_cannot_be_used_is_one_line(
    tmp_path: Path, proxy_yaml: str | None, reason: str
) -> None:
    if proxy_yaml is not None:
        (tmp_path / "proxy.yaml").write_text(proxy_yaml)
    topology = tmp_path / "topology.yaml"
    topology.write_text(
        yaml.safe_dump(
            {"listen": "127.0.0.1:8080", "runtime": "/tmp/a.sock", "proxy_config": "proxy.yaml",
             "models": {MODEL: {"replicas": [{"name": "r", "version": "v",
                                              "address": "127.0.0.1:2", "check_port": 3}]}}}
        )
    )  # fmt: skip
    with pytest.raises(gateway.TopologyError, match=reason) as raised:
        gateway.load(topology)
    assert "\n" not in str(raised.value)
