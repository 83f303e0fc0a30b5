"""``inferwatch demo`` as a user runs it, for the end-to-end tests that watch a whole stack."""

from __future__ import annotations

import contextlib
import json
import os
import re
import signal
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest

from inferwatch.alerts import build
from inferwatch.demo import alerting, automation, topology
from support.output import Output

DEMO = [sys.executable, "-P", "-m", "inferwatch", "demo", "--probe-cycle", "3", "--refresh", "5"]
REPLICAS = [r.name for r in topology.REPLICAS]


def pids(output: str) -> list[int]:
    """The processes a demo or drill run announced (``pid N``), for the tests that check it
    leaves none of them running."""
    return [int(pid) for pid in re.findall(r"\bpid (\d+)", output)]


def alive(pid: int) -> bool:
    """Whether process ``pid`` still exists (signal 0 asks without sending anything)."""
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    return True


class Demo:
    """A running ``inferwatch demo``: its lines as they arrive, and the URLs it announced."""

    def __init__(self, process: subprocess.Popen[str]) -> None:
        assert process.stdout is not None
        self.process = process
        self.out = Output(process.stdout)

    def wait_line(self, pattern: str, timeout: float) -> tuple[float, re.Match[str]]:
        """When the first line matching ``pattern`` arrived, and the match."""
        return self.out.wait_line(pattern, timeout)

    @property
    def output(self) -> str:
        return self.out.text

    def running(self) -> bool:
        """True while the demo runs; once it has stopped (a component died, say), fails at
        once with what it printed, rather than letting a wait on its servers run out."""
        if self.process.poll() is not None:
            self.out.ended.wait(10)
            pytest.fail(f"the demo stopped (exit {self.process.returncode}):\n{self.output}")
        return True

    @property
    def up_at(self) -> float:
        return self.wait_line(r"^all \d+ processes answering", 60)[0]

    def url(self, kind: str, name: str = "") -> str:
        """The URL the banner gives the component ``kind`` (of replica or cluster ``name``)."""
        pattern = rf"^  {kind} +{re.escape(name)} *(http://127\.0\.0\.1:\d+) "
        return self.wait_line(pattern, 30)[1][1]

    @property
    def workdir(self) -> Path:
        return Path(self.wait_line(r"^  work dir (\S+) ", 30)[1][1])

    def audit(self) -> list[dict[str, Any]]:
        """The runbook receiver's audit records so far (a line being written is left out)."""
        path = self.workdir / automation.AUDIT_LOG
        text = path.read_text(encoding="utf-8") if path.exists() else ""
        return [json.loads(line) for line in text.splitlines(keepends=True) if line.endswith("\n")]

    def alerts(self) -> list[dict[str, Any]]:
        response = httpx.get(self.url("alertmanager") + "/api/v2/alerts", timeout=5)
        response.raise_for_status()
        alerts: list[dict[str, Any]] = response.json()
        return alerts


@contextlib.contextmanager
def running_demo(folder: Path, *args: str) -> Iterator[Demo]:
    """A demo until the block ends; then stopped with SIGINT (Ctrl-C), and it must exit 0."""
    process = subprocess.Popen(
        [*DEMO, *args],
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
        cwd=folder,
    )
    demo = Demo(process)
    try:
        assert demo.up_at
        yield demo
    finally:
        if process.poll() is None:
            process.send_signal(signal.SIGINT)
        try:
            process.wait(30)
        except subprocess.TimeoutExpired:
            process.kill()
            process.wait()
        demo.out.ended.wait(10)
    assert process.returncode == 0, demo.output
    stopped = demo.wait_line(r"^stopped (\d+) processes", 5)[1]
    assert int(stopped[1]) >= 11, demo.output


def rules_loaded(prometheus_url: str) -> bool:
    """Whether Prometheus evaluates exactly the generated demo rules, every one healthy."""
    response = httpx.get(prometheus_url + "/api/v1/rules", timeout=5)
    response.raise_for_status()
    rules = [rule for group in response.json()["data"]["groups"] for rule in group["rules"]]
    broken = [(r["name"], r.get("lastError")) for r in rules if r.get("health") == "err"]
    assert not broken, broken
    chosen = alerting.demo_config()
    expected = {name for name in build.alert_names(chosen) if not chosen.alert(name).disabled}
    assert {r["name"] for r in rules if r["type"] == "alerting"} == expected
    return True
