"""The shared state through Redis Sentinel and Redis Cluster, each a real set of redis-server
processes: the URL forms of docs/tenancy.md reach them through redis-py's clients, with the
password from the config, and one budget holds through each."""

from __future__ import annotations

import asyncio
import subprocess
from pathlib import Path

import pytest

from inferwatch.proxy import config as proxy_config
from inferwatch.proxy.admission import Refusal, Reservation
from inferwatch.proxy.sharedstate import SharedLedger
from support.ports import PortTaken, in_use, start_on_free_port
from support.redis import RedisServer, _answers, cluster_url, redis_cluster
from support.shared import tool
from support.wait import wait_for

pytestmark = pytest.mark.proc

PASSWORD = "fleet-secret"


def spend_the_budget(url: str, tmp_path: Path) -> list[Reservation | Refusal]:
    """Six reservations of 40 against a budget of 200 through ``url``: five hold."""
    secret = tmp_path / "password"
    secret.write_text(PASSWORD + "\n")
    document = {
        "shared_state": {"url": url, "password_file": str(secret), "timeout": "1s"},
        "tenants": {"acme": {"budget": {"tokens": 200}}},
    }
    config = proxy_config.parse(document, "p.yaml")
    budget = config.tenants["acme"].budget
    assert budget is not None

    async def run() -> list[Reservation | Refusal]:
        ledger = SharedLedger(config)
        try:
            reserved = [await ledger.reserve("acme", budget, 0, 40, clamp=False) for _ in range(6)]
            results = [reservation for reservation, _ in reserved]
            assert ledger.up, ledger.errors
            return results
        finally:
            await ledger.aclose()

    return asyncio.run(run())


def test_a_budget_holds_through_sentinels_master(tmp_path: Path) -> None:
    master = RedisServer(tmp_path / "master", password=PASSWORD)
    sentinels: list[subprocess.Popen[bytes]] = []

    def sentinel(port: int) -> int:
        folder = tmp_path / f"sentinel-{port}"
        folder.mkdir()
        conf = folder / "sentinel.conf"  # the sentinel rewrites it: its own, writable
        conf.write_text(
            f"port {port}\nbind 127.0.0.1\ndir {folder}\n"
            f"sentinel monitor primary 127.0.0.1 {master.port} 1\n"
            f"sentinel auth-pass primary {PASSWORD}\n"
        )
        log = folder / "sentinel.log"
        with log.open("w") as out:
            process = subprocess.Popen(
                [master.binary, str(conf), "--sentinel"], stdout=out, stderr=subprocess.STDOUT
            )
        sentinels.append(process)

        def up() -> bool:
            if process.poll() is not None:
                text = log.read_text(errors="replace")
                if in_use(text):
                    raise PortTaken(str(port))
                raise AssertionError(text[-2000:])
            return _answers(port)

        wait_for(up, "the sentinel to answer")
        return port

    try:
        port = start_on_free_port(sentinel)
        results = spend_the_budget(f"redis+sentinel://127.0.0.1:{port}/primary/0", tmp_path)
        assert [isinstance(r, Reservation) for r in results] == [True] * 5 + [False]
    finally:
        for process in sentinels:
            process.kill()
            process.wait()
        master.stop()


def test_a_budget_holds_on_a_cluster_with_the_tenants_keys_in_one_slot(tmp_path: Path) -> None:
    cli = tool("redis-cli")
    with redis_cluster(tmp_path, PASSWORD) as nodes:
        results = spend_the_budget(cluster_url(nodes), tmp_path)
        assert [isinstance(r, Reservation) for r in results] == [True] * 5 + [False]
        slots = {
            subprocess.run(
                [cli, "-a", PASSWORD, "--no-auth-warning", "-p", str(nodes[0].port),
                 "cluster", "keyslot", key],
                capture_output=True, text=True, timeout=10, check=True,
            ).stdout.strip()
            for key in ("inferwatch:{acme}:w", "inferwatch:{acme}:h", "inferwatch:{acme}:l")
        }  # fmt: skip
        assert len(slots) == 1
