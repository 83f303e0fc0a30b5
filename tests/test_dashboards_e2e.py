"""No dead panels: every panel's query returns data from a real Prometheus scraping the demo.

The demo runs its replicas, sidecars and proxies (``inferwatch demo --no-prometheus``); the
test runs its own Prometheus on the demo's ports with the generated rule files loaded (the
demo's scrape config, plus a ``cluster`` target label as a multi-cluster setup adds), and a
scenario that makes the fault series exist: a contained (restart-app, non-fatal) XID on the
replica the variables pick, and some degenerate answers. Each variable is set to a real
value, read with the variable's own ``label_values`` query; a panel is dead when none of
its queries returns one finite sample. Every query of a panel has data too, unless its panel's
description says why it is empty by design (``EMPTY_BY_DESIGN``). The snapshot command is
checked against the same stack.
"""

from __future__ import annotations

import re
import signal
import subprocess
import sys
from collections.abc import Iterator, Mapping
from contextlib import ExitStack, suppress
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import httpx
import pytest
import yaml

from inferwatch.alerts import config as alert_config
from inferwatch.dashboards import queries, writer
from inferwatch.dashboards.snapshot import DRAWN_OVER_TIME
from inferwatch.demo import topology
from support import panels
from support.ports import fixed_run
from support.wait import wait_for

pytestmark = pytest.mark.e2e

DEMO = [sys.executable, "-P", "-m", "inferwatch", "demo"]
INFERWATCH = [sys.executable, "-P", "-m", "inferwatch"]
CLUSTER = "e2e"
SCENARIO = f"name: dashboards-e2e\nsteps:\n{panels.FAULTS_STEP}"
#: the queries that may be empty in this stack, each with the words of its panel's description
#: that say why; any other query without data reads a series the demo does not serve or
#: scrape (a defect of the demo, the simulator or the query, not of the stack's age)
EMPTY_BY_DESIGN = {
    ("fleet", 18, "A"): "Empty (No alert firing) while no alert fires",
    ("gpu", 1, "A"): "Empty until a GPU reports an XID",
    ("gpu", 7, "B"): "No reason line while the GPU runs at full clocks",
    ("gpu", 14, "B"): "dcgm-exporter lists no processes",
    ("cost", 3, "A"): "Only the admitted line until a proxy refuses",
    ("latency", 19, "B"): "No shared line without a connector",
}
SCRAPE_S = panels.SCRAPE_S
DATA_DEADLINE_S = 75.0
DEMO_START_S = 180.0


def prometheus_config(ports: topology.Ports) -> str:
    document = yaml.safe_load(topology.prometheus_config(ports, topology.generated_rule_files()))
    document["global"] = {"scrape_interval": f"{SCRAPE_S:g}s",
                          "evaluation_interval": f"{SCRAPE_S:g}s"}  # fmt: skip
    for job in document["scrape_configs"]:
        for group in job["static_configs"]:
            group["labels"]["cluster"] = CLUSTER
    return yaml.safe_dump(document)


@dataclass
class Stack(panels.Source):
    """The demo and the test's Prometheus (``url``), whose panels are read."""

    demo: subprocess.Popen[str]
    demo_log: Path

    @property
    def prometheus(self) -> str:
        return self.url

    def check_demo(self) -> None:
        """Fail at once, with the demo's last line, when the demo has stopped."""
        if self.demo.poll() is not None:
            lines = self.demo_log.read_text().strip().splitlines() or ["no output"]
            pytest.fail(f"the demo stopped (exit {self.demo.returncode}): {lines[-1]}")

    def wait_demo_up(self, timeout: float) -> None:
        """Until the demo says every process answers: the panels' deadline starts then, not
        while a busy machine is still starting its two dozen processes."""

        def up() -> bool:
            self.check_demo()
            return bool(re.search(r"^all \d+ processes answering", self.demo_log.read_text(), re.M))

        wait_for(up, "the demo's processes answering", timeout, interval=0.5)

    def targets_down(self) -> list[str]:
        """The scrape targets Prometheus last failed to scrape, with why."""
        response = self.http.get(f"{self.url}/api/v1/targets", params={"state": "active"})
        targets = response.json()["data"]["activeTargets"]
        return [f"{t['scrapeUrl']}: {t['lastError']}" for t in targets if t["health"] != "up"]


def wait_ready(url: str, timeout: float) -> None:
    wait_for(lambda: httpx.get(url, timeout=1).status_code == 200, url, timeout, interval=0.2)


@pytest.fixture(scope="module")
def stack(tmp_path_factory: pytest.TempPathFactory, prometheus_bin: str) -> Iterator[Stack]:
    work = tmp_path_factory.mktemp("dashboards-e2e")
    base = fixed_run(topology.Ports.count(topology.REPLICAS))
    ports = topology.Ports.assign(base)
    (work / "scenario.yaml").write_text(SCENARIO)
    (work / "prometheus.yml").write_text(prometheus_config(ports))
    with ExitStack() as cleanup:
        demo_log = cleanup.enter_context((work / "demo.log").open("w"))
        demo = subprocess.Popen(
            [*DEMO, "--no-prometheus", "--base-port", str(base), "--speed", "50", "--rate", "5",
             "--probe-cycle", "3", "--scenario", str(work / "scenario.yaml"),
             "--duration", "600"],
            stdout=demo_log, stderr=subprocess.STDOUT, cwd=work, text=True,
        )  # fmt: skip
        cleanup.callback(_stop, demo)
        prom = subprocess.Popen(
            [prometheus_bin, f"--config.file={work / 'prometheus.yml'}",
             f"--storage.tsdb.path={work / 'data'}", "--log.level=warn",
             f"--web.listen-address=127.0.0.1:{ports.prometheus}"],
            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
        )  # fmt: skip
        cleanup.callback(_stop, prom)
        url = topology.url(ports.prometheus)
        wait_ready(f"{url}/-/ready", 30)
        with httpx.Client(timeout=10) as http:
            up = Stack(url, http, demo, work / "demo.log")
            up.wait_demo_up(DEMO_START_S)
            yield up


def _stop(process: subprocess.Popen[Any]) -> None:
    process.send_signal(signal.SIGTERM)
    try:
        process.wait(timeout=20)
    except subprocess.TimeoutExpired:
        process.kill()
        process.wait()


def empty_queries(stack: Stack, boards: Mapping[str, Mapping[str, Any]]) -> list[str]:
    """Every query (not only one per panel) that returns no finite sample, as
    ``board panel refId``, with each board's variables chosen as for the panels."""
    empty = []
    for name, dashboard in boards.items():
        chosen = panels.choose_values(stack, dashboard, panels.preferred(name))
        assert chosen is not None, f"{name}: a variable has no value"
        values = panels.grafana_values(chosen)
        for target in queries.targets(dashboard):
            if not panels.has_data(stack.query(queries.substitute(target.expr, values))):
                empty.append((name, target.panel_id, target.ref_id))
    return [f"{board} {pid} {ref}" for board, pid, ref in empty
            if (board, pid, ref) not in EMPTY_BY_DESIGN]  # fmt: skip


@pytest.fixture(scope="module")
def dead_after_waiting(stack: Stack) -> list[str]:
    """The dead panels once every panel has data or the deadline passed."""
    boards = writer.dashboards(alert_config.load())
    dead: list[str] = []

    def all_alive() -> bool:
        stack.check_demo()
        dead[:] = panels.dead_panels(stack, boards)
        return not dead

    with suppress(pytest.fail.Exception):  # the test names the panels still dead
        wait_for(all_alive, "data on every panel", DATA_DEADLINE_S, interval=3)
    if dead:
        dead += [f"target down: {line}" for line in stack.targets_down()]
    return dead


def test_every_panel_returns_data_with_each_variable_set(dead_after_waiting: list[str]) -> None:
    assert dead_after_waiting == [], "dead panels: " + "; ".join(dead_after_waiting)


def test_every_query_returns_data_unless_its_panel_says_why_not(
    stack: Stack, dead_after_waiting: list[str]
) -> None:
    """Each line of a panel, not only one of them: the GPU board's limit, threshold and
    NVLink lines read fields only the simulator's GPU page can serve, beside lines that do
    have data. A line that comes later (a version's baseline after its first probe cycles)
    has until the panels' deadline."""
    boards = writer.dashboards(alert_config.load())
    for (board, pid, _), words in EMPTY_BY_DESIGN.items():
        panel = next(p for p in queries.panels(boards[board]) if p["id"] == pid)
        assert words in panel["description"], (board, pid)
    empty: list[str] = []

    def none_empty() -> bool:
        stack.check_demo()
        empty[:] = empty_queries(stack, boards)
        return not empty

    with suppress(pytest.fail.Exception):  # the assertion names the queries still empty
        wait_for(none_empty, "data on every query", DATA_DEADLINE_S, interval=3)
    assert empty == []


def test_a_dead_panel_is_named(stack: Stack) -> None:
    """The check itself can fail: a panel on a series nobody serves is reported by name."""
    board = {
        "templating": {"list": [{"name": "datasource"}]},
        "panels": [{"id": 7, "title": "Nothing here", "targets": [
            {"refId": "A", "expr": "inferwatch_gpu_xid_errors_total{xid=\"999\"}"}]}],
    }  # fmt: skip
    assert panels.dead_panels(stack, {"x": board}) == ["x 7 'Nothing here'"]


# --- inferwatch snapshot against the same Prometheus -----------------------------------------
def snapshot(stack: Stack, out: Path, *args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [*INFERWATCH, "snapshot", "--prometheus", stack.prometheus, "--from", "2m",
         "--scrape-interval", f"{SCRAPE_S:g}s", "--out", str(out), *args],
        capture_output=True, text=True, timeout=120,
    )  # fmt: skip


@pytest.mark.parametrize("board", ["fleet", "gpu"])
def test_snapshot_draws_every_panel_of_the_board_with_data(
    stack: Stack, dead_after_waiting: list[str], tmp_path: Path, board: str
) -> None:
    import matplotlib.image

    out = tmp_path / f"{board}.png"
    result = snapshot(stack, out, "--dashboard", board, "--var", "replica=primary-v1")
    assert result.returncode == 0, result.stderr
    assert "Warning" not in result.stderr  # Prometheus evaluates the rules the board reads
    dashboard = writer.dashboards(alert_config.load())[board]
    count = len(queries.panels(dashboard))
    assert result.stdout.strip() == f"{out}: {board}, {count} of {count} panels with data"
    assert out.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    pixels = matplotlib.image.imread(out)
    units = max(p["gridPos"]["y"] + p["gridPos"]["h"] for p in dashboard["panels"]) + 2
    assert pixels.shape[1] == 1280 and abs(pixels.shape[0] - units * 0.34 * 80) <= 1
    for panel in queries.panels(dashboard):
        region = panel_region(pixels, panel["gridPos"], units)
        if panel["type"] in DRAWN_OVER_TIME:  # lines in colour ("No data" is grey text)
            drawn = ((region.max(axis=2) - region.min(axis=2)) > 0.25).sum()  # lines, legend
        else:  # values as dark text below the title
            drawn = (region[region.shape[0] // 4 :].max(axis=2) < 0.3).sum()
        assert drawn > 0, (board, panel["id"], panel["title"])


def panel_region(pixels: Any, grid: Mapping[str, int], units: int) -> Any:
    """The pixels of one panel, placed as the snapshot places it (a 2-unit title band)."""
    height, width = pixels.shape[:2]
    top, bottom = ((grid["y"] + 2 + d) * height // units for d in (0, grid["h"]))
    left, right = (col * width // 24 for col in (grid["x"], grid["x"] + grid["w"]))
    return pixels[top:bottom, left:right, :3]


def test_snapshot_of_a_range_without_data_is_one_line_and_exit_2(
    stack: Stack, tmp_path: Path
) -> None:
    out = tmp_path / "none.png"
    result = snapshot(stack, out, "--dashboard", "fleet", "--var", "cluster=nowhere")
    assert result.returncode == 2
    assert result.stderr.strip().splitlines() == [
        f"Error: no data for any panel of fleet in the last 2m at {stack.prometheus}"
    ]
    assert not out.exists()
