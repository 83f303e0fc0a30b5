"""The demo's Redis: where every tenancy proxy keeps the tenants' budgets (``shared_state``).

Debian's ``redis-server`` runs on loopback with an append-only file fsynced on every write in
the work directory, so a ``kill -9`` (the drill's ``redis-dies``) loses no booked token and a
restart comes back with the same books; the proxies journal what they charge while it is
down and replay it once it is back, as in production.
"""

from __future__ import annotations

from collections.abc import Mapping
from pathlib import Path
from typing import Any

from inferwatch.demo import processes
from inferwatch.demo.processes import Component

#: how long a proxy's reservation holds unrenewed; short, so that a crashed proxy's holds
#: come back within seconds of demo time
LEASE = "6s"


def binary() -> str:
    """The redis-server binary; a one-line error when it is not installed."""
    return processes.installed("redis-server", "the proxies' shared budgets", "redis")


def component(binary: str, port: int, workdir: Path) -> Component:
    """Redis in the foreground on loopback ``port``; ready once it answers PING."""
    data = workdir / "redis"
    data.mkdir(exist_ok=True)
    argv = [
        binary,
        "--port", str(port),
        "--bind", "127.0.0.1",
        "--dir", str(data),
        "--save", "",
        "--appendonly", "yes",
        "--appendfsync", "always",
        "--daemonize", "no",
    ]  # fmt: skip
    return Component("redis", "", f"redis://127.0.0.1:{port}/0", "", argv)


def proxy_section(port: int, journal: Path) -> Mapping[str, Any]:
    """A proxy's ``shared_state``: the demo's Redis, and its own journal directory."""
    journal.mkdir(parents=True, exist_ok=True)
    return {"url": f"redis://127.0.0.1:{port}/0", "lease": LEASE, "journal_dir": str(journal)}
