"""VictoriaMetrics on loopback, as the scale-out tests start it: the single-node server,
vmagents sharing a scrape config, vmalert, each a real Debian binary on a port the test
reserved (``support.ports.fixed_run``: below the range other tests' port-0 binds use), with
the command lines the demo's ``--tsdb victoriametrics`` builds (:mod:`inferwatch.demo.victoria`).

Each process is ready when it answers ``/health``; :meth:`Server.kill` is ``kill -9``, the
way a node dies under a vmagent.
"""

from __future__ import annotations

import subprocess
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import httpx

from inferwatch.config import Duration
from inferwatch.demo import victoria
from support.wait import wait_for

#: the scrape and evaluation interval of every test stack, the demo's
INTERVAL_S = Duration.parse(victoria.INTERVAL).seconds


@dataclass
class Server:
    """One process on ``port``, logging to ``log``, ready when ``ready`` answers 200."""

    argv: Sequence[str]
    port: int
    log: Path
    ready: str = "/health"
    process: subprocess.Popen[bytes] | None = field(default=None, repr=False)

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    def start(self, timeout: float = 30.0) -> Server:
        with self.log.open("w") as out:
            self.process = subprocess.Popen(self.argv, stdout=out, stderr=subprocess.STDOUT)
        process = self.process

        def healthy() -> bool:
            if process.poll() is not None:
                text = self.log.read_text(encoding="utf-8", errors="replace")
                raise AssertionError(f"{self.argv[0]} exited: {text[-2000:]}")
            return httpx.get(self.url + self.ready, timeout=2).status_code == 200

        wait_for(healthy, f"{Path(self.argv[0]).name} on port {self.port}", timeout)
        return self

    def kill(self) -> None:
        if self.process is not None and self.process.poll() is None:
            self.process.kill()
            self.process.wait(10)

    def stop(self) -> None:
        if self.process is not None and self.process.poll() is None:
            self.process.terminate()
            try:
                self.process.wait(15)
            except subprocess.TimeoutExpired:
                self.kill()


def victoria_metrics(binary: str, port: int, workdir: Path, vmalert_port: int = 0) -> Server:
    """The demo's single node (:mod:`inferwatch.demo.victoria`), replicas' samples
    deduplicated per scrape interval (what vmagent's replication needs)."""
    argv = victoria.victoria_metrics_argv(binary, port, workdir / "data", vmalert_port,
                                          f"-dedup.minScrapeInterval={INTERVAL_S:g}s")  # fmt: skip
    return Server(argv, port, workdir / "victoria-metrics.log")


def vmagent(
    binary: str, port: int, workdir: Path, config: Path, storage: str, member: int,
    replication: int, *flags: str,
) -> Server:  # fmt: skip
    """Member ``member`` of two vmagents sharing ``config``'s targets, each target scraped by
    ``replication`` of them, remote-writing to ``storage``."""
    queue = workdir / f"vmagent-{member}-queue"
    argv = victoria.vmagent_argv(binary, port, config, storage, queue,
                                 "-promscrape.cluster.membersCount=2",
                                 f"-promscrape.cluster.memberNum={member}",
                                 f"-promscrape.cluster.replicationFactor={replication}",
                                 *flags)  # fmt: skip
    return Server(argv, port, workdir / f"vmagent-{member}.log")


def vmalert(
    binary: str, port: int, workdir: Path, rules: Sequence[Path], storage: str, notifier: str
) -> Server:
    """The demo's vmalert: ``rules`` evaluated against ``storage``, alerts to ``notifier``."""
    argv = victoria.vmalert_argv(binary, port, rules, storage, notifier)
    return Server(argv, port, workdir / "vmalert.log")


def query(http: httpx.Client, storage: str, expr: str) -> list[dict[str, Any]]:
    """An instant query through the Prometheus-compatible API; its result list."""
    response = http.get(f"{storage}/api/v1/query", params={"query": expr})
    assert response.status_code == 200, (expr, response.text)
    result: list[dict[str, Any]] = response.json()["data"]["result"]
    return result
