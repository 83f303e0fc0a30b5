"""The kit's Redis for the proxies' shared state: reachable from the model's pods only, its
password from a Secret in both Redis and the proxies, and a proxy config the proxy accepts."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
import yaml

from inferwatch.proxy import config as proxy_config
from support.k8s import KIT, render
from support.shared import tool

pytestmark = pytest.mark.proc

OVERLAYS = sorted(p.parent.name for p in (KIT / "overlays").glob("*/kustomization.yaml"))


@pytest.fixture(params=OVERLAYS)
def documents(request: pytest.FixtureRequest) -> list[dict[str, Any]]:
    return list(render(tool("kubectl"), str(request.param)))


def named(documents: list[dict[str, Any]], kind: str, name: str) -> dict[str, Any]:
    (found,) = [d for d in documents if d["kind"] == kind and d["metadata"]["name"] == name]
    return found


def test_redis_answers_the_models_pods_only(documents: list[dict[str, Any]]) -> None:
    policy = named(documents, "NetworkPolicy", "inferwatch-redis")
    (rule,) = policy["spec"]["ingress"]
    assert rule["ports"] == [{"port": 6379, "protocol": "TCP"}]
    assert rule["from"] == [
        {"podSelector": {"matchLabels": {"app.kubernetes.io/name": "llama-8b"}}}
    ]
    redis = named(documents, "StatefulSet", "inferwatch-redis")
    labels = redis["spec"]["template"]["metadata"]["labels"]
    assert policy["spec"]["podSelector"]["matchLabels"].items() <= labels.items()


def test_redis_and_the_proxies_take_the_password_from_one_secret(
    documents: list[dict[str, Any]],
) -> None:
    (container,) = named(documents, "StatefulSet", "inferwatch-redis")["spec"]["template"]["spec"][
        "containers"
    ]
    (env,) = container["env"]
    assert env["valueFrom"]["secretKeyRef"] == {"name": "inferwatch-redis", "key": "password"}
    assert "$REDIS_PASSWORD" in container["args"][0] and "--appendonly yes" in container["args"][0]
    models = [
        d for d in documents if d["kind"] == "Deployment" and "llama-8b" in d["metadata"]["name"]
    ]
    assert len(models) == 2  # stable and canary share the budgets
    for model in models:
        volumes = {v["name"]: v for v in model["spec"]["template"]["spec"]["volumes"]}
        assert volumes["redis-password"]["secret"]["secretName"] == "inferwatch-redis"
        assert "emptyDir" in volumes["proxy-journal"]


def test_each_proxy_config_reaches_the_kits_redis_and_loads(
    documents: list[dict[str, Any]], tmp_path: Path
) -> None:
    maps = [d for d in documents if d["kind"] == "ConfigMap" and "proxy.yaml" in d.get("data", {})]
    assert len(maps) == 2
    for config_map in maps:
        document = yaml.safe_load(config_map["data"]["proxy.yaml"])
        shared = document["shared_state"]
        assert shared["url"] == "redis://inferwatch-redis:6379/0"
        assert shared["password_file"] == "/etc/inferwatch/redis/password"
        assert shared["journal_dir"] == "/var/lib/inferwatch/journal"
        (tmp_path / "password").write_text("from-the-secret\n")
        shared.update(password_file=str(tmp_path / "password"), journal_dir=str(tmp_path))
        parsed = proxy_config.parse(document, config_map["metadata"]["name"]).shared_state
        assert parsed is not None and parsed.password == "from-the-secret"
