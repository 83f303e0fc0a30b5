"""A real Prometheus on loopback, as the end-to-end tests start it: one config file, scraping
every second, its data under the test's folder, on a free port and ready on ``/-/ready``.

The tests differ only in what Prometheus scrapes (``scrape_configs``) and in feature flags.
"""

from __future__ import annotations

import contextlib
import subprocess
from collections.abc import Iterator
from pathlib import Path

from support.ports import launch

#: a scrape a second: a test sees a series a few seconds after its target serves it
GLOBAL = "global: {scrape_interval: 1s, scrape_timeout: 900ms}\n"


def start_prometheus(
    prometheus_bin: str, scrape_configs: str, workdir: Path, *flags: str
) -> tuple[subprocess.Popen[bytes], str]:
    """Prometheus scraping the YAML list ``scrape_configs``; (process, its URL)."""
    config = workdir / "prometheus.yml"
    config.write_text(GLOBAL + "scrape_configs:\n" + scrape_configs)
    return launch(
        lambda port: [
            prometheus_bin,
            f"--config.file={config}",
            f"--storage.tsdb.path={workdir / 'tsdb'}",
            f"--web.listen-address=127.0.0.1:{port}",
            *flags,
        ],
        workdir / "prometheus.log",
        "/-/ready",
        "Prometheus",
    )


@contextlib.contextmanager
def running_prometheus(prometheus_bin: str, scrape_configs: str, workdir: Path) -> Iterator[str]:
    """:func:`start_prometheus` for the length of a ``with``; yields its URL."""
    process, url = start_prometheus(prometheus_bin, scrape_configs, workdir)
    try:
        yield url
    finally:
        process.terminate()
        process.wait(10)
