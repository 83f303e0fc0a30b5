"""The one way a test waits for something that happens in another thread or process."""

from __future__ import annotations

import time
from collections.abc import Callable
from typing import TypeVar

import httpx
import pytest

T = TypeVar("T")


def wait_for(
    check: Callable[[], T],
    what: str,
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
    deadline = time.monotonic() + timeout
    last_error: Exception | None = None
    while True:
        try:
            result = check()
        except ignore as exc:
            last_error = exc
        else:
            if result:
                return result
        if time.monotonic() >= deadline:
            detail = f" (last error: {last_error!r})" if last_error else ""
            pytest.fail(f"timed out after {timeout:g} s waiting for {what}{detail}")
        time.sleep(interval)
