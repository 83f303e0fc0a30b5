"""One HTTP request to a server a command does not trust: read to a cap, under a deadline.

httpx's timeouts bound each network read, not a whole answer: a server that sends a byte
every few seconds holds a command for as long as it likes. :func:`fetch` reads an answer in
chunks, checks a :class:`Deadline` (shared by all the requests of one command run) after
each, and stops at ``max_bytes``; whatever goes wrong is a :class:`RequestFailed` with one
line, which the command turns into its own exit code.
"""

from __future__ import annotations

import time
from typing import Any

import httpx

__all__ = ["Deadline", "RequestFailed", "fetch"]

#: the longest wait for one network read, where the deadline leaves more
READ_TIMEOUT_S = 15.0


class RequestFailed(Exception):
    """The server could not be reached or did not answer in time (``too_large`` False), or
    answered more than the cap (True: the server is not what the command expected)."""

    def __init__(self, message: str, too_large: bool = False) -> None:
        super().__init__(message)
        self.too_large = too_large


class Deadline:
    """When a command's requests must be done, ``seconds`` from now."""

    def __init__(self, seconds: float) -> None:
        self.seconds = seconds
        self._at = time.monotonic() + seconds

    def left(self) -> float:
        """Seconds left; raises once there are none."""
        left = self._at - time.monotonic()
        if left <= 0:
            raise RequestFailed(f"no complete answer within the {self.seconds:g} s deadline")
        return left


def fetch(
    client: httpx.Client,
    method: str,
    url: str,
    *,
    what: str,
    deadline: Deadline,
    max_bytes: int,
    **request: Any,
) -> tuple[int, bytes]:
    """(status, body) of one request; raises ``RequestFailed`` naming ``what`` (the server,
    as the command's one line calls it)."""
    try:
        return _fetch(client, method, url, deadline, max_bytes, request)
    except httpx.TimeoutException:
        deadline.left()  # the deadline's own line when it cut the read short
        raise RequestFailed(f"{what} did not answer within {READ_TIMEOUT_S:g} s") from None
    except (httpx.HTTPError, httpx.InvalidURL) as exc:
        raise RequestFailed(f"cannot reach {what}: {exc}") from None
    except RequestFailed as exc:
        raise RequestFailed(f"{what}: {exc}", exc.too_large) from None


def _fetch(
    client: httpx.Client,
    method: str,
    url: str,
    deadline: Deadline,
    max_bytes: int,
    request: dict[str, Any],
) -> tuple[int, bytes]:
    timeout = min(READ_TIMEOUT_S, deadline.left())
    with client.stream(method, url, timeout=timeout, **request) as response:
        body = bytearray()
        for chunk in response.iter_bytes():
            body += chunk
            if len(body) > max_bytes:
                raise RequestFailed(f"answer over {max_bytes} bytes", too_large=True)
            deadline.left()  # a trickle ends at the deadline
        return response.status_code, bytes(body)
