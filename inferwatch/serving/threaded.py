"""A standard-library HTTP server on a background thread, for the in-process fakes (the drill's
Kubernetes API) and the benches' and tests' engines, which need a real socket but no event loop."""

from __future__ import annotations

import contextlib
import threading
from collections.abc import Callable, Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

__all__ = ["serving"]


@contextlib.contextmanager
def serving(
    handler: Callable[..., BaseHTTPRequestHandler], name: str = "http"
) -> Iterator[str]:
    """Serve ``handler`` on a free loopback port until the block ends; yields the origin.

    The handler threads are daemons and the server polls for shutdown every 50 ms, so the block
    ends at once even while a client holds a connection open."""
    server = ThreadingHTTPServer(("127.0.0.1", 0), handler)
    server.daemon_threads = True
    thread = threading.Thread(target=server.serve_forever, args=(0.05,), name=name, daemon=True)
    thread.start()
    try:
        yield f"http://127.0.0.1:{server.server_address[1]}"
    finally:
        server.shutdown()
        server.server_close()
        thread.join(timeout=10)
