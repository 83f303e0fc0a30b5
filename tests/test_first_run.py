"""A first run without surprises: what a newcomer types works as printed and documented."""

from __future__ import annotations

import json
import queue
import socket
import subprocess
import sys
import threading
from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest
from click.testing import CliRunner
from prometheus_client.parser import text_string_to_metric_families

from inferwatch.cli import main
from inferwatch.exitcodes import ExitCode
from inferwatch.sim.server import start_subprocess
from support.ports import announced_url
from support.wait import wait_for

INFERWATCH = Path(sys.executable).parent / "inferwatch"
SCRIPT = Path(__file__).resolve().parent.parent / "scripts" / "inferwatch"


def samples(text: str, name: str) -> list[float]:
    return [
        s.value
        for family in text_string_to_metric_families(text)
        for s in family.samples
        if s.name == name
    ]


@pytest.mark.e2e
@pytest.mark.parametrize("sim_args", [[], ["--gpu-port", "0"]], ids=["one-port", "gpu-port"])
def test_the_simulators_ready_file_urls_work_with_the_flags_that_take_them(
    sim_args: list[str], tmp_path: Path
) -> None:
    with start_subprocess(["--speed", "50", *sim_args]) as sim:
        scraped = CliRunner().invoke(main, ["scrape", sim.url])
        assert scraped.exit_code == 0 and scraped.output.startswith("engine: vllm"), scraped.output
        log = tmp_path / "sidecar.log"
        with log.open("w") as out:
            sidecar = subprocess.Popen(
                [str(INFERWATCH), "sidecar", "--engine-url", sim.url, "--gpu",
                 f"dcgm={sim.gpu_url}", "--listen", "127.0.0.1:0"],
                stdout=out, stderr=subprocess.STDOUT,
            )  # fmt: skip
        try:
            url = announced_url(sidecar, log, "the sidecar")
            wait_for(lambda: httpx.get(url + "/readyz").status_code == 200, "/readyz 200")
            page = httpx.get(url + "/metrics").text
        finally:
            sidecar.terminate()
            sidecar.wait(10)
    assert samples(page, "inferwatch_engine_up") == [1.0]
    assert 1.0 in samples(page, "inferwatch_gpu_backend_up"), log.read_text()
    assert samples(page, "inferwatch_gpu_healthy"), log.read_text()


class Proxy:
    """``inferwatch proxy`` as a user starts it, its JSON log lines read as they come."""

    def __init__(self, args: list[str], cwd: Path, command: Path = INFERWATCH) -> None:
        self.process = subprocess.Popen(
            [str(command), "--log-format", "json", "proxy", "--listen", "127.0.0.1:0", *args],
            cwd=cwd, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True,
        )  # fmt: skip
        self._lines: queue.Queue[str | None] = queue.Queue()  # None: the stream ended
        self._reader = threading.Thread(target=self._read, daemon=True)
        self._reader.start()

    def _read(self) -> None:
        assert self.process.stderr is not None
        with self.process.stderr as stream:
            for line in stream:
                self._lines.put(line)
        self._lines.put(None)

    def log(self, timeout: float = 60.0) -> Iterator[dict[str, object]]:
        """Its JSON log lines; a failure when the next one takes longer than ``timeout``."""
        while True:
            try:
                line = self._lines.get(timeout=timeout)
            except queue.Empty:
                pytest.fail(f"no log line from the proxy within {timeout}s")
            if line is None:
                pytest.fail(f"the proxy exited (code {self.process.wait(10)})")
            if line.startswith("{"):
                yield json.loads(line)

    def stop(self) -> None:
        self.process.terminate()
        self.process.wait(10)
        self._reader.join(10)


@pytest.mark.e2e
def test_the_script_reads_a_relative_config_from_the_callers_directory(tmp_path: Path) -> None:
    elsewhere = tmp_path / "somewhere" / "else"
    elsewhere.mkdir(parents=True)
    (elsewhere / "proxy.yaml").write_text(
        "upstream: {url: 'http://127.0.0.1:9', reconcile_interval: 0}\n"
        "tenants: {acme: {key_sha256: ['" + "0" * 64 + "']}}\n"
    )
    proxy = Proxy(["--config", "proxy.yaml"], cwd=elsewhere, command=SCRIPT)
    try:  # the script may prepare .venv first when pyproject.toml is newer
        started = next(line for line in proxy.log(180) if line["msg"] == "proxy starting")
    finally:
        proxy.stop()
    assert started["config"] == "proxy.yaml" and started["tenants"] == 1
    assert started["upstream"] == "http://127.0.0.1:9"
    host, _, port = str(started["listen"]).removeprefix("http://").rpartition(":")
    assert host == "127.0.0.1" and int(port) > 0  # the port it really bound, not the 0 asked for


@pytest.mark.e2e
def test_the_proxy_says_plainly_that_without_a_config_every_request_is_refused(
    tmp_path: Path,
) -> None:
    proxy = Proxy([], cwd=tmp_path)
    try:
        lines = proxy.log()
        started = next(line for line in lines if line["msg"] == "proxy starting")
        warning = next(lines)
        response = httpx.post(
            f"{started['listen']}/v1/chat/completions", json={"model": "m", "messages": []}
        )
    finally:
        proxy.stop()
    assert started["tenants"] == 0 and started["config"] == "none"
    assert warning["level"] == "warning"
    assert str(warning["msg"]).startswith("no --config given: every request will be refused")
    assert response.status_code == 401


@pytest.mark.unit
def test_a_taken_listen_address_is_one_clear_line() -> None:
    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        port = taken.getsockname()[1]
        result = CliRunner().invoke(main, ["proxy", "--listen", f"127.0.0.1:{port}"])
    assert result.exit_code == ExitCode.PORT_TAKEN
    assert result.output.strip() == (
        f"Error: cannot listen on 127.0.0.1:{port} (--listen): Address already in use"
    )
