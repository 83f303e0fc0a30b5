"""Real receivers and real sidecars over loopback HTTP, for the runbook automation tests.

Each server is the production ASGI app under uvicorn (lifespan on, so the receiver's worker
runs) on a free port, in one event-loop thread that sync test code talks to. As a pytest plugin
it gives the fixtures ``runbook_loop`` (that thread, per test) and ``sidecars`` (a factory of
real sidecars on it).
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import threading
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest
import uvicorn
from starlette.applications import Starlette
from starlette.requests import Request
from starlette.responses import JSONResponse
from starlette.routing import Route

from inferwatch.exporters.engine.collector import EngineCollector
from inferwatch.exporters.sidecar import Sidecar
from inferwatch.runbooks import config as mapping
from inferwatch.runbooks.actions.isolate_replica import IsolateReplica
from inferwatch.runbooks.audit import AuditLog
from inferwatch.runbooks.dispatch import MAX_BACKLOG_BYTES, Dispatcher
from inferwatch.runbooks.inventory import Entry, Inventory, Kind, entry
from inferwatch.runbooks.server import Receiver
from inferwatch.runbooks.state import DirectoryStore
from inferwatch.serving.page_fetch import EngineScraper
from support.wait import wait_for

RECEIVER_TOKEN = "receiver-token-0123456789"
SIDECAR_TOKEN = "sidecar-admin-token-0123456789"
VLLM_PAGE = "/fixture/vllm-generated-0.33.0-1engine/metrics"


class Loop:
    """An event loop in a daemon thread, and the replica inventory its receivers trust (the
    sidecars started on it, and whatever a test lists)."""

    def __init__(self) -> None:
        self.listed: list[dict[str, str]] = []
        self.loop = asyncio.new_event_loop()
        self._thread = threading.Thread(target=self.loop.run_forever, daemon=True)
        self._thread.start()

    def run(self, factory: Callable[[], Any], timeout: float = 20.0) -> Any:
        return asyncio.run_coroutine_threadsafe(factory(), self.loop).result(timeout)

    def close(self) -> None:
        self.loop.call_soon_threadsafe(self.loop.stop)
        self._thread.join(5)
        self.loop.close()


class Served:
    """An ASGI app under uvicorn on a free loopback port (or ``port``, to restart on it), on
    ``host`` (another loopback address: a pod IP a test gives it)."""

    def __init__(self, loop: Loop, app: Any, port: int = 0, host: str = "127.0.0.1") -> None:
        self._loop = loop
        config = uvicorn.Config(app, host=host, port=port, log_config=None, lifespan="on")
        self.server = uvicorn.Server(config)

        async def start() -> tuple[asyncio.Task[None], int]:
            task = asyncio.ensure_future(self.server.serve())
            while not self.server.started:
                if task.done():
                    task.result()
                await asyncio.sleep(0.005)
            return task, int(self.server.servers[0].sockets[0].getsockname()[1])

        self._task, self.port = loop.run(start)
        self.url = f"http://{host}:{self.port}"
        self.address = f"{host}:{self.port}"

    def stop(self) -> None:
        self.server.should_exit = True

        async def wait() -> None:
            await self._task

        self._loop.run(wait)


class Listed:
    """A replica inventory read from a list the test changes as it starts sidecars."""

    kind: Kind = "replicas"

    def __init__(self, listed: list[dict[str, str]]) -> None:
        self.listed = listed

    async def entries(self) -> list[Entry]:
        return [entry(self.kind, labels) for labels in self.listed]


def listing(loop: Loop, address: str, model: str = "llama", **labels: str) -> dict[str, str]:
    """List a replica at ``address`` in the inventory of ``loop``'s receivers."""
    item = {"instance": address, "model": model, **labels}
    loop.listed.append(item)
    return item


class ReceiverUnderTest:
    def __init__(
        self,
        loop: Loop,
        tmp: Path,
        document: dict[str, Any],
        execute: bool,
        queue_size: int = 100,
        state_dir: Path | None = None,
        max_backlog_bytes: int = MAX_BACKLOG_BYTES,
    ) -> None:
        token_file = tmp / "sidecar-token"
        token_file.write_text(SIDECAR_TOKEN + "\n")
        self.config = mapping.parse(document, "test.yaml")
        self.audit_path = tmp / "audit.jsonl"
        self._loop = loop

        async def build() -> Dispatcher:  # httpx clients belong to the loop that uses them
            action = IsolateReplica(token_file=str(token_file), timeout=5.0)
            audit = AuditLog(self.audit_path)
            actions = {"isolate_replica": action}
            store = DirectoryStore(state_dir) if state_dir is not None else None
            return Dispatcher(
                self.config,
                actions,
                audit,
                execute=execute,
                queue_size=queue_size,
                store=store,
                inventory=Inventory({"replicas": Listed(loop.listed)}),
                max_backlog_bytes=max_backlog_bytes,
            )

        self.dispatcher: Dispatcher = loop.run(build)
        self.served = Served(loop, Receiver(self.dispatcher, RECEIVER_TOKEN, 64 * 1024).app())
        self.url = self.served.url

    def post(self, body: Any, token: str | None = RECEIVER_TOKEN, **kwargs: Any) -> httpx.Response:
        headers = {"authorization": f"Bearer {token}"} if token else {}
        if isinstance(body, (dict, list)):
            body = json.dumps(body)
        return httpx.post(
            self.url + "/webhook", content=body, headers=headers, timeout=10, **kwargs
        )

    def drain(self) -> None:
        """Wait until the worker has decided on everything accepted so far."""
        self._loop.run(self.dispatcher.drain)

    def audit(self) -> list[dict[str, Any]]:
        if not self.audit_path.exists():
            return []
        return [json.loads(line) for line in self.audit_path.read_text().splitlines()]

    def outcomes(self) -> list[str]:
        return [r["outcome"] for r in self.audit() if "outcome" in r]

    def wait_for(self, outcome: str, timeout: float = 15.0) -> dict[str, Any]:
        """The first audit record with ``outcome``, once the worker has written it."""

        def found() -> dict[str, Any] | None:
            return next((r for r in self.audit() if r.get("outcome") == outcome), None)

        return wait_for(found, f"{outcome!r} in the audit log", timeout, interval=0.02)

    def stop(self) -> None:
        self.served.stop()
        self.dispatcher.audit.close()


class SidecarUnderTest:
    def __init__(self, loop: Loop, engine_url: str, model: str = "llama") -> None:
        async def build() -> Sidecar:
            scraper = EngineScraper(engine_url, timeout_s=2.0, max_bytes=1 << 22)
            return Sidecar([EngineCollector(scraper, {"model": model})], admin_token=SIDECAR_TOKEN)

        self._loop = loop
        self.sidecar: Sidecar = loop.run(build)
        self.served = Served(loop, self.sidecar.app())
        self.url, self.address = self.served.url, self.served.address
        self.listed = listing(loop, self.address, model)

    def restart(self) -> None:
        """A new sidecar process on the same address: its isolation flag starts clear."""
        self.served.stop()
        self.sidecar.isolation.state = None
        self.served = Served(self._loop, self.sidecar.app(), self.served.port)

    def state(self) -> dict[str, Any]:
        reply = httpx.get(
            self.url + "/admin/isolation",
            headers={"authorization": f"Bearer {SIDECAR_TOKEN}"},
            timeout=10,
        )
        assert reply.status_code == 200
        result: dict[str, Any] = reply.json()
        return result

    def readyz(self) -> httpx.Response:
        return httpx.get(self.url + "/readyz", timeout=10)


def config(**overrides: Any) -> dict[str, Any]:
    """A mapping config with one isolation rule; overrides replace top-level sections."""
    document: dict[str, Any] = {
        "namespaces": ["*"],
        "breaker": {"max_fraction": 1.0, "window": "1h"},
        "rules": [
            {
                "name": "isolate-on-xid",
                "alertname": "InferwatchGPUXidErrors",
                "matchers": ['severity="critical"'],
                "action": "isolate_replica",
                "params": {"admin_url": "http://{instance}/admin/isolation"},
            }
        ],
    }
    document.update(overrides)
    return document


def alert(
    instance: str,
    *,
    status: str = "firing",
    fingerprint: str = "7f35b58fac4dbac1",
    starts_at: str = "2026-11-30T00:25:23.11723649Z",
    **labels: str,
) -> dict[str, Any]:
    return {
        "status": status,
        "labels": {
            "alertname": "InferwatchGPUXidErrors",
            "severity": "critical",
            "instance": instance,
            "model": "llama",
            **labels,
        },
        "annotations": {"summary": "A GPU reported XID errors that call for action."},
        "startsAt": starts_at,
        "endsAt": "0001-01-01T00:00:00Z" if status == "firing" else "2026-11-30T00:35:23Z",
        "generatorURL": "http://prom:9090/graph?g0.expr=x",
        "fingerprint": fingerprint,
    }


def payload(*alerts: dict[str, Any]) -> dict[str, Any]:
    return {
        "receiver": "runbooks",
        "status": "firing" if any(a["status"] == "firing" for a in alerts) else "resolved",
        "alerts": list(alerts),
        "groupLabels": {"alertname": "InferwatchGPUXidErrors"},
        "commonLabels": {},
        "commonAnnotations": {},
        "externalURL": "http://alertmanager:9093",
        "version": "4",
        "groupKey": '{}:{alertname="InferwatchGPUXidErrors"}',
        "truncatedAlerts": 0,
    }


@contextlib.contextmanager
def held_target(loop: Loop) -> Iterator[tuple[str, threading.Event]]:
    """A listed replica whose isolation calls wait until the block ends, to hold the receiver's
    worker: yields its address and the event set once a call arrived."""
    arrived, release = threading.Event(), asyncio.Event()

    async def admin(request: Request) -> JSONResponse:
        arrived.set()
        await release.wait()
        return JSONResponse({"isolated": True, "changed": True})

    slow = Served(loop, Starlette(routes=[Route("/admin/isolation", admin, methods=["POST"])]))
    listing(loop, slow.address)
    try:
        yield slow.address, arrived
    finally:
        loop.loop.call_soon_threadsafe(release.set)
        slow.stop()


@pytest.fixture
def runbook_loop() -> Iterator[Loop]:
    loop = Loop()
    yield loop
    loop.close()


@pytest.fixture
def sidecars(
    runbook_loop: Loop, page_server: Any
) -> Iterator[Callable[[int], list[SidecarUnderTest]]]:
    """A factory of real sidecars on the fixture page; all are stopped after the test."""
    made: list[SidecarUnderTest] = []

    def make(count: int) -> list[SidecarUnderTest]:
        url = page_server.url + VLLM_PAGE
        made.extend(SidecarUnderTest(runbook_loop, url) for _ in range(count))
        return made[-count:]

    yield make
    for sidecar in made:
        sidecar.served.stop()
