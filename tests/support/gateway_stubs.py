"""Loopback stand-ins for what a real haproxy routes to: replicas and their sidecars.

A replica answers every request with its name and the split header(s) the gateway gave it,
so a test sees where each request went and as which split; a sidecar answers its health
check 200 or 503 as the test sets ``ready``. The gateway tests (weights, fallbacks, canary
splits) all route to these.
"""

from __future__ import annotations

import json
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Literal

from inferwatch import wire

Role = Literal["replica", "sidecar"]


class _Handler(BaseHTTPRequestHandler):
    protocol_version = "HTTP/1.1"

    def log_message(self, format: str, *args: object) -> None:
        pass

    def _answer(self) -> None:
        length = int(self.headers.get("content-length") or 0)
        if length:
            self.rfile.read(length)
        server: Stub = self.server  # type: ignore[assignment]
        if server.role == "sidecar":
            status, body = (200 if server.ready else 503), b"{}"
        else:
            every = self.headers.get_all(wire.SPLIT_HEADER) or []
            answer = {"replica": server.replica, "split": every[0] if every else None,
                      "splits": every}  # fmt: skip
            status, body = 200, json.dumps(answer).encode()
        self.send_response(status)
        self.send_header("content-type", "application/json")
        self.send_header("content-length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)

    do_GET = do_POST = _answer


class Stub(ThreadingHTTPServer):
    """A replica (``split``: the first split header received, ``splits``: all of them) or a
    sidecar, on ``port`` of loopback (0: a free one)."""

    daemon_threads = True

    def __init__(self, port: int, replica: str, role: Role) -> None:
        super().__init__(("127.0.0.1", port), _Handler)
        self.replica, self.role, self.ready = replica, role, True
