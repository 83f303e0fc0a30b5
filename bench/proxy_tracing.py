"""What tracing costs the tenancy proxy: the proxy before tracing existed, today's with tracing
off, and today's tracing every request (ratio 1.0), side by side in one run.

    .venv/bin/python bench/proxy_tracing.py [--requests 2000] [--rounds 3] [--baseline REV]

The mock engine and load generator are ``proxy_overhead.py``'s. ``baseline`` is the proxy at
``REV`` (default: the commit before tracing was added), installed from ``git archive`` into a
scratch directory and run by this venv's interpreter; ``off`` is this checkout without
``--otlp-endpoint``; ``traced`` is this checkout with ``--otlp-endpoint`` at ratio 1.0,
exporting to an OTLP/HTTP sink in its own process that answers every export with 200. The
three run in turn, ``--rounds`` times, so that the machine's drift spreads over all of them;
the table gives each one's median throughput at concurrency 16, its spread over the rounds
(the run's noise) and the median of its per-round ratios to the baseline.
"""

from __future__ import annotations

import argparse
import hashlib
import os
import shutil
import socket
import statistics
import subprocess
import sys
import tempfile
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any

import proxy_overhead as po

REPO = po.REPO
TRACING_MODULE = "inferwatch/proxy/tracing.py"


def _default_baseline() -> str:
    """The parent of the commit that added the proxy's tracing module."""
    added = subprocess.run(
        ["git", "log", "--diff-filter=A", "--format=%H", "--", TRACING_MODULE],
        cwd=REPO, capture_output=True, text=True, check=True,
    ).stdout.split()  # fmt: skip
    if not added:
        raise SystemExit(f"no commit adds {TRACING_MODULE}: give --baseline REV")
    return added[-1] + "^"


def _install_baseline(rev: str, workdir: Path) -> dict[str, str]:
    """The environment that runs the proxy at ``rev``: its package installed (without its
    dependencies, which this venv has) into a directory put first on PYTHONPATH."""
    source, target = workdir / "baseline-src", workdir / "baseline-site"
    source.mkdir()
    archive = subprocess.run(
        ["git", "archive", rev], cwd=REPO, capture_output=True, check=True
    ).stdout
    subprocess.run(["tar", "-x", "-C", str(source)], input=archive, check=True)
    subprocess.run(
        [sys.executable, "-m", "pip", "install", "-q", "--disable-pip-version-check",
         "--no-deps", "--no-build-isolation", "--target", str(target), str(source)],
        check=True,
    )  # fmt: skip
    return dict(os.environ, PYTHONPATH=str(target))


class _Sink(BaseHTTPRequestHandler):
    """Takes every export (and the readiness GET) with an empty 200, on keep-alive."""

    protocol_version = "HTTP/1.1"

    def do_POST(self) -> None:
        self.rfile.read(int(self.headers.get("content-length", "0")))
        self.do_GET()

    def do_GET(self) -> None:
        self.send_response(200)
        self.send_header("content-length", "0")
        self.end_headers()

    def log_message(self, format: str, *args: Any) -> None:
        pass


def _serve_sink(listener: socket.socket) -> None:
    server = ThreadingHTTPServer(listener.getsockname(), _Sink, bind_and_activate=False)
    server.socket = listener
    server.serve_forever()


def _start_proxy(
    env: dict[str, str] | None, mock_port: int, workdir: Path, name: str, extra: list[str]
) -> tuple[subprocess.Popen[bytes], int]:
    """The proxy under ``env`` (None: this checkout's), with ``extra`` flags."""
    config = workdir / "proxy.yaml"
    digest = hashlib.sha256(po.TENANT_KEY.encode()).hexdigest()
    config.write_text(
        f"upstream: {{url: 'http://127.0.0.1:{mock_port}', reconcile_interval: 0}}\n"
        f"tenants: {{bench: {{key_sha256: ['{digest}']}}}}\n"
        f"prices: {{default: {{prompt: 0.5, completion: 1.5}}}}\n"
    )
    log = workdir / f"{name}.log"
    process = po._start(
        # -P: the checkout's bare inferwatch/ folder must not shadow the installed package
        [sys.executable, "-P", "-m", "inferwatch", "--log-format", "json", "proxy",
         "--config", str(config), "--listen", "127.0.0.1:0", "--metrics-listen", "127.0.0.1:0",
         "--no-access-log", *extra],
        log,
        env,
    )  # fmt: skip
    try:
        port = int(po.announced_url(process, log, name).rsplit(":", 1)[1])
        po._wait_ready(port, po.TENANT_KEY, 30, lambda: process.poll() is None)
    except BaseException:
        po._stop(process)
        raise
    return process, port


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--requests", type=int, default=2000, help="requests per measurement")
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--baseline", default="", help="git revision of the baseline proxy")
    args = parser.parse_args()

    workdir = Path(tempfile.mkdtemp(prefix="proxy-tracing-bench-"))
    rev = args.baseline or _default_baseline()
    mock, mock_port = po._serve_in_child(po._serve_mock, 0.0)
    sink, sink_port = po._serve_in_child(_serve_sink)
    try:
        baseline = _install_baseline(rev, workdir)
        rows: dict[str, tuple[dict[str, str] | None, list[str]]] = {
            "baseline": (baseline, []),
            "off": (None, []),
            "traced": (
                None,
                [f"--otlp-endpoint=http://127.0.0.1:{sink_port}", "--otlp-sampling-ratio=1.0"],
            ),
        }
        rps: dict[tuple[str, str], list[float]] = {}
        for round_ in range(args.rounds):
            for name, (env, extra) in rows.items():
                process, port = _start_proxy(env, mock_port, workdir, name, extra)
                try:
                    for mode, stream in (("plain", False), ("stream", True)):
                        result = po._run_load(port, po.TENANT_KEY, stream, 16, args.requests)
                        rps.setdefault((name, mode), []).append(result["rps"])
                        print(f"  round {round_ + 1} {name:8} {mode:6} {result['rps']:8.0f} req/s")
                finally:
                    po._stop(process)
        _report(rps, rev, list(rows))
    finally:
        for child in (mock, sink):
            child.terminate()
            child.join(5)
        shutil.rmtree(workdir, ignore_errors=True)


def _report(rps: dict[tuple[str, str], list[float]], rev: str, names: list[str]) -> None:
    """Median throughput per proxy, its spread over the rounds, and the median of the
    per-round ratios to the baseline (each round's rows ran back to back, so a round's
    ratio cancels the drift between rounds)."""
    rounds = len(rps[(names[0], "plain")])
    print(f"\nbaseline: {rev}; throughput at c=16 over {rounds} rounds")
    print(f"{'proxy':9} {'mode':6} {'req/s':>8} {'spread':>8} {'vs baseline':>11}")
    for mode in ("plain", "stream"):
        base = rps[("baseline", mode)]
        for name in names:
            values = rps[(name, mode)]
            median = statistics.median(values)
            spread = (max(values) - min(values)) / median
            ratio = statistics.median(v / b for v, b in zip(values, base, strict=True))
            print(f"{name:9} {mode:6} {median:8.0f} {spread:8.1%} {ratio:11.2f}")


if __name__ == "__main__":
    main()
