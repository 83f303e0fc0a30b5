"""What every client of Prometheus's HTTP API in inferwatch shares (``inferwatch canary``,
``inferwatch snapshot``): the check of the ``--prometheus`` URL, and the one deadline all
queries of a run share (``--timeout``).

Both commands query a Prometheus they do not trust, so they refuse the same URLs with the same
line and bound their queries the same way; the wording lives here once.
"""

from __future__ import annotations

from collections.abc import Callable

import click
import httpx

from inferwatch.clikit import F, FiniteFloat

__all__ = ["DEADLINE_S", "checked_url", "timeout_option"]

#: seconds all queries of one run share, by default (``--timeout``)
DEADLINE_S = 120.0


def checked_url(url: str) -> str:
    """``--prometheus`` as an http(s) URL with a host and a port that is one; anything else
    is a ``ValueError`` whose message is the one line to show."""
    try:
        parsed = httpx.URL(url)
    except httpx.InvalidURL as exc:
        raise ValueError(f"--prometheus {url!r}: not a URL ({exc})") from None
    if parsed.scheme not in ("http", "https") or not parsed.host:
        raise ValueError(f"--prometheus {url!r}: expected an http(s) URL with a host")
    if parsed.port is not None and not 0 < parsed.port < 65536:
        raise ValueError(f"--prometheus {url!r}: port {parsed.port} is not a port")
    return url


def timeout_option(help: str) -> Callable[[F], F]:
    """``--timeout``: the seconds all queries to Prometheus may take together."""
    return click.option(
        "--timeout",
        type=FiniteFloat(1, 3600),
        default=DEADLINE_S,
        show_default=True,
        show_envvar=True,
        help=help,
    )
