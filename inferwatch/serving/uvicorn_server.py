"""How every inferwatch server runs under uvicorn, so that they all log the same way.

uvicorn's own lines (``uvicorn``, ``uvicorn.error``) go through the handler
:func:`inferwatch.logs.configure` installs, never uvicorn's dictConfig; its access log is
off (components that want one write their own, with their fields); and it is handed a
socket bound beforehand, so that a taken port is the CLI's one line, not a uvicorn error.
"""

from __future__ import annotations

import socket
from typing import Any

import uvicorn

__all__ = ["config", "serve"]


def config(app: Any, **settings: Any) -> uvicorn.Config:
    """uvicorn settings with our logging; ``settings`` are uvicorn's other options."""
    return uvicorn.Config(app, log_config=None, log_level=None, access_log=False, **settings)


def serve(app: Any, sock: socket.socket, **settings: Any) -> None:
    """Serve ``app`` on the bound ``sock`` until SIGTERM or SIGINT, then close it."""
    with sock:
        uvicorn.Server(config(app, **settings)).run(sockets=[sock])
