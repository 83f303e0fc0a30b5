"""The retry helper for external servers that take their port only on their command line."""

from __future__ import annotations

import errno
import socket
from collections.abc import Iterator

import pytest

from support.ports import PortTaken, start_on_free_port

pytestmark = pytest.mark.unit


def bind_or_taken(port: int) -> socket.socket:
    """Stands for a server: binds ``port``, and reports a taken port as a server's log would."""
    sock = socket.socket()
    try:
        sock.bind(("127.0.0.1", port))
    except OSError as exc:
        sock.close()
        if exc.errno == errno.EADDRINUSE:
            raise PortTaken(str(port)) from None
        raise
    return sock


@pytest.fixture
def taken() -> Iterator[int]:
    with socket.socket() as holder:
        holder.bind(("127.0.0.1", 0))
        yield int(holder.getsockname()[1])


def test_a_taken_port_is_retried_on_another(taken: int) -> None:
    picks = iter([taken, 0])
    with start_on_free_port(bind_or_taken, pick=lambda: next(picks)) as sock:
        assert sock.getsockname()[1] not in (0, taken)


def test_it_gives_up_after_its_bound_naming_the_ports_tried(taken: int) -> None:
    calls: list[int] = []

    def start(port: int) -> socket.socket:
        calls.append(port)
        return bind_or_taken(port)

    with pytest.raises(
        PortTaken, match=rf"taken before it was bound: \[{taken}, {taken}, {taken}\]"
    ):
        start_on_free_port(start, attempts=3, pick=lambda: taken)
    assert calls == [taken] * 3
