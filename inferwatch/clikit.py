"""What the subcommands' command-line code shares: option groups, ``HOST:PORT`` parsing,
listening sockets, bearer-token files, :class:`CommandError` (the one way a command fails)
and the check of the optional extras a command needs.

Domain CLIs (sidecar, proxy, probes, runbooks, generate, ...) import this and never the
top-level ``inferwatch.cli``, which only finds the subcommands.
"""

from __future__ import annotations

import errno
import importlib.util
import math
import os
import socket
from collections.abc import Callable
from pathlib import Path
from typing import Any, ClassVar, TypeVar

import click

from inferwatch.auth import TokenError, load_token
from inferwatch.exitcodes import ExitCode

__all__ = [
    "COMMAND_EXTRAS",
    "EXTRAS",
    "BadInput",
    "CannotRun",
    "CommandError",
    "F",
    "Failed",
    "FiniteFloat",
    "MissingExtra",
    "PortTaken",
    "bind",
    "cannot_write",
    "check_option",
    "config_option",
    "downward_api_option",
    "json_option",
    "listen_error",
    "listen_option",
    "missing_extra",
    "missing_extras",
    "option_group",
    "out_file_option",
    "parse_listen",
    "prometheus_option",
    "require_extra",
    "required_token",
    "token_file_option",
    "token_from",
]

F = TypeVar("F", bound=Callable[..., Any])


class CommandError(click.ClickException):
    """A failure a user can cause: one ``Error: ...`` line, and a status from the table.
    Commands raise one of its subclasses, each fixed to its code, never a bare number."""

    exit_code: ClassVar[int] = ExitCode.FAILED


class Failed(CommandError):
    exit_code = ExitCode.FAILED


class BadInput(CommandError):
    exit_code = ExitCode.BAD_INPUT


class CannotRun(CommandError):
    exit_code = ExitCode.CANNOT_RUN


class PortTaken(CommandError):
    exit_code = ExitCode.PORT_TAKEN


class MissingExtra(CannotRun):
    """An optional extra that is not installed: the host must change, not the input."""


#: extra (``pip install 'inferwatch[NAME]'``) -> the modules it installs. The core install
#: carries what the sidecar, proxy, probes, receiver and generators need.
EXTRAS: dict[str, tuple[str, ...]] = {
    "snapshot": ("matplotlib",),
    "console": ("rich",),
    "kubernetes": ("kubernetes",),
    "tokenizer": ("tokenizers",),
    "redis": ("redis",),
    "parquet": ("pyarrow",),
}

#: command -> the extras it always needs (an extra one setting needs is checked where the
#: setting is read)
COMMAND_EXTRAS: dict[str, tuple[str, ...]] = {
    "snapshot": ("snapshot",),
    # the demo's proxies keep their budgets in Redis (shared_state)
    "demo": ("console", "redis"),
    "canary": ("console",),
    # the drill's GPU reset request goes through the Kubernetes client to a fake API server
    "drill": ("console", "kubernetes", "redis"),
}


def missing_extras(command: str) -> list[str]:
    """The extras ``command`` needs that are not installed, looked up without importing."""
    return [
        extra
        for extra in COMMAND_EXTRAS.get(command, ())
        if any(importlib.util.find_spec(module) is None for module in EXTRAS[extra])
    ]


def require_extra(command: str) -> None:
    """Fail with one line naming the extra ``command`` lacks, before it starts anything."""
    missing = ",".join(missing_extras(command))
    if missing:
        raise missing_extra(f"inferwatch {command}", missing)


def missing_extra(what: str, extras: str) -> MissingExtra:
    """The one line for ``what`` (a command, or a setting of one) lacking ``extras``."""
    return MissingExtra(
        f"{what} needs inferwatch[{extras}], which is not installed: "
        f"pip install 'inferwatch[{extras}]'"
    )


class FiniteFloat(click.FloatRange):
    """A float option within bounds that refuses ``nan`` and ``inf``: click's FloatRange
    lets ``nan`` through every bound (each comparison with it is false), and a threshold of
    ``nan`` silently disables the check it sets."""

    name = "finite float"

    def convert(self, value: Any, param: click.Parameter | None, ctx: click.Context | None) -> Any:
        number = super().convert(value, param, ctx)
        if not math.isfinite(number):
            self.fail(f"{value!r} is not a finite number", param, ctx)
        return number


def cannot_write(exc: OSError) -> CannotRun:
    return CannotRun(f"cannot write {exc.filename or 'a file'}: {exc.strerror or exc}")


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


def listen_option(default: str, why: str = "") -> Callable[[F], F]:
    """``--listen``: the ``HOST:PORT`` a server binds (see :func:`parse_listen`); ``why``:
    the reason for its default, said in the help."""
    return click.option(
        "--listen",
        default=default,
        show_envvar=True,
        help="HOST:PORT to serve on." + (f" {why}" if why else ""),
    )


def prometheus_option(required: bool = True, why: str = "") -> Callable[[F], F]:
    """``--prometheus``: the base URL of the Prometheus query API a command reads (Prometheus,
    or VictoriaMetrics's compatible API); ``why`` ends the help of an optional one."""
    return click.option(
        "--prometheus",
        required=required,
        show_envvar=True,
        help="Prometheus base URL (http://host:9090), or any server of its query API"
        + (f": {why}." if why else "."),
    )


def token_file_option(flag: str, help: str) -> Callable[[F], F]:
    """A file option holding a bearer token (a mounted Secret): tokens are never flag values,
    which ``ps`` shows (:mod:`inferwatch.auth`)."""
    return click.option(
        flag,
        type=click.Path(dir_okay=False, path_type=Path),
        default=None,
        show_envvar=True,
        help=help,
    )


def token_from(value: str | None, path: Path | None, flag: str, *, what: str) -> str | None:
    """The token of :func:`inferwatch.auth.load_token` (``value`` from the environment, or
    the file of ``flag``); a source it refuses is a usage error naming ``flag``."""
    try:
        return load_token(value, path, what=what)
    except TokenError as exc:
        raise click.BadParameter(str(exc), param_hint=flag) from None


def required_token(
    value: str | None, path: Path | None, flag: str, *, what: str, missing: str
) -> str:
    """:func:`token_from` for a command that cannot start without a token: none is the
    usage error ``missing``."""
    token = token_from(value, path, flag, what=what)
    if token is None:
        raise click.UsageError(missing)
    return token


def _twin(command: str, flag: str) -> str:
    """The environment twin of ``flag`` of ``command`` (``runbooks serve``, ``--config``:
    ``INFERWATCH_RUNBOOKS_SERVE_CONFIG``), for an option whose parameter is not named as its
    flag: click would name the twin after the parameter."""
    words = ("INFERWATCH", *command.split(), flag.removeprefix("--"))
    return "_".join(words).upper().replace("-", "_")


def json_option(command: str, help: str = "Print JSON instead of a table.") -> Callable[[F], F]:
    """``--json`` of ``command``: its result as JSON (the parameter is ``as_json``, leaving the
    name ``json`` to the module that writes it)."""
    return click.option(
        "--json",
        "as_json",
        is_flag=True,
        envvar=_twin(command, "--json"),
        show_envvar=True,
        help=help,
    )


def config_option(
    command: str, help: str, *, show_default: str | None = None, path_type: type[Any] = Path
) -> Callable[[F], F]:
    """``--config`` of ``command``: the YAML file it reads (the parameter is ``config_path``);
    ``path_type`` ``str`` keeps the path as given, for a loader that names it so."""
    return click.option(
        "--config",
        "config_path",
        envvar=_twin(command, "--config"),
        type=click.Path(dir_okay=False, path_type=path_type),
        default=None,
        show_envvar=True,
        show_default=show_default,
        help=help,
    )


def out_file_option(help: str) -> Callable[[F], F]:
    """``--out``: the one file a command writes; ``help`` says where it goes without one."""
    return click.option(
        "--out",
        type=click.Path(dir_okay=False, path_type=Path),
        default=None,
        show_envvar=True,
        help=help,
    )


def downward_api_option(
    flag: str, variable: str, help: str, *, say_where: bool = False
) -> Callable[[F], F]:
    """An option that defaults to the pod's ``variable``, read when the command runs (the
    Kubernetes downward API sets it); ``say_where``: the help names the downward API."""
    return click.option(
        flag,
        default=lambda: os.environ.get(variable, ""),
        show_envvar=True,
        help=help,
        show_default=f"${variable}" + (" (Kubernetes downward API)" if say_where else ""),
    )


def check_option(what: str = "a file") -> Callable[[F], F]:
    """``--check``: fail instead of writing when a generated file is stale."""
    return click.option(
        "--check",
        is_flag=True,
        show_envvar=True,
        help=f"Fail instead of writing when {what} is stale.",
    )


def listen_error(exc: OSError, where: str) -> CommandError:
    """A bind that failed: PORT_TAKEN when another process holds the address, else
    CANNOT_RUN (an address this host lacks, a privileged port)."""
    reason = os.strerror(exc.errno) if exc.errno else str(exc)
    error = PortTaken if exc.errno == errno.EADDRINUSE else CannotRun
    return error(f"cannot listen on {where}: {reason}")


def bind(address: tuple[str, int], flag: str = "--listen") -> socket.socket:
    """A listening TCP socket on ``address`` (port 0: a free one), bound before the server
    starts so that a taken port is one line and the log can name the real port."""
    host, port = address
    try:
        family = socket.AF_INET6 if ":" in host else socket.AF_INET
        return socket.create_server((host, port), family=family)
    except OSError as exc:
        shown = f"[{host}]:{port}" if ":" in host else f"{host}:{port}"
        raise listen_error(exc, f"{shown} ({flag})") from None
