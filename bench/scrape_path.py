"""Scrape-path benchmark: our exposition parser against prometheus_client's, side by side.

Run from the repository root:  .venv/bin/python bench/scrape_path.py [--rounds N]

Pages: the vLLM 0.33.0 one-engine capture, and data-parallel pages with 4 and 8 engine ranks
built from it (every ``vllm:`` series repeated per ``engine`` rank, other series kept once).
Rows run round-robin in the same process so that machine noise (and the caches the anchor
leaves behind) hit them alike; each cell is the median time of one operation, with its ratio
against prometheus_client's parser (consumed fully). Rows: the anchor; ``textformat.parse``
(steady state: the series memo filled by earlier scrapes); parse with the vLLM adapter's
family filter; parse + ``engines.normalize`` with and without the filter ("n/a" when the
adapter is absent); ``str.splitlines`` as a floor; and, timed apart because it empties the
memos, parse on a first scrape.

A second table times whole scrapes over loopback HTTP: a real ``inferwatch sidecar`` process
in front of a local server holding the page, against a plain GET of that page (the floor any
scraper pays), and reports the sidecar's resident memory after the run.
"""

from __future__ import annotations

import argparse
import contextlib
import os
import platform
import socket
import statistics
import subprocess
import sys
import time
from collections.abc import Callable, Iterator
from http.server import BaseHTTPRequestHandler
from pathlib import Path

import httpx
from prometheus_client.parser import text_string_to_metric_families

from inferwatch.serving import textformat, threaded

Row = tuple[str, Callable[[str], object] | None]  # None: not available in this checkout

VLLM_PAGE = (  # the shared captures sit beside the checkout
    Path(__file__).resolve().parent.parent.parent
    / "shared/fixtures/engines/vllm-generated-0.33.0-1engine.prom"
)
ANCHOR = "prometheus_client text_string_to_metric_families"


def data_parallel_page(page: str, ranks: int) -> str:
    """The page as vLLM serves it with ``ranks`` engines: each ``vllm:`` family's samples
    repeated once per rank, rank by rank, with ``engine="0"`` rewritten."""
    out: list[str] = []
    block: list[str] = []

    def flush() -> None:
        for rank in range(ranks):
            out.extend(line.replace('engine="0"', f'engine="{rank}"') for line in block)
        block.clear()

    for line in page.splitlines():
        if line.startswith("vllm:"):
            block.append(line)
        else:
            flush()
            out.append(line)
    flush()
    return "\n".join(out) + "\n"


def prometheus_client_parse(text: str) -> int:
    return sum(len(family.samples) for family in text_string_to_metric_families(text))


def our_parse(text: str) -> textformat.Exposition:
    return textformat.parse(text)


def our_parse_cold(text: str) -> textformat.Exposition:
    """First scrape of a page: nothing memoised yet. Timed apart from the round-robin rows,
    since emptying the memos would slow whichever row follows it."""
    textformat.clear_caches()
    return textformat.parse(text)


def splitlines_floor(text: str) -> list[str]:
    return text.splitlines()


def vllm_adapter_rows() -> list[Row]:
    """parse + the vLLM engine adapter, with and without its family filter, when present."""
    try:
        from inferwatch.exporters.engine.adapters import normalize, wanted
    except ImportError:
        return [("textformat.parse + engines.normalize", None)]
    vllm_families = wanted("vllm")

    def parse_filtered(text: str) -> textformat.Exposition:
        return textformat.parse(text, wanted=vllm_families)

    return [
        ("textformat.parse(wanted=engines.wanted)", parse_filtered),
        (
            "textformat.parse + engines.normalize",
            lambda text: normalize(our_parse(text), "vllm", {}),
        ),
        (
            "parse(wanted=...) + engines.normalize",
            lambda text: normalize(parse_filtered(text), "vllm", {}),
        ),
    ]


def build_rows() -> list[Row]:
    """Rows timed round-robin with the anchor."""
    return [
        (ANCHOR, prometheus_client_parse),
        ("textformat.parse", our_parse),
        *vllm_adapter_rows(),
        ("str.splitlines (floor)", splitlines_floor),
    ]


def machine_facts() -> list[str]:
    return [
        f"python {platform.python_version()} ({platform.python_implementation()})",
        f"cpus {os.cpu_count()}",
        f"platform {platform.platform()}",
    ]


def median_ms(rows: list[Row], text: str, rounds: int) -> dict[str, float]:
    """Median milliseconds per call of each available row (the first is the anchor)."""
    timings: dict[str, list[float]] = {label: [] for label, run in rows if run is not None}
    for _, run in rows:  # warm-up, and a check that every row works on this page
        if run is not None:
            run(text)
    anchor, others = rows[0], [row for row in rows[1:] if row[1] is not None]
    for round_index in range(rounds):
        # The anchor first, then the others in a rotating order, so that each of them is as
        # often the one that meets the caches the anchor leaves behind.
        turn = round_index % len(others)
        for label, run in [anchor, *others[turn:], *others[:turn]]:
            assert run is not None
            start = time.perf_counter()
            run(text)
            timings[label].append(time.perf_counter() - start)
    return {label: statistics.median(times) * 1000 for label, times in timings.items()}


def print_table(results: dict[str, float], labels: list[str], anchor_ms: float) -> None:
    width = max(len(label) for label in labels)
    print(f"  {'operation':<{width}}  {'p50 ms':>9}  {'speed-up vs anchor':>18}")
    for label in labels:
        if label in results:
            ms = results[label]
            print(f"  {label:<{width}}  {ms:9.3f}  {anchor_ms / ms:17.1f}x")
        else:
            print(f"  {label:<{width}}  {'n/a':>9}  {'n/a':>18}")


class _PageHandler(BaseHTTPRequestHandler):
    page = b""

    def do_GET(self) -> None:
        self.send_response(200)
        self.send_header("Content-Type", "text/plain; version=0.0.4; charset=utf-8")
        self.send_header("Content-Length", str(len(self.page)))
        self.end_headers()
        self.wfile.write(self.page)

    def log_message(self, format: str, *args: object) -> None:
        pass


@contextlib.contextmanager
def engine_serving(page: str) -> Iterator[str]:
    """A local HTTP server answering every GET with ``page``; yields its /metrics URL."""
    handler = type("Handler", (_PageHandler,), {"page": page.encode()})
    with threaded.serving(handler) as origin:
        yield origin + "/metrics"


@contextlib.contextmanager
def sidecar_serving(engine_url: str) -> Iterator[tuple[str, int]]:
    """A real ``inferwatch sidecar`` process; yields its /metrics URL and pid."""
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        port = sock.getsockname()[1]
    command = [
        str(Path(sys.executable).parent / "inferwatch"),
        "--log-level=warning",
        "sidecar",
        f"--engine-url={engine_url}",
        f"--listen=127.0.0.1:{port}",
        "--gpu=none",
    ]
    process = subprocess.Popen(command, stderr=subprocess.DEVNULL)
    url = f"http://127.0.0.1:{port}/metrics"
    try:
        for _ in range(200):
            with contextlib.suppress(httpx.TransportError):
                httpx.get(url.replace("/metrics", "/healthz"))
                break
            time.sleep(0.05)
        yield url, process.pid
    finally:
        process.terminate()
        process.wait(10)


def rss_mb(pid: int) -> float:
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1]) / 1024
    return float("nan")


def http_scrapes(pages: dict[str, str], rounds: int) -> None:
    """Whole scrapes over HTTP: the page itself, then through the sidecar, alternating."""
    print(f"\nGET /metrics over loopback, {rounds} rounds (p50 / p99 ms)")
    print(
        f"  {'page':<9} {'engine page direct':>19} {'through sidecar':>16} {'ratio':>6}"
        f" {'sidecar RSS':>12}"
    )
    for page_name, text in pages.items():
        with engine_serving(text) as engine_url, sidecar_serving(engine_url) as (url, pid):
            times: dict[str, list[float]] = {engine_url: [], url: []}
            with httpx.Client() as client:
                for target in (engine_url, url):  # warm-up: connections, memos, detection
                    client.get(target).raise_for_status()
                for _ in range(rounds):
                    for target in (engine_url, url):
                        start = time.perf_counter()
                        client.get(target).raise_for_status()
                        times[target].append((time.perf_counter() - start) * 1000)
            rss = rss_mb(pid)
        direct, sidecar = (sorted(times[engine_url]), sorted(times[url]))
        p50 = statistics.median
        p99 = lambda xs: xs[min(len(xs) - 1, int(len(xs) * 0.99))]  # noqa: E731
        print(
            f"  {page_name:<9} {p50(direct):9.2f} / {p99(direct):6.2f} "
            f"{p50(sidecar):7.2f} / {p99(sidecar):6.2f} {p50(sidecar) / p50(direct):5.1f}x"
            f" {rss:9.1f} MB"
        )


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rounds", type=int, default=60, help="timed calls per row and page")
    args = parser.parse_args(argv)

    one_engine = VLLM_PAGE.read_text(encoding="utf-8")
    pages = {
        "1 engine": one_engine,
        "DP=4": data_parallel_page(one_engine, 4),
        "DP=8": data_parallel_page(one_engine, 8),
    }
    rows = build_rows()
    cold_label = "textformat.parse, first scrape (empty memos)"
    print("; ".join(machine_facts()))
    for page_name, text in pages.items():
        samples = prometheus_client_parse(text)
        print(f"\n{page_name}: {len(text):,} bytes, {samples:,} samples, {args.rounds} rounds")
        results = median_ms(rows, text, args.rounds)
        cold_rows: list[Row] = [(ANCHOR, prometheus_client_parse), (cold_label, our_parse_cold)]
        results[cold_label] = median_ms(cold_rows, text, args.rounds)[cold_label]
        our_parse(text)  # memos back for the next page
        labels = [label for label, _ in rows] + [cold_label]
        print_table(results, labels, results[ANCHOR])
    http_scrapes(pages, max(args.rounds, 100))
    return 0


if __name__ == "__main__":
    sys.exit(main())
