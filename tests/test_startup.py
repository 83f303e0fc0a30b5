"""Cold start: the phases a replica passes, the warm-up gate, and the simulator's cold start.

The phases are checked against real processes (``inferwatch sim`` loading its weights,
``inferwatch sidecar`` warming it up); the gate's failure paths against a real simulator with
faults injected and against hostile HTTP servers that hang, fail, or answer too much.
"""

from __future__ import annotations

import asyncio
import gzip
import json
import subprocess
import sys
import time
from collections.abc import AsyncIterator, Awaitable, Callable, Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest
from click.testing import CliRunner
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from prometheus_client.exposition import generate_latest
from prometheus_client.parser import text_string_to_metric_families

from inferwatch.cli import main
from inferwatch.exporters.engine.collector import EngineCollector
from inferwatch.exporters.sidecar import Sidecar
from inferwatch.exporters.startup import warmup as warmup_module
from inferwatch.exporters.startup.phases import PHASES, StartupTracker
from inferwatch.exporters.startup.warmup import Warmup, WarmupFailure, WarmupPlan
from inferwatch.proxy.reconcile import direct_tokens, engine_token_counters
from inferwatch.serving.page_fetch import EngineScraper
from inferwatch.sim.coldstart import capture_size
from inferwatch.sim.server import SimHandle, run_in_thread, start_subprocess
from inferwatch.sim.simulator import SimConfig
from support.ports import announced_url
from support.relay import Relay, port_of
from support.wait import wait_for, wait_until

pytestmark = pytest.mark.proc

INFERWATCH = Path(sys.executable).parent / "inferwatch"
TOKEN = "admin-secret"
MODEL = "meta-llama/Llama-3.1-8B-Instruct"


def samples(text: str, name: str, label: str = "phase") -> dict[str, float]:
    """Values of one family's samples by the value of one label."""
    found = {}
    for family in text_string_to_metric_families(text):
        for sample in family.samples:
            if sample.name == name:
                found[sample.labels.get(label, "")] = sample.value
    return found


# ---- the phases, on real processes ------------------------------------------------------------


def test_phases_are_recorded_in_order_against_a_real_simulator_process(tmp_path: Path) -> None:
    relay = Relay()  # the engine's address, refusing until the simulator starts behind it
    engine = relay.url
    log_path = tmp_path / "sidecar.log"
    with log_path.open("w") as log:
        process = subprocess.Popen(
            [str(INFERWATCH), "--log-format", "json", "sidecar", f"--engine-url={engine}",
             "--listen=127.0.0.1:0", "--gpu=none", "--engine=vllm",
             "--warmup-batch-sizes=1,4", "--warmup-prompt-tokens=16,512"],
            stdout=log, stderr=subprocess.STDOUT,
        )  # fmt: skip
    seen_reasons: list[str] = []
    sim = None
    try:
        sidecar = announced_url(process, log_path, "the sidecar")
        wait_for(lambda: httpx.get(f"{sidecar}/healthz").status_code == 200, "the sidecar", 30)
        # The sidecar is up before the engine: the replica's start is the sidecar's.
        first = httpx.get(f"{sidecar}/readyz")
        assert first.status_code == 503
        # About 16 GB of weights at 4 GB/s: the engine answers 503 for some 4 seconds.
        sim = start_subprocess(["--storage-bandwidth", "4", "--graph-capture-seconds", "1"])
        relay.resume(port_of(sim.url))

        def ready() -> bool:
            response = httpx.get(f"{sidecar}/readyz")
            warm = {c["name"]: c for c in response.json()["conditions"]}["warmup"]
            if not seen_reasons or seen_reasons[-1] != warm["reason"]:
                seen_reasons.append(warm["reason"])
            return response.status_code == 200

        wait_for(ready, "readiness after warm-up", 60)
        page = httpx.get(f"{sidecar}/metrics").text
        current = samples(page, "inferwatch_replica_startup_phase")
        assert current["warmup_done"] == 1
        assert samples(page, "inferwatch_warmup_requests_total", "outcome") == {"ok": 10}
        reply = httpx.post(f"{engine}/v1/completions", json={"prompt": "hi", "max_tokens": 2})
        assert reply.status_code == 200

        def serving() -> str:
            text = httpx.get(f"{sidecar}/metrics").text
            return text if samples(text, "inferwatch_replica_startup_phase")["serving"] else ""

        page = wait_for(serving, "the first client request to be seen", 60)
    finally:  # the sidecar first: an engine that stops under it is a restart it would log
        process.terminate()
        process.wait(10)
        if sim is not None:
            sim.stop()
        relay.close()
    stamps = samples(page, "inferwatch_replica_startup_phase_timestamp_seconds")
    assert list(stamps) == list(PHASES)
    ordered = [stamps[p] for p in PHASES]
    assert ordered == sorted(ordered)
    # It answered 503 while loading, so reachable came strictly before healthy.
    assert stamps["engine_reachable"] < stamps["engine_healthy"] < stamps["warmup_done"]
    assert seen_reasons[0] == "waiting for the engine to load the model"
    assert "warming up (round 1)" in seen_reasons
    lines = log_path.read_text().splitlines()
    events = [json.loads(line) for line in lines if line.startswith("{")]
    logged = [e["phase"] for e in events if e["msg"] == "replica phase reached"]
    assert logged == list(PHASES)
    reachable = next(e for e in events if e.get("phase") == "engine_reachable")
    assert reachable["status"] == 503


# ---- the first client request ----------------------------------------------------------------


@pytest.fixture
def fast_sim() -> Iterator[SimHandle]:
    with run_in_thread(SimConfig(port=0, speed=1000, admin_token=TOKEN, seed=3)) as handle:
        yield handle


def tracker_for(sim: SimHandle, plan: WarmupPlan | None) -> StartupTracker:
    engine = EngineCollector(EngineScraper(f"{sim.url}/metrics", timeout_s=5.0), {"pod": "r0"})
    warm = Warmup(plan, sim.url, MODEL) if plan else None
    return StartupTracker(engine, warm, poll_s=0.05)


def test_warmup_requests_are_not_taken_for_the_first_client_request(fast_sim: SimHandle) -> None:
    async def scenario() -> None:
        tracker = tracker_for(fast_sim, WarmupPlan((1, 4), (16, 64)))
        task = asyncio.create_task(tracker.run())
        try:
            await wait_until(lambda: "warmup_done" in tracker.reached, "warm-up", 30)
            # The engine has counted the 10 warm-up requests, and several polls pass...
            await asyncio.sleep(0.8)
            assert tracker.phase == "warmup_done"
            async with httpx.AsyncClient() as client:
                page = (await client.get(f"{fast_sim.url}/metrics")).text
                finished = samples(page, "vllm:request_success_total", "finished_reason")
                assert finished["stop"] + finished.get("length", 0) >= 10
                # ... but one client request is the first client request.
                body = {"prompt": "hello", "max_tokens": 2}
                assert (await client.post(f"{fast_sim.url}/v1/completions", json=body)).is_success
            await wait_until(lambda: tracker.phase == "serving", "the client request", 30)
            assert tracker.reached["serving"] > tracker.reached["warmup_done"]
        finally:
            task.cancel()
            await tracker.aclose()
            await tracker.engine.aclose()

    asyncio.run(scenario())


def test_without_warmup_ready_follows_health_and_serving_waits_for_a_client(
    fast_sim: SimHandle,
) -> None:
    async def scenario() -> None:
        tracker = tracker_for(fast_sim, None)
        assert tracker.readiness() == []  # no warm-up: no condition of its own
        task = asyncio.create_task(tracker.run())
        try:
            await wait_until(lambda: tracker.phase == "warmup_done", "health", 30)
            await asyncio.sleep(0.5)
            assert tracker.phase == "warmup_done"
            async with httpx.AsyncClient() as client:
                body = {"prompt": "hello", "max_tokens": 2}
                await client.post(f"{fast_sim.url}/v1/completions", json=body)
            await wait_until(lambda: tracker.phase == "serving", "the client request", 30)
        finally:
            task.cancel()
            await tracker.aclose()
            await tracker.engine.aclose()

    asyncio.run(scenario())


# ---- the gate: failure keeps the replica unready, success turns it ready -----------------------


async def readyz(sidecar: Sidecar) -> tuple[int, dict[str, dict[str, Any]], str]:
    transport = httpx.ASGITransport(app=sidecar.app())
    async with httpx.AsyncClient(transport=transport, base_url="http://sidecar") as client:
        response = await client.get("/readyz")
        page = (await client.get("/metrics")).text
    body = response.json()
    return response.status_code, {c["name"]: c for c in body["conditions"]}, page


def test_failing_warmup_keeps_the_replica_unready_with_the_reason_then_turns_ready(
    fast_sim: SimHandle, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(warmup_module, "BACKOFF_INITIAL_S", 0.05)
    faults = f"{fast_sim.url}/admin/faults"
    auth = {"Authorization": f"Bearer {TOKEN}"}
    httpx.post(faults, json={"error_rate": 1.0}, headers=auth).raise_for_status()

    async def scenario() -> None:
        tracker = tracker_for(fast_sim, WarmupPlan((1, 2), (16,)))
        sidecar = Sidecar([tracker.engine, tracker], readiness_max_age=0)
        assert tracker.warmup is not None
        task = asyncio.create_task(tracker.run())
        try:
            # a round's number is counted when it starts; its failure is in the reason after
            warmup = tracker.warmup
            await wait_until(lambda: warmup.rounds >= 2, "a second round", 30)

            async def said_why() -> tuple[int, dict[str, dict[str, Any]], str] | None:
                answer = await readyz(sidecar)
                return answer if "failed" in answer[1]["warmup"]["reason"] else None

            # /readyz read while a failed round waits for its retry: the next round may start
            # between any two reads, and a round under way says only "warming up"
            status, conditions, page = await wait_until(said_why, "/readyz to say why", 30)
            assert status == 503
            assert conditions["engine"]["ok"]  # the engine is up: only warm-up holds it back
            warm = conditions["warmup"]
            assert not warm["ok"]
            assert "http_status" in warm["reason"] and "HTTP 500" in warm["reason"]
            assert 'condition="warmup"' in page
            ready = {
                s.labels["condition"]: s.value
                for f in text_string_to_metric_families(page)
                for s in f.samples
                if s.name == "inferwatch_replica_ready"
            }
            assert ready["warmup"] == 0 and ready["engine"] == 1
            assert tracker.phase == "engine_healthy"
            httpx.delete(faults, headers=auth).raise_for_status()
            await wait_until(lambda: tracker.warmup.done, "a successful round", 30)
            status, conditions, page = await readyz(sidecar)
            assert status == 200 and conditions["warmup"]["ok"]
            outcomes = samples(page, "inferwatch_warmup_requests_total", "outcome")
            assert outcomes["ok"] == 3  # one round: 1 + 2 requests
            assert outcomes["http_status"] >= 2  # the first request of each failed round
        finally:
            task.cancel()
            await sidecar.aclose()

    asyncio.run(scenario())


# ---- a hostile or slow engine during warm-up ---------------------------------------------------

Handler = Callable[[asyncio.StreamReader, asyncio.StreamWriter], Awaitable[None]]


async def _read_request(reader: asyncio.StreamReader) -> bytes:
    head = await reader.readuntil(b"\r\n\r\n")
    length = next(
        (int(line.split(b":")[1]) for line in head.split(b"\r\n")
         if line.lower().startswith(b"content-length")),
        0,
    )  # fmt: skip
    return head + await reader.readexactly(length)


async def _read_head(reader: asyncio.StreamReader) -> None:
    await _read_request(reader)


def _answer(status: int, body: bytes, extra: bytes = b"") -> bytes:
    return (
        f"HTTP/1.1 {status} X\r\ncontent-type: application/json\r\n"
        f"content-length: {len(body)}\r\n".encode()
        + extra
        + b"\r\n"
        + body
    )


async def hang(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
    await _read_head(reader)
    await asyncio.sleep(3600)


async def server_error(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
    await _read_head(reader)
    writer.write(_answer(503, b'{"error": "overloaded"}'))
    await writer.drain()


async def endless(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
    await _read_head(reader)
    writer.write(b"HTTP/1.1 200 OK\r\ncontent-type: application/json\r\n"
                 b"transfer-encoding: chunked\r\n\r\n")  # fmt: skip
    chunk = b"x" * 65536
    while True:
        writer.write(f"{len(chunk):x}\r\n".encode() + chunk + b"\r\n")
        await writer.drain()


async def trickle(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
    await _read_head(reader)
    writer.write(b"HTTP/1.1 200 OK\r\ncontent-length: 100000\r\n\r\n")
    while True:
        writer.write(b"{")
        await writer.drain()
        await asyncio.sleep(0.05)


#: 20 MB of spaces in about 20 kB of gzip
BOMB = gzip.compress(b" " * 20_000_000)


async def bomb(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
    await _read_head(reader)
    writer.write(_answer(200, BOMB, b"content-encoding: gzip\r\n"))
    await writer.drain()


async def not_json(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
    await _read_head(reader)
    writer.write(_answer(200, b"<html>hello</html>"))
    await writer.drain()


async def no_choices(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
    await _read_head(reader)
    writer.write(_answer(200, b'{"choices": []}'))
    await writer.drain()


#: the model list of the hostile engines: warm-up reads it first, for the model's context
MODELS = b'{"data": [{"id": "m", "max_model_len": 4096}]}'


async def hostile_server(handler: Handler) -> AsyncIterator[str]:
    """An engine that lists its model and is hostile to every other request."""

    async def guarded(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        try:
            request = await _read_request(reader)
            if request.startswith(b"GET /v1/models"):
                writer.write(_answer(200, MODELS))
                await writer.drain()
                request = await _read_request(reader)
            rest = asyncio.StreamReader()  # the request again, for the handler to read
            rest.feed_data(request)
            await handler(rest, writer)
        except (ConnectionError, asyncio.IncompleteReadError):
            pass
        finally:
            writer.close()

    server = await asyncio.start_server(guarded, "127.0.0.1", 0)
    port = server.sockets[0].getsockname()[1]
    try:
        yield f"http://127.0.0.1:{port}"
    finally:
        server.close()


@pytest.mark.parametrize(
    ("handler", "outcome"),
    [
        (hang, "timeout"),
        (server_error, "http_status"),
        (endless, "too_large"),
        (trickle, "timeout"),
        (bomb, "too_large"),
        (not_json, "invalid"),
        (no_choices, "invalid"),
    ],
    ids=lambda v: getattr(v, "__name__", v),
)
def test_a_hostile_engine_fails_the_round_within_its_deadline(
    handler: Handler, outcome: str
) -> None:
    async def scenario() -> None:
        servers = hostile_server(handler)
        url = await anext(servers)
        warm = Warmup(WarmupPlan((4,), (16,), deadline_s=1.0), url, "m")
        gaps = [0.0]

        async def heartbeat() -> None:  # the event loop keeps turning while warm-up reads
            last = time.perf_counter()
            while True:
                await asyncio.sleep(0.01)
                now = time.perf_counter()
                gaps.append(now - last)
                last = now

        beating = asyncio.create_task(heartbeat())
        try:
            with pytest.raises(WarmupFailure) as failure:
                async with asyncio.timeout(20):
                    await warm.round()
        finally:
            beating.cancel()
            await warm.aclose()
            await servers.aclose()
        assert failure.value.outcome == outcome
        assert warm.sent == 4
        assert sum(warm.outcomes.values()) == 4  # every request counted once, however it ended
        assert set(warm.outcomes) <= {outcome, "cancelled"}
        assert max(gaps) < 0.5  # never held up for long, however much the server sends

    asyncio.run(scenario())


@pytest.mark.parametrize(
    ("handler", "phase"),
    [(hang, "process_start"), (server_error, "engine_reachable"), (endless, "warmup_done")],
    ids=lambda v: getattr(v, "__name__", v),
)
def test_a_hostile_health_endpoint_holds_the_phases_back_within_bounds(
    handler: Handler, phase: str
) -> None:
    """A health endpoint that hangs gives no phase, a 503 gives reachable only, and a 200
    with an endless body gives healthy (and, with no warm-up, warmup_done) without its body
    being read; its /metrics, endless too, never counts as a client served."""

    async def scenario() -> None:
        servers = hostile_server(handler)
        url = await anext(servers)
        engine = EngineCollector(EngineScraper(f"{url}/metrics", timeout_s=0.3), {})
        tracker = StartupTracker(engine, None, poll_s=0.05)
        task = asyncio.create_task(tracker.run())
        try:
            await wait_until(lambda: tracker.phase == phase, phase, 20)
            await asyncio.sleep(0.5)  # several polls later, no further
            assert tracker.phase == phase
            assert {f.name for f in await tracker.collect()} >= {
                "inferwatch_replica_startup_phase"
            }
        finally:
            task.cancel()
            await asyncio.gather(task, return_exceptions=True)
            await tracker.aclose()
            await engine.aclose()
            await servers.aclose()

    asyncio.run(scenario())


@settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(status=st.integers(100, 599), body=st.binary(max_size=2048) | st.builds(
    lambda c: json.dumps({"choices": c}).encode(),
    st.lists(st.dictionaries(st.text(max_size=5), st.integers()), max_size=3),
))  # fmt: skip
def test_any_answer_is_a_success_or_a_counted_failure(status: int, body: bytes) -> None:
    """An answer counts as ok only with HTTP 200 and a JSON object holding choices."""

    def respond(request: httpx.Request) -> httpx.Response:
        return httpx.Response(status, content=body)

    async def scenario() -> str:
        http = httpx.AsyncClient(transport=httpx.MockTransport(respond))
        warm = Warmup(WarmupPlan((1,), (16,), deadline_s=5), "http://engine", "m", http=http)
        try:
            await warm.round()
        except WarmupFailure as failure:
            return failure.outcome
        finally:
            await warm.aclose()
        return "ok"

    outcome = asyncio.run(scenario())
    try:
        parsed = json.loads(body)
    except ValueError:
        parsed = None
    valid = status == 200 and isinstance(parsed, dict) and bool(parsed.get("choices"))
    if valid:
        assert outcome == "ok"
    else:
        assert outcome == ("http_status" if status != 200 else "invalid")


# ---- the simulator's cold start ---------------------------------------------------------------


def test_capture_sizes_are_vllms() -> None:
    sizes = {b: capture_size(b) for b in (1, 2, 3, 4, 5, 8, 9, 17, 512, 513)}
    assert sizes == {1: 1, 2: 2, 3: 4, 4: 4, 5: 8, 8: 8, 9: 16, 17: 24, 512: 512, 513: None}


def test_the_engine_is_not_healthy_until_the_weights_are_read() -> None:
    # About 16 GB at 0.2 GB/s: 80 simulated seconds, 4 s of wall time at speed 20.
    config = SimConfig(port=0, speed=20, storage_bandwidth=0.2e9)
    with run_in_thread(config) as sim:
        assert sim.simulator.load_seconds == pytest.approx(16.06e9 / 0.2e9, rel=0.01)
        health = httpx.get(f"{sim.url}/health")
        refused = httpx.post(f"{sim.url}/v1/completions", json={"prompt": "x", "max_tokens": 1})
        assert health.status_code == refused.status_code == 503
        assert "loading" in health.json()["error"]["message"]
        assert httpx.get(f"{sim.url}/metrics").status_code == 200
        wait_for(lambda: httpx.get(f"{sim.url}/health").status_code == 200, "the load", 30)
        done = httpx.post(f"{sim.url}/v1/completions", json={"prompt": "x", "max_tokens": 1})
        assert done.status_code == 200


def _timed(url: str) -> float:
    started = time.perf_counter()
    reply = httpx.post(f"{url}/v1/completions", json={"prompt": "hello", "max_tokens": 2})
    assert reply.status_code == 200
    return time.perf_counter() - started


def test_warmup_takes_the_graph_capture_penalty_off_the_first_client_request() -> None:
    # A new batch shape costs 40 simulated seconds (2 s of wall time at speed 20).
    config = SimConfig(port=0, speed=20, graph_capture_seconds=40)
    with run_in_thread(config) as cold:
        cold_first, cold_second = _timed(cold.url), _timed(cold.url)
    with run_in_thread(config) as warmed:
        plan = WarmupPlan((1,), (16,), max_tokens=2)

        async def warm_up() -> float:
            warm = Warmup(plan, warmed.url, None)
            started = time.perf_counter()
            try:
                await warm.round()
            finally:
                await warm.aclose()
            return time.perf_counter() - started

        warmup_took = asyncio.run(warm_up())
        warm_first = _timed(warmed.url)
    # Without warm-up the first request pays, the next one does not; with warm-up the warm-up
    # pays and the first client request is as fast as a warm one.
    assert cold_first > cold_second
    assert warmup_took > warm_first
    assert cold_first > warm_first


def test_an_engine_restarted_inside_the_pod_is_warmed_up_again() -> None:
    config = SimConfig(port=0, speed=1000, seed=4)

    async def scenario() -> None:
        sim = run_in_thread(config)
        relay = Relay(port_of(sim.url))  # one engine address across the restart
        engine = EngineCollector(EngineScraper(f"{relay.url}/metrics", timeout_s=5.0), {})
        warm = Warmup(WarmupPlan((1, 2), (16,)), relay.url, MODEL)
        tracker = StartupTracker(engine, warm, poll_s=0.05, watch_s=0.05)
        task = asyncio.create_task(tracker.run())
        try:
            await wait_until(lambda: warm.done, "the first warm-up", 30)
            first_healthy = tracker.reached["engine_healthy"]
            await asyncio.to_thread(sim.stop)
            relay.pause()
            await wait_until(lambda: not warm.done, "the restart to be seen", 30)
            assert tracker.phase in ("process_start", "engine_reachable")
            assert not warm.readiness()[0].ok  # the gate is closed again
            sim = await asyncio.to_thread(run_in_thread, config)
            relay.resume(port_of(sim.url))
            await wait_until(lambda: warm.done, "the second warm-up", 30)
            assert tracker.reached["engine_healthy"] > first_healthy
            assert warm.outcomes["ok"] == 6  # one round of 1 + 2 requests per engine process
        finally:
            task.cancel()
            await asyncio.gather(task, return_exceptions=True)
            await tracker.aclose()
            await engine.aclose()
            sim.stop()
            relay.close()

    asyncio.run(scenario())


@pytest.mark.parametrize(
    ("args", "message"),
    [
        (["--warmup-batch-sizes", "1,x"], "is not a comma-separated list of positive integers"),
        (["--warmup-batch-sizes", "0"], "is not a comma-separated list of positive integers"),
        (["--warmup-batch-sizes", "4096"], "a warm-up batch is at most 1024 requests"),
        (["--warmup-batch-sizes", "1", "--warmup-prompt-tokens", ""], "prompt lengths"),
        (["--warmup-batch-sizes", "1", "--warmup-prompt-tokens", "999999"], "prompt lengths"),
        (["--warmup-max-tokens", "0"], "--warmup-max-tokens"),
    ],
)
def test_bad_warmup_flags_are_one_line_errors(args: list[str], message: str) -> None:
    result = CliRunner().invoke(
        main, ["sidecar", "--engine-url", "http://127.0.0.1:1", "--gpu", "none", *args]
    )
    assert result.exit_code == 2, result.output
    errors = [line for line in result.output.splitlines() if line.startswith("Error:")]
    assert len(errors) == 1 and message in errors[0], result.output


def test_warmup_without_an_engine_is_refused() -> None:
    result = CliRunner().invoke(main, ["sidecar", "--warmup-batch-sizes", "1"])
    assert result.exit_code == 2
    assert "--warmup-batch-sizes needs --engine-url" in result.output


def test_warmup_tokens_are_what_the_engine_counted_so_reconciliation_knows_them(
    fast_sim: SimHandle,
) -> None:
    """The engine's token counters grow by exactly the warm-up tokens the sidecar serves,
    which the tenancy proxy reads as traffic around it."""

    def engine_tokens() -> dict[str, float]:
        counters = engine_token_counters(httpx.get(f"{fast_sim.url}/metrics").content)
        assert counters is not None
        return counters

    class Page:
        def __init__(self, families: list[Any]) -> None:
            self.families = families

        def collect(self) -> list[Any]:
            return self.families

    async def warm_up() -> tuple[bytes, float]:
        warm = Warmup(WarmupPlan((1, 3), (16, 64)), fast_sim.url, MODEL)
        try:
            await warm.round()
        finally:
            await warm.aclose()
        return generate_latest(Page(warm.families())), warm.tokens_since  # type: ignore[arg-type]

    before = engine_tokens()
    page, since = asyncio.run(warm_up())
    after = engine_tokens()
    direct = direct_tokens(page)
    assert direct is not None and min(direct.tokens.values()) > 0
    assert direct.tokens == {k: after[k] - before[k] for k in ("prompt", "completion")}
    assert direct.started == pytest.approx(since)


def test_quality_probes_wait_for_the_first_warmup(fast_sim: SimHandle) -> None:
    """A replica still loading or warming up says nothing about its quality."""

    async def scenario() -> None:
        servers = hostile_server(server_error)  # an engine that never turns healthy
        url = await anext(servers)
        loading = StartupTracker(
            EngineCollector(EngineScraper(f"{url}/metrics", timeout_s=0.3), {}), poll_s=0.05
        )
        tracker = tracker_for(fast_sim, WarmupPlan((1,), (16,)))
        started: list[str] = []

        async def probes(name: str) -> None:
            started.append(name)

        tasks = [asyncio.create_task(t.run()) for t in (loading, tracker)]
        waiting = [
            asyncio.create_task(loading.after_warmup(lambda: probes("loading"))),
            asyncio.create_task(tracker.after_warmup(lambda: probes("warm"))),
        ]
        try:
            await wait_until(lambda: started, "the warm replica's probes", 30)
            assert "warmup_done" in tracker.reached
            await wait_until(lambda: loading.phase == "engine_reachable", "a 503", 30)
            await asyncio.sleep(0.3)
            assert started == ["warm"]
        finally:
            for task in (*tasks, *waiting):
                task.cancel()
            await asyncio.gather(*tasks, *waiting, return_exceptions=True)
            for t in (loading, tracker):
                await t.aclose()
                await t.engine.aclose()
            await servers.aclose()

    asyncio.run(scenario())
