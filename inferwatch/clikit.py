"""What the subcommands' command-line code shares: option groups and ``HOST:PORT`` parsing.

Domain CLIs (sidecar, proxy, probes, runbooks, generate, ...) import this and never the
top-level ``inferwatch.cli``, which only finds the subcommands.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any, TypeVar

import click

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


def check_option(what: str = "a file") -> Callable[[F], F]:
    """``--check``: fail instead of writing when a generated file is stale."""
    return click.option(
        "--check",
        is_flag=True,
        show_envvar=True,
        help=f"Fail instead of writing when {what} is stale.",
    )
