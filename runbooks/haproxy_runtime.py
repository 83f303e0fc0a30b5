"""A client for HAProxy's Runtime API (the admin stats socket): one command per connection.

HAProxy answers a single command on a fresh connection and closes it, which keeps the client
stateless and a slow or half-dead HAProxy from wedging a shared session. Every read is bounded
in bytes and time; every failure is a :class:`RuntimeApiError` with one line that says what
went wrong, never a raw socket exception.
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import re
from dataclasses import dataclass

#: bytes read from one answer at most (``show servers state`` of a large fleet fits easily)
MAX_ANSWER = 1 << 20
TIMEOUT_S = 5.0
# HAProxy's answers to a command it could not carry out (first line of the reply)
_FAILURES = (
    "No such",
    "Can't find",
    "Unknown command",
    "Permission denied",
    "Require ",
    "Invalid ",
)
_COMMAND = re.compile(r"^[\x20-\x7e]{1,1024}$")
#: what HAProxy accepts in a proxy or server name; nothing else reaches a command line, so a
#: name cannot smuggle a second command (``;``) in
_NAME = re.compile(r"^[A-Za-z0-9._:-]{1,200}$")
_WEIGHT = re.compile(r"^(\d+) \(initial (\d+)\)$")


def valid_name(name: str) -> bool:
    return _NAME.match(name) is not None


class RuntimeApiError(Exception):
    """The Runtime API could not be reached, or refused or did not understand a command."""


@dataclass(frozen=True)
class ServerState:
    """One server's row of ``show servers state``."""

    backend: str
    name: str
    #: operational state: 0 stopped, 1 starting, 2 running, 3 soft stopping
    op_state: int
    weight: int
    initial_weight: int

    @property
    def up(self) -> bool:
        return self.op_state == 2


class RuntimeApi:
    """The Runtime API at ``address``: a unix socket path, or ``host:port``."""

    def __init__(self, address: str, timeout_s: float = TIMEOUT_S) -> None:
        self.address = address
        self.timeout_s = timeout_s

    async def command(self, line: str) -> str:
        """Send one command; the answer's text. Raises :class:`RuntimeApiError`."""
        if not _COMMAND.match(line):
            raise RuntimeApiError(f"refusing to send a malformed command: {line[:80]!r}")
        try:
            async with asyncio.timeout(self.timeout_s):
                return await self._exchange(line)
        except TimeoutError:
            raise RuntimeApiError(
                f"haproxy runtime API at {self.address}: no answer within {self.timeout_s:g}s"
            ) from None
        except OSError as exc:
            reason = os.strerror(exc.errno) if exc.errno else str(exc) or type(exc).__name__
            raise RuntimeApiError(f"haproxy runtime API at {self.address}: {reason}") from None

    async def _exchange(self, line: str) -> str:
        if self.address.startswith("/"):
            reader, writer = await asyncio.open_unix_connection(self.address)
        else:
            host, _, port = self.address.rpartition(":")
            if not (port.isascii() and port.isdigit()):
                raise RuntimeApiError(f"haproxy runtime API address {self.address!r}: no port")
            reader, writer = await asyncio.open_connection(host.strip("[]"), int(port))
        try:
            writer.write(line.encode("ascii") + b"\n")
            await writer.drain()
            data = await reader.read(MAX_ANSWER + 1)
            chunks = [data]
            total = len(data)
            while data and total <= MAX_ANSWER:
                data = await reader.read(MAX_ANSWER + 1 - total)
                chunks.append(data)
                total += len(data)
        finally:
            writer.close()
            with contextlib.suppress(OSError):
                await writer.wait_closed()
        if total > MAX_ANSWER:
            raise RuntimeApiError(f"haproxy runtime API: answer over {MAX_ANSWER} bytes")
        answer = b"".join(chunks).decode("utf-8", "replace")
        first = answer.strip().split("\n", 1)[0]
        if first.startswith(_FAILURES):
            raise RuntimeApiError(f"haproxy refused {line.split(' ', 1)[0]!r}: {first}")
        return answer

    async def servers(self, backend: str) -> list[ServerState]:
        """The servers of ``backend`` in config order (``show servers state``)."""
        answer = await self.command(f"show servers state {_checked(backend)}")
        rows = [line for line in answer.splitlines() if line and not line.startswith("#")]
        if rows and rows[0].strip().isascii() and rows[0].strip().isdigit():
            rows = rows[1:]  # the format version
        states = []
        for row in rows:
            fields = row.split()
            # be_id be_name srv_id srv_name srv_addr srv_op_state srv_admin_state
            # srv_uweight srv_iweight ...
            numbers = (fields[5], fields[7], fields[8]) if len(fields) >= 9 else ()
            if not numbers or not all(f.isascii() and f.isdigit() for f in numbers):
                raise RuntimeApiError(f"haproxy: unreadable servers state row: {row[:120]!r}")
            states.append(
                ServerState(fields[1], fields[3], int(fields[5]), int(fields[7]), int(fields[8]))
            )
        if not states:
            raise RuntimeApiError(f"haproxy: backend {backend!r} has no servers")
        return states

    async def weight(self, backend: str, server: str) -> tuple[int, int]:
        """(current, initial) weight of one server (``get weight``)."""
        answer = (await self.command(f"get weight {_checked(backend)}/{_checked(server)}")).strip()
        match = _WEIGHT.match(answer)
        if match is None:
            raise RuntimeApiError(f"haproxy: unexpected answer to get weight: {answer[:120]!r}")
        return int(match[1]), int(match[2])

    async def set_weight(self, backend: str, server: str, weight: int) -> None:
        if not 0 <= weight <= 256:
            raise RuntimeApiError(f"weight {weight} is outside 0-256")
        answer = await self.command(
            f"set server {_checked(backend)}/{_checked(server)} weight {weight}"
        )
        if answer.strip():
            raise RuntimeApiError(f"haproxy: set weight {backend}/{server}: {answer.strip()}")


def _checked(name: str) -> str:
    if not valid_name(name):
        raise RuntimeApiError(f"not a HAProxy proxy or server name: {name[:80]!r}")
    return name
