"""The multi-tenant load generator, and the readiness-aware routing a gateway would do.

Requests arrive as a Poisson process at ``rate`` per second; each belongs to a tenant (by share),
asks for the tenant's model with a prompt and a completion length drawn from its profile, and
streams its reply through the tenancy proxy of the replica the router picks, with the tenant's
API key. The router honours the sidecars' ``/readyz`` as a Kubernetes Service does: a replica
that is not ready gets no new requests, and when no replica of a model is ready its traffic
moves to the other model (the fallback route), with the request's ``model`` rewritten.
"""

from __future__ import annotations

import asyncio
import random
from collections.abc import Mapping, Sequence
from dataclasses import dataclass

import httpx

from inferwatch.demo.topology import Replica, Role, Tenant

_TEXT = (
    "latency throughput replica cache token batch schedule prompt answer request budget tenant "
    "gateway rollout canary fallback signal probe quality window cluster node pod queue memory "
    "power clock error metric alert runbook"
)
_VOCABULARY = _TEXT.split()
#: requests in flight above which new arrivals are dropped (the client is saturated)
MAX_IN_FLIGHT = 64


@dataclass
class LoadStats:
    """What the load generator saw from the client side (cumulative)."""

    sent: int = 0
    ok: int = 0
    rejected: int = 0  # 4xx from the proxy: budget, auth, too long
    failed: int = 0  # 5xx and transport errors
    dropped: int = 0  # not sent: too many in flight
    in_flight: int = 0


class Router:
    """Picks the replica for a request from the replicas' latest readiness."""

    def __init__(self, replicas: Sequence[Replica]) -> None:
        self.replicas = tuple(replicas)
        self.ready: dict[str, bool] = {r.name: True for r in replicas}

    def serving(self, role: Role) -> list[Replica]:
        """The replicas that take ``role``'s traffic now."""
        own = [r for r in self.replicas if r.role == role]
        ready = [r for r in own if self.ready[r.name]]
        if ready:
            return ready
        others = [r for r in self.replicas if r.role != role and self.ready[r.name]]
        return others or own  # nothing ready: keep trying its own (the errors show it)

    def pick(self, role: Role, rng: random.Random) -> Replica:
        candidates = self.serving(role)
        return rng.choices(candidates, weights=[r.weight for r in candidates])[0]

    def describe(self, role: Role) -> str:
        serving = self.serving(role)
        total = sum(r.weight for r in serving)
        return ", ".join(f"{r.name} {r.weight / total:.0%}" for r in serving)


class LoadGenerator:
    def __init__(
        self,
        http: httpx.AsyncClient,
        router: Router,
        proxy_urls: Mapping[str, str],
        tenants: Sequence[Tenant],
        rate: float,
        seed: int = 0,
    ) -> None:
        self.http = http
        self.router = router
        self.proxy_urls = proxy_urls
        self.tenants = tuple(tenants)
        self.rate = rate
        self.stats = LoadStats()
        self._rng = random.Random(seed)
        self._tasks: set[asyncio.Task[None]] = set()

    async def run(self) -> None:
        """Send requests until cancelled; in-flight requests are cancelled with it."""
        try:
            while True:
                if self.rate <= 0:
                    await asyncio.sleep(0.5)
                    continue
                await asyncio.sleep(self._rng.expovariate(self.rate))
                if self.stats.in_flight >= MAX_IN_FLIGHT:
                    self.stats.dropped += 1
                    continue
                task = asyncio.create_task(self._one(self._pick_tenant()))
                self._tasks.add(task)
                task.add_done_callback(self._tasks.discard)
        finally:
            for task in list(self._tasks):
                task.cancel()
            await asyncio.gather(*self._tasks, return_exceptions=True)

    def _pick_tenant(self) -> Tenant:
        return self._rng.choices(self.tenants, weights=[t.share for t in self.tenants])[0]

    def _body(self, tenant: Tenant, model: str) -> dict[str, object]:
        words = self._rng.randint(*tenant.prompt_words)
        text = " ".join(self._rng.choices(_VOCABULARY, k=words))
        return {
            "model": model,
            "messages": [{"role": "user", "content": f"Summarise for {tenant.name}: {text}"}],
            "max_tokens": self._rng.randint(*tenant.max_tokens),
            "stream": True,
        }

    async def _one(self, tenant: Tenant) -> None:
        replica = self.router.pick(tenant.role, self._rng)
        url = self.proxy_urls[replica.name] + "/v1/chat/completions"
        headers = {"Authorization": f"Bearer {tenant.key}"}
        self.stats.sent += 1
        self.stats.in_flight += 1
        try:
            async with self.http.stream(
                "POST", url, json=self._body(tenant, replica.model), headers=headers, timeout=60
            ) as response:
                if response.status_code >= 500:
                    self.stats.failed += 1
                elif response.status_code >= 400:
                    self.stats.rejected += 1
                elif await _stream_ok(response):
                    self.stats.ok += 1
                else:
                    self.stats.failed += 1
        except httpx.HTTPError:
            self.stats.failed += 1
        finally:
            self.stats.in_flight -= 1


async def _stream_ok(response: httpx.Response) -> bool:
    """Read an SSE reply to the end; False when it carried an error event."""
    ok = True
    async for line in response.aiter_lines():
        if line.startswith('data: {"error"'):
            ok = False
    return ok
