"""A process's output as it arrives, and the one way a test waits for something in it."""

from __future__ import annotations

import re
import threading
import time
from collections.abc import Callable
from typing import IO, TypeVar

import pytest

from support.wait import wait_for

T = TypeVar("T")


class Output:
    """The lines of a text stream, read by a thread as they come, each with the
    ``time.monotonic()`` it arrived at; ``on_line`` sees every line as it is read."""

    def __init__(self, stream: IO[str], on_line: Callable[[str], None] = lambda line: None):
        self.lines: list[tuple[float, str]] = []
        self.ended = threading.Event()
        self._on_line = on_line
        threading.Thread(target=self._read, args=(stream,), daemon=True).start()

    def _read(self, stream: IO[str]) -> None:
        with stream:
            for line in stream:
                self.lines.append((time.monotonic(), line.rstrip("\n")))
                self._on_line(line)
        self.ended.set()

    @property
    def text(self) -> str:
        return "\n".join(line for _, line in list(self.lines))

    def wait(self, done: Callable[[list[tuple[float, str]]], T], what: str, timeout: float) -> T:
        """The first truthy ``done(lines so far)``; a failure with the output so far when
        ``timeout`` seconds pass or the stream ends first."""

        def check() -> T:
            ended = self.ended.is_set()  # read first: once set, every line is in
            result = done(list(self.lines))  # a copy: the reader keeps appending
            if not result and ended:
                pytest.fail(f"the output ended before {what}:\n{self.text}")
            return result

        try:
            return wait_for(check, what, timeout, interval=0.05)
        except pytest.fail.Exception as failure:
            pytest.fail(f"{failure.msg}:\n{self.text}")

    def wait_text(self, done: Callable[[str], T], what: str, timeout: float) -> T:
        """The first truthy ``done(output so far, one string)``, as :meth:`wait`."""
        return self.wait(lambda lines: done("\n".join(line for _, line in lines)), what, timeout)

    def wait_line(self, pattern: str, timeout: float) -> tuple[float, re.Match[str]]:
        """When the first line matching ``pattern`` arrived, and the match."""

        def first(lines: list[tuple[float, str]]) -> tuple[float, re.Match[str]] | None:
            for at, line in lines:
                if match := re.search(pattern, line):
                    return at, match
            return None

        found = self.wait(first, f"a line matching {pattern!r}", timeout)
        assert found is not None  # wait returns only a truthy result
        return found
