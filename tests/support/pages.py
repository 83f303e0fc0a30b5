"""A local HTTP server standing in for an engine's /metrics, in the ways engines misbehave."""

from __future__ import annotations

import contextlib
import gzip
import threading
import time
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

from support.shared import SHARED


class PageHandler(BaseHTTPRequestHandler):
    """Serves engine pages the way real and broken engines do; see ``page_server``."""

    server: PageServer

    def log_message(self, format: str, *args: object) -> None:  # keep test output clean
        pass

    def do_GET(self) -> None:
        self.server.hits[self.path] = self.server.hits.get(self.path, 0) + 1
        mode, _, rest = self.path.strip("/").partition("/")
        if mode == "fixture":
            name = rest.removesuffix("/metrics")
            self._send(200, (SHARED / "fixtures" / "engines" / f"{name}.prom").read_bytes())
        elif mode == "page":
            self._send(200, self.server.page)
        elif mode == "slow":
            time.sleep(float(rest.split("/")[0]))
            self._send(200, self.server.page)
        elif mode == "hang":  # headers, then silence until the test ends
            self.send_response(200)
            self.send_header("Content-Type", "text/plain; version=0.0.4")
            self.send_header("Content-Length", "100000")
            self.end_headers()
            self.server.release.wait(30)
        elif mode == "html":
            self._send(200, b"<html><body>502 Bad Gateway</body></html>", "text/html")
        elif mode == "html-as-text":
            self._send(200, b"<html><body>Loading model...</body></html>\n")
        elif mode == "error":
            self._send(500, b"Internal Server Error\n")
        elif mode == "empty":
            self._send(200, b"")
        elif mode == "huge":
            self._send(200, b"# padding\n" * 200_000)
        elif mode == "gzip":
            self._send(200, gzip.compress(self.server.page), encoding="gzip")
        else:
            self._send(404, b"not found\n")

    def _send(
        self,
        status: int,
        body: bytes,
        content_type: str = "text/plain; version=0.0.4",
        encoding: str | None = None,
    ) -> None:
        self.send_response(status)
        self.send_header("Content-Type", content_type)
        self.send_header("Content-Length", str(len(body)))
        if encoding:
            self.send_header("Content-Encoding", encoding)
        self.end_headers()
        with contextlib.suppress(OSError):
            self.wfile.write(body)


class PageServer(ThreadingHTTPServer):
    daemon_threads = True

    def __init__(self) -> None:
        super().__init__(("127.0.0.1", 0), PageHandler)
        self.hits: dict[str, int] = {}
        self.page = b""
        self.release = threading.Event()

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.server_address[1]}"
