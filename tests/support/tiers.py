"""Test tiers: every test carries exactly one tier marker, ``unit`` tests are held to it, and the
run ends with the time each tier took against its CI budget.

A ``unit`` test starts no process and opens no socket beyond loopback: the guard fails one that
does, naming what it did, so the fast tier stays fast and runs anywhere. The guard covers the
test's fixtures too (it is active from setup to teardown).

The tiers run in the order of :data:`TIERS`, cheapest first: a broken unit test fails the run in
minutes, and the processes the later tiers keep for the session (a real vLLM, llama.cpp) are not
yet running while the unit tier is timed.
"""

from __future__ import annotations

import _posixsubprocess  # type: ignore[import-not-found]
import contextlib
import ipaddress
import multiprocessing.process
import os
import platform
import shutil
import socket
import subprocess
import tempfile
from collections.abc import Callable, Generator
from typing import Any

import pytest

#: tier -> CI budget in minutes (None: not budgeted, e.g. gpu runs only where a GPU is)
TIERS: dict[str, float | None] = {
    "unit": 3,
    "proc": 8,
    "e2e": 6,
    "realengine": 8,
    "gpu": None,
}
_TIER_KEY = pytest.StashKey[str]()
#: the user property that carries a test's tier into its reports (and from xdist's workers)
_TIER_PROPERTY = "tier"


class TierViolation(Exception):
    """A ``unit`` test did what only a ``proc`` or ``e2e`` test may do."""


def tier_of(item: pytest.Item) -> str:
    return item.stash[_TIER_KEY]


@pytest.hookimpl(tryfirst=True)
def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    """Fail the run, before anything runs, naming every test with no tier or more than one."""
    wrong = []
    for item in items:
        tiers = sorted({mark.name for mark in item.iter_markers() if mark.name in TIERS})
        if len(tiers) == 1:
            item.stash[_TIER_KEY] = tiers[0]
            item.user_properties.append((_TIER_PROPERTY, tiers[0]))
        else:
            wrong.append(f"  {item.nodeid}: {', '.join(tiers) or 'no tier'}")
    if wrong:
        raise pytest.UsageError(
            f"every test carries exactly one tier marker ({', '.join(TIERS)}); "
            f"{len(wrong)} do not:\n" + "\n".join(wrong)
        )
    order = list(TIERS)
    items.sort(key=lambda item: order.index(tier_of(item)))  # stable: file order within a tier


def _loopback(address: Any) -> bool:
    if not isinstance(address, tuple):  # a unix socket path
        return True
    try:
        return ipaddress.ip_address(address[0].split("%")[0]).is_loopback
    except ValueError:
        return address[0] == "localhost"


class Guard:
    """Patches process starts and socket connect/bind for the duration of one unit test."""

    def __init__(self) -> None:
        self.violations: list[str] = []
        self._patch = pytest.MonkeyPatch()

    def refuse(self, what: str) -> None:
        message = f"a unit test {what}; mark it proc (or e2e) instead"
        self.violations.append(message)
        raise TierViolation(message)

    def __enter__(self) -> Guard:
        def process(name: str) -> Callable[..., Any]:
            def refused(*args: Any, **kwargs: Any) -> Any:
                self.refuse(f"started a process ({name})")

            return refused

        def popen(popen: subprocess.Popen[Any], args: Any, *rest: Any, **kwargs: Any) -> None:
            shown = " ".join(map(str, args)) if isinstance(args, (list, tuple)) else str(args)
            self.refuse(f"started a process: {shown}")

        patch = self._patch
        patch.setattr(subprocess.Popen, "__init__", popen)
        patch.setattr(_posixsubprocess, "fork_exec", process("fork_exec"))
        for name in ("fork", "forkpty", "posix_spawn", "posix_spawnp", "system"):
            patch.setattr(os, name, process(f"os.{name}"))
        patch.setattr(multiprocessing.process.BaseProcess, "start", process("multiprocessing"))
        for method in ("bind", "connect", "connect_ex"):
            patch.setattr(socket.socket, method, self._socket_call(method))
        return self

    def _socket_call(self, method: str) -> Callable[..., Any]:
        real = getattr(socket.socket, method)

        def checked(sock: socket.socket, address: Any, *args: Any) -> Any:
            if sock.family in (socket.AF_INET, socket.AF_INET6) and not _loopback(address):
                self.refuse(f"called socket.{method}{(address,)!r}, beyond loopback")
            return real(sock, address, *args)

        return checked

    def __exit__(self, *exc: object) -> None:
        self._patch.undo()


def _guarded(item: pytest.Item) -> Generator[None, None, None]:
    if tier_of(item) != "unit":
        yield
        return
    with Guard() as active:
        yield
    if active.violations:  # also when the code under test swallowed the exception
        pytest.fail("\n".join(active.violations), pytrace=False)


@pytest.hookimpl(wrapper=True)
def pytest_runtest_setup(item: pytest.Item) -> Generator[None, None, None]:
    return (yield from _guarded(item))


@pytest.hookimpl(wrapper=True)
def pytest_runtest_call(item: pytest.Item) -> Generator[None, None, None]:
    return (yield from _guarded(item))


@pytest.hookimpl(wrapper=True)
def pytest_runtest_teardown(item: pytest.Item) -> Generator[None, None, None]:
    return (yield from _guarded(item))


def pytest_configure(config: pytest.Config) -> None:
    config.pluginmanager.register(TierClock(), "tier-clock")
    # The standard library runs `uname -p` once per process, the first time anything asks for
    # the processor (the openai client does, for its headers): run it before any test, so the
    # guard never blames whichever unit test happens to ask first.
    platform.processor()
    _build_font_cache(config)


def _build_font_cache(config: pytest.Config) -> None:
    """matplotlib lists the system's fonts with ``fc-list`` the first time it is imported on a
    machine (no font cache yet) and caches them. Without that cache the first unit test that
    draws (snapshot) is refused its ``fc-list``, fails its import, and so does every later one.

    Every run starts from an empty cache of its own, as on a fresh machine, and builds it here
    before any test: a run never depends on what an earlier one left in ``~/.cache``."""
    cache = tempfile.mkdtemp(prefix="inferwatch-mplconfig-")
    config.add_cleanup(lambda: shutil.rmtree(cache, ignore_errors=True))
    os.environ["MPLCONFIGDIR"] = cache
    with contextlib.suppress(ImportError):  # without the snapshot extra nothing draws
        import matplotlib.font_manager  # noqa: F401


class TierClock:
    """The wall-clock time each tier took: the time during which at least one of its tests
    was in a phase (setup, call or teardown), so that tests run side by side on xdist workers
    count once. Reports reach it on the process that prints the summary (under xdist, the
    controller, to which each worker sends its reports)."""

    def __init__(self) -> None:
        self.phases: dict[str, list[tuple[float, float]]] = {}

    def pytest_runtest_logreport(self, report: pytest.TestReport) -> None:
        tier = dict(report.user_properties).get(_TIER_PROPERTY)
        if isinstance(tier, str):
            self.phases.setdefault(tier, []).append((report.start, report.stop))

    def seconds(self, tier: str) -> float:
        total, reached = 0.0, float("-inf")
        for start, stop in sorted(self.phases.get(tier, [])):
            total += max(0.0, stop - max(start, reached))
            reached = max(reached, stop)
        return total

    def pytest_terminal_summary(self, terminalreporter: Any) -> None:
        """Per tier: the time it took, its CI budget (over budget is flagged, never failed)
        and when in the run its first test started and its last one ended."""
        if not self.phases:
            return
        began = min(start for phases in self.phases.values() for start, _ in phases)
        terminalreporter.section("time per tier")
        terminalreporter.write_line(f"{'tier':<11} {'spent':>8} {'budget':>8}   from    to")
        for tier, budget in TIERS.items():
            if tier not in self.phases:
                continue
            minutes = self.seconds(tier) / 60
            shown = f"{budget:g} min" if budget is not None else "-"
            first = min(start for start, _ in self.phases[tier]) - began
            last = max(stop for _, stop in self.phases[tier]) - began
            over = "  OVER BUDGET" if budget is not None and minutes > budget else ""
            terminalreporter.write_line(
                f"{tier:<11} {minutes:>4.1f} min {shown:>8}  {_clock(first)} {_clock(last)}{over}"
            )


def _clock(seconds: float) -> str:
    return f"{int(seconds // 60):>2}:{int(seconds % 60):02d}"
