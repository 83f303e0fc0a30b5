"""SIGTERM on a real ``inferwatch proxy`` process: drain, then cut short and charge."""

from __future__ import annotations

import json
import os
import signal
import socket
import subprocess
import sys
import threading
import time
from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest

from inferwatch.proxy.tenants import hash_key
from support.otlp import hung_collector
from support.ports import announced_url
from support.proxy_stack import KEYS, Engine, own_engine
from support.wait import wait_for

pytestmark = pytest.mark.proc

GRACE = 2.0
INFERWATCH = Path(sys.executable).parent / "inferwatch"


@pytest.fixture
def engine() -> Iterator[Engine]:
    with own_engine() as engine:
        yield engine


class Stream(threading.Thread):
    """A streamed chat request read line by line; counts the content tokens received."""

    def __init__(self, url: str, max_tokens: int) -> None:
        super().__init__(daemon=True)
        self.url = url
        self.max_tokens = max_tokens
        self.tokens = 0
        self.done = False
        self.error = ""
        self.ended = threading.Event()

    def run(self) -> None:
        body = {
            "model": "m",
            "messages": [{"role": "user", "content": "count"}],
            "max_tokens": self.max_tokens,
            "stream": True,
        }
        headers = {"authorization": f"Bearer {KEYS['acme']}", "x-scenario": "slow_stream"}
        try:
            with httpx.stream(
                "POST", self.url + "/v1/chat/completions", json=body, headers=headers, timeout=30
            ) as reply:
                for line in reply.iter_lines():
                    if not line.startswith("data: "):
                        continue
                    data = line[6:]
                    if data == "[DONE]":
                        self.done = True
                        continue
                    event = json.loads(data)
                    if "error" in event:
                        self.error = event["error"]["code"]
                    for choice in event.get("choices") or ():
                        if (choice.get("delta") or {}).get("content"):
                            self.tokens += 1
        finally:
            self.ended.set()


def hold(url: str) -> httpx.Response:
    body = {"model": "m", "messages": [{"role": "user", "content": "wait"}], "max_tokens": 2}
    headers = {"authorization": f"Bearer {KEYS['acme']}", "x-delay-ms": "30000"}
    return httpx.post(url + "/v1/chat/completions", json=body, headers=headers, timeout=30)


def refused(url: str) -> bool:
    """Whether a connection to ``url``'s host and port is refused."""
    host, port = url.removeprefix("http://").rsplit(":", 1)
    try:
        socket.create_connection((host, int(port)), timeout=0.5).close()
    except OSError:
        return True
    return False


def test_sigterm_drains_then_cuts_short_and_charges_every_token(
    engine: Engine, tmp_path: Path
) -> None:
    config = tmp_path / "proxy.yaml"
    config.write_text(
        json.dumps(
            {
                "upstream": {"url": engine.url, "reconcile_interval": 0},
                "tenants": {"acme": {"key_sha256": [hash_key(KEYS["acme"])]}},
            }
        )
    )
    log = tmp_path / "proxy.log"
    with log.open("w") as out:
        process = subprocess.Popen(
            [str(INFERWATCH), "proxy", "--config", str(config),
             "--listen", "127.0.0.1:0", "--metrics-listen", "127.0.0.1:0",
             "--drain-grace", f"{GRACE:g}"],
            stdout=subprocess.DEVNULL,
            stderr=out,
            env={**os.environ, "PYTHONUNBUFFERED": "1"},
        )  # fmt: skip
    try:
        url = announced_url(process, log, "the proxy")  # logged once both sockets listen
        short, long = Stream(url, 20), Stream(url, 1000)  # 0.4 s and 20 s at 20 ms a token
        short.start(), long.start()
        held: list[httpx.Response] = []  # a whole (unstreamed) reply the engine holds 30 s
        waiting = threading.Thread(target=lambda: held.append(hold(url)), daemon=True)
        waiting.start()
        wait_for(lambda: short.tokens >= 2 and long.tokens >= 2, "both streams", 15, interval=0.01)
        wait_for(lambda: len(engine.engine.requests) == 3, "3 engine requests", 15, interval=0.01)
        process.send_signal(signal.SIGTERM)
        signalled = time.monotonic()
        wait_for(lambda: refused(url), "refusal after SIGTERM", 5, interval=0.01)
        assert short.ended.wait(10) and long.ended.wait(GRACE + 10)
        cut_after = time.monotonic() - signalled
        process.wait(timeout=20)
    finally:
        if process.poll() is None:
            process.kill()
            process.wait()
    # the short stream finished inside the grace period; the long one was cut at its end
    assert short.done and short.tokens == 20 and not short.error
    assert long.error == "shutdown" and not long.done
    waiting.join(10)
    assert held[0].status_code == 503 and held[0].json()["error"]["code"] == "shutdown"
    assert GRACE - 0.5 < cut_after < GRACE + 5
    stderr = log.read_text(encoding="utf-8")
    lines = [json.loads(line) for line in stderr.splitlines() if line.startswith("{")]
    access = [line for line in lines if line.get("logger") == "inferwatch.proxy.access"]
    by_tokens = sorted(access, key=lambda line: line["completion_tokens"])
    assert [line["accounting"] for line in by_tokens] == [
        "shutdown_cancelled",  # the held request: its prompt, the engine had taken it
        "complete",
        "shutdown_cancelled",
    ]
    assert by_tokens[1]["completion_tokens"] == 20
    # every token that left the engine before the cut was relayed and charged; the engine
    # only notices the hang-up on its next writes (as vLLM does), which no proxy can see
    assert by_tokens[2]["completion_tokens"] == long.tokens
    # the engine goes on emitting until it sees the closed connection: a few tokens on a busy
    # machine, never charged twice and never more than those in flight
    assert engine.engine.generation_total - sum(line["completion_tokens"] for line in access) <= 5
    assert all(line["prompt_tokens"] > 0 for line in access)


def test_a_hung_trace_collector_holds_sigterm_no_longer_than_the_drain_grace(
    engine: Engine, tmp_path: Path
) -> None:
    """The spans still batched wait for a collector that accepts and never answers: with a
    2 s grace the proxy took 11-17 s to exit (the exporter's 10 s timeout and its retries)."""
    config = tmp_path / "proxy.yaml"
    config.write_text(json.dumps({
        "upstream": {"url": engine.url, "reconcile_interval": 0},
        "tenants": {"acme": {"key_sha256": [hash_key(KEYS["acme"])]}},
    }))  # fmt: skip
    log = tmp_path / "proxy.log"
    with hung_collector() as collector, log.open("w") as out:
        process = subprocess.Popen(
            [str(INFERWATCH), "proxy", "--config", str(config),
             "--listen", "127.0.0.1:0", "--metrics-listen", "127.0.0.1:0",
             "--drain-grace", f"{GRACE:g}", "--otlp-endpoint", collector.url],
            stdout=subprocess.DEVNULL, stderr=out,
        )  # fmt: skip
        try:
            url = announced_url(process, log, "the proxy")
            body = {"model": "m", "messages": [{"role": "user", "content": "hi"}], "max_tokens": 2}
            headers = {"authorization": f"Bearer {KEYS['acme']}"}
            reply = httpx.post(url + "/v1/chat/completions", json=body, headers=headers, timeout=10)
            assert reply.status_code == 200  # its span waits in the batch
            process.send_signal(signal.SIGTERM)
            signalled = time.monotonic()
            assert collector.accepted.wait(10), "the proxy sent its last spans to the collector"
            wait_for(lambda: process.poll() is not None, "the proxy exiting", 2 * GRACE + 3)
            took = time.monotonic() - signalled
        finally:
            if process.poll() is None:
                process.kill()
                process.wait()
    assert "trace export cut short" in log.read_text()
    print(f"SIGTERM to exit with a hung collector: {took:.2f} s (grace {GRACE:g} s)")
