"""Imported, as ``sitecustomize``, by every Python process of a run under Debian's ``faketime``
(tests/test_clock.py, scripts/faketime-pytest): PYTHONPATH names this folder.

Debian 12's libfaketime (0.9.10) cannot run Python 3.11 with every clock faked, nor with only
the wall clock faked, as it is:

* with CLOCK_MONOTONIC faked (its default), a lock's ``acquire(timeout=...)`` (and so every
  ``Event.wait``, ``Thread.join``, ``Queue.get`` with a timeout) waits in ``sem_clockwait`` on
  CLOCK_MONOTONIC, which the library does not intercept: the deadline, taken from the faked
  monotonic clock, lies as far ahead of the real one as the faked date does, and the wait hangs
  (libfaketime issue #390);
* with ``FAKETIME_DONT_FAKE_MONOTONIC=1`` the monotonic clock is real, but the library still
  shifts an absolute CLOCK_MONOTONIC ``clock_nanosleep``, the call ``time.sleep`` makes, by the
  faked offset: a date ahead gives a negative time and ``OSError: [Errno 22]`` (issue #426).

A date-bound test depends on the wall clock only, so a run fakes that alone
(``FAKETIME_DONT_FAKE_MONOTONIC=1``), and here ``time.sleep`` waits with a relative timeout
instead, which the library passes through unchanged. Outside such a run this module only hands
over to the ``sitecustomize`` it hides (Debian's, for one).
"""

from __future__ import annotations

import importlib.machinery
import importlib.util
import os
import select
import sys
import time


def _sleep(seconds: float) -> None:
    """``time.sleep`` on a relative timeout (select retries it on EINTR, PEP 475)."""
    if seconds < 0:
        raise ValueError("sleep length must be non-negative")
    select.select([], [], [], seconds)


def _faked_wall_clock_only() -> bool:
    return "libfaketime" in os.environ.get("LD_PRELOAD", "") and os.environ.get(
        "FAKETIME_DONT_FAKE_MONOTONIC"
    ) == "1"


def _hand_over() -> None:
    """Run the ``sitecustomize`` that this folder, first on the path, hides."""
    here = os.path.dirname(os.path.abspath(__file__))
    rest = [entry for entry in sys.path if os.path.abspath(entry or ".") != here]
    spec = importlib.machinery.PathFinder.find_spec("sitecustomize", rest)
    if spec is None or spec.loader is None:
        return
    module = importlib.util.module_from_spec(spec)
    sys.modules[__name__] = module
    spec.loader.exec_module(module)


if _faked_wall_clock_only():
    time.sleep = _sleep
_hand_over()
