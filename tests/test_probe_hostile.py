"""Pathological JSON from an endpoint: the probes and the gate could not run, no verdict."""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import Iterator
from http.server import BaseHTTPRequestHandler

import httpx
import pytest
from click.testing import CliRunner

from inferwatch.cli import main
from inferwatch.probes import client, golden
from inferwatch.probes.runner import ProbeRunner, Target
from inferwatch.serving import threaded

pytestmark = pytest.mark.unit

MODELS = b'{"object":"list","data":[{"id":"m","object":"model"}]}'
#: replies no JSON parser reads back as data, as a whole body or as one stream frame
POISONS = {
    "deep": b'{"choices":' + b"[" * 5000 + b"]" * 5000 + b"}",
    "huge_float": b'{"choices":[{"index":0,"message":{"content":"4"}}],"x":1e400}',
    "huge_usage": b'{"choices":[],"usage":{"prompt_tokens":1e999,"completion_tokens":2}}',
    "long_int": b'{"choices":[],"usage":{"prompt_tokens":' + b"9" * 5000 + b"}}",
}


class Hostile(BaseHTTPRequestHandler):
    poison = b""
    stream = False
    models = MODELS

    def log_message(self, *args: object) -> None:
        pass

    def _send(self, body: bytes, kind: str) -> None:
        self.send_response(200)
        self.send_header("content-type", kind)
        self.send_header("content-length", str(len(body)))
        self.end_headers()
        # the client may give up on the body: its verdict, not this write, is the point
        with contextlib.suppress(ConnectionError):
            self.wfile.write(body)

    def do_GET(self) -> None:
        self._send(self.models, "application/json")

    def do_POST(self) -> None:
        self.rfile.read(int(self.headers.get("content-length", "0")))
        if self.stream:
            self._send(b"data: " + self.poison + b"\n\ndata: [DONE]\n\n", "text/event-stream")
        else:
            self._send(self.poison, "application/json")


@pytest.fixture
def hostile() -> Iterator[tuple[str, type[Hostile]]]:
    handler = type("H", (Hostile,), {})
    with threaded.serving(handler) as origin:
        yield origin, handler


@pytest.mark.parametrize("stream", [False, True])
@pytest.mark.parametrize("kind", sorted(POISONS))
def test_an_unreadable_reply_is_could_not_run_not_a_failed_answer(
    hostile: tuple[str, type[Hostile]], kind: str, stream: bool
) -> None:
    url, handler = hostile
    handler.poison, handler.stream = POISONS[kind], stream
    probe = golden.load().probes[0]

    async def send() -> client.Reply:
        async with httpx.AsyncClient() as http:
            return await client.send(http, client.Endpoint(url, "m"), probe, 10)

    assert asyncio.run(send()).error == client.UNREADABLE


@pytest.mark.parametrize("kind", sorted(POISONS))
def test_the_gate_exits_3_on_unreadable_replies(
    hostile: tuple[str, type[Hostile]], kind: str
) -> None:
    url, handler = hostile
    handler.poison = POISONS[kind]
    result = CliRunner().invoke(
        main,
        ["gate", "--baseline", url, "--candidate", url, "--repeats", "1", "--load-requests", "1",
         "--timeout", "5"],
    )  # fmt: skip
    assert result.exit_code == 3, result.output
    assert result.output.count("\n") == 1 and "could not run" in result.output
    assert "Traceback" not in result.output


def test_an_unreadable_model_list_is_one_line_and_exit_3(
    hostile: tuple[str, type[Hostile]],
) -> None:
    url, handler = hostile
    handler.models = POISONS["deep"]
    result = CliRunner().invoke(main, ["gate", "--baseline", url, "--candidate", url])
    assert result.exit_code == 3
    assert result.output.count("\n") == 1 and "cannot list models" in result.output


@pytest.mark.parametrize("kind", sorted(POISONS))
def test_the_probe_runner_scores_no_verdict_from_an_unreadable_reply(
    hostile: tuple[str, type[Hostile]], kind: str
) -> None:
    """The runner counts the probe as skipped and keeps it out of the verdict window, so a
    hostile engine cannot fail (or pass) the replica's quality readiness with junk."""
    url, handler = hostile
    handler.poison = POISONS[kind]
    target = Target("replica", client.Endpoint(url))
    runner = ProbeRunner(golden.load(), [target])

    async def probe() -> list[client.Reply | None]:
        try:
            return [await runner.probe_once(target, g) for g in golden.load().probes[:3]]
        finally:
            await runner.aclose()

    assert asyncio.run(probe()) == [None, None, None]
    assert runner.verdict_for(target)[1] == "warming"
    assert runner.metrics.skipped[("replica", client.UNREADABLE)] == 3
