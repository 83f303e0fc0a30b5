"""The runbook receiver's handling time per webhook, next to a bare HTTP endpoint.

    .venv/bin/python bench/receiver.py [--payloads 1000]

One process runs, under uvicorn on loopback: a bare Starlette endpoint that reads the body and
answers 200 (the floor: HTTP, JSON-free), the receiver in dry-run, the receiver acting, and a
real sidecar (its engine unreachable: only its isolation endpoint and /readyz matter here).
The client replays the same Alertmanager v4 payload shape, one request at a time, each with
its own fingerprint so that every one is a new firing episode.

Rows: ``ack`` is the time from sending the webhook to the receiver's 200 (what Alertmanager
waits for); ``handled`` adds the worker's whole decision up to the fsync'd audit line: in
dry-run the plan, acting the POST to the sidecar's /admin/isolation and the /readyz read back
(the sidecar's isolation is cleared between payloads, outside the timing, so each one
applies). p50/p99 in milliseconds, and the ratio of each p50 to the floor's.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import logging
import os
import platform
import statistics
import tempfile
import time
from pathlib import Path
from typing import Any

import httpx
import uvicorn
from starlette.applications import Starlette
from starlette.requests import Request
from starlette.responses import Response
from starlette.routing import Route

from inferwatch.exporters.engine.collector import EngineCollector
from inferwatch.exporters.sidecar import Sidecar
from inferwatch.runbooks import config as mapping
from inferwatch.runbooks import inventory
from inferwatch.runbooks.actions.isolate_replica import IsolateReplica
from inferwatch.runbooks.audit import AuditLog
from inferwatch.runbooks.dispatch import Dispatcher
from inferwatch.runbooks.server import Receiver
from inferwatch.serving.page_fetch import EngineScraper

TOKEN = "bench-receiver-token-0123456789"
SIDECAR_TOKEN = "bench-sidecar-token-0123456789"


async def serve(app: Any) -> tuple[uvicorn.Server, asyncio.Task[None], str]:
    config = uvicorn.Config(app, host="127.0.0.1", port=0, log_config=None, lifespan="on")
    server = uvicorn.Server(config)
    task = asyncio.ensure_future(server.serve())
    while not server.started:
        await asyncio.sleep(0.01)
    port = server.servers[0].sockets[0].getsockname()[1]
    return server, task, f"127.0.0.1:{port}"


def payload(i: int, instance: str) -> bytes:
    alert = {
        "status": "firing",
        "labels": {
            "alertname": "InferwatchGPUXidErrors",
            "severity": "critical",
            "instance": instance,
            "model": "llama",
            "gpu_uuid": "GPU-5a8a0f7e-3bb8-4d1c-8f3a-0c4f4b1e9d2a",
            "xid": "79",
            "action": "reboot_node",
        },
        "annotations": {"summary": "A GPU reported XID errors that call for action."},
        "startsAt": "2026-11-30T00:25:23.11723649Z",
        "endsAt": "0001-01-01T00:00:00Z",
        "generatorURL": "http://prom:9090/graph?g0.expr=x",
        "fingerprint": f"{i:016x}",
    }
    return json.dumps(
        {
            "receiver": "runbooks",
            "status": "firing",
            "alerts": [alert],
            "groupLabels": {"alertname": "InferwatchGPUXidErrors"},
            "commonLabels": alert["labels"],
            "commonAnnotations": alert["annotations"],
            "externalURL": "http://alertmanager:9093",
            "version": "4",
            "groupKey": '{}:{alertname="InferwatchGPUXidErrors"}',
            "truncatedAlerts": 0,
        }
    ).encode()


def receiver_app(folder: Path, execute: bool, sidecar: str) -> tuple[Any, Dispatcher]:
    token_file = folder / "sidecar-token"
    token_file.write_text(SIDECAR_TOKEN)
    config = mapping.parse(
        {
            "namespaces": ["*"],
            "breaker": {"max_fraction": 1.0},
            "inventory": {"replicas": {"static": [{"instance": sidecar, "model": "llama"}]}},
            "rules": [
                {
                    "name": "isolate",
                    "alertname": "InferwatchGPUXidErrors",
                    "action": "isolate_replica",
                    "cooldown": "0s",
                }
            ],
        }
    )
    action = IsolateReplica(token_file=str(token_file))
    audit = AuditLog(folder / f"audit-{'execute' if execute else 'dry'}.jsonl")
    dispatcher = Dispatcher(
        config,
        {"isolate_replica": action},
        audit,
        execute=execute,
        inventory=inventory.build(config.inventory),
    )
    return Receiver(dispatcher, TOKEN).app(), dispatcher


def quantiles(samples: list[float]) -> tuple[float, float]:
    cuts = statistics.quantiles(samples, n=100, method="inclusive")
    return cuts[49] * 1000, cuts[98] * 1000


async def run(count: int) -> list[tuple[str, list[float]]]:
    folder = Path(tempfile.mkdtemp(prefix="bench-receiver-"))

    async def floor(request: Request) -> Response:
        await request.body()
        return Response(b'{"accepted": 1}\n', media_type="application/json")

    engine = EngineScraper("http://127.0.0.1:9/metrics", timeout_s=0.5)
    sidecar = Sidecar([EngineCollector(engine, {"model": "m"})], admin_token=SIDECAR_TOKEN)
    servers = [await serve(Starlette(routes=[Route("/webhook", floor, methods=["POST"])]))]
    servers.append(await serve(sidecar.app()))
    sidecar_address = servers[-1][2]
    dry_app, dry = receiver_app(folder, execute=False, sidecar=sidecar_address)
    act_app, act = receiver_app(folder, execute=True, sidecar=sidecar_address)
    servers.append(await serve(dry_app))
    servers.append(await serve(act_app))
    floor_url, dry_url, act_url = (f"http://{s[2]}/webhook" for s in (servers[0], *servers[2:]))
    headers = {"authorization": f"Bearer {TOKEN}", "content-type": "application/json"}
    admin = f"http://{sidecar_address}/admin/isolation"
    rows: dict[str, list[float]] = {}
    async with httpx.AsyncClient(headers=headers, timeout=10) as client:
        for name, url, dispatcher in (
            ("floor: bare endpoint", floor_url, None),
            ("receiver dry-run", dry_url, dry),
            ("receiver acting", act_url, act),
        ):
            for i in range(count + 20):  # the first 20 warm up
                body = payload(i, sidecar_address)
                started = time.perf_counter()
                reply = await client.post(url, content=body)
                acked = time.perf_counter()
                assert reply.status_code == 200, reply.text
                if dispatcher is not None:
                    await dispatcher.drain()
                handled = time.perf_counter()
                if dispatcher is act:
                    auth = {"authorization": f"Bearer {SIDECAR_TOKEN}"}
                    await client.delete(admin, headers=auth)
                if i < 20:
                    continue
                rows.setdefault(f"{name}: ack", []).append(acked - started)
                if dispatcher is not None:
                    rows.setdefault(f"{name}: handled", []).append(handled - started)
    applied = sum(
        1 for line in act.audit.path.read_text().splitlines() if '"outcome":"applied"' in line
    )
    planned = sum(
        1 for line in dry.audit.path.read_text().splitlines() if '"outcome":"dry_run"' in line
    )
    assert applied == planned == count + 20, (applied, planned)
    for server, task, _ in servers:
        server.should_exit = True
        await task
    for dispatcher in (dry, act):
        dispatcher.audit.close()
    return list(rows.items())


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--payloads", type=int, default=1000)
    args = parser.parse_args()
    logging.getLogger("inferwatch").setLevel(logging.ERROR)  # the sidecar's engine is absent
    rows = asyncio.run(run(args.payloads))
    floor_p50 = quantiles(rows[0][1])[0]
    print(
        f"python {platform.python_version()}, {os.cpu_count()} CPUs, "
        f"{args.payloads} payloads per row, audit fsync'd on {tempfile.gettempdir()}"
    )
    width = max(len(name) for name, _ in rows)
    print(f"{'row'.ljust(width)}  {'p50 ms':>8}  {'p99 ms':>8}  {'p50/floor':>9}")
    for name, samples in rows:
        p50, p99 = quantiles(samples)
        print(f"{name.ljust(width)}  {p50:8.2f}  {p99:8.2f}  {p50 / floor_p50:9.2f}")


if __name__ == "__main__":
    main()
