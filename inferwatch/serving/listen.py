"""Listening sockets our servers bind themselves, so that ``HOST:0`` reports the real port.

A server that binds port 0 in its own process and logs the address it got is the only race-free
way to run it on a free port: a port probed elsewhere and bound later may be taken in between.
"""

from __future__ import annotations

import socket

import uvicorn
from starlette.types import ASGIApp

__all__ = ["bind", "serve", "url"]


def bind(host: str, port: int) -> socket.socket:
    """A listening socket (port 0: a free one), handed to uvicorn so the port is known.

    Created as an explicit TCP socket with TCP_NODELAY, which its connections inherit:
    asyncio sets TCP_NODELAY only on sockets whose protocol is IPPROTO_TCP, and without it a
    response written in two pieces (headers, then body) waits for the client's delayed ACK,
    about 40 ms on every kept-alive request.
    """
    family = socket.AF_INET6 if ":" in host else socket.AF_INET
    sock = socket.socket(family, socket.SOCK_STREAM, socket.IPPROTO_TCP)
    try:
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        sock.bind((host, port))
        sock.listen(128)
    except OSError:
        sock.close()
        raise
    sock.setblocking(False)
    return sock


def url(host: str, sock: socket.socket) -> str:
    """``http://HOST:PORT`` of a socket bound on ``host``, with the port the OS gave it."""
    port = sock.getsockname()[1]
    return f"http://[{host}]:{port}" if ":" in host else f"http://{host}:{port}"


def serve(app: ASGIApp, sock: socket.socket) -> None:
    """Serve ``app`` on an already bound socket until SIGTERM or SIGINT."""
    config = uvicorn.Config(app, log_level="warning", access_log=False)
    uvicorn.Server(config).run(sockets=[sock])
