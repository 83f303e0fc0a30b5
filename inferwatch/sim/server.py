"""Serving a simulator over HTTP, and starting one from code or tests.

Endpoints (one port): ``POST /v1/chat/completions``, ``POST /v1/completions``,
``GET /v1/models``, ``/health``, ``/version``, ``/metrics`` (vLLM 0.33 families),
``/gpu/metrics`` (dcgm-exporter format) and ``GET|POST|DELETE /admin/faults`` (bearer token).
With ``gpu_port`` set, the DCGM text is also served at ``/metrics`` on that second port, like a
dcgm-exporter next to the engine.

In-process (one event loop in a daemon thread; returns once it accepts connections)::

    from inferwatch.sim.server import run_in_thread
    from inferwatch.sim.simulator import SimConfig

    handle = run_in_thread(SimConfig(port=0, speed=20, admin_token="t"))
    ...  # handle.url == "http://127.0.0.1:<port>", handle.gpu_url (its DCGM page), handle.simulator
    handle.stop()

As a subprocess (``python -m inferwatch sim ...``; port 0 means a free one)::

    from inferwatch.sim.server import start_subprocess

    proc = start_subprocess(["--speed", "20", "--engine-ranks", "2"])
    ...  # proc.url, proc.gpu_url
    proc.stop()

Both are context managers too (``with run_in_thread(config) as handle: ...``).
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import logging
import shutil
import socket
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import AsyncIterator, Awaitable, Callable, Sequence
from pathlib import Path
from typing import Any

import uvicorn
from starlette.applications import Starlette
from starlette.responses import Response
from starlette.routing import Route
from starlette.types import ASGIApp, Message, Receive, Scope, Send

from inferwatch.logs import log_event
from inferwatch.serving import uvicorn_server
from inferwatch.sim import openai_api as api
from inferwatch.sim.metrics import UNINSTRUMENTED_PATHS, VllmMetrics
from inferwatch.sim.simulator import SimConfig, Simulator

logger = logging.getLogger("inferwatch.sim")


class HttpMetrics:
    """ASGI middleware recording the http_* families as vLLM's instrumentator does."""

    def __init__(self, app: ASGIApp, metrics: VllmMetrics, handlers: frozenset[str]) -> None:
        self.app = app
        self.metrics = metrics
        self.handlers = handlers

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        path = scope.get("path", "")
        if scope["type"] != "http" or path in UNINSTRUMENTED_PATHS or path not in self.handlers:
            await self.app(scope, receive, send)
            return
        started = time.perf_counter()
        status, sent = 500, 0

        async def counting_send(message: Message) -> None:
            nonlocal status, sent
            if message["type"] == "http.response.start":
                status = message["status"]
            elif message["type"] == "http.response.body":
                sent += len(message.get("body", b""))
            await send(message)

        try:
            await self.app(scope, receive, counting_send)
        finally:
            headers = dict(scope.get("headers", []))
            received = int(headers.get(b"content-length", b"0") or 0)
            elapsed = time.perf_counter() - started
            self.metrics.observe_http(path, scope["method"], status, received, sent, elapsed)


def create_app(sim: Simulator) -> Starlette:
    """The engine's HTTP app; its lifespan starts and stops the engine tasks."""

    @contextlib.asynccontextmanager
    async def lifespan(app: Starlette) -> AsyncIterator[None]:
        sim.start()
        try:
            yield
        finally:
            await sim.stop()

    routes = [
        Route("/v1/chat/completions", api.chat_completions, methods=["POST"]),
        Route("/v1/completions", api.completions, methods=["POST"]),
        Route("/v1/models", api.models, methods=["GET"]),
        Route("/health", api.health, methods=["GET"]),
        Route("/version", api.version, methods=["GET"]),
        Route("/metrics", api.metrics, methods=["GET"]),
        Route("/gpu/metrics", api.gpu_metrics, methods=["GET"]),
        Route("/admin/faults", api.admin_faults, methods=["GET", "POST", "DELETE"]),
    ]
    app = Starlette(routes=routes, lifespan=lifespan)
    app.state.sim = sim
    instrumented = frozenset({"/v1/chat/completions", "/v1/completions", "/v1/models"})
    app.add_middleware(HttpMetrics, metrics=sim.metrics, handlers=instrumented)
    return app


def create_gpu_app(sim: Simulator) -> Starlette:
    """A dcgm-exporter lookalike: ``/metrics`` and ``/health``."""

    async def ok(request: Any) -> Response:
        return Response("OK")

    app = Starlette(routes=[Route("/metrics", api.gpu_metrics), Route("/health", ok)])
    app.state.sim = sim
    return app


def bind(host: str, port: int) -> socket.socket:
    """A listening socket (port 0: a free one), handed to uvicorn so the port is known.

    Created as an explicit TCP socket with TCP_NODELAY, which its connections inherit:
    asyncio sets TCP_NODELAY only on sockets whose protocol is IPPROTO_TCP, and without it a
    response written in two pieces (headers, then body) waits for the client's delayed ACK,
    about 40 ms on every kept-alive request.
    """
    family = socket.AF_INET6 if ":" in host else socket.AF_INET
    sock = socket.socket(family, socket.SOCK_STREAM, socket.IPPROTO_TCP)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
    try:
        sock.bind((host, port))
        sock.listen(128)
    except OSError:
        sock.close()  # a taken port is the caller's one line, not also a ResourceWarning
        raise
    sock.setblocking(False)
    return sock


def _url(host: str, sock: socket.socket) -> str:
    port = sock.getsockname()[1]
    return f"http://[{host}]:{port}" if ":" in host else f"http://{host}:{port}"


class _Servers:
    """The uvicorn servers of one simulator (engine port, optional GPU port)."""

    def __init__(self, sim: Simulator) -> None:
        config = sim.config
        self.sim = sim
        self.sockets = [bind(config.host, config.port)]
        apps: list[ASGIApp] = [create_app(sim)]
        if config.gpu_port is not None:
            self.sockets.append(bind(config.host, config.gpu_port))
            apps.append(create_gpu_app(sim))
        self.servers = [
            uvicorn.Server(uvicorn_server.config(app, lifespan="auto", timeout_graceful_shutdown=2))
            for app in apps
        ]
        self.url = _url(config.host, self.sockets[0])
        gpu = _url(config.host, self.sockets[1]) if len(self.sockets) > 1 else self.url + "/gpu"
        self.gpu_url = gpu + "/metrics"  # the dcgm-exporter page, as --gpu dcgm=URL takes it

    async def serve(self, on_ready: Callable[[], Awaitable[None] | None] | None = None) -> None:
        tasks = [
            asyncio.create_task(server.serve(sockets=[sock]))
            for server, sock in zip(self.servers, self.sockets, strict=True)
        ]
        while not all(server.started for server in self.servers):
            if any(task.done() for task in tasks):
                break
            await asyncio.sleep(0.01)
        else:
            if on_ready is not None:
                result = on_ready()
                if result is not None:
                    await result
        await asyncio.gather(*tasks)

    def exit(self) -> None:
        for server in self.servers:
            server.should_exit = True

    def close(self) -> None:
        for sock in self.sockets:
            sock.close()


class SimHandle:
    """A simulator serving from a daemon thread; ``stop()`` shuts it down."""

    def __init__(self, servers: _Servers, thread: threading.Thread) -> None:
        self._servers = servers
        self._thread = thread
        self.simulator = servers.sim
        self.url = servers.url
        self.gpu_url = servers.gpu_url

    def stop(self, timeout_s: float = 10.0) -> None:
        self._servers.exit()
        self._thread.join(timeout_s)
        self._servers.close()

    def __enter__(self) -> SimHandle:
        return self

    def __exit__(self, *exc: object) -> None:
        self.stop()


def run_in_thread(config: SimConfig, timeout_s: float = 10.0) -> SimHandle:
    """Start a simulator in this process; raises CapacityError/FaultError for bad config."""
    servers = _Servers(Simulator(config))
    ready = threading.Event()
    failure: list[BaseException] = []

    def main() -> None:
        try:
            asyncio.run(servers.serve(ready.set))
        except BaseException as exc:  # reported to the caller below
            failure.append(exc)
        finally:
            ready.set()

    thread = threading.Thread(target=main, name=f"inferwatch-sim-{servers.url}", daemon=True)
    thread.start()
    if not ready.wait(timeout_s) or failure or not thread.is_alive():
        servers.exit()
        servers.close()
        raise RuntimeError(f"the simulator did not start: {failure[0] if failure else 'timeout'}")
    return SimHandle(servers, thread)


def serve_forever(config: SimConfig, ready_file: Path | None = None) -> None:
    """Serve until interrupted (the CLI); once up, logs the addresses it bound (``--port 0``
    gets one from the OS) and writes ``{"url", "gpu_url"}`` to ready_file."""
    servers = _Servers(Simulator(config))

    def announce() -> None:
        log_event(
            logger, logging.INFO, "simulator listening", listen=servers.url, gpu=servers.gpu_url
        )
        if ready_file is not None:
            tmp = ready_file.with_suffix(".tmp")
            tmp.write_text(json.dumps({"url": servers.url, "gpu_url": servers.gpu_url}))
            tmp.replace(ready_file)

    try:
        asyncio.run(servers.serve(announce))
    finally:
        servers.close()


class SimProcess:
    """A simulator in a child process (``python -m inferwatch sim``); its stderr is a file
    in a temporary folder that ``stop()`` removes."""

    def __init__(self, process: subprocess.Popen[bytes], url: str, gpu_url: str, log: Path) -> None:
        self.process = process
        self.url = url
        self.gpu_url = gpu_url
        self.log = log

    def stop(self, timeout_s: float = 10.0) -> None:
        if self.process.poll() is None:
            self.process.terminate()
            try:
                self.process.wait(timeout_s)
            except subprocess.TimeoutExpired:
                self.process.kill()
                self.process.wait()
        shutil.rmtree(self.log.parent, ignore_errors=True)

    def __enter__(self) -> SimProcess:
        return self

    def __exit__(self, *exc: object) -> None:
        self.stop()


def start_subprocess(args: Sequence[str] = (), timeout_s: float = 20.0) -> SimProcess:
    """Start ``inferwatch sim --port 0 <args>`` and wait until it serves."""
    folder = Path(tempfile.mkdtemp(prefix="inferwatch-sim-"))
    ready, log = folder / "ready.json", folder / "stderr.log"
    # -P: the working directory (a source checkout, say) must not shadow the installed package
    command = [sys.executable, "-P", "-m", "inferwatch", "--log-format", "json", "sim",
               "--port", "0", "--ready-file", str(ready), *args]  # fmt: skip
    with log.open("wb") as stderr:
        process = subprocess.Popen(command, stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL,
                                   stderr=stderr)  # fmt: skip
    deadline = time.monotonic() + timeout_s
    while not ready.exists():
        if process.poll() is not None or time.monotonic() > deadline:
            process.kill()
            process.wait()
            reason = log.read_text(errors="replace").strip().splitlines()[-1:] or ["timeout"]
            shutil.rmtree(folder, ignore_errors=True)
            raise RuntimeError(f"inferwatch sim did not start: {reason[0]}")
        time.sleep(0.02)
    info = json.loads(ready.read_text())
    return SimProcess(process, info["url"], info["gpu_url"], log)
