"""How every inferwatch server runs under uvicorn, so that they all log and bound clients alike.

uvicorn's own lines (``uvicorn``, ``uvicorn.error``) go through the handler
:func:`inferwatch.logs.configure` installs, never uvicorn's dictConfig; its access log is
off (components that want one write their own, with their fields); it is handed a socket
bound beforehand, so that a taken port is the CLI's one line, not a uvicorn error; and every
connection is held to one :class:`~inferwatch.serving.bounded_http.ServerLimits` (a head
deadline, an idle deadline, a connection cap), so that no slow client pins a server.
"""

from __future__ import annotations

import socket
from typing import Any

import click
import uvicorn

from inferwatch.clikit import F, FiniteFloat, option_group
from inferwatch.serving.bounded_http import ServerLimits

__all__ = ["config", "limit_options", "limits_from", "serve"]


def config(app: Any, limits: ServerLimits | None = None, **settings: Any) -> uvicorn.Config:
    """uvicorn settings with our logging and ``limits``; ``settings`` are uvicorn's others."""
    limits = limits or ServerLimits()
    return uvicorn.Config(
        app,
        log_config=None,
        log_level=None,
        access_log=False,
        http=limits.protocol(),
        timeout_keep_alive=max(1, round(limits.keep_alive_timeout_s)),  # uvicorn takes an int
        # A peer is who its TCP address says (the proxy trusts a tenant header by it).
        # uvicorn would otherwise take an address from X-Forwarded-For when the peer is
        # local, and any process in the pod could pass as a trusted gateway.
        proxy_headers=False,
        **settings,
    )


def serve(app: Any, sock: socket.socket, limits: ServerLimits | None = None) -> None:
    """Serve ``app`` on the bound ``sock`` until SIGTERM or SIGINT, then close it."""
    with sock:
        uvicorn.Server(config(app, limits)).run(sockets=[sock])


def limit_options(function: F) -> F:
    """The client limits of a server command, as ``--header-timeout``, ``--idle-timeout``
    and ``--max-connections`` (each with its ``INFERWATCH_<COMMAND>_*`` twin)."""
    defaults = ServerLimits()
    return option_group(
        click.option(
            "--header-timeout",
            type=FiniteFloat(0.1, 3600),
            default=defaults.header_timeout_s,
            show_default=True,
            show_envvar=True,
            help="Seconds a client has to send a request's line and headers; a slower one "
            "is disconnected.",
        ),
        click.option(
            "--idle-timeout",
            type=FiniteFloat(0.1, 3600),
            default=defaults.keep_alive_timeout_s,
            show_default=True,
            show_envvar=True,
            help="Seconds a kept-alive connection may stay idle between requests.",
        ),
        click.option(
            "--max-connections",
            type=click.IntRange(min=0, max=1 << 20),
            default=0,
            show_envvar=True,
            help="Open connections at most; past it the longest idle one is closed. "
            "0: half the soft file-descriptor limit, at most 4096.",
        ),
    )(function)


def limits_from(options: dict[str, Any]) -> ServerLimits:
    """The ``ServerLimits`` of :func:`limit_options`' values, taken out of ``options``."""
    return ServerLimits(
        header_timeout_s=options.pop("header_timeout"),
        keep_alive_timeout_s=options.pop("idle_timeout"),
        max_connections=options.pop("max_connections"),
    )
