"""Overhead of the tenancy proxy, side by side with LiteLLM's proxy, against one fast mock.

    .venv/bin/python bench/proxy_overhead.py [--requests 2000] [--no-litellm] [--engine-ms 0]

One run starts a mock OpenAI-compatible engine (raw asyncio, fixed replies, SSE streams with
usage), then measures the same load four ways: direct to the mock, through a byte relay
(a Python process that copies bytes between each client connection and its own upstream
connection without reading them: the ceiling of any Python proxy on this machine), through
``inferwatch proxy`` and through LiteLLM's proxy (installed on first use into
bench/.venv-litellm with ``pip install 'litellm[proxy]'``, configured with a master key and no
database). The load generator is a raw asyncio HTTP/1.1 client in its own process, one
keep-alive connection per concurrent worker, so that it is not the bottleneck.

Reported: non-streamed latency p50/p99 and the proxies' added latency at concurrency 1 and 16,
streamed time to first token and total time, and throughput at concurrency 16, with ratios.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import multiprocessing
import multiprocessing.process
import os
import shutil
import signal
import socket
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any, cast

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO / "tests"))

from support.ports import PortTaken, announced_url, in_use, start_on_free_port  # noqa: E402

LITELLM_VENV = REPO / "bench" / ".venv-litellm"
MASTER_KEY = "sk-bench-master"
TENANT_KEY = "sk-bench-tenant"
MODEL = "bench-model"
STREAM_CHUNKS = 16

# ----------------------------------------------------------------------------- mock engine


def _mock_replies() -> tuple[bytes, bytes, bytes]:
    usage = {"prompt_tokens": 12, "completion_tokens": STREAM_CHUNKS, "total_tokens": 28}
    body = json.dumps(
        {
            "id": "chatcmpl-bench",
            "object": "chat.completion",
            "created": 1700000000,
            "model": MODEL,
            "choices": [
                {
                    "index": 0,
                    "finish_reason": "stop",
                    "message": {"role": "assistant", "content": "hello " * STREAM_CHUNKS},
                }
            ],
            "usage": usage,
        }
    ).encode()
    plain = b"HTTP/1.1 200 OK\r\ncontent-type: application/json\r\ncontent-length: %d\r\n\r\n%s" % (
        len(body),
        body,
    )

    def frame(payload: dict[str, Any]) -> bytes:
        data = b"data: " + json.dumps(payload).encode() + b"\n\n"
        return b"%x\r\n%s\r\n" % (len(data), data)

    def chunk(choices: list[Any], with_usage: Any) -> dict[str, Any]:
        out = {
            "id": "chatcmpl-bench",
            "object": "chat.completion.chunk",
            "created": 1700000000,
            "model": MODEL,
            "choices": choices,
        }
        if with_usage is not False:
            out["usage"] = with_usage
        return out

    def stream(include_usage: bool) -> bytes:
        parts = [
            b"HTTP/1.1 200 OK\r\ncontent-type: text/event-stream\r\n"
            b"transfer-encoding: chunked\r\n\r\n"
        ]
        marker: Any = None if include_usage else False
        for i in range(STREAM_CHUNKS):
            parts.append(
                frame(
                    chunk(
                        [
                            {
                                "index": 0,
                                "delta": {"content": "hello "},
                                "finish_reason": "stop" if i == STREAM_CHUNKS - 1 else None,
                            }
                        ],
                        marker,
                    )
                )
            )
        if include_usage:
            parts.append(frame(chunk([], usage)))
        data = b"data: [DONE]\n\n"
        parts.append(b"%x\r\n%s\r\n0\r\n\r\n" % (len(data), data))
        return b"".join(parts)

    return plain, stream(True), stream(False)


class _MockProtocol(asyncio.Protocol):
    PLAIN, STREAM_USAGE, STREAM_BARE = _mock_replies()
    #: seconds of simulated engine work before each reply (0: answer at once)
    DELAY = 0.0

    def _reply(self, data: bytes) -> None:
        if self.DELAY:
            asyncio.get_running_loop().call_later(self.DELAY, self.transport.write, data)
        else:
            self.transport.write(data)

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        self.transport = cast(asyncio.Transport, transport)  # uvloop's is not a subclass
        self.buffer = b""

    def data_received(self, data: bytes) -> None:
        self.buffer += data
        while True:
            end = self.buffer.find(b"\r\n\r\n")
            if end < 0:
                return
            head = self.buffer[:end].lower()
            length = 0
            at = head.find(b"content-length:")
            if at >= 0:
                stop = head.find(b"\r\n", at)
                length = int(head[at + 15 : stop if stop > 0 else None])
            if len(self.buffer) < end + 4 + length:
                return
            body = self.buffer[end + 4 : end + 4 + length]
            self.buffer = self.buffer[end + 4 + length :]
            if head.startswith(b"get /v1/models"):
                models = json.dumps({"object": "list", "data": [{"id": MODEL, "object": "model"}]})
                self.transport.write(  # not delayed: readiness checks only
                    b"HTTP/1.1 200 OK\r\ncontent-type: application/json\r\n"
                    b"content-length: %d\r\n\r\n%s" % (len(models), models.encode())
                )
            elif b'"stream":true' in body.replace(b" ", b""):
                with_usage = b'"include_usage":true' in body.replace(b" ", b"")
                self._reply(self.STREAM_USAGE if with_usage else self.STREAM_BARE)
            else:
                self._reply(self.PLAIN)


def _serve_forever(protocol: Callable[[], asyncio.Protocol], listener: socket.socket) -> None:
    import uvloop

    async def main() -> None:
        server = await asyncio.get_running_loop().create_server(protocol, sock=listener)
        await server.serve_forever()

    uvloop.run(main())


def _serve_mock(listener: socket.socket, delay: float) -> None:
    _MockProtocol.DELAY = delay
    _serve_forever(_MockProtocol, listener)


# ----------------------------------------------------------------------------- relay ceiling


class _RelayProtocol(asyncio.Protocol):
    """Copies a client connection's bytes to its own upstream connection and back, unread.

    No parsing, no accounting: the most any Python proxy on uvloop can do on this machine, so
    the report can show how much of the gap to direct is the runtime's, not the proxy's.
    """

    UPSTREAM_PORT = 0

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        self.transport = cast(asyncio.Transport, transport)
        self.upstream: asyncio.Transport | None = None
        self.pending: list[bytes] = []
        self.connecting = asyncio.ensure_future(self._connect())

    async def _connect(self) -> None:
        loop = asyncio.get_running_loop()
        upstream, _ = await loop.create_connection(
            lambda: _RelayBack(self.transport), "127.0.0.1", self.UPSTREAM_PORT
        )
        self.upstream = cast(asyncio.Transport, upstream)
        for data in self.pending:
            self.upstream.write(data)

    def data_received(self, data: bytes) -> None:
        if self.upstream is None:
            self.pending.append(data)
        else:
            self.upstream.write(data)

    def connection_lost(self, exc: Exception | None) -> None:
        if self.upstream is not None:
            self.upstream.close()


class _RelayBack(asyncio.Protocol):
    def __init__(self, client: asyncio.Transport) -> None:
        self.client = client

    def data_received(self, data: bytes) -> None:
        self.client.write(data)


def _serve_relay(listener: socket.socket, upstream_port: int) -> None:
    _RelayProtocol.UPSTREAM_PORT = upstream_port
    _serve_forever(_RelayProtocol, listener)


# ----------------------------------------------------------------------------- load generator


class _Client(asyncio.Protocol):
    """One keep-alive connection; times a request to its first body byte and to its end."""

    def __init__(self) -> None:
        import httptools

        self.parser = httptools.HttpResponseParser(self)
        self.done: asyncio.Future[None] | None = None
        self.first: float = 0.0
        self.status = 0

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        self.transport = cast(asyncio.Transport, transport)  # uvloop's is not a subclass

    def data_received(self, data: bytes) -> None:
        self.parser.feed_data(data)

    def connection_lost(self, exc: Exception | None) -> None:
        if self.done is not None and not self.done.done():
            self.done.set_exception(ConnectionError("closed"))

    def on_body(self, body: bytes) -> None:
        if not self.first and (b"data: {" in body or b'"choices"' in body):
            self.first = time.perf_counter()

    def on_message_complete(self) -> None:
        self.status = self.parser.get_status_code()
        if self.done is not None:
            self.done.set_result(None)

    async def send(self, request: bytes) -> tuple[float, float]:
        self.first = 0.0
        self.done = asyncio.get_running_loop().create_future()
        start = time.perf_counter()
        self.transport.write(request)
        await self.done
        end = time.perf_counter()
        if self.status != 200:
            raise RuntimeError(f"HTTP {self.status}")
        return (self.first or end) - start, end - start


def _request(port: int, stream: bool, key: str) -> bytes:
    body = {
        "model": MODEL,
        "messages": [{"role": "user", "content": "Say hello to the bench."}],
        "max_tokens": STREAM_CHUNKS,
    }
    if stream:
        body["stream"] = True
    data = json.dumps(body).encode()
    return (
        b"POST /v1/chat/completions HTTP/1.1\r\nhost: 127.0.0.1:%d\r\n"
        b"authorization: Bearer %s\r\ncontent-type: application/json\r\n"
        b"content-length: %d\r\n\r\n%s" % (port, key.encode(), len(data), data)
    )


def _load(port: int, key: str, stream: bool, concurrency: int, requests: int) -> dict[str, Any]:
    import uvloop

    async def main() -> dict[str, Any]:
        loop = asyncio.get_running_loop()
        request = _request(port, stream, key)
        clients = [
            (await loop.create_connection(_Client, "127.0.0.1", port))[1]
            for _ in range(concurrency)
        ]
        for client in clients:  # warm up every connection and the server's code paths
            for _ in range(max(3, min(50, requests // (10 * concurrency)))):
                await client.send(request)
        first: list[float] = []
        total: list[float] = []

        async def worker(client: _Client, count: int) -> None:
            for _ in range(count):
                ttft, elapsed = await client.send(request)
                first.append(ttft)
                total.append(elapsed)

        per_worker = max(1, requests // concurrency)
        start = time.perf_counter()
        await asyncio.gather(*(worker(client, per_worker) for client in clients))
        wall = time.perf_counter() - start
        for client in clients:
            client.transport.close()
        return {"first": first, "total": total, "rps": len(total) / wall}

    return uvloop.run(main())


# ----------------------------------------------------------------------------- processes


def _serve_in_child(
    target: Callable[..., None], *args: object
) -> tuple[multiprocessing.process.BaseProcess, int]:
    """``target(listener, *args)`` in a spawned process, on a loopback socket bound here (port
    0) and handed over, so no other process can take the port in between; (process, port)."""
    listener = socket.create_server(("127.0.0.1", 0))
    port = int(listener.getsockname()[1])
    child = multiprocessing.get_context("spawn").Process(
        target=target, args=(listener, *args), daemon=True
    )
    child.start()
    try:
        _wait_ready(port, "none", 30, child.is_alive)
    finally:
        listener.close()  # the child holds its own copy
    return child, port


def _wait_ready(port: int, key: str, timeout: float, alive: Callable[[], bool]) -> None:
    deadline = time.monotonic() + timeout
    request = (
        b"GET /v1/models HTTP/1.1\r\nhost: x\r\nauthorization: Bearer %s\r\n"
        b"connection: close\r\n\r\n" % key.encode()
    )
    while time.monotonic() < deadline:
        if not alive():
            raise RuntimeError("server exited before it was ready")
        try:
            with socket.create_connection(("127.0.0.1", port), timeout=2) as sock:
                sock.sendall(request)
                if sock.recv(64).startswith(b"HTTP/1.1 200"):
                    return
        except OSError:
            pass
        time.sleep(0.2)
    raise RuntimeError(f"server on port {port} not ready after {timeout:g}s")


def _ensure_litellm() -> Path | None:
    """The LiteLLM venv's `litellm` script, installing it on first use; None with a reason."""
    script = LITELLM_VENV / "bin" / "litellm"
    if script.exists():
        return script
    print(f"installing litellm[proxy] into {LITELLM_VENV} (first run only) ...", flush=True)
    try:
        subprocess.run([sys.executable, "-m", "venv", str(LITELLM_VENV)], check=True)
        subprocess.run(
            [str(LITELLM_VENV / "bin" / "pip"), "install", "-q", "litellm[proxy]"], check=True
        )
    except subprocess.CalledProcessError as exc:
        print(f"LiteLLM could not be installed: {exc}", file=sys.stderr)
        return None
    return script if script.exists() else None


def _start(
    argv: Sequence[str], log: Path, env: dict[str, str] | None = None
) -> subprocess.Popen[bytes]:
    with log.open("wb") as out:
        return subprocess.Popen(
            argv, stdout=out, stderr=subprocess.STDOUT, env=env, start_new_session=True
        )


def _stop(process: subprocess.Popen[bytes]) -> None:
    if process.poll() is None:
        os.killpg(process.pid, signal.SIGTERM)
        try:
            process.wait(10)
        except subprocess.TimeoutExpired:
            os.killpg(process.pid, signal.SIGKILL)
            process.wait()


def start_proxy(
    config: Path, key: str, log: Path, timeout: float
) -> tuple[subprocess.Popen[bytes], int]:
    """``inferwatch proxy`` with ``config``, its listeners on ports the OS gives it; (process,
    the client port it logged), once it answers ``/v1/models`` to tenant ``key``."""
    process = _start(
        [str(REPO / ".venv" / "bin" / "inferwatch"), "--log-format", "json", "proxy",
         "--config", str(config), "--listen", "127.0.0.1:0", "--metrics-listen", "127.0.0.1:0"],
        log,
    )  # fmt: skip
    try:
        port = int(announced_url(process, log, "inferwatch proxy").rsplit(":", 1)[1])
        _wait_ready(port, key, timeout, lambda: process.poll() is None)
    except BaseException:
        _stop(process)
        raise
    return process, port


def _start_inferwatch(
    mock_port: int, workdir: Path, usage_log: bool
) -> tuple[subprocess.Popen[bytes], int]:
    import hashlib

    config = workdir / "proxy.yaml"
    digest = hashlib.sha256(TENANT_KEY.encode()).hexdigest()
    config.write_text(
        f"upstream: {{url: 'http://127.0.0.1:{mock_port}', reconcile_interval: 0}}\n"
        f"tenants: {{bench: {{key_sha256: ['{digest}']}}}}\n"
        f"prices: {{default: {{prompt: 0.5, completion: 1.5}}}}\n"
        + (f"usage_log: {{dir: '{workdir / 'usage'}'}}\n" if usage_log else "")
    )
    return start_proxy(config, TENANT_KEY, workdir / "proxy.log", 30)


def _start_litellm(
    script: Path, mock_port: int, workdir: Path
) -> tuple[subprocess.Popen[bytes], int]:
    config = workdir / "litellm.yaml"
    config.write_text(
        "model_list:\n"
        f"  - model_name: {MODEL}\n"
        "    litellm_params:\n"
        f"      model: openai/{MODEL}\n"
        f"      api_base: http://127.0.0.1:{mock_port}/v1\n"
        "      api_key: sk-mock\n"
        "general_settings:\n"
        f"  master_key: {MASTER_KEY}\n"
        "litellm_settings:\n"
        "  telemetry: false\n"
    )
    env = dict(
        os.environ,
        LITELLM_LOCAL_MODEL_COST_MAP="True",
        LITELLM_LOG="ERROR",
        DISABLE_SCHEMA_UPDATE="true",
    )
    env.pop("DATABASE_URL", None)
    log = workdir / "litellm.log"

    def start(port: int) -> tuple[subprocess.Popen[bytes], int]:
        process = _start(
            [str(script), "--config", str(config), "--host", "127.0.0.1", "--port", str(port),
             "--num_workers", "1"],
            log,
            env,
        )  # fmt: skip
        try:
            _wait_ready(port, MASTER_KEY, 180, lambda: process.poll() is None)
        except RuntimeError:
            _stop(process)
            if in_use(log.read_text(encoding="utf-8", errors="replace")):
                raise PortTaken(f"LiteLLM: port {port} taken") from None
            raise
        return process, port

    return start_on_free_port(start)


# ----------------------------------------------------------------------------- report


def _pct(values: list[float], q: float) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, int(q * len(ordered)))]


def _run_load(port: int, key: str, stream: bool, concurrency: int, requests: int) -> dict[str, Any]:
    """Runs the load generator in a fresh process so it never shares a core with its own target."""
    from concurrent.futures import ProcessPoolExecutor

    with ProcessPoolExecutor(1) as pool:
        return pool.submit(_load, port, key, stream, concurrency, requests).result()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument(
        "--requests",
        type=int,
        default=2000,
        help="requests per measurement for direct and inferwatch",
    )
    parser.add_argument("--litellm-requests", type=int, default=400)
    parser.add_argument("--no-litellm", action="store_true")
    parser.add_argument(
        "--usage-log", action="store_true", help="run inferwatch with its usage log on"
    )
    parser.add_argument(
        "--engine-ms",
        type=float,
        default=0.0,
        help="milliseconds the mock spends per reply, like an engine would (default: none)",
    )
    args = parser.parse_args()

    workdir = Path(tempfile.mkdtemp(prefix="proxy-bench-"))
    mock, mock_port = _serve_in_child(_serve_mock, args.engine_ms / 1000)
    names = ["direct", "relay", "inferwatch"]
    litellm_note = ""
    script = None
    if not args.no_litellm:
        script = _ensure_litellm()
        if script is None:
            litellm_note = "LiteLLM not measured: installation failed (see above)"
    results: dict[tuple[str, str, int], dict[str, Any]] = {}
    try:
        # one proxy runs at a time, so that an idle one never takes CPU from the one measured
        _measure(results, "direct", mock_port, "none", args.requests)
        relay, relay_port = _serve_in_child(_serve_relay, mock_port)
        try:
            _measure(results, "relay", relay_port, "none", args.requests)
        finally:
            relay.terminate()
            relay.join(5)
        process, port = _start_inferwatch(mock_port, workdir, args.usage_log)
        try:
            _measure(results, "inferwatch", port, TENANT_KEY, args.requests)
        finally:
            _stop(process)
        if script is not None:
            try:
                process, port = _start_litellm(script, mock_port, workdir)
            except RuntimeError as exc:
                litellm_note = f"LiteLLM not measured: {exc}"
            else:
                try:
                    _measure(results, "litellm", port, MASTER_KEY, args.litellm_requests)
                    names.append("litellm")
                finally:
                    _stop(process)
        _report(results, names)
        if litellm_note:
            print(litellm_note)
    finally:
        mock.terminate()
        mock.join(5)
        shutil.rmtree(workdir, ignore_errors=True)


def _measure(
    results: dict[tuple[str, str, int], dict[str, Any]],
    name: str,
    port: int,
    key: str,
    requests: int,
) -> None:
    for stream in (False, True):
        for concurrency in (1, 16):
            mode = "stream" if stream else "plain"
            print(f"  {name:10} {mode:6} c={concurrency:<2} ...", end="", flush=True)
            result = _run_load(port, key, stream, concurrency, requests)
            results[(name, mode, concurrency)] = result
            print(f" {result['rps']:8.0f} req/s", flush=True)


def _report(results: dict[tuple[str, str, int], dict[str, Any]], names: list[str]) -> None:
    ms = 1000.0
    print()
    print(
        f"{'target':11} {'mode':6} {'c':>2} {'p50 ms':>8} {'p99 ms':>8} {'+p50 ms':>8} "
        f"{'+p99 ms':>8} {'ttft50':>8} {'+ttft50':>8} {'req/s':>8} {'vs direct':>9}"
    )
    for mode in ("plain", "stream"):
        for concurrency in (1, 16):
            base = results[("direct", mode, concurrency)]
            for name in names:
                r = results[(name, mode, concurrency)]
                p50, p99 = _pct(r["total"], 0.5), _pct(r["total"], 0.99)
                f50 = statistics.median(r["first"])
                print(
                    f"{name:11} {mode:6} {concurrency:>2} {p50 * ms:8.3f} {p99 * ms:8.3f} "
                    f"{(p50 - _pct(base['total'], 0.5)) * ms:8.3f} "
                    f"{(p99 - _pct(base['total'], 0.99)) * ms:8.3f} "
                    f"{f50 * ms:8.3f} {(f50 - statistics.median(base['first'])) * ms:8.3f} "
                    f"{r['rps']:8.0f} {r['rps'] / base['rps']:9.2f}"
                )
    print()
    for mode in ("plain", "stream"):
        ours = results[("inferwatch", mode, 16)]["rps"]
        ceiling = results[("relay", mode, 16)]["rps"]
        print(f"throughput at c=16, {mode}: inferwatch / byte relay = {ours / ceiling:.2f}")
    if "litellm" in names:
        for mode in ("plain", "stream"):
            ours = results[("inferwatch", mode, 16)]["rps"]
            theirs = results[("litellm", mode, 16)]["rps"]
            print(f"throughput at c=16, {mode}: inferwatch / litellm = {ours / theirs:.1f}x")


if __name__ == "__main__":
    main()
