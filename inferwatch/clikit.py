"""What the subcommands' command-line code shares: option groups, ``HOST:PORT`` parsing
and binding.

Domain CLIs (sidecar, proxy, probes, runbooks, generate, ...) import this and never the
top-level ``inferwatch.cli``, which only finds the subcommands.
"""

from __future__ import annotations

import os
import socket
from collections.abc import Callable
from typing import Any, TypeVar

import click

from inferwatch.serving import listen

F = TypeVar("F", bound=Callable[..., Any])


def option_group(*options: Callable[[F], F]) -> Callable[[F], F]:
    """Several click options as one decorator, for options that commands share."""

    def apply(command: F) -> F:
        for option in reversed(options):
            command = option(command)
        return command

    return apply


def parse_listen(value: str, flag: str = "--listen") -> tuple[str, int]:
    """``:9400``, ``0.0.0.0:9400``, ``[::1]:9400`` -> (host, port); an empty host is every
    interface. An IPv6 address goes in brackets (``::1:9400`` is ambiguous); the port is 0
    to 65535 in ASCII digits. A wrong value is a ``click.BadParameter`` naming ``flag``."""
    host, sep, port = value.rpartition(":")
    if not sep or not (port.isascii() and port.isdigit()) or int(port) > 65535:
        raise click.BadParameter(f"{value!r} is not HOST:PORT", param_hint=flag)
    if host.startswith("[") or host.endswith("]"):
        if not (host.startswith("[") and host.endswith("]")) or ":" not in host:
            raise click.BadParameter(f"{value!r}: brackets hold an IPv6 address", param_hint=flag)
        host = host[1:-1]
    elif ":" in host:
        raise click.BadParameter(
            f"{value!r}: write an IPv6 address in brackets, e.g. [::1]:{port}", param_hint=flag
        )
    if any(c.isspace() for c in host):
        raise click.BadParameter(f"{value!r}: the host has white space", param_hint=flag)
    return host or "0.0.0.0", int(port)


def bind_listen(value: str, flag: str = "--listen") -> socket.socket:
    """Bind ``HOST:PORT`` in this process (port 0: one the OS picks, which the caller logs);
    a port that cannot be bound is a ``click.BadParameter`` naming ``flag`` and the reason."""
    host, port = parse_listen(value, flag)
    try:
        return listen.bind(host, port)
    except OSError as exc:
        reason = os.strerror(exc.errno) if exc.errno else str(exc)
        raise click.BadParameter(f"cannot listen on {value!r}: {reason}", param_hint=flag) from None


def check_option(what: str = "a file") -> Callable[[F], F]:
    """``--check``: fail instead of writing when a generated file is stale."""
    return click.option(
        "--check",
        is_flag=True,
        show_envvar=True,
        help=f"Fail instead of writing when {what} is stale.",
    )
