"""The multi-tenant load generator, sending every request through the gateway (HAProxy).

Requests arrive as a Poisson process at ``rate`` per second, on an absolute schedule (a busy
event loop that wakes late sends what it missed, so the load sent is the load asked for); each
belongs to a tenant (by share), asks for the tenant's model with a prompt and a completion
length drawn from its profile, and streams its reply through the gateway with the tenant's API
key. Routing is the gateway's: it honours the sidecars' ``/readyz`` and the weights the runbook
receiver sets, and sends a model whose replicas are all out to its fallback model's replicas,
which answer its name.
Each finished request is recorded with the server that answered it (HAProxy's
``X-Served-By`` header), so that where traffic went is seen from the client side.
"""

from __future__ import annotations

import asyncio
import random
import time
from collections import deque
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Literal

import httpx

from inferwatch.demo.topology import Role, Tenant, owner
from inferwatch.wire import SERVER_HEADER, parse_server_name

_TEXT = (
    "latency throughput replica cache token batch schedule prompt answer request budget tenant "
    "gateway rollout canary fallback signal probe quality window cluster node pod queue memory "
    "power clock error metric alert runbook"
)
_VOCABULARY = _TEXT.split()
#: requests in flight above which new arrivals are dropped (the client is saturated); well
#: above what the demo's scenarios need at their peak (22 req/s, seconds of queueing each)
MAX_IN_FLIGHT = 192
#: the most arrivals a late wake-up catches up on, in seconds of schedule: a client stalled
#: for longer sends a burst of at most this many seconds' requests, not its whole backlog
MAX_BACKLOG_S = 1.0


@dataclass
class LoadStats:
    """What the load generator saw from the client side (cumulative)."""

    sent: int = 0
    ok: int = 0
    rejected: int = 0  # 4xx from the proxy: budget, auth, too long
    failed: int = 0  # 5xx and transport errors
    dropped: int = 0  # not sent: too many in flight
    in_flight: int = 0


Outcome = Literal["ok", "rejected", "failed"]
#: finished requests kept for the drill's client-side view
HISTORY = 20_000


@dataclass(frozen=True)
class Completion:
    """One finished request as the client saw it."""

    started: float  # time.monotonic()
    ended: float
    tenant: str
    role: Role
    replica: str  # the replica that answered ("" when the gateway answered itself)
    outcome: Outcome


class LoadGenerator:
    def __init__(
        self,
        http: httpx.AsyncClient,
        gateway_url: str,
        models: Mapping[Role, str],
        tenants: Sequence[Tenant],
        rate: float,
        seed: int = 0,
    ) -> None:
        self.http = http
        self.url = gateway_url + "/v1/chat/completions"
        self.models = dict(models)
        self.tenants = tuple(tenants)
        self.rate = rate
        self.stats = LoadStats()
        self.history: deque[Completion] = deque(maxlen=HISTORY)
        #: (when, role, replica) as each answer's headers arrive: where new requests go, also
        #: while the replica stalls them
        self.routed: deque[tuple[float, Role, str]] = deque(maxlen=HISTORY)
        self._rng = random.Random(seed)
        self._tasks: set[asyncio.Task[None]] = set()

    async def run(self) -> None:
        """Send requests until cancelled; in-flight requests are cancelled with it."""
        loop = asyncio.get_running_loop()
        due = loop.time()
        try:
            while True:
                if self.rate <= 0:
                    await asyncio.sleep(0.5)
                    due = loop.time()
                    continue
                due = next_arrival(due, loop.time(), self.rate, self._rng)
                await asyncio.sleep(max(0.0, due - loop.time()))
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
        headers = {"Authorization": f"Bearer {tenant.key}"}
        body = self._body(tenant, self.models[tenant.role])
        self.stats.sent += 1
        self.stats.in_flight += 1
        started, replica = time.monotonic(), ""
        outcome: Outcome = "failed"
        try:
            async with self.http.stream(
                "POST", self.url, json=body, headers=headers, timeout=60
            ) as response:
                # the server is a proxy: both proxies of a replica count for the replica
                replica = owner(parse_server_name(response.headers.get(SERVER_HEADER, ""))[1])
                self.routed.append((time.monotonic(), tenant.role, replica))
                if response.status_code >= 500:
                    outcome = "failed"
                elif response.status_code >= 400:
                    outcome = "rejected"
                elif await _stream_ok(response):
                    outcome = "ok"
        except httpx.HTTPError:
            pass
        finally:
            self.stats.in_flight -= 1
            setattr(self.stats, outcome, getattr(self.stats, outcome) + 1)
            self.history.append(
                Completion(started, time.monotonic(), tenant.name, tenant.role, replica, outcome)
            )


def next_arrival(due: float, now: float, rate: float, rng: random.Random) -> float:
    """The arrival after the one due at ``due``, ``now`` being when the client woke for it.

    The gap is drawn from the previous arrival's due time, not from the wake-up, so late
    wake-ups do not stretch the schedule; a backlog older than ``MAX_BACKLOG_S`` is forgiven."""
    return max(due, now - MAX_BACKLOG_S) + rng.expovariate(rate)


async def _stream_ok(response: httpx.Response) -> bool:
    """Read an SSE reply to the end; False when it carried an error event."""
    ok = True
    async for line in response.aiter_lines():
        if line.startswith('data: {"error"'):
            ok = False
    return ok
