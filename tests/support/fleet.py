"""Several real ``inferwatch proxy`` processes sharing one redis-server, in front of the
scripted engine: the fleet the budget, failure-policy and rate-limit tests run against.

Each proxy has its own journal directory (as each pod has its own volume) and is started,
killed (``kill -9``) and restarted on its own; :func:`flood` sends many requests at once,
spread over the proxies, and returns what each answered.
"""

from __future__ import annotations

import asyncio
import json
import os
import subprocess
import sys
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, ClassVar

import httpx

from inferwatch.proxy.tenants import hash_key
from support.ports import announced_url
from support.proxy_stack import KEYS, samples
from support.redis import RedisServer
from support.restartable import Restartable
from support.wait import wait_for

INFERWATCH = Path(sys.executable).parent / "inferwatch"
CHAT = "/v1/chat/completions"


def _metrics_url(log: Path) -> str:
    for line in log.read_text(encoding="utf-8", errors="replace").splitlines():
        try:
            event = json.loads(line)
        except ValueError:
            continue
        if isinstance(event, dict) and event.get("metrics_listen"):
            return str(event["metrics_listen"])
    raise AssertionError(f"the proxy logged no metrics address: {log}")


@dataclass
class Proxy(Restartable):
    """One proxy of the fleet; :meth:`kill` leaves what it held to the leases, no drain."""

    stop_timeout: ClassVar[float] = 15.0

    config: Path
    directory: Path
    process: subprocess.Popen[bytes] | None = None
    url: str = ""
    metrics_url: str = ""
    starts: int = 0

    def start(self) -> None:
        self.starts += 1
        log = self.directory / f"proxy-{self.starts}.log"
        with log.open("w") as out:
            self.process = subprocess.Popen(
                [str(INFERWATCH), "--log-format", "json", "proxy", "--config", str(self.config),
                 "--listen", "127.0.0.1:0", "--metrics-listen", "127.0.0.1:0",
                 "--no-access-log", "--drain-grace", "1"],
                stdout=subprocess.DEVNULL,
                stderr=out,
                env={**os.environ, "PYTHONUNBUFFERED": "1"},
            )  # fmt: skip
        self.url = announced_url(self.process, log, "a fleet proxy")
        self.metrics_url = _metrics_url(log)

    def metrics(self) -> str:
        return httpx.get(self.metrics_url + "/metrics", timeout=10).text

    def ready(self) -> httpx.Response:
        return httpx.get(self.url + "/readyz", timeout=10)


@dataclass
class Fleet:
    redis: RedisServer
    engine_url: str
    directory: Path
    tenants: dict[str, Any]
    shared: dict[str, Any] = field(default_factory=dict)
    limits: dict[str, Any] = field(default_factory=dict)
    usage_log: dict[str, Any] = field(default_factory=dict)  # the section, where one is kept
    proxies: list[Proxy] = field(default_factory=list)

    def add(self, count: int) -> list[Proxy]:
        added = []
        for _ in range(count):
            index = len(self.proxies)
            directory = self.directory / f"proxy-{index}"
            (directory / "journal").mkdir(parents=True)
            document = {
                "upstream": {"url": self.engine_url, "reconcile_interval": 0, "read_timeout": 60},
                "tenants": {
                    name: {"key_sha256": [hash_key(KEYS[name])], **spec}
                    for name, spec in self.tenants.items()
                },
                "limits": self.limits,
                "shared_state": {
                    "url": self.redis.address,
                    # generous on a busy machine: a lease that runs out under a request still
                    # streaming frees its room early (the tests of that set their own)
                    "lease": "6s",
                    "timeout": "1s",
                    "journal_dir": str(directory / "journal"),
                    **self.shared,
                },
            }
            if self.usage_log:
                document["usage_log"] = self.usage_log
            config = directory / "proxy.yaml"
            config.write_text(json.dumps(document))
            proxy = Proxy(config, directory)
            proxy.start()
            self.proxies.append(proxy)
            added.append(proxy)
        return added

    def add_counted(self, count: int) -> list[Proxy]:
        """``count`` more proxies, once each of the fleet counts them all (their heartbeats
        seen in Redis): a test of shared books starts from a fleet that knows its size."""
        added = self.add(count)
        size = len(self.proxies)
        wait_for(
            lambda: all(
                samples(p.metrics(), "inferwatch_tenancy_shared_state_replicas") == size
                for p in self.proxies
            ),
            "each proxy to count the fleet",
        )
        return added

    def close(self) -> None:
        for proxy in self.proxies:
            proxy.stop()


def body(max_tokens: int, stream: bool = False) -> dict[str, Any]:
    return {
        "model": "m",
        "messages": [{"role": "user", "content": "hello there"}],
        "max_tokens": max_tokens,
        "stream": stream,
    }


async def _send(
    client: httpx.AsyncClient,
    url: str,
    tenant: str,
    request: dict[str, Any],
    delay_ms: int,
    tag: str,
) -> httpx.Response:
    headers = {
        "authorization": f"Bearer {KEYS[tenant]}",
        "x-delay-ms": str(delay_ms),
        "x-test-tag": tag,
    }
    return await client.post(url + CHAT, json=request, headers=headers)


def flood(
    urls: list[str],
    tenant: str,
    per_proxy: int,
    max_tokens: int,
    delay_ms: int = 200,
    tag: str = "",
) -> list[httpx.Response]:
    """``per_proxy`` requests at once to each proxy; every answer, in no particular order.
    ``tag`` names them for the engine's count of requests it runs at once (``peak``)."""

    async def go() -> list[httpx.Response]:
        limits = httpx.Limits(max_connections=len(urls) * per_proxy + 8)
        async with httpx.AsyncClient(timeout=60, limits=limits) as client:
            return list(
                await asyncio.gather(
                    *(
                        _send(client, url, tenant, body(max_tokens), delay_ms, tag)
                        for url in urls
                        for _ in range(per_proxy)
                    )
                )
            )

    return asyncio.run(go())


def wait_ready(proxy: Proxy, ready: bool, timeout: float = 15) -> None:
    wait_for(
        lambda: (proxy.ready().status_code == 200) == ready,
        f"the proxy's /readyz to say {'ready' if ready else 'not ready'}",
        timeout,
    )
