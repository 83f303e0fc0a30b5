"""The one way a test waits for something that happens in another thread, process or task.

``wait_for`` sleeps between checks; ``wait_until`` is its twin for a coroutine, which awaits
between them so that the event loop it shares with what it waits for keeps turning.
"""

from __future__ import annotations

import asyncio
import contextlib
import inspect
import time
from collections.abc import Awaitable, Callable, Iterator
from typing import TypeVar

import httpx
import pytest

T = TypeVar("T")

#: what a wait is for: a phrase, or a function that says it (with the last state seen) when
#: the wait fails
What = str | Callable[[], str]


class _Deadline:
    """When a wait gives up, and the one failure it gives up with; both waits check through
    :meth:`attempt`, so they count errors as "not yet" the same way."""

    def __init__(self, what: What, timeout: float, ignore: tuple[type[Exception], ...]) -> None:
        self.what, self.timeout, self.ignore = what, timeout, ignore
        self.at = time.monotonic() + timeout
        self.last_error: Exception | None = None

    @contextlib.contextmanager
    def attempt(self) -> Iterator[None]:
        """One check: an error in ``ignore`` means "not yet", and is kept for the failure."""
        try:
            yield
        except self.ignore as exc:
            self.last_error = exc

    def fail_if_passed(self) -> None:
        if time.monotonic() < self.at:
            return
        try:
            what = self.what if isinstance(self.what, str) else self.what()
        except Exception as exc:  # the description reads a server that may be gone too
            what = f"what it waited for (describing it failed: {exc!r})"
        detail = f" (last error: {self.last_error!r})" if self.last_error else ""
        pytest.fail(f"timed out after {self.timeout:g} s waiting for {what}{detail}")


def wait_for(
    check: Callable[[], T],
    what: What,
    timeout: float = 30.0,
    *,
    interval: float = 0.1,
    ignore: tuple[type[Exception], ...] = (httpx.HTTPError,),
) -> T:
    """Call ``check`` until it returns something truthy and return that; fail naming ``what``
    (and the last ignored error) once ``timeout`` seconds have passed.

    Every wait has a deadline so that a broken test fails instead of hanging; errors in
    ``ignore`` (by default an HTTP call to a server still starting) count as "not yet".
    """
    deadline = _Deadline(what, timeout, ignore)
    while True:
        with deadline.attempt():
            result = check()
            if result:
                return result
        deadline.fail_if_passed()
        time.sleep(interval)


async def wait_until(
    check: Callable[[], T | Awaitable[T]],
    what: What,
    timeout: float = 30.0,
    *,
    interval: float = 0.1,
    ignore: tuple[type[Exception], ...] = (httpx.HTTPError,),
) -> T:
    """``wait_for`` inside a coroutine: ``check`` may be a coroutine function too, and the
    pause between checks is an ``asyncio.sleep``, never a blocking one."""
    deadline = _Deadline(what, timeout, ignore)
    while True:
        with deadline.attempt():
            outcome = check()
            result = await outcome if inspect.isawaitable(outcome) else outcome
            if result:
                return result
        deadline.fail_if_passed()
        await asyncio.sleep(interval)
