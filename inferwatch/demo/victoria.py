"""VictoriaMetrics in place of Prometheus (``inferwatch demo --tsdb victoriametrics``): the
single-node server storing every cluster's series, one vmagent per cluster scraping it and
remote-writing there, and vmalert evaluating the generated rules against it.

The command lines are the ones docs/scaling.md shows, with the flags Debian's 1.79 takes;
the tests start the same processes from these builders. Each answers ``/health`` once up.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

from inferwatch.demo import processes, topology
from inferwatch.demo.processes import Component

#: the demo's scrape and evaluation interval, as its Prometheus's
INTERVAL = topology.INTERVAL
READY = "/health"


@dataclass(frozen=True)
class Binaries:
    victoria_metrics: str
    vmagent: str
    vmalert: str


def binaries() -> Binaries:
    """The three binaries; a one-line error naming the first one not installed."""
    purpose = "the demo's --tsdb victoriametrics"
    return Binaries(
        *(processes.installed(name, purpose, "victoriametrics")
          for name in ("victoria-metrics", "vmagent", "vmalert"))
    )  # fmt: skip


def victoria_metrics_argv(
    binary: str, port: int, data: Path, vmalert_port: int = 0, *flags: str
) -> list[str]:
    """The single-node server, its data in ``data``: what lands is queryable a second later
    (the default hides the last 30 s from queries), and with ``vmalert_port`` its
    ``/api/v1/rules`` is that vmalert's (``inferwatch snapshot`` lists recording rules there)."""
    argv = [binary, f"-storageDataPath={data}", f"-httpListenAddr=127.0.0.1:{port}",
            "-search.latencyOffset=1s", "-loggerLevel=WARN", *flags]  # fmt: skip
    if vmalert_port:
        argv.append(f"-vmalert.proxyURL={topology.url(vmalert_port)}")
    return argv


def vmagent_argv(
    binary: str, port: int, config: Path, storage: str, queue: Path, *flags: str
) -> list[str]:
    """A vmagent scraping ``config``'s targets and remote-writing to ``storage``, buffering in
    ``queue`` while it is unreachable; discovery files are read again every interval (a
    started spare's targets), where the default waits 5 minutes."""
    return [binary, f"-promscrape.config={config}", f"-httpListenAddr=127.0.0.1:{port}",
            f"-remoteWrite.url={storage}/api/v1/write", f"-remoteWrite.tmpDataPath={queue}",
            "-remoteWrite.flushInterval=1s", f"-promscrape.fileSDCheckInterval={INTERVAL}",
            "-loggerLevel=WARN", *flags]  # fmt: skip


def vmalert_argv(
    binary: str, port: int, rules: Sequence[Path], storage: str, notifier: str, *flags: str
) -> list[str]:
    """vmalert evaluating ``rules`` against ``storage``, writing recording rules and alert
    state back to it, restoring that state from it on a restart (``for:`` timers go on), and
    sending alerts to the Alertmanager at ``notifier``."""
    return [binary, *(f"-rule={path}" for path in rules), f"-datasource.url={storage}",
            f"-remoteWrite.url={storage}", f"-remoteRead.url={storage}",
            f"-notifier.url={notifier}", f"-evaluationInterval={INTERVAL}",
            f"-httpListenAddr=127.0.0.1:{port}", "-remoteWrite.flushInterval=1s",
            "-loggerLevel=WARN", *flags]  # fmt: skip


def storage(binary: str, port: int, workdir: Path, vmalert_port: int) -> Component:
    """The demo's single node, its ``/api/v1/rules`` answered by the vmalert on ``vmalert_port``."""
    argv = victoria_metrics_argv(binary, port, workdir / "victoria-metrics-data", vmalert_port)
    return Component("victoria", "", topology.url(port), READY, argv)


def agent(
    binary: str, cluster: str, port: int, workdir: Path, config: Path, storage_url: str
) -> Component:
    """The vmagent of ``cluster``, scraping what ``config`` lists into ``storage_url``."""
    queue = workdir / f"vmagent-{cluster}-queue"
    argv = vmagent_argv(binary, port, config, storage_url, queue)
    return Component("vmagent", cluster, topology.url(port), READY, argv)


def rule_engine(
    binary: str, port: int, rules: Sequence[Path], storage_url: str, notifier: str
) -> Component:
    argv = vmalert_argv(binary, port, rules, storage_url, notifier)
    return Component("vmalert", "", topology.url(port), READY, argv)
