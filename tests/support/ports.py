"""Loopback ports for tests that start servers which cannot report the port they bound."""

from __future__ import annotations

import socket


def free_port() -> int:
    """A port the OS had free a moment ago (another process may take it before it is bound)."""
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])
