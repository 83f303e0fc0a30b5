"""Traffic shifts through the receiver: the gateway's backends are the inventory (HAProxy's
Runtime API lists them), and a drained version is restored only by the episode that drained it.

HAProxy's Runtime API is played by a unix-socket server that keeps the weights and answers the
three commands the action sends, in HAProxy's words.
"""

from __future__ import annotations

import asyncio
import json
from collections.abc import Iterator
from pathlib import Path

import pytest

from inferwatch.runbooks import config as mapping
from inferwatch.runbooks import inventory
from inferwatch.runbooks.actions.base import Alert
from inferwatch.runbooks.actions.haproxy import ShiftTraffic
from inferwatch.runbooks.audit import AuditLog
from inferwatch.runbooks.dispatch import Dispatcher
from inferwatch.wire import backend_name

pytestmark = pytest.mark.unit

MODEL = "org/big"
BACKEND = backend_name(MODEL)


class FakeRuntime:
    """Server weights by name, as ``show servers state``, ``get weight`` and ``set server``
    read and change them."""

    def __init__(self) -> None:
        self.initial = {"v1:big-1": 75, "v2:big-2": 25, "fallback:small-1": 0}
        self.weights = dict(self.initial)

    def answer(self, line: str) -> str:
        words = line.split()
        if words[:3] == ["show", "servers", "state"]:
            rows = [
                f"1 {BACKEND} {i} {name} 127.0.0.1 2 0 {w} {self.initial[name]} 0 0 0 0 0 0 0"
                for i, (name, w) in enumerate(self.weights.items(), 1)
            ]
            return "1\n# be_id be_name srv_id srv_name ...\n" + "\n".join(rows) + "\n"
        if words[:2] == ["get", "weight"]:
            name = words[2].split("/", 1)[1]
            return f"{self.weights[name]} (initial {self.initial[name]})\n"
        if words[:2] == ["set", "server"] and words[3] == "weight":
            self.weights[words[2].split("/", 1)[1]] = int(words[4])
            return "\n"
        return "Unknown command.\n"

    async def serve(self, path: str) -> asyncio.Server:
        async def handle(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
            line = (await reader.readline()).decode().strip()
            writer.write(self.answer(line).encode())
            await writer.drain()
            writer.close()

        return await asyncio.start_unix_server(handle, path)


@pytest.fixture
def socket_path(tmp_path: Path) -> Iterator[str]:
    yield str(tmp_path / "admin.sock")


def shift(fingerprint: str, status: str = "firing", model: str = MODEL) -> Alert:
    labels = {"alertname": "InferwatchDegenerateOutputRising", "model": model,
              "model_version": "v2"}  # fmt: skip
    return Alert(status, labels, {}, "2026-12-01T09:00:00Z", "0001-01-01T00:00:00Z", fingerprint)  # type: ignore[arg-type]


def test_only_the_episode_that_drained_a_version_restores_it(
    socket_path: str, tmp_path: Path
) -> None:
    runtime = FakeRuntime()
    config = mapping.parse(
        {
            "execute": True,
            "namespaces": [""],
            "breaker": {"max_fraction": 0.5},
            "inventory": {"gateway": {"haproxy": {"runtime": socket_path}}},
            "rules": [{"name": "shift", "alertname": "InferwatchDegenerateOutputRising",
                       "action": "shift_traffic", "cooldown": "0s", "rollback_after": "0s",
                       "params": {"steps": [1.0], "step_interval": 0}}],
        }
    )  # fmt: skip
    audit = tmp_path / "audit.jsonl"
    now = [1000.0]

    async def play() -> None:
        server = await runtime.serve(socket_path)
        dispatcher = Dispatcher(
            config,
            {"shift_traffic": ShiftTraffic(socket_path)},
            AuditLog(audit),
            execute=True,
            inventory=inventory.build(config.inventory),
            clock=lambda: now[0],
        )
        try:
            await dispatcher.handle_one(shift("aa"), {})  # drains v2
            await dispatcher.handle_one(shift("bb"), {})  # already drained: holds, changes nothing
            await dispatcher.handle_one(shift("cc", "resolved"), {})  # never fired here
            await dispatcher.handle_one(shift("bb", "resolved"), {})
            now[0] += 1
            await dispatcher.tick()
            assert runtime.weights["v2:big-2"] == 0  # aa still fires: v2 stays drained
            await dispatcher.handle_one(shift("ee", model="org/unknown"), {})
            await dispatcher.handle_one(shift("aa", "resolved"), {})
            now[0] += 1
            await dispatcher.tick()
        finally:
            server.close()
            await dispatcher.aclose()

    asyncio.run(play())
    outcomes = [json.loads(line)["outcome"] for line in audit.read_text().splitlines()]
    assert outcomes == [
        "applied",
        "no_op",
        "never_acted",  # cc: no episode of it
        "rollback_scheduled",
        "never_acted",  # bb's rollback: it drained nothing, so it restores nothing
        "inventory",  # a model HAProxy has no backend for
        "rollback_scheduled",
        "reverted",
    ]
    assert runtime.weights == runtime.initial  # aa, which drained it, restored it
