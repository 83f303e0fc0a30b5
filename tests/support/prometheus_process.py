"""A real Prometheus on loopback, as the end-to-end tests start it: one config file, scraping
every second, its data under the test's folder, on a free port and ready on ``/-/ready``.

The tests differ only in what Prometheus scrapes (``scrape_configs``) and in feature flags.
"""

from __future__ import annotations

import contextlib
import json
import subprocess
from collections.abc import Callable, Sequence
from pathlib import Path

from support.ports import launch, running

#: a scrape and a rule evaluation a second: a test sees a series (or a recorded one) a few
#: seconds after its target serves it
GLOBAL = "global: {scrape_interval: 1s, scrape_timeout: 900ms, evaluation_interval: 1s}\n"


def start_prometheus(
    prometheus_bin: str, scrape_configs: str, workdir: Path, *flags: str
) -> tuple[subprocess.Popen[bytes], str]:
    """Prometheus scraping the YAML list ``scrape_configs``; (process, its URL)."""
    return launch(*_launch_args(prometheus_bin, scrape_configs, workdir, flags))


def _launch_args(
    prometheus_bin: str,
    scrape_configs: str,
    workdir: Path,
    flags: tuple[str, ...],
    rule_files: Sequence[Path] = (),
) -> tuple[Callable[[int], list[str]], Path, str, str]:
    config = workdir / "prometheus.yml"
    rules = f"rule_files: {json.dumps([str(path) for path in rule_files])}\n"
    config.write_text(GLOBAL + rules + "scrape_configs:\n" + scrape_configs)

    def argv(port: int) -> list[str]:
        return [
            prometheus_bin,
            f"--config.file={config}",
            f"--storage.tsdb.path={workdir / 'tsdb'}",
            f"--web.listen-address=127.0.0.1:{port}",
            *flags,
        ]

    return argv, workdir / "prometheus.log", "/-/ready", "Prometheus"


def running_prometheus(
    prometheus_bin: str, scrape_configs: str, workdir: Path, rule_files: Sequence[Path] = ()
) -> contextlib.AbstractContextManager[str]:
    """:func:`start_prometheus` for the length of a ``with``, evaluating ``rule_files`` (the
    generated rules, say); yields its URL."""
    return running(*_launch_args(prometheus_bin, scrape_configs, workdir, (), rule_files))
