"""A Prometheus HTTP API that answers what a test tells it: hostile answers on loopback.

Every GET or POST is answered by ``answer(path, query)`` (``query`` the PromQL asked, "" for
other endpoints) with (status, body); for a path ``trickle(path)`` holds, the head is sent
and then a byte at a time until the server stops, as a server (or a proxy before it) that
never finishes. Each
query asked is kept in ``queries``.
"""

from __future__ import annotations

import contextlib
import json
import threading
from collections.abc import Callable, Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any
from urllib.parse import parse_qs, urlsplit

Answer = Callable[[str, str], tuple[int, bytes]]


def vector(*samples: tuple[dict[str, str], Any]) -> bytes:
    """An instant-vector answer of (labels, value) samples."""
    result = [{"metric": labels, "value": [1700000000, value]} for labels, value in samples]
    return json.dumps({"status": "success", "data": {"resultType": "vector", "result": result}})\
        .encode()  # fmt: skip


class StubPrometheus(ThreadingHTTPServer):
    daemon_threads = True

    def __init__(self) -> None:
        super().__init__(("127.0.0.1", 0), _Handler)
        self.answer: Answer = lambda path, query: (200, vector())
        self.trickle: Callable[[str], bool] = lambda path: False
        self.content_type = "application/json"
        self.queries: list[str] = []
        self.stop = threading.Event()

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.server_address[1]}"

    def always(self, body: bytes, status: int = 200) -> None:
        """Answer every request with ``body``."""
        self.answer = lambda path, query: (status, body)


class _Handler(BaseHTTPRequestHandler):
    server: StubPrometheus

    def log_message(self, format: str, *args: object) -> None:
        pass

    def do_GET(self) -> None:
        self._reply(urlsplit(self.path).query)

    def do_POST(self) -> None:
        length = int(self.headers.get("content-length", "0"))
        self._reply(self.rfile.read(length).decode())

    def _reply(self, form: str) -> None:
        query = parse_qs(form).get("query", [""])[0]
        if query:
            self.server.queries.append(query)
        path = urlsplit(self.path).path
        status, body = self.server.answer(path, query)
        self.send_response(status)
        self.send_header("content-type", self.server.content_type)
        if self.server.trickle(path):
            self.end_headers()
            while not self.server.stop.is_set():
                self.wfile.write(b" ")
                self.wfile.flush()
                self.server.stop.wait(0.05)  # the trickle's pace, not a wait for an event
            return
        self.send_header("content-length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)


@contextlib.contextmanager
def stub_prometheus() -> Iterator[StubPrometheus]:
    server = StubPrometheus()
    thread = threading.Thread(target=server.serve_forever, args=(0.05,), daemon=True)
    thread.start()
    try:
        yield server
    finally:
        server.stop.set()
        server.shutdown()
        server.server_close()
