"""Hostile-engine benchmark: what a gzip bomb or a cardinality explosion costs the sidecar.

Run from the repository root:  .venv/bin/python bench/sidecar_hostile.py [--rounds N]

Three real ``inferwatch sidecar`` processes (default flags: 16 MiB page cap, 1000 series per
family, 256-character label values) each sit in front of one page served over loopback:

- ``normal``: the vLLM 0.33.0 one-engine capture (the anchor);
- ``gzip bomb``: ~0.25 MB on the wire that inflates to 256 MiB (gzip); the sidecar must refuse
  it as ``too_large`` once the cap is passed;
- ``gzip, gzip bomb``: the same page gzipped twice (a few kilobytes on the wire);
- ``cardinality``: the normal page plus 120,000 ``vllm:num_requests_running`` series and 2,000
  ``vllm:e2e_request_latency_seconds`` histogram series with distinct model names (just under
  the page cap), which the sidecar must parse and bound.

Scrapes go round-robin over the three sidecars, so that machine noise hits them alike. Each
row reports p50 and p99 of a whole ``GET /metrics`` through the sidecar, the samples it
served, its peak and final resident memory (with the p99 and peak-memory ratios against the
normal page's row), and the reasons of the scrape errors and series drops it counted.
"""

from __future__ import annotations

import argparse
import contextlib
import gzip
import statistics
import sys
import time
import zlib
from collections.abc import Iterator
from http.server import BaseHTTPRequestHandler
from pathlib import Path
from typing import ClassVar

import httpx
from scrape_path import VLLM_PAGE, machine_facts, rss_mb, sidecar_serving

from inferwatch.serving import threaded

MiB = 1 << 20

Page = tuple[bytes, str]  # body, Content-Encoding ("" for none)


def gzip_bomb(inflated: int) -> bytes:
    """``inflated`` bytes of blank lines (a valid, empty page), gzipped."""
    compressor = zlib.compressobj(9, wbits=16 + zlib.MAX_WBITS)
    block = b"\n" * MiB
    return b"".join(compressor.compress(block) for _ in range(inflated // MiB)) + (
        compressor.flush()
    )


def cardinality_page(normal: str, gauges: int, histograms: int) -> bytes:
    """The normal page with one gauge and one histogram family exploded over model names."""
    lines = [normal.rstrip("\n")]
    lines.append("# TYPE vllm:num_requests_running gauge")
    lines += [
        f'vllm:num_requests_running{{engine="0",model_name="junk-{i:06d}"}} 1'
        for i in range(gauges)
    ]
    name = "vllm:e2e_request_latency_seconds"
    lines.append(f"# TYPE {name} histogram")
    for i in range(histograms):
        labels = f'engine="0",model_name="junk-{i:06d}"'
        cumulative = 0
        for le in ("0.3", "0.5", "0.8", "1.0", "1.5", "2.0", "2.5", "5.0", "10.0", "+Inf"):
            cumulative += 1
            lines.append(f'{name}_bucket{{{labels},le="{le}"}} {cumulative}')
        lines += [f"{name}_count{{{labels}}} {cumulative}", f"{name}_sum{{{labels}}} 12.5"]
    return ("\n".join(lines) + "\n").encode()


class _Handler(BaseHTTPRequestHandler):
    pages: ClassVar[dict[str, Page]] = {}

    def do_GET(self) -> None:
        page = self.pages.get(self.path.split("/")[1].replace("%20", " "))
        if page is None or not self.path.endswith("/metrics"):  # the version endpoint, say
            self.send_error(404)
            return
        body, encoding = page
        self.send_response(200)
        self.send_header("Content-Type", "text/plain; version=0.0.4; charset=utf-8")
        self.send_header("Content-Length", str(len(body)))
        if encoding:
            self.send_header("Content-Encoding", encoding)
        self.end_headers()
        with contextlib.suppress(OSError):
            self.wfile.write(body)

    def log_message(self, format: str, *args: object) -> None:
        pass


@contextlib.contextmanager
def engine_serving(pages: dict[str, Page]) -> Iterator[str]:
    """One local server answering ``/<case>/metrics`` with each page; yields its origin."""
    handler = type("Handler", (_Handler,), {"pages": pages})
    with threaded.serving(handler) as origin:
        yield origin


def peak_rss_mb(pid: int) -> float:
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmHWM:"):
            return int(line.split()[1]) / 1024
    return float("nan")


def outcome(text: str) -> tuple[int, str]:
    """Samples on a sidecar page, and the engine scrape errors and drops it reports."""
    samples = [line for line in text.splitlines() if line and line[0] != "#"]
    counted = [
        line.split('reason="')[1].split('"')[0]
        for line in samples
        if line.startswith(
            (
                "inferwatch_engine_scrape_errors_total{",
                "inferwatch_engine_scrape_dropped_series_total{",
            )
        )
    ]
    return len(samples), ",".join(sorted(set(counted))) or "-"


def p99(values: list[float]) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, int(len(ordered) * 0.99))]


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rounds", type=int, default=30, help="timed scrapes per sidecar")
    args = parser.parse_args(argv)

    normal = VLLM_PAGE.read_text(encoding="utf-8")
    bomb = gzip_bomb(256 * MiB)
    pages: dict[str, Page] = {
        "normal": (normal.encode(), ""),
        "gzip bomb": (bomb, "gzip"),
        "gzip, gzip bomb": (gzip.compress(bomb, mtime=0), "gzip, gzip"),
        "cardinality": (cardinality_page(normal, 120_000, 2_000), ""),
    }
    print("; ".join(machine_facts()))
    for case, (body, encoding) in pages.items():
        print(f"  {case}: {len(body):,} bytes on the wire{f' ({encoding})' if encoding else ''}")

    with contextlib.ExitStack() as stack:
        origin = stack.enter_context(engine_serving(pages))
        sidecars = {
            case: stack.enter_context(sidecar_serving(f"{origin}/{case}/metrics")) for case in pages
        }
        times: dict[str, list[float]] = {case: [] for case in pages}
        served: dict[str, int] = {}
        errors: dict[str, str] = {}
        with httpx.Client(timeout=60) as client:
            for url, _ in sidecars.values():  # warm-up: connections, memos, detection
                client.get(url).raise_for_status()
            for _ in range(args.rounds):
                for case, (url, _) in sidecars.items():
                    start = time.perf_counter()
                    response = client.get(url)
                    times[case].append((time.perf_counter() - start) * 1000)
                    response.raise_for_status()
                    served[case], errors[case] = outcome(response.text)
        memory = {case: (peak_rss_mb(pid), rss_mb(pid)) for case, (_, pid) in sidecars.items()}

    print(f"\nGET /metrics through the sidecar, {args.rounds} rounds round-robin")
    header = (
        f"  {'engine page':<16} {'p50 ms':>8} {'p99 ms':>8} {'p99 vs normal':>14}"
        f" {'samples out':>12} {'peak RSS MB':>12} {'vs normal':>10} {'RSS MB':>8}"
        "  errors/drops counted"
    )
    print(header)
    anchor_p99, anchor_peak = p99(times["normal"]), memory["normal"][0]
    for case in pages:
        peak, rss = memory[case]
        print(
            f"  {case:<16} {statistics.median(times[case]):8.2f} {p99(times[case]):8.2f}"
            f" {p99(times[case]) / anchor_p99:13.1f}x {served[case]:12,}"
            f" {peak:12.1f} {peak / anchor_peak:9.2f}x {rss:8.1f}  {errors[case]}"
        )
    return 0


if __name__ == "__main__":
    sys.exit(main())
