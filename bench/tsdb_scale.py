"""Prometheus against VictoriaMetrics on one machine, as the fleet grows to thousands of replicas.

Run from the repository root (needs ``prometheus`` and Debian's ``victoria-metrics``,
``vmagent`` and ``vmalert`` on the PATH: ``scripts/install-victoriametrics``):
  .venv/bin/python bench/tsdb_scale.py [--replicas 100,1000] [--scrape-interval 15] [--cycles 6]

The replicas are one page replayer: a single asyncio process serving a real sidecar's page
(``inferwatch sidecar`` in front of the shared vLLM 0.33.0 and dcgm-exporter captures) at
``/r/INDEX`` for every replica, each with its own identity labels (pod, node, instance,
gpu_uuid, four models with two versions each) and its counters and histograms growing with
every scrape interval. For each fleet size one Prometheus (the generated rule files
evaluated every interval) and one VictoriaMetrics (the single-node server fed by one vmagent,
the same rules on vmalert) scrape the same replayer side by side.

Rows: samples ingested per second over ``--cycles`` scrape intervals, from each store's own
counter (Prometheus' ``prometheus_tsdb_head_samples_appended_total``, VictoriaMetrics'
``vm_rows_inserted_total``; both include the recording rules' output), against what the
targets offer; the slowest scrape and the 99th percentile of Prometheus' actual scrape
interval (past the interval: it does not keep up); CPU and resident memory of each process
(``/proc``); disk bytes per sample (VictoriaMetrics' data folder after
``/internal/force_flush``; Prometheus keeps its head in memory and a write-ahead log on disk:
both its WAL and a snapshot block of the head, ``/api/v1/admin/tsdb/snapshot``, are given);
and the fleet board's panels as instant queries, as drawn (on recorded series) and with every
recorded series replaced by its rule's expression (``fleet_scale.expand``): the whole board
once, and its heaviest raw query (the slowest on Prometheus in this run) as the median of
``--rounds``, timed as the HTTP round trip on both stores (VictoriaMetrics 1.79 reports no
execution time of its own). Ratios are VictoriaMetrics over Prometheus.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import multiprocessing
import os
import platform
import random
import resource
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterator
from dataclasses import dataclass, field
from multiprocessing.connection import Connection
from pathlib import Path
from typing import Any

import httpx
import yaml
from fleet_scale import capture_page, du, expand, recording_rules
from localfleet import FLEET_DASHBOARD, MODELS, RULE_FILES, panel_queries, stopped

from inferwatch.serving import textformat

sys.path.insert(0, str(Path(__file__).resolve().parent.parent / "tests"))
from support.ports import launch  # the tests' port tools

JOB = "replicas"
#: the series a scraper adds per target (up, scrape_duration_seconds, scrape_samples_*)
SCRAPE_SERIES = 5
MAX_HEAD_BYTES = 8 << 10
HEAD_TIMEOUT_S = 10.0
GROWING = {"counter", "histogram", "summary"}


class Replayer:
    """Replica INDEX's page: the template's samples under that replica's identity labels,
    counters and histograms multiplied by a per-replica rate and by the number of scrape
    intervals since the start (so every scrape of an interval sees the same page, and the
    next interval a larger one). One page per replica is kept for the current interval, so
    that the second store's scrape costs no rendering."""

    def __init__(self, template: str, replicas: int, interval_s: float) -> None:
        exposition = textformat.parse(template)
        identity = {"namespace", "pod", "node", "instance", "model", "model_version", "cluster"}
        self.lines: list[tuple[str, str, str, float, bool]] = []
        for family in exposition.families.values():
            for sample in family.samples:
                labels = {k: v for k, v in sample.labels.items() if k not in identity}
                gpu = labels.pop("gpu_uuid", "")
                rest = "".join(f',{k}="{_escape(v)}"' for k, v in sorted(labels.items()))
                grows = family.type in GROWING
                self.lines.append((sample.name, gpu[-8:], rest, sample.value, grows))
        self.replicas = replicas
        self.interval_s = interval_s
        self.started = time.monotonic()
        rng = random.Random(0)
        self.rates = [rng.uniform(0.5, 1.5) for _ in range(replicas)]
        self.cache: dict[int, tuple[int, bytes]] = {}

    def page(self, index: int) -> bytes:
        step = int((time.monotonic() - self.started) / self.interval_s)
        cached = self.cache.get(index)
        if cached and cached[0] == step:
            return cached[1]
        growth = self.rates[index] * (1 + step / 10)
        model = MODELS[index % len(MODELS)]
        ident = (
            f'cluster="c1",namespace="inference",pod="{model}-{index:05d}",'
            f'node="node-{index // 8:04d}",model="{model}",model_version="v{(index // 4) % 2}",'
            f'instance="{instance(index)}"'
        )
        out = []
        for name, gpu, rest, value, grows in self.lines:
            uuid = f',gpu_uuid="GPU-{index:05d}-{gpu}"' if gpu else ""
            number = value * growth if grows else value
            out.append(f"{name}{{{ident}{uuid}{rest}}} {number:.6g}\n")
        body = "".join(out).encode()
        self.cache[index] = (step, body)
        return body

    async def handle(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        """Requests on one keep-alive connection; a head that is too large, too slow or not
        HTTP closes it, a path that is no replica's gets a 404."""
        try:
            while True:
                try:
                    async with asyncio.timeout(HEAD_TIMEOUT_S):
                        head = await reader.readuntil(b"\r\n\r\n")
                except asyncio.LimitOverrunError:
                    writer.write(_reply(431, b"request head too large\n"))
                    return
                except (asyncio.IncompleteReadError, TimeoutError):
                    return
                parts = head.split(b" ", 2)
                if len(parts) < 3 or not parts[2].startswith(b"HTTP/1."):
                    writer.write(_reply(400, b"not an HTTP/1.x request\n"))
                    return
                index = _replica(parts[1], self.replicas)
                if parts[0] != b"GET" or index is None:
                    writer.write(_reply(404, b"no such replica\n"))
                else:
                    writer.write(_reply(200, self.page(index)))
                await writer.drain()
        except ConnectionError:
            pass
        finally:
            writer.close()


def instance(index: int) -> str:
    """Replica ``index``'s address: its page's and its target's ``instance`` label."""
    return f"10.{index // 62500}.{index // 250 % 250}.{index % 250}:9400"


def _replica(path: bytes, replicas: int) -> int | None:
    prefix, _, number = path.partition(b"/r/")
    if prefix or not number.isdigit() or len(number) > 6 or int(number) >= replicas:
        return None
    return int(number)


def _reply(status: int, body: bytes) -> bytes:
    kind = b"text/plain; version=0.0.4" if status == 200 else b"text/plain"
    return (
        b"HTTP/1.1 %d %s\r\nContent-Type: %s\r\nContent-Length: %d\r\n\r\n"
        % (status, b"OK" if status == 200 else b"Error", kind, len(body))
    ) + body


def _escape(value: str) -> str:
    return value.replace("\\", "\\\\").replace('"', '\\"').replace("\n", "\\n")


def serve(template: str, replicas: int, interval_s: float, announce: Connection) -> None:
    """The replayer process: binds a loopback port, sends it through ``announce``, serves
    until killed. Its descriptor limit is raised to the hard one (two stores keep one
    connection per target each)."""
    _, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    resource.setrlimit(resource.RLIMIT_NOFILE, (hard, hard))
    replayer = Replayer(template, replicas, interval_s)

    async def main() -> None:
        server = await asyncio.start_server(
            replayer.handle, "127.0.0.1", 0, limit=MAX_HEAD_BYTES, backlog=4096
        )
        announce.send(server.sockets[0].getsockname()[1])
        await server.serve_forever()

    asyncio.run(main())


@contextlib.contextmanager
def replaying(template: str, replicas: int, interval_s: float) -> Iterator[tuple[str, int]]:
    """The replayer in its own process: (its ``host:port``, its pid) until the block ends."""
    context = multiprocessing.get_context("fork")
    receive, send = context.Pipe(duplex=False)
    process = context.Process(target=serve, args=(template, replicas, interval_s, send))
    process.start()
    try:
        if not receive.poll(60):
            raise TimeoutError("the replayer did not announce its port within 60 s")
        port = receive.recv()
        assert process.pid is not None
        yield f"127.0.0.1:{port}", process.pid
    finally:
        process.kill()
        process.join()


def scrape_config(address: str, replicas: int, interval_s: float) -> dict[str, Any]:
    return {
        "global": {"scrape_interval": f"{interval_s:g}s", "scrape_timeout": f"{interval_s:g}s"},
        "scrape_configs": [{
            "job_name": JOB, "honor_labels": True,
            "static_configs": [
                {"targets": [address], "labels": {
                    "__metrics_path__": f"/r/{i}", "instance": instance(i), "replica": str(i),
                }}
                for i in range(replicas)
            ],
        }],
    }  # fmt: skip


@dataclass
class Store:
    """One store's processes (name -> pid) and where to ask it."""

    api: str
    metrics: list[str]
    pids: dict[str, int] = field(default_factory=dict)


def cpu_seconds(pid: int) -> float:
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def rss_bytes(pid: int, key: str = "VmRSS") -> int:
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith(key + ":"):
            return int(line.split()[1]) * 1024
    return 0


def metric_sum(urls: list[str], name: str) -> float:
    """The sum of every sample of ``name`` on the ``/metrics`` pages at ``urls``."""
    total = 0.0
    for url in urls:
        for family in textformat.parse(
            httpx.get(f"{url}/metrics", timeout=30).text
        ).families.values():
            total += sum(s.value for s in family.samples if s.name == name)
    return total


def instant(api: str, expr: str) -> tuple[float, int]:
    """(seconds of the HTTP round trip, series in the result) of an instant query."""
    started = time.perf_counter()
    reply = httpx.get(f"{api}/api/v1/query", params={"query": expr}, timeout=600)
    elapsed = time.perf_counter() - started
    body = reply.json()
    if body.get("status") != "success":
        raise SystemExit(f"query failed on {api}: {expr}\n{body.get('error')}")
    return elapsed, len(body["data"]["result"])


def value(api: str, expr: str) -> float:
    reply = httpx.get(f"{api}/api/v1/query", params={"query": expr}, timeout=120).json()
    found = reply["data"]["result"]
    return float(found[0]["value"][1]) if found else float("nan")


def wait_until(what: str, check: Any, deadline_s: float, fatal: bool = True) -> bool:
    """Whether ``check()`` came true within ``deadline_s``; past it, the run ends if ``fatal``."""
    deadline = time.monotonic() + deadline_s
    while not check():
        if time.monotonic() > deadline:
            if fatal:
                raise SystemExit(f"{what} within {deadline_s:.0f} s: not reached")
            print(f"# {what} within {deadline_s:.0f} s: not reached", file=sys.stderr)
            return False
        time.sleep(1)
    return True


@contextlib.contextmanager
def stores(
    work: Path, address: str, replicas: int, interval_s: float
) -> Iterator[dict[str, Store]]:
    """Prometheus with the generated rules, and VictoriaMetrics with one vmagent and vmalert,
    scraping the replayer at ``address``."""
    scrape = scrape_config(address, replicas, interval_s)
    (work / "scrape.yml").write_text(yaml.safe_dump(scrape))
    (work / "prometheus.yml").write_text(yaml.safe_dump({
        **scrape, "global": {**scrape["global"], "evaluation_interval": f"{interval_s:g}s"},
        "rule_files": [str(p) for p in RULE_FILES],
    }))  # fmt: skip
    every = f"{interval_s:g}s"
    with contextlib.ExitStack() as stack:

        def start(what: str, argv: Any, ready: str) -> tuple[int, str]:
            proc, url = launch(argv, work / f"{what}.log", ready, what, timeout=120)
            stack.enter_context(stopped(proc))
            return proc.pid, url

        vm_pid, vm = start("victoria-metrics", lambda port: [
            "victoria-metrics", f"-storageDataPath={work / 'vm'}",
            f"-httpListenAddr=127.0.0.1:{port}", "-search.latencyOffset=1s",
            "-loggerLevel=WARN",
        ], "/health")  # fmt: skip
        agent_pid, _ = start("vmagent", lambda port: [
            "vmagent", f"-promscrape.config={work / 'scrape.yml'}",
            f"-httpListenAddr=127.0.0.1:{port}", f"-remoteWrite.url={vm}/api/v1/write",
            f"-remoteWrite.tmpDataPath={work / 'vmagent-queue'}", "-loggerLevel=WARN",
        ], "/health")  # fmt: skip
        alert_pid, _ = start("vmalert", lambda port: [
            "vmalert", *(f"-rule={p}" for p in RULE_FILES), f"-datasource.url={vm}",
            f"-remoteWrite.url={vm}", "-notifier.url=http://127.0.0.1:9/",
            f"-evaluationInterval={every}", f"-httpListenAddr=127.0.0.1:{port}",
            "-loggerLevel=WARN",
        ], "/health")  # fmt: skip
        prom_pid, prom = start("prometheus", lambda port: [
            "prometheus", f"--config.file={work / 'prometheus.yml'}",
            f"--storage.tsdb.path={work / 'prometheus'}", f"--web.listen-address=127.0.0.1:{port}",
            "--web.enable-admin-api",
        ], "/-/ready")  # fmt: skip
        yield {
            "prometheus": Store(prom, [prom], {"prometheus": prom_pid}),
            "victoriametrics": Store(vm, [vm], {
                "victoria-metrics": vm_pid, "vmagent": agent_pid, "vmalert": alert_pid,
            }),
        }  # fmt: skip


APPENDED = {
    "prometheus": "prometheus_tsdb_head_samples_appended_total",
    "victoriametrics": "vm_rows_inserted_total",
}


def measure(
    template: str, replicas: int, interval_s: float, cycles: int, rounds: int, work: Path,
    queries: list[tuple[str, str]],
) -> dict[str, Any]:  # fmt: skip
    page_series = sum(len(f.samples) for f in textformat.parse(template).families.values())
    result: dict[str, Any] = {
        "replicas": replicas,
        "offered": replicas * (page_series + SCRAPE_SERIES) / interval_s,
    }
    with (
        replaying(template, replicas, interval_s) as (address, replayer_pid),
        stores(work, address, replicas, interval_s) as found,
    ):
        up = f'count(up{{job="{JOB}"}} == 1)'
        # a store that cannot scrape every target is measured as it is: that is the finding
        for name, store in found.items():
            wait_until(f"{name}: every target up", lambda s=store: value(s.api, up) >= replicas,
                       3 * interval_s + 120, fatal=False)  # fmt: skip
        before = {
            n: (metric_sum(s.metrics, APPENDED[n]), time.monotonic()) for n, s in found.items()
        }
        cpu0 = {p: cpu_seconds(p) for s in found.values() for p in s.pids.values()}
        replayer0 = (cpu_seconds(replayer_pid), time.monotonic())
        time.sleep(cycles * interval_s)
        for name, store in found.items():
            count, at = before[name]
            seconds = time.monotonic() - at
            row: dict[str, Any] = {
                "samples_s": (metric_sum(store.metrics, APPENDED[name]) - count) / seconds
            }
            row["cpu"] = {
                what: (cpu_seconds(pid) - cpu0[pid]) / seconds for what, pid in store.pids.items()
            }
            row["rss"] = {what: rss_bytes(pid) for what, pid in store.pids.items()}
            row["up"] = value(store.api, up)
            row["slowest_scrape"] = value(
                store.api,
                f'max(max_over_time(scrape_duration_seconds{{job="{JOB}"}}'
                f"[{cycles * interval_s:g}s]))",
            )
            result[name] = row
        used, at = replayer0
        result["replayer_cpu"] = (cpu_seconds(replayer_pid) - used) / (time.monotonic() - at)
        prom, vm = found["prometheus"], found["victoriametrics"]
        result["interval_p99"] = metric_quantile(prom.api, interval_s)
        result["board"] = board(found, queries, rounds)
        result["prometheus"]["disk"] = prometheus_disk(prom.api, work / "prometheus")
        httpx.get(f"{vm.api}/internal/force_flush", timeout=120)
        result["victoriametrics"]["disk"] = {
            "data": du(work / "vm") / metric_sum(vm.metrics, APPENDED["victoriametrics"])
        }
    return result


def metric_quantile(api: str, interval_s: float) -> float:
    """Prometheus' 99th percentile of the time between two scrapes of a target (on its own
    ``/metrics``: it does not scrape itself here)."""
    page = textformat.parse(httpx.get(f"{api}/metrics", timeout=30).text)
    for family in page.families.values():
        for s in family.samples:
            if s.name == "prometheus_target_interval_length_seconds" and s.labels == {
                "interval": f"{interval_s:g}s",
                "quantile": "0.99",
            }:
                return s.value
    return float("nan")


def prometheus_disk(api: str, data: Path) -> dict[str, float]:
    """Bytes per appended sample: the WAL as it is, and a block written from the head."""
    samples = metric_sum([api], APPENDED["prometheus"])
    wal = du(data / "wal") / samples
    name = httpx.post(f"{api}/api/v1/admin/tsdb/snapshot", timeout=300).json()["data"]["name"]
    return {"wal": wal, "block": du(data / "snapshots" / name) / samples}


def board(found: dict[str, Store], queries: list[tuple[str, str]], rounds: int) -> dict[str, Any]:
    """The fleet board's panel queries on both stores, drawn and raw: the whole board once,
    then the query slowest raw on Prometheus ``rounds`` times."""
    rules = recording_rules()
    pairs = [(title, expr, expand(expr, rules)) for title, expr in queries]
    drawn_pairs = [(t, e, r) for t, e, r in pairs if r != e]
    totals: dict[str, dict[str, float]] = {}
    raw_on_prometheus = []
    for name, store in found.items():
        for title, expr, _ in drawn_pairs:
            wait_until(f"{name}: {title} drawn from recorded series",
                       lambda s=store, e=expr: instant(s.api, e)[1] > 0, 300)  # fmt: skip
        totals[name] = {"drawn": 0.0, "raw": 0.0}
        for title, expr, raw in pairs:
            drawn_s, _ = instant(store.api, expr)
            raw_s, _ = instant(store.api, raw)
            totals[name]["drawn"] += drawn_s
            totals[name]["raw"] += raw_s
            if name == "prometheus":
                raw_on_prometheus.append((raw_s, title, expr, raw))
    _, title, expr, raw = max(raw_on_prometheus)
    heaviest = {
        name: {
            form: statistics.median(instant(store.api, q)[0] for _ in range(rounds))
            for form, q in (("drawn", expr), ("raw", raw))
        }
        for name, store in found.items()
    }
    return {"totals": totals, "heaviest": (title, heaviest), "panels": len(pairs)}


def _ratio(vm: float, prom: float) -> str:
    return f"{vm / prom:.2f}" if prom else "-"


def report(results: list[dict[str, Any]], interval_s: float) -> None:
    sizes = " | ".join(str(r["replicas"]) for r in results)
    mib = 1 << 20
    print(f"\n| measure | {sizes} |")
    print("|---" + "|---:" * len(results) + "|")

    def row(label: str, cell: Any) -> None:
        print(f"| {label} | " + " | ".join(cell(r) for r in results) + " |")

    row("samples/s offered (targets x series / interval)", lambda r: f"{r['offered']:,.0f}")
    row("samples/s ingested: Prometheus", lambda r: f"{r['prometheus']['samples_s']:,.0f}")
    row(
        "samples/s ingested: VictoriaMetrics", lambda r: f"{r['victoriametrics']['samples_s']:,.0f}"
    )
    row(
        "ingested VM / Prometheus",
        lambda r: _ratio(r["victoriametrics"]["samples_s"], r["prometheus"]["samples_s"]),
    )
    row("targets up: Prometheus", lambda r: f"{r['prometheus']['up']:.0f}")
    row("targets up: vmagent", lambda r: f"{r['victoriametrics']['up']:.0f}")
    row("slowest scrape (s): Prometheus", lambda r: f"{r['prometheus']['slowest_scrape']:.2f}")
    row("slowest scrape (s): vmagent", lambda r: f"{r['victoriametrics']['slowest_scrape']:.2f}")
    row(
        f"Prometheus scrape interval p99 (s; set {interval_s:g})",
        lambda r: f"{r['interval_p99']:.2f}",
    )
    row("CPU cores: Prometheus", lambda r: f"{r['prometheus']['cpu']['prometheus']:.2f}")
    for what in ("victoria-metrics", "vmagent", "vmalert"):
        row(f"CPU cores: {what}", lambda r, w=what: f"{r['victoriametrics']['cpu'][w]:.2f}")
    row(
        "CPU VM (all three) / Prometheus",
        lambda r: _ratio(
            sum(r["victoriametrics"]["cpu"].values()), r["prometheus"]["cpu"]["prometheus"]
        ),
    )
    row("CPU cores: the replayer", lambda r: f"{r['replayer_cpu']:.2f}")
    row("RSS MiB: Prometheus", lambda r: f"{r['prometheus']['rss']['prometheus'] / mib:.0f}")
    for what in ("victoria-metrics", "vmagent", "vmalert"):
        row(f"RSS MiB: {what}", lambda r, w=what: f"{r['victoriametrics']['rss'][w] / mib:.0f}")
    row(
        "RSS VM (all three) / Prometheus",
        lambda r: _ratio(
            sum(r["victoriametrics"]["rss"].values()), r["prometheus"]["rss"]["prometheus"]
        ),
    )
    row("disk bytes/sample: Prometheus WAL", lambda r: f"{r['prometheus']['disk']['wal']:.2f}")
    row(
        "disk bytes/sample: Prometheus head as a block",
        lambda r: f"{r['prometheus']['disk']['block']:.2f}",
    )
    row(
        "disk bytes/sample: VictoriaMetrics (flushed)",
        lambda r: f"{r['victoriametrics']['disk']['data']:.2f}",
    )
    row(
        "disk VM / Prometheus block",
        lambda r: _ratio(r["victoriametrics"]["disk"]["data"], r["prometheus"]["disk"]["block"]),
    )
    for form in ("drawn", "raw"):
        for name in ("prometheus", "victoriametrics"):
            row(
                f"whole board, {form} (ms): {name}",
                lambda r, f=form, n=name: f"{r['board']['totals'][n][f] * 1000:.0f}",
            )
    row("heaviest raw query (slowest on Prometheus)", lambda r: r["board"]["heaviest"][0])
    for form in ("drawn", "raw"):
        for name in ("prometheus", "victoriametrics"):
            row(
                f"heaviest, {form} (ms): {name}",
                lambda r, f=form, n=name: f"{r['board']['heaviest'][1][n][f] * 1000:.1f}",
            )
        row(f"heaviest, {form}: VM / Prometheus", lambda r, f=form: _ratio(
            *(r["board"]["heaviest"][1][n][f] for n in ("victoriametrics", "prometheus"))
        ))  # fmt: skip


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument(
        "--replicas", default="100,1000", help="fleet sizes, comma-separated (default 100,1000)"
    )
    parser.add_argument(
        "--scrape-interval",
        type=float,
        default=15.0,
        metavar="S",
        help="scrape and rule evaluation interval in seconds (default 15)",
    )
    parser.add_argument(
        "--cycles",
        type=int,
        default=6,
        help="scrape intervals over which ingestion is measured (default 6)",
    )
    parser.add_argument(
        "--rounds",
        type=int,
        default=3,
        help="timings of the heaviest query per form and store; the median is shown",
    )
    parser.add_argument(
        "--dashboard",
        type=Path,
        default=FLEET_DASHBOARD,
        help="the fleet board whose panel queries are timed",
    )
    options = parser.parse_args()
    for binary in ("prometheus", "victoria-metrics", "vmagent", "vmalert"):
        if not shutil.which(binary):
            raise SystemExit(f"{binary} is not on the PATH (scripts/install-victoriametrics)")
    print(f"# {platform.machine()}, {os.cpu_count()} CPUs, Python {platform.python_version()}")
    out = subprocess.run(["prometheus", "--version"], capture_output=True, text=True)
    print("#", out.stdout.splitlines()[0])
    # Debian's build prints no version of its own
    out = subprocess.run(["dpkg-query", "-W", "victoria-metrics"], capture_output=True, text=True)
    print("#", out.stdout.strip() or "victoria-metrics (version unknown)")
    _, template = capture_page()
    series = sum(len(f.samples) for f in textformat.parse(template).families.values())
    print(
        f"# template: a sidecar's page of {series} series; interval {options.scrape_interval:g} s,"
        f" {options.cycles} cycles"
    )
    queries = panel_queries(options.dashboard)
    results = []
    for replicas in (int(r) for r in options.replicas.split(",")):
        with tempfile.TemporaryDirectory(prefix="tsdb-scale-") as tmp:
            results.append(measure(template, replicas, options.scrape_interval, options.cycles,
                                   options.rounds, Path(tmp), queries))  # fmt: skip
        print(f"# {replicas} replicas measured", file=sys.stderr)
    report(results, options.scrape_interval)


if __name__ == "__main__":
    main()
